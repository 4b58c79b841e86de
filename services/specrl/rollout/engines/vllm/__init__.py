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
