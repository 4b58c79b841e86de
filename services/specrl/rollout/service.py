"""The rollout server's core: plain objects, no gRPC. Fans a batch of prompts out to the
engine, gathers samples as they finish, stamps versions, keeps metrics, gates speculative
serving on the sampler self-test, and takes weight updates between requests."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from pydantic import ValidationError

from specrl.config import RolloutServerConfig
from specrl.metrics import RolloutMetrics
from specrl.rollout.adaptive import AdaptiveK
from specrl.rollout.admission import AdmissionGate
from specrl.rollout.engines.base import Engine, EngineStep, GeneratedSample, Sampling, SelfTestResult
from specrl.rollout.hybrid import SOURCES
from specrl.rollout.weights import Served, WeightUpdater

log = logging.getLogger("specrl.rollout")
# how often a Generate call's end reads the history drafter's counts for /metrics at most
# (a read is a call into the engine's workers)
HISTORY_READ_EVERY_S = 10.0


class NotServing(RuntimeError):
    """The server must not produce speculative rollouts (failed self-test)."""


class NotReady(RuntimeError):
    """The served weights are not complete or not yet synced; retry later or elsewhere."""


@dataclass
class StampedSample:
    prompt_index: int
    sample: GeneratedSample
    policy_version: int
    draft_version: int


class RolloutService:
    def __init__(self, cfg: RolloutServerConfig, engine: Engine, metrics: RolloutMetrics) -> None:
        self.cfg = cfg
        self.engine = engine
        self.metrics = metrics
        self.self_test: SelfTestResult | None = None
        self.engine_patches: list[str] = []
        self.gate = AdmissionGate()
        self._listeners: list[Callable[[bool], None]] = []
        served = Served(
            policy_model=cfg.engine.model,
            draft_model=cfg.speculation.draft,
            method=cfg.speculation.method,
            policy_version=cfg.policy_version,
            draft_version=cfg.draft_version,
        )
        self.weights = WeightUpdater(
            cfg.weight_sync, served, engine, metrics, self.gate, on_change=self._notify
        )
        self._ids = itertools.count()
        self.k_schedule = cfg.speculation.k_schedule
        self.drafter_paused = False
        metrics.speculative_tokens.set(engine.info.k)
        self._history_rows = HistoryRows(metrics)
        self._history_read_at = -HISTORY_READ_EVERY_S
        self._history_reading: asyncio.Task | None = None
        self.adaptive: AdaptiveK | None = None
        self._applying: asyncio.Task | None = None
        self._adaptive_mode = ""
        spec = cfg.speculation
        if spec.adaptive.enabled:
            self.adaptive = AdaptiveK(
                spec.adaptive, spec.num_speculative_tokens, cfg.engine.max_num_seqs, start=spec.k_schedule
            )
            self._adaptive_mode = self.adaptive.mode
            engine.watch_steps(self._on_step)

    @property
    def policy_version(self) -> int:
        return self.weights.versions["policy"]

    @property
    def draft_version(self) -> int:
        return self.weights.versions["draft"]

    @property
    def in_flight(self) -> int:
        return self.gate.in_flight

    @property
    def sampler_ok(self) -> bool:
        return self.self_test is None or self.self_test.passed

    @property
    def serving(self) -> bool:
        """Generate is served: sampler verified and weights complete."""
        return self.sampler_ok and self.weights.ready

    @property
    def not_serving_reason(self) -> str:
        if not self.sampler_ok:
            return "speculative sampling self-test failed"
        return "" if self.weights.ready else self.weights.detail

    def watch_serving(self, listener: Callable[[bool], None]) -> None:
        """Call `listener(serving)` now and whenever readiness may have changed."""
        self._listeners.append(listener)
        listener(self.serving)

    def _notify(self) -> None:
        for listener in getattr(self, "_listeners", ()):
            listener(self.serving)

    async def set_k_schedule(self, schedule: tuple[tuple[int, int, int], ...]) -> None:
        """Change k by batch size from the next engine step. Raises NotServing when the
        engine started without a schedule, ValueError (naming the problem) for a bad one."""
        if self.adaptive is not None:
            raise NotServing("the adaptive controller sets the draft length (speculation.adaptive)")
        if self.k_schedule is None:
            raise NotServing("started without speculation.k_schedule: the draft length is fixed")
        try:
            checked = self.cfg.speculation.model_validate(
                self.cfg.speculation.model_dump() | {"k_schedule": schedule}
            ).k_schedule
        except ValidationError as e:
            raise ValueError("; ".join(err["msg"] for err in e.errors())) from None
        assert checked is not None
        self._record_drafter(await self.engine.set_k_schedule(list(checked)))
        self.k_schedule = checked
        log.info("k schedule set to %s", list(checked))

    def _record_drafter(self, paused: bool) -> None:
        """Whether the engine paused its drafter after a schedule change (status, metric)."""
        if paused != self.drafter_paused:
            log.info("drafter %s", "paused (k=0 at every batch size)" if paused else "resumed")
        self.drafter_paused = paused
        self.metrics.drafter_paused.set(1 if paused else 0)

    def _on_step(self, step: EngineStep) -> None:
        """Feed the adaptive controller (on the engine's output loop: must be quick)."""
        assert self.adaptive is not None
        changed = self.adaptive.observe(step)
        if (mode := self.adaptive.mode) != self._adaptive_mode:
            self._adaptive_mode = mode
            if not changed:  # a probe that ends off keeps k=0 everywhere: the log's only trace of it
                log.info("adaptive k schedule now %s (%s)", list(self.adaptive.schedule()), mode)
        if changed and (self._applying is None or self._applying.done()):
            self._applying = asyncio.get_running_loop().create_task(self._apply_adaptive())
        elif self.adaptive.steps % 100 == 0:
            _publish(self.adaptive, self.metrics)

    async def _apply_adaptive(self) -> None:
        """Give the engine the controller's schedule until the engine has the latest."""
        assert self.adaptive is not None
        while (schedule := self.adaptive.schedule()) != self.k_schedule:
            try:
                self._record_drafter(await self.engine.set_k_schedule(list(schedule)))
            except Exception:  # the engine is going away; the next change tries again
                log.exception("could not apply the adaptive k schedule %s", list(schedule))
                return
            self.k_schedule = schedule
            _publish(self.adaptive, self.metrics)
            log.info("adaptive k schedule now %s (%s)", list(schedule), self.adaptive.mode)

    async def start(self) -> None:
        """Ask the engine which specrl fixes it runs, then self-test its sampler."""
        await self.engine.start()
        if self.k_schedule is not None:
            # an engine may take its start schedule as a lookup only (vLLM does): applied
            # here as a change is, so that k=0 everywhere pauses the drafter from the start
            self._record_drafter(await self.engine.set_k_schedule(list(self.k_schedule)))
        if self.adaptive is not None:
            await self._apply_adaptive()
        self.engine_patches = await self.engine.applied_patches()
        log.info("engine fixes active in the workers: %s", self.engine_patches or "none")
        await self.run_self_test()

    async def run_self_test(self) -> SelfTestResult | None:
        """Check the engine's speculative sampler; afterwards `serving` says whether
        Generate is allowed. No-op (None) without speculation or when disabled."""
        st = self.cfg.self_test
        if not (self.cfg.speculation.enabled and st.enabled):
            return None
        t0 = time.perf_counter()
        result = await self.engine.sampler_self_test(trials=st.trials, alpha=st.alpha, seed=st.seed)
        self.self_test = result
        self._notify()
        self.metrics.self_test_passed.set(1 if result.passed else 0)
        self.metrics.self_test_p_value.set(result.p_value)
        took = time.perf_counter() - t0
        if result.passed:
            log.info(
                "speculative sampler self-test passed in %.1fs (p=%.3g): %s",
                took,
                result.p_value,
                result.detail,
            )
        else:
            log.error(
                "speculative sampler self-test FAILED (p=%.3g < alpha=%g): %s. The engine's "
                "rejection sampling does not reproduce the target distribution; refusing to "
                "serve speculative rollouts.",
                result.p_value,
                st.alpha,
                result.detail,
            )
        return result

    async def generate(
        self,
        prompts: list[list[int]],
        sampling: Sampling,
        request_id: str = "",
        history: list[list[list[int]]] | None = None,
    ) -> AsyncIterator[StampedSample]:
        """Yield every sample of every prompt as it finishes (completion order). Waits
        while a weight update is in progress; every sample carries the versions in force
        when the request was admitted, which produced all of its tokens. `history`: per
        prompt, earlier responses the engine keeps to draft from (before it starts)."""
        if not self.sampler_ok:
            raise NotServing(
                "speculative sampling self-test failed at startup "
                f"({self.self_test.detail if self.self_test else ''}); not serving"
            )
        await self.gate.enter(len(prompts))
        if not self.weights.ready:
            self.gate.leave(len(prompts))
            raise NotReady(f"weights not ready: {self.weights.detail}")
        try:
            for prompt, responses in zip(prompts, history or ()):
                if responses:
                    await self.engine.seed_history(prompt, responses)
        except BaseException:
            self.gate.leave(len(prompts))
            raise
        base = request_id or uuid.uuid4().hex[:12]
        ids = [f"{base}-{next(self._ids)}" for _ in prompts]
        queue: asyncio.Queue[tuple[int, GeneratedSample] | BaseException | None] = asyncio.Queue()
        policy, draft = self.policy_version, self.draft_version

        async def pump(index: int, tokens: list[int], rid: str) -> None:
            try:
                async for s in self.engine.generate(tokens, sampling, rid):
                    await queue.put((index, s))
            except BaseException as e:  # surfaced to the consumer below
                await queue.put(e)
            finally:
                await queue.put(None)

        t0 = time.perf_counter()
        n_seqs = len(prompts) * sampling.n
        self.metrics.queue_depth.inc(n_seqs)
        tasks = [asyncio.create_task(pump(i, p, rid)) for i, (p, rid) in enumerate(zip(prompts, ids))]
        remaining, delivered, status = len(tasks), 0, "error"
        try:
            while remaining:
                item = await queue.get()
                if item is None:
                    remaining -= 1
                    continue
                if isinstance(item, BaseException):
                    raise item
                index, sample = item
                delivered += 1
                self.metrics.queue_depth.dec()
                self._observe(sample)
                yield StampedSample(index, sample, policy, draft)
            status = "ok"
        except (asyncio.CancelledError, GeneratorExit):
            # the caller went away (its deadline, a disconnect, the orchestrator stopping):
            # not the server's error, and counted apart so an error-rate alert stays quiet
            status = "cancelled"
            raise
        finally:
            self.metrics.queue_depth.dec(n_seqs - delivered)
            for t in tasks:
                if not t.done():
                    t.cancel()
            try:
                if status != "ok":
                    for rid in ids:
                        await self.engine.abort(rid)
            finally:
                self.gate.leave(len(prompts))
            self.metrics.requests.labels(status=status).inc()
            self.metrics.latency.observe(time.perf_counter() - t0)
            self._read_history_soon()

    async def history_state(self) -> dict[str, int]:
        """The history drafter's counts (Engine.history_state; {} without one), published
        as metrics: the rows each source drafted (HistoryRows), the tokens held."""
        state = await self.engine.history_state()
        self._history_read_at = time.monotonic()
        if state:
            self._history_rows.publish(state)
            self.metrics.history_tokens.set(state.get("tokens", 0))
        return state

    def _read_history_soon(self) -> None:
        """After a Generate call: the history drafter's counts read for /metrics, at most
        every HISTORY_READ_EVERY_S and one read at a time."""
        if not self.cfg.speculation.drafts_from_history:
            return
        if self._history_reading is not None and not self._history_reading.done():
            return
        if time.monotonic() - self._history_read_at < HISTORY_READ_EVERY_S:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # a call closed after its loop stopped (shutdown): nothing to read for
            return
        self._history_reading = loop.create_task(self._read_history())

    async def _read_history(self) -> None:
        try:
            await self.history_state()
        except Exception as e:  # the engine stopping: the next read tries again
            log.debug("history counts not read: %s", e)

    def _observe(self, s: GeneratedSample) -> None:
        m, a = self.metrics, s.acceptance
        m.samples.inc()
        m.prompt_tokens.inc(s.prompt_tokens)
        m.generated_tokens.inc(len(s.token_ids))
        if a.drafts:
            m.drafts.inc(a.drafts)
            m.draft_tokens.inc(a.draft_tokens)
            m.accepted_tokens.inc(a.accepted_tokens)
            for pos, count in enumerate(a.accepted_per_position):
                m.accepted_per_position.labels(position=str(pos)).inc(count)
            m.acceptance_length.observe(a.acceptance_length)


class HistoryRows:
    """The rows (request steps) each source drafted in the hybrid, and the draft model's
    rows history extended, counted by the engine (they only grow), published as
    increments of specrl_rollout_history_rows (and _extended_rows) since the highest count
    read: reads may overtake each other (GetStatus's and the one after a Generate call),
    and a lower count read late adds nothing."""

    def __init__(self, metrics: RolloutMetrics) -> None:
        self.counters = {source: metrics.history_rows.labels(source=source) for source in SOURCES}
        self.counters["extended"] = metrics.history_extended_rows
        self.seen = dict.fromkeys(self.counters, 0)

    def publish(self, state: dict[str, int]) -> None:
        for name, seen in self.seen.items():
            now = state.get(name, 0)
            if now > seen:
                self.counters[name].inc(now - seen)
                self.seen[name] = now


def _publish(controller: AdaptiveK, metrics: RolloutMetrics) -> None:
    """The controller's k per batch range and the rates it chose from, as gauges."""
    for r in controller.ranges:
        metrics.adaptive_k.labels(batch_sizes=r.label).set(controller.k_for(r.first))
        costs = controller.costs(r)
        for k, rate in controller.rates(r, costs).items():
            if k in costs:
                metrics.adaptive_rate.labels(batch_sizes=r.label, k=str(k)).set(rate)
        if (off := controller.off_rate(r)) is not None:
            metrics.adaptive_rate.labels(batch_sizes=r.label, k="off").set(off)
        if (speedup := controller.speedup(r)) is not None:
            metrics.adaptive_speedup.labels(batch_sizes=r.label).set(speedup)
