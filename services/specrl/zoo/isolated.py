"""Zoo builds run in a child Python whose numeric environment is fixed, so that every
machine with the same libraries builds the same zoo.

Why: the zoo's models are trained for minutes, and a float reduction split over one
thread or two rounds differently; 500 training steps turn that into different models (a
miniature build differed in three of its four models between OMP_NUM_THREADS=1 and 2).
The suite's own process runs one thread (tests/conftest.py) while `make zoo` ran torch's
default, so the zoo the tests built and the one CI built were different models, and tests
written against one failed on the other. The child gets a fixed thread count, torch's
and MKL's code paths capped at AVX2 (so an AVX-512 host computes as this AVX2 testbed
does, MKL's conditional numerical reproducibility) and torch's deterministic
algorithms, whatever the caller's environment. What the libraries do not pin (another
CPU architecture, another torch or MKL build) can still change a build: its fingerprint
(`fingerprint`, in the manifest and `specrl zoo info`) tells two builds apart.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

# The build's threads: the CI machine's cores, and fixed, since the result depends on it.
BUILD_THREADS = 2
BUILD_ENV = {
    "OMP_NUM_THREADS": str(BUILD_THREADS),
    "MKL_NUM_THREADS": str(BUILD_THREADS),
    "MKL_CBWR": "AVX2",  # MKL: the same results on any x86 CPU with AVX2 or more
    "ATEN_CPU_CAPABILITY": "avx2",  # torch's own vectorised kernels
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "DNNL_MAX_CPU_ISA": "AVX2",  # oneDNN's older name for it
    "CUDA_VISIBLE_DEVICES": "",  # the zoo is a CPU build, also on a GPU machine
    "PYTHONHASHSEED": "0",
    "TOKENIZERS_PARALLELISM": "false",
}
RESULT = "build.json"  # what the child returns, in its output directory


def run_isolated(target: str, out: Path, **kwargs: Any) -> dict:
    """Call `target` ("module:function") as `function(out, **kwargs)` in a child Python
    with BUILD_ENV; its JSON-able return value. Output goes to this process's terminal;
    a failed build raises with the child's exit status (its traceback is above)."""
    result = out / RESULT
    result.unlink(missing_ok=True)
    call = json.dumps({"target": target, "out": str(out), "kwargs": kwargs})
    done = subprocess.run([sys.executable, "-m", __name__, call], env={**os.environ, **BUILD_ENV})
    if done.returncode != 0 or not result.exists():
        raise RuntimeError(f"the zoo build ({target}) failed with exit status {done.returncode}: see above")
    return json.loads(result.read_text())


def fingerprint(root: Path, names: list[str]) -> dict[str, str]:
    """SHA-256 of each model directory's files (relative names and bytes, sorted), and
    `all` over them: equal fingerprints, identical models."""
    out: dict[str, str] = {}
    for name in names:
        h = hashlib.sha256()
        for path in sorted(p for p in (root / name).rglob("*") if p.is_file()):
            h.update(str(path.relative_to(root / name)).encode() + b"\0" + path.read_bytes())
        out[name] = h.hexdigest()
    out["all"] = hashlib.sha256("".join(out[n] for n in names).encode()).hexdigest()
    return out


def _main(call: str) -> None:
    import torch

    torch.use_deterministic_algorithms(True)
    spec = json.loads(call)
    module, function = spec["target"].split(":")
    out = Path(spec["out"])
    value = getattr(importlib.import_module(module), function)(out, **spec["kwargs"])
    (out / RESULT).write_text(json.dumps(value))


if __name__ == "__main__":
    _main(sys.argv[1])
