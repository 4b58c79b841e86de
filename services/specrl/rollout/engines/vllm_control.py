"""Runtime control of a running vLLM engine that vLLM has no API for, installed in every
vLLM process through the `vllm.general_plugins` entry point (pyproject.toml).

`specrl_set_k_schedule` becomes an engine-core utility method (called from the frontend
with `AsyncLLM.engine_core.call_utility_async`): it replaces the scheduler's draft length
by batch size (vLLM's dynamic speculative decoding lookup, which vLLM only builds once,
from `num_speculative_tokens_per_batch_size` at startup). It runs between engine steps,
on the engine-core thread, so a step never sees half a schedule. This is the lever of
the adaptive speculation controller (docs/design.md).

The drafter pause (`paused_drafter_skips_k0`, in the worker process, switched by the
worker extension's `specrl_pause_drafter`): at k=0 vLLM still runs the draft model's
first pass every step, only to keep the draft's KV cache current for when drafting
resumes; measured on the zoo it is most of what a speculative engine at k=0 costs over a
plain AR one. While no batch size drafts at all, that pass is skipped; the draft KV of
the paused steps is then missing, so resuming recomputes what is in flight
(VllmEngine.set_k_schedule).
"""

from __future__ import annotations

import logging

log = logging.getLogger("specrl.vllm_control")

METHOD = "specrl_set_k_schedule"


def set_k_schedule(engine_core, schedule: list[list[int]]) -> None:
    """Replace the scheduler's batch-size -> k lookup. The engine must have started with
    a schedule (otherwise vLLM pads every decode to the full k and builds no lookup)."""
    from vllm.v1.spec_decode.dynamic.utils import build_dynamic_sd_schedule_lookup

    scheduler = engine_core.scheduler
    if getattr(scheduler, "dynamic_sd_lookup", None) is None:
        raise ValueError("the engine started without speculation.k_schedule: k cannot change at runtime")
    scheduler.dynamic_sd_lookup = build_dynamic_sd_schedule_lookup(
        [tuple(entry) for entry in schedule],
        vllm_max_batch_size=scheduler.scheduler_config.max_num_seqs,
        vllm_num_speculative_tokens=scheduler.num_spec_tokens,
    )
    log.info("k schedule now %s", schedule)


PAUSED = "specrl_paused"  # drafter attribute set by the worker extension


def paused_drafter_skips_k0(propose):
    """Wrap SpecDecodeBaseProposer.propose: with the drafter paused and no draft asked
    for, return the empty draft vLLM's own k=0 path returns, without the forward pass."""

    def propose_unless_paused(self, num_speculative_tokens, *args, **kwargs):
        if num_speculative_tokens == 0 and getattr(self, PAUSED, False):
            import torch

            batch = kwargs["common_attn_metadata"].batch_size()
            return torch.empty(batch, 0, dtype=torch.int64, device=self.device)
        return propose(self, num_speculative_tokens, *args, **kwargs)

    propose_unless_paused.specrl_wraps = propose  # type: ignore[attr-defined]
    return propose_unless_paused


def register() -> None:
    """vLLM general-plugin entry point (every vLLM process; idempotent)."""
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer

    if not hasattr(EngineCore, METHOD):
        setattr(EngineCore, METHOD, set_k_schedule)
    if not hasattr(SpecDecodeBaseProposer.propose, "specrl_wraps"):
        SpecDecodeBaseProposer.propose = paused_drafter_skips_k0(SpecDecodeBaseProposer.propose)
