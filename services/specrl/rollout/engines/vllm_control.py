"""Runtime control of a running vLLM engine that vLLM has no API for, installed in the
engine-core process through the `vllm.general_plugins` entry point (pyproject.toml).

`specrl_set_k_schedule` becomes an engine-core utility method (called from the frontend
with `AsyncLLM.engine_core.call_utility_async`): it replaces the scheduler's draft length
by batch size (vLLM's dynamic speculative decoding lookup, which vLLM only builds once,
from `num_speculative_tokens_per_batch_size` at startup). It runs between engine steps,
on the engine-core thread, so a step never sees half a schedule. This is the lever of
the adaptive speculation controller (docs/design.md).
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


def register() -> None:
    """vLLM general-plugin entry point (every vLLM process; idempotent)."""
    from vllm.v1.engine.core import EngineCore

    if not hasattr(EngineCore, METHOD):
        setattr(EngineCore, METHOD, set_k_schedule)
