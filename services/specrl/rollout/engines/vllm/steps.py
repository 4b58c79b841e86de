"""Engine steps out of vLLM, for the adaptive speculation controller: a vLLM stat logger
(the documented extension point for per-step stats, `AsyncLLM(stat_loggers=...)`) that
turns each decode step's scheduler stats into an `EngineStep`.

vLLM reports with every step its batch composition (`SchedulerIterationDetails`, on with
`enable_logging_iteration_details`), the verification counts per draft position
(`SpecDecodingStats`) and, per request, the time since its previous output
(`inter_token_latencies_iter`, engine-side timestamps). The step's cost is the latter:
the engine's whole cycle from one output to the next, scheduling and output handling
included, where the iteration details' own `elapsed_ms` times only the model execution
(measured at batch 1 on 2 CPU cores: 13.1 / 15.8 ms at k = 0 / 3 by `elapsed_ms`,
14.3 / 17.5 ms by cycle). Steps that prefill are left out: their cost is the prompt's,
not the draft length's.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable

from specrl.rollout.engines.base import EngineStep

log = logging.getLogger("specrl.rollout.vllm")


def decode_step(scheduler_stats, iteration_stats) -> EngineStep | None:
    """The decode step these stats describe, None for a prefill, dummy or empty step."""
    details = getattr(scheduler_stats, "iteration_details", None)
    if details is None or iteration_stats is None or details.is_dummy:
        return None
    cycles = iteration_stats.inter_token_latencies_iter
    if details.num_ctx_requests or not details.num_generation_requests or not cycles:
        return None
    spec = scheduler_stats.spec_decoding_stats
    return EngineStep(
        batch=details.num_generation_requests,
        seconds=statistics.median(cycles),
        drafted=tuple(spec.num_draft_tokens_per_pos) if spec else (),
        accepted=tuple(spec.num_accepted_tokens_per_pos) if spec else (),
    )


def step_logger(listeners: list[Callable[[EngineStep], None]]):
    """A stat-logger factory (vllm_config, engine_index) -> logger that hands every decode
    step to `listeners`."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class StepLogger(StatLoggerBase):
        def __init__(self, vllm_config, engine_index: int = 0) -> None:
            self.engine_index = engine_index

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0) -> None:
            step = decode_step(scheduler_stats, iteration_stats)
            if step is None:
                return
            for listener in listeners:
                try:
                    listener(step)
                except Exception:  # a controller bug must not stop vLLM's output loop
                    log.exception("engine step listener failed")

        def log_engine_initialized(self) -> None:
            """Required by StatLoggerBase; the controller needs no startup record."""

    return StepLogger
