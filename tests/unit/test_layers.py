"""The walls between specrl's parts hold at run time, not only in the import graph that
`make lint` checks (import-linter, pyproject.toml): the orchestrator, the services' api
modules and the data sources import in a Python where torch cannot be imported, so an
orchestrator image or a client needs no torch."""

from __future__ import annotations

import subprocess
import sys
import textwrap

TORCH_FREE = (
    "specrl.orchestrator",
    "specrl.data",
    "specrl.rollout.api",
    "specrl.trainer.api",
    "specrl.draft.api",
)

_IMPORT_ALL_WITHOUT_TORCH = textwrap.dedent(
    """
    import importlib, importlib.abc, pkgutil, sys

    class NoTorch(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ImportError(f"torch is blocked here (imported as {name})")
            return None

    sys.meta_path.insert(0, NoTorch())
    names = []
    for root in sys.argv[1:]:
        module = importlib.import_module(root)
        names.append(root)
        for info in pkgutil.walk_packages(getattr(module, "__path__", []), root + "."):
            importlib.import_module(info.name)
            names.append(info.name)
    assert "torch" not in sys.modules
    print(len(names))
    """
)


def _import_without_torch(*modules: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _IMPORT_ALL_WITHOUT_TORCH, *modules],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_orchestrator_and_the_service_faces_import_without_torch():
    out = _import_without_torch(*TORCH_FREE)
    assert out.returncode == 0, out.stderr[-3000:]
    assert int(out.stdout.split()[-1]) >= 15  # every orchestrator and data module, not only the packages


def test_the_check_fails_for_a_module_that_needs_torch():
    """The premise: the blocker really stops torch (the trainer's internals need it)."""
    out = _import_without_torch("specrl.trainer.batch")
    assert out.returncode != 0 and "torch is blocked here" in out.stderr
