"""The orchestrator's own autoscaler (`rollout.autoscale`): it scales the rollout workload
toward a target share of each RL step spent waiting for generation (exposed generation),
the number an RL team watches. KEDA and an HPA see queue depth or load; neither knows
whether more replicas would shorten the step, nor when they stop paying.

The control law (ExposureControl) works on steps measured at a settled replica count
(every replica asked for is in the run and served the step's batch from its start, for
`window_steps` steps: the batches published before the set last changed, up to max_lag
of them, were dispatched mostly to the replicas there were and would show a scale-up
that has not reached them yet as one that did not pay) and predicts the exposed
share at another count R' from the measured step time T, generation span G and exposed
time E at R replicas:

    G' = G R / R'               generation time inversely proportional to replicas
    H  = G - E                  the part hidden behind training stays hidden
    E' = max(0, G' - H)
    T' = T - E + E'             share' = E' / T'

Too exposed (share > target + tolerance): the fewest replicas predicted to meet the target,
at most `max_factor` times as many, at most max_replicas. Well hidden (share < target -
tolerance): the fewest replicas predicted to still meet it, at least 1/`max_factor` as many.
When E is about 0, H = G is a lower bound of what is hidden, so a scale-down is
conservative and goes on over several decisions. A scale-up is checked once settled: if
the exposed time fell by less than a third of what was predicted (prompts fewer than the
slots, or a long tail that more replicas cannot shorten), the added replicas go back and
the count before is a ceiling for RETRY_AFTER_STEPS steps.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

from specrl.config import AutoscaleConfig
from specrl.metrics import OrchestratorMetrics

log = logging.getLogger("specrl.orchestrator.autoscale")

RETRY_AFTER_STEPS = 20  # a ceiling found by a scale-up that did not pay lasts this long
# of the predicted cut in exposed time, for added replicas to stay: low, since windows of a
# few steps are noisy
MIN_GAIN = 1 / 3


@dataclass(frozen=True)
class Measured:
    """A step's times (or their mean over a window) at `replicas` replicas."""

    replicas: int
    step_s: float
    gen_s: float
    exposed_s: float

    @property
    def share(self) -> float:
        return self.exposed_s / self.step_s if self.step_s > 0 else 0.0

    def predict(self, replicas: int) -> float:
        """The exposed share predicted at `replicas` (module docstring)."""
        gen = self.gen_s * self.replicas / replicas
        exposed = max(0.0, gen - max(0.0, self.gen_s - self.exposed_s))
        step = self.step_s - self.exposed_s + exposed
        return exposed / step if step > 0 else 0.0


@dataclass(frozen=True)
class Decision:
    replicas: int  # to ask for (the same: hold)
    measured_share: float
    predicted_share: float  # at `replicas`
    reason: str


def mean(window: list[Measured]) -> Measured:
    k = len(window)
    return Measured(
        window[0].replicas,
        sum(m.step_s for m in window) / k,
        sum(m.gen_s for m in window) / k,
        sum(m.exposed_s for m in window) / k,
    )


class ExposureControl:
    """The control law (module docstring); `observe` a step at a time."""

    def __init__(self, cfg: AutoscaleConfig) -> None:
        self.cfg = cfg
        self._window: list[Measured] = []
        self._scaled_up_from: Measured | None = None  # the window before the last scale-up
        self._ceiling: int | None = None
        self._ceiling_steps = 0

    def observe(self, step: Measured, asked: int) -> Decision | None:
        """One step measured with `step.replicas` replicas in the run for the whole step,
        the workload asked to run `asked`: a decision once `window_steps` such steps are
        in, else None (not settled, or still measuring)."""
        if self._ceiling is not None:
            self._ceiling_steps += 1
            if self._ceiling_steps >= RETRY_AFTER_STEPS:
                self._ceiling = None
        if step.replicas != asked:  # replicas still joining or leaving
            self._window.clear()
            return None
        self._window.append(step)
        if len(self._window) < self.cfg.window_steps:
            return None
        m = mean(self._window)
        self._window.clear()
        decision = self._no_gain(m) or self._decide(m)
        if decision.replicas > m.replicas:
            self._scaled_up_from = m
        return decision

    def _no_gain(self, m: Measured) -> Decision | None:
        """The first window after a scale-up: did the exposed time fall as predicted? (The
        exposed time, what the law steers, not the generation span: with a lag the span
        can stay while more of it hides behind training.)"""
        before, self._scaled_up_from = self._scaled_up_from, None
        if before is None or m.replicas <= before.replicas:
            return None
        hidden = max(0.0, before.gen_s - before.exposed_s)
        predicted = before.exposed_s - max(0.0, before.gen_s * before.replicas / m.replicas - hidden)
        gained = before.exposed_s - m.exposed_s
        if predicted <= 0 or gained >= MIN_GAIN * predicted:
            return None
        self._ceiling, self._ceiling_steps = before.replicas, 0
        return Decision(
            before.replicas,
            m.share,
            before.share,
            f"{before.replicas}->{m.replicas} replicas cut the exposed time by {gained:.2f}s of "
            f"{predicted:.2f}s predicted: back to {before.replicas} (the ceiling for "
            f"{RETRY_AFTER_STEPS} steps)",
        )

    def _decide(self, m: Measured) -> Decision:
        cfg, r, share = self.cfg, m.replicas, m.share
        top = min(cfg.max_replicas, self._ceiling or cfg.max_replicas)
        if share > cfg.target_exposed_share + cfg.tolerance:
            if r >= top:
                why = "at max_replicas" if top == cfg.max_replicas else "at the ceiling"
                return Decision(r, share, share, f"exposed {share:.0%} over the target, {why} ({top})")
            upper = max(r + 1, min(top, math.floor(r * cfg.max_factor)))
            new = self._fewest(m, r + 1, upper)
            return Decision(new, share, m.predict(new), f"exposed {share:.0%} over the target")
        if share < cfg.target_exposed_share - cfg.tolerance:
            if r <= cfg.min_replicas:
                return Decision(r, share, share, f"exposed {share:.0%} under the target, at min_replicas")
            lower = max(cfg.min_replicas, math.ceil(r / cfg.max_factor))
            new = self._fewest(m, lower, r)
            if new < r:
                return Decision(new, share, m.predict(new), f"exposed {share:.0%} under the target")
            why = f"exposed {share:.0%} under the target, {r - 1} replicas predicted over it"
            return Decision(r, share, share, why)
        return Decision(r, share, share, f"exposed {share:.0%}: within the target's tolerance")

    def _fewest(self, m: Measured, lower: int, upper: int) -> int:
        """The fewest replicas in [lower, upper] predicted to meet the target; `upper`
        when none is."""
        target = self.cfg.target_exposed_share
        return next((n for n in range(lower, upper + 1) if m.predict(n) <= target), upper)


class Autoscaler:
    """The law driving a workload's scale (kube.WorkloadScale, or anything with get/set):
    the count asked for starts as the workload's own, clamped into [min, max]. A failed
    API call is logged and the run goes on at the replicas it has."""

    def __init__(self, cfg: AutoscaleConfig, scale, metrics: OrchestratorMetrics | None = None) -> None:
        self.cfg, self.scale, self.metrics = cfg, scale, metrics
        self.law = ExposureControl(cfg)
        self.asked: int | None = None

    def start(self) -> None:
        """Read the workload's replicas; clamp them into [min_replicas, max_replicas]."""
        current = self.scale.get()
        self.asked = current
        if self.metrics:
            self.metrics.target_replicas.set(current)
        clamped = min(max(current, self.cfg.min_replicas), self.cfg.max_replicas)
        if clamped != current:
            bounds = f"[{self.cfg.min_replicas}, {self.cfg.max_replicas}]"
            self._set(clamped, f"{current} replicas outside {bounds}")

    def on_step(self, record: dict, replicas: int, settled: bool) -> dict:
        """After a step run by `replicas` replicas, `settled` when all of them served its
        batch from the start (the loop knows which batches were published before the
        set changed): its part of the step record ('autoscale')."""
        t = record["time"]
        out: dict = {"replicas": replicas}
        if self.asked is None:
            try:
                self.start()
            except Exception as e:
                log.warning("autoscaler: cannot read %s: %s", self.scale, e)
                return out | {"asked": None, "error": str(e)}
        assert self.asked is not None
        step = Measured(replicas if settled else -1, t["step"], t["gen"], t["exposed_generation"])
        decision = self.law.observe(step, self.asked)
        if decision is not None:
            out |= {"measured_share": decision.measured_share, "predicted_share": decision.predicted_share}
            out["reason"] = decision.reason
            if decision.replicas != self.asked:
                try:
                    self._set(decision.replicas, decision.reason)
                except Exception as e:
                    log.warning("autoscaler: cannot scale %s: %s", self.scale, e)
                    out["error"] = str(e)
            if self.metrics:
                self.metrics.predicted_exposed_share.set(decision.predicted_share)
        return out | {"asked": self.asked}

    def _set(self, replicas: int, reason: str) -> None:
        self.scale.set(replicas)
        direction = "up" if self.asked is None or replicas > self.asked else "down"
        log.info("autoscaler: %s %s -> %d replicas: %s", self.scale, self.asked, replicas, reason)
        self.asked = replicas
        if self.metrics:
            self.metrics.target_replicas.set(replicas)
            self.metrics.autoscale_decisions.labels(direction=direction).inc()
