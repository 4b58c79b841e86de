"""Methods specrl adds to vLLM's workers (`worker_extension_cls`), called through
`collective_rpc`. They run in the worker process, where the model and sampler live.
Weight-sync receivers join this class in a later issue."""

from __future__ import annotations


class SpecrlWorkerExtension:
    """Mixed into vLLM's Worker class; `self.model_runner` is the worker's model runner."""

    def specrl_sampler_self_test(self, trials: int, alpha: float, seed: int) -> dict:
        from specrl.rollout import selftest

        sampler = getattr(self.model_runner, "rejection_sampler", None)  # type: ignore[attr-defined]
        if sampler is None:
            return {"passed": False, "p_value": 0.0, "detail": "engine has no rejection sampler"}
        return selftest.run(sampler, trials=trials, alpha=alpha, seed=seed)

    def specrl_applied_patches(self) -> list[str]:
        from specrl.rollout.engines import vllm_patches

        return vllm_patches.applied()
