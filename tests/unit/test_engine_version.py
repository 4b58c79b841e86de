"""The rollout server refuses a vLLM release its engine code was not written for, at
startup and with a message naming what to install, instead of failing at the first
weight push deep inside the worker extension (issue 30)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from specrl.rollout.engines.base import UnsupportedEngine
from specrl.rollout.engines.vllm import ALLOW_ENV, SUPPORTED_RELEASE, check_version


@pytest.mark.parametrize(
    "version", [f"{SUPPORTED_RELEASE}.0", f"{SUPPORTED_RELEASE}.1+cpu", f"{SUPPORTED_RELEASE}.2.dev3"]
)
def test_the_supported_release_line_starts(version, monkeypatch):
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    check_version(version)


@pytest.mark.parametrize("version", ["0.11.0", "0.33.0", "1.32.0", "0.3.2"])
def test_another_release_is_refused_naming_what_to_install(version, monkeypatch):
    monkeypatch.delenv(ALLOW_ENV, raising=False)
    with pytest.raises(UnsupportedEngine) as e:
        check_version(version)
    assert f"vLLM {version} is installed" in str(e.value)
    assert f"vllm=={SUPPORTED_RELEASE}.*" in str(e.value) and ALLOW_ENV in str(e.value)


def test_the_override_starts_another_release_with_a_warning(monkeypatch, caplog):
    monkeypatch.setenv(ALLOW_ENV, "1")
    check_version("0.11.0")
    assert "starting anyway" in caplog.text


def test_specrl_serve_rollout_refuses_an_unsupported_vllm_before_building_the_engine(tmp_path):
    """The real CLI with the installed vLLM reporting another release: exit 2 and the
    message, before any engine starts (the config names a model that does not exist, so
    getting past the check would fail differently)."""
    pytest.importorskip("vllm")
    config = tmp_path / "rollout.yaml"
    config.write_text("engine: {model: /nonexistent/model}\nport: 0\n")
    script = textwrap.dedent(
        f"""
        import sys, vllm
        vllm.__version__ = "0.11.0"
        from specrl.cli import app
        sys.argv = ["specrl", "serve", "rollout", "--config", {str(config)!r}]
        app()
        """
    )
    env = {k: v for k, v in os.environ.items() if k != ALLOW_ENV}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 2, out.stdout + out.stderr
    text = " ".join((out.stdout + out.stderr).split())
    assert "vLLM 0.11.0 is installed" in text and f"vllm=={SUPPORTED_RELEASE}.*" in text, text
