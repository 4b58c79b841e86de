"""Methods specrl adds to vLLM's workers (`worker_extension_cls`), called through
`collective_rpc`. They run in the worker process, where the model and sampler live."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch


class SpecrlWorkerExtension:
    """Mixed into vLLM's Worker class; `self.model_runner` is the worker's model runner."""

    def specrl_sampler_self_test(self, trials: int, alpha: float, seed: int) -> dict:
        from specrl.rollout.engines.vllm import selftest

        sampler = getattr(self.model_runner, "rejection_sampler", None)  # type: ignore[attr-defined]
        if sampler is None:
            return {"passed": False, "p_value": 0.0, "detail": "engine has no rejection sampler"}
        return selftest.run(sampler, trials=trials, alpha=alpha, seed=seed)

    def specrl_applied_patches(self) -> list[str]:
        from specrl.rollout.engines.vllm import patches

        return patches.applied()

    def specrl_pause_drafter(self, paused: bool) -> bool:
        """Pause (or resume) the drafter's k=0 forward pass (control.py); returns
        whether this worker's drafter is now paused (False when it has no model drafter,
        e.g. n-gram, whose k=0 step costs nothing)."""
        from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

        from specrl.rollout.engines.vllm.control import PAUSED

        drafter = getattr(self.model_runner, "drafter", None)  # type: ignore[attr-defined]
        if not isinstance(drafter, SpecDecodeBaseProposer):
            return False
        setattr(drafter, PAUSED, paused)
        return paused

    def specrl_attach_history(self, settings: dict, hybrid: dict | None) -> bool:
        """Start drafting from history (history.py): give the history drafter (method
        history) the model runner and its settings, or, with `hybrid` (install_hybrid's
        min_draft and min_match), overlay history's drafts on the draft model's. False
        when there is nothing to attach to."""
        from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

        from specrl.rollout.engines.vllm.history import HistoryProposer, install_hybrid

        runner = self.model_runner  # type: ignore[attr-defined]
        drafter = getattr(runner, "drafter", None)
        if hybrid is not None and isinstance(drafter, SpecDecodeBaseProposer):
            install_hybrid(runner, settings, **hybrid)
        elif hybrid is None and isinstance(drafter, HistoryProposer):
            drafter.attach(runner, settings)
        else:
            return False
        return True

    def specrl_seed_history(self, prompt: list[int], responses: list[list[int]]) -> None:
        """Earlier responses to `prompt` (carried by the orchestrator) into the history."""
        history = getattr(self.model_runner, "specrl_history", None)  # type: ignore[attr-defined]
        if history is not None:
            history.seed(prompt, responses)

    def specrl_history_state(self) -> dict[str, int]:
        """Tokens held, and (hybrid) the rows (request steps) drafted from history and by
        the draft model."""
        history = getattr(self.model_runner, "specrl_history", None)  # type: ignore[attr-defined]
        return {**history.rows, "tokens": history.index.tokens} if history is not None else {}

    # -- weight sync ----------------------------------------------------------------

    def _specrl_groups(self) -> dict[str, Any]:
        groups = getattr(self, "_specrl_weight_groups", None)
        if groups is None:
            groups = self._specrl_weight_groups = {}
        return groups

    def specrl_join_weight_group(self, fields: dict) -> int:
        """Leave this kind's previous group (if any) and join the one `fields` (a JoinInfo
        as a dict) describes; blocks until every member has joined. Returns this worker's
        rank in the group."""
        from specrl.weightsync.group import JoinInfo, WeightGroup

        info = JoinInfo(**fields)
        groups = self._specrl_groups()
        old = groups.pop(info.kind, None)
        if old is not None:
            old.close()
        group = WeightGroup.join(info, self.rank)  # type: ignore[attr-defined]
        groups[info.kind] = group
        return group.rank

    def specrl_receive_weights(self, kind: str, epoch: int, manifest: dict) -> dict:
        """Receive one update from the group and load it into the target (policy) or the
        drafter (draft) with vLLM's layerwise reload, which restores the checkpoint-format
        parameters that kernel preparation replaced (e.g. CPU GEMM prepacking), loads
        each layer as its tensors arrive and re-runs its weight processing."""
        from vllm.config import set_current_vllm_config
        from vllm.model_executor.model_loader.reload.layerwise import (
            finalize_layerwise_reload,
            initialize_layerwise_reload,
        )

        from specrl.weightsync.manifest import Manifest
        from specrl.weightsync.receiver import receive

        group = self._specrl_groups().get(kind)
        if group is None or group.epoch != epoch:
            have = "none" if group is None else f"epoch {group.epoch}"
            return {"ok": False, "buckets": 0, "error": f"not in {kind} weight group epoch {epoch} ({have})"}
        runner = self.model_runner  # type: ignore[attr-defined]
        vllm_config = self.vllm_config  # type: ignore[attr-defined]
        if kind == "policy":
            model, model_config = runner.get_model(), vllm_config.model_config
        else:
            model = runner.get_draft_model()
            model_config = vllm_config.speculative_config.draft_model_config
        with set_current_vllm_config(vllm_config), _quiet_reload_warnings():
            initialize_layerwise_reload(model)
            try:
                result = receive(group, Manifest.from_dict(manifest), model.load_weights, runner.device)
            finally:
                finalize_layerwise_reload(model, model_config)
                refresh_tied_weights(model, model_config)
        history = getattr(runner, "specrl_history", None)  # drafting from history (history.py)
        if kind == "policy" and result.get("ok") and history is not None:
            history.index.set_version(history.index.version + 1)  # its responses' age
        return result


@contextlib.contextmanager
def _quiet_reload_warnings() -> Iterator[None]:
    """vLLM warns "Failed to load weights" for every layer that had nothing to load on a
    reload: rotary caches, and the LM head tied to the embedding (handled by
    refresh_tied_weights). The manifest check already guarantees an update names every
    checkpoint tensor, so these warnings carry no information; hide them for the reload."""
    logger = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def refresh_tied_weights(model: torch.nn.Module, model_config: Any) -> None:
    """Re-run weight processing of embedding modules that share a weight Parameter (tied
    input embedding and LM head). Only one of them receives the checkpoint tensor, so layerwise
    reload leaves the other's processed copy stale: on CPU the LM head keeps its old
    prepacked GEMM weight and logits silently come from the old embedding. Unquantized
    processing is idempotent, so re-running it is safe; quantized models are left alone."""
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding

    if getattr(model_config, "quantization", None) is not None:
        return
    sharing: dict[int, list[torch.nn.Module]] = {}
    for module in model.modules():
        if isinstance(module, VocabParallelEmbedding):  # ParallelLMHead is a subclass
            sharing.setdefault(id(module.weight), []).append(module)
    for modules in sharing.values():
        if len(modules) > 1:
            for module in modules:
                module.quant_method.process_weights_after_loading(module)
