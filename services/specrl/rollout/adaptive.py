"""Adaptive speculation: the draft length k chosen per engine batch size from what the
engine measures while it serves, including k=0 (speculation off) where drafting costs
more than it saves.

Measured, not modelled: whether speculation pays depends on things no config knows, the
draft's current acceptance (it moves as the policy drifts and the draft is re-published),
the batch size (verification is nearly free at batch 1 and compute-bound at large
batches) and the hardware's per-step cost of drafting. Per range of batch sizes the
controller measures the engine's step cost at a few anchor ks, predicts the other ks
from per-position acceptance pooled over many requests, and keeps the best *measured* k;
close ks are measured again next to each other, since step costs drift within minutes.
Above that sits one decision for the whole engine, speculation or off: only k=0 at every
batch size pauses the drafter (vLLM's k=0 still runs it), so the controller probes the
paused engine now and then and keeps speculation only when it is clearly faster. Margins
make noise favour AR, and a draft whose acceptance cannot pay is turned off from
acceptance alone. The rules in detail and the measurements behind them: docs/draft.md.
"""

from __future__ import annotations

import bisect
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from specrl.config import AdaptiveSpeculationConfig
from specrl.rollout.engines.base import EngineStep

SPECULATING, PROBING, OFF = "speculating", "probing", "off"  # AdaptiveK.mode


def batch_ranges(max_batch: int) -> list[tuple[int, int]]:
    """Ranges of batch sizes that share one k: 1, 2, 3-4, 5-6, 7-8, 9-12, 13-16, ...
    (each about 1.5x the last), covering 1..max_batch."""
    lasts = sorted({2**n for n in range(32)} | {3 * 2**n for n in range(1, 32)})
    ranges, first = [], 1
    for last in lasts:
        ranges.append((first, min(last, max_batch)))
        if last >= max_batch:
            return ranges
        first = last + 1
    raise ValueError(f"batch size {max_batch} too large")


@dataclass
class _Range:
    first: int
    last: int
    k: int
    seconds: dict[int, deque[float]] = field(default_factory=dict)  # k -> step seconds
    measured: dict[int, int] = field(default_factory=dict)  # k -> `steps` at its last step
    batches: deque[int] = field(default_factory=lambda: deque(maxlen=64))
    steps: int = 0
    deep_mark: int = 0  # AdaptiveK.deep_drafts when this range's measurements were renewed
    paused: deque[float] = field(default_factory=deque)  # step seconds with speculation off
    paused_steps: int = 0  # paused steps seen in the current probe
    searched: bool = False  # its own search has begun (until then it follows its neighbours)
    verdict: int | None = None  # the best k its own measurements found (0: AR)

    @property
    def label(self) -> str:
        return str(self.first) if self.first == self.last else f"{self.first}-{self.last}"


class AdaptiveK:
    """Chooses k per batch range from observed engine steps. Plain and synchronous: the
    caller feeds `observe` and applies the schedule it returns when that changes."""

    def __init__(
        self,
        cfg: AdaptiveSpeculationConfig,
        max_k: int,
        max_batch: int,
        *,
        start: Sequence[tuple[int, int, int]] | None = None,
    ) -> None:
        """`start`: the schedule to begin with (each range takes the k of its first batch
        size there); None: `max_k` everywhere."""
        if max_k < 1:
            raise ValueError("adaptive speculation needs num_speculative_tokens >= 1")
        self.cfg = cfg
        self.max_k = max_k
        self.steps = 0
        self.max_batch = max_batch
        self.ranges = [
            _Range(a, b, _k_at(start, a, max_k), paused=deque(maxlen=cfg.window))
            for a, b in batch_ranges(max_batch)
        ]
        self._firsts = [r.first for r in self.ranges]
        self.deep_drafts = 0  # requests verified in steps at the largest k, all ranges
        self._reset_acceptance()
        self._settle = 0  # steps to ignore after a schedule change (drafts of the old k in flight)
        # a start with k=0 everywhere is off (the engine pauses the drafter)
        self.mode = OFF if all(r.k == 0 for r in self.ranges) else SPECULATING
        self._mode_steps = 0  # steps observed in this mode
        self._period = cfg.refresh_steps // 4  # speculating steps before the next probe
        self.probe_steps = 3 * cfg.min_samples
        self._off_periods = 1  # length of the next off period, in refresh periods
        self._after_off = False  # speculation measured afresh after an off period
        self._off_steps = cfg.refresh_steps  # length of the off period in force
        self._renew_steps = cfg.refresh_steps * cfg.renew_periods  # a range's, see _choose

    def _reset_acceptance(self) -> None:
        """Per draft position, the most recent steps' (requests, accepted) counts and
        their sums, emptied."""
        self._recent: list[deque[tuple[int, int]]] = [deque() for _ in range(self.max_k)]
        self._requests = [0] * self.max_k
        self._accepted = [0] * self.max_k

    def k_for(self, batch: int) -> int:
        """The draft length in force at `batch`."""
        return self.range_of(batch).k if self.mode == SPECULATING else 0

    def schedule(self) -> tuple[tuple[int, int, int], ...]:
        """The schedule in force: (first, last, k) ranges, neighbours with equal k merged;
        k=0 everywhere (the drafter paused) while probing or off."""
        if self.mode != SPECULATING:
            return ((1, self.max_batch, 0),)
        out: list[list[int]] = []
        for r in self.ranges:
            if out and out[-1][2] == r.k:
                out[-1][1] = r.last
            else:
                out.append([r.first, r.last, r.k])
        return tuple(tuple(e) for e in out)  # type: ignore[misc]

    def acceptance(self) -> list[float]:
        """Per position (1-based position i at index i-1), the probability that a request
        in a step drafting that far gets an accepted draft token there, over the last
        `acceptance_window` such requests."""
        return [a / n if n > 0 else 0.0 for a, n in zip(self._accepted, self._requests)]

    def range_of(self, batch: int) -> _Range:
        return self.ranges[min(bisect.bisect_right(self._firsts, batch) - 1, len(self.ranges) - 1)]

    def observe(self, step: EngineStep) -> bool:
        """Record one decode step; True when the schedule changed (apply `schedule()`)."""
        if step.batch < 1 or step.seconds <= 0:
            return False
        self.steps += 1
        if self._settle > 0:
            self._settle -= 1
            return False
        self._mode_steps += 1
        r = self.range_of(step.batch)
        if self.mode != SPECULATING:
            return self._observe_paused(step, r)
        changed = self._observe_speculating(step, r)
        if (bound := self.tokens_bound()) is not None and bound < self.cfg.ar_margin:
            for x in self.ranges:  # no k can pay at any batch size (tokens_bound)
                x.k = 0
            changed = True
        if changed and all(x.k == 0 for x in self.ranges):
            self._go_off()  # the engine pauses the drafter: measure it as paused
        elif self._mode_steps >= self._period:
            self._enter(PROBING)
        else:
            return changed
        return True

    def _enter(self, mode: str) -> None:
        self.mode, self._mode_steps, self._settle = mode, 0, 2
        for r in self.ranges:
            r.paused_steps = 0

    def _go_off(self) -> None:
        """Speculation lost: off for the current number of periods, and twice that (up to
        `off_backoff_max`) should it lose again when measured afresh."""
        self._enter(OFF)
        self._off_steps = self.cfg.refresh_steps * self._off_periods
        self._off_periods = min(2 * self._off_periods, self.cfg.off_backoff_max)

    def _observe_paused(self, step: EngineStep, r: _Range) -> bool:
        if any(step.drafted):
            return False  # verifies drafts proposed before the pause
        r.paused.append(step.seconds)
        r.batches.append(step.batch)
        r.paused_steps += 1
        if self.mode == PROBING and self._mode_steps >= self.probe_steps:
            return self._decide()
        if self.mode == OFF and self._mode_steps >= self._off_steps:
            for x in self.ranges:  # speculation is measured afresh (draft and load moved),
                x.k, x.seconds, x.measured, x.steps = 1, {}, {}, 0  # from its cheap end
                x.deep_mark, x.searched, x.verdict = self.deep_drafts, False, None
            self._after_off = True
            self._reset_acceptance()
            self._enter(SPECULATING)
            self._period = self.cfg.refresh_steps // 4
            return True
        return False

    def _decide(self) -> bool:
        """End of a probe: the traffic's time under the speculative schedule against its
        time paused, over the ranges the probe saw enough of; speculation stays only when
        it is `keep_margin` faster. True when the schedule changes (back to speculation)."""
        spec_s = off_s = 0.0
        for r in self.ranges:
            off = self.off_rate(r)
            costs = self.costs(r)
            rates = self.rates(r, costs)
            # each range is credited with the best k it has measured, where its search is
            # going: a probe comes on a timer and can fall while a range measures an anchor
            # (the largest k of a weak draft, or one it has too few steps of)
            spec = max((rates[k] for k in costs), default=None)
            if r.paused_steps < self.cfg.min_samples // 2 or off is None or spec is None:
                continue
            tokens = r.paused_steps * statistics.fmean(r.batches)
            spec_s += tokens / spec
            off_s += tokens / off
        if off_s >= spec_s * self.cfg.keep_margin:
            self._enter(SPECULATING)
            self._period = self.cfg.refresh_steps
            self._off_periods = 1
            self._after_off = False
            return True
        self._go_off()
        return False

    def speedup(self, r: _Range) -> float | None:
        """Range `r`'s estimated generation speedup from speculation: its rate at the k in
        force over its rate without speculation (the paused engine's when measured, else
        vLLM's k=0); 1.0 while it runs without drafts; None before both are measured. The
        net gain users ask for (a draft that stopped paying shows here before anywhere)."""
        k = self.k_for(r.first)
        if k == 0:
            return 1.0
        rates = self.rates(r, self.costs(r))
        base = self.off_rate(r) or rates.get(0)
        return rates[k] / base if base and k in rates else None

    def off_rate(self, r: _Range) -> float | None:
        """Tokens/s of range `r` with speculation off everywhere (the drafter paused)."""
        if len(r.paused) < 2:
            return None
        return statistics.fmean(r.batches) / statistics.median(r.paused)

    def _observe_speculating(self, step: EngineStep, r: _Range) -> bool:
        if len(step.drafted) > r.k and any(step.drafted[r.k :]):
            return False  # verifies drafts of a larger k scheduled before a change
        self._learn_acceptance(step, r.k)
        r.seconds.setdefault(r.k, deque(maxlen=self.cfg.window)).append(step.seconds)
        r.batches.append(step.batch)
        r.steps += 1
        r.measured[r.k] = r.steps
        if r.k == self.max_k:
            self.deep_drafts += step.batch
        if r.steps % self._renew_steps == 0:
            r.seconds = {r.k: r.seconds[r.k]}  # renew: the anchors are measured again
            r.deep_mark = self.deep_drafts
        if r.steps % self.cfg.min_samples or len(r.seconds[r.k]) < self.cfg.min_samples:
            return False
        r.searched = True
        verdict = r.verdict
        chosen = self._choose(r)
        followed = r.verdict != verdict and self._follow_neighbours()
        if chosen == r.k and not followed:
            return False
        r.k = chosen
        self._settle = 2
        return True

    def _follow_neighbours(self) -> bool:
        """Ranges whose own search has not begun take the verdict of the nearest range
        that has one (the smaller k at equal distance): a batch size never measured
        starts from what was measured nearest to it, off where speculation lost
        everywhere it was measured, not from the largest k. True when a k changed."""
        judged = [(i, x.verdict) for i, x in enumerate(self.ranges) if x.verdict is not None]
        changed = False
        for i, x in enumerate(self.ranges):
            if x.searched or not judged:
                continue
            k = min(judged, key=lambda jv: (abs(jv[0] - i), jv[1]))[1]
            changed |= x.k != k
            x.k = k
        return changed

    def _learn_acceptance(self, step: EngineStep, k: int) -> None:
        """Count, per position up to the k in force, the step's requests and the drafts
        accepted there. Per request, not per proposed draft: a drafter that proposes fewer
        than k tokens for some requests (n-gram finds no match) gains less, and that is
        what the rate must reflect."""
        window = self.cfg.acceptance_window
        for i in range(k):
            a = step.accepted[i] if i < len(step.accepted) else 0
            recent = self._recent[i]
            recent.append((step.batch, a))
            self._requests[i] += step.batch
            self._accepted[i] += a
            while self._requests[i] - recent[0][0] >= window:
                old_n, old_a = recent.popleft()
                self._requests[i] -= old_n
                self._accepted[i] -= old_a

    def tokens_per_step(self, k: int) -> float:
        """Expected tokens a request gains in one step at draft length k: one sampled or
        bonus token plus the accepted drafts."""
        return 1 + sum(self.acceptance()[:k])

    def tokens_bound(self) -> float | None:
        """An upper confidence bound (z = 3) on the tokens a request gains per step at the
        largest k, from the drafts verified so far; None before `cheap_drafts` at the
        first position. A step at any k > 0 costs at least what the paused engine's step
        costs (the same forward over more tokens, plus the drafter), so below `ar_margin`
        no k beats AR by the margin at any batch size, on any machine: a never-accepted
        draft is turned off from acceptance alone, without step costs that noise can
        rank wrong. Positions not yet measured are bounded by the one before (acceptance
        never rises with the position)."""
        if self._requests[0] < self.cfg.cheap_drafts:
            return None
        total, cap = 1.0, 1.0
        for n, a in zip(self._requests, self._accepted):
            if n:
                cap = min(cap, _upper_bound(a, n))
            total += cap
        return total

    def costs(self, r: _Range) -> dict[int, float]:
        """Median step seconds of each k measured enough in range `r`, made non-decreasing
        in k. A step at k+1 does a step's work at k and more (one more draft position, one
        more token per request verified; vLLM's k=0 still runs the drafter's first pass),
        so a k measured cheaper than a smaller one is noise: ks are measured minutes apart
        on machines whose speed moves 10% and more, and taken at face value such a reading
        makes a never-accepted draft look faster than AR (docs/draft.md, issue 36)."""
        medians = sorted(
            (k, statistics.median(v)) for k, v in r.seconds.items() if len(v) >= self.cfg.min_samples
        )
        return dict(zip((k for k, _ in medians), _non_decreasing([c for _, c in medians])))

    def rates(self, r: _Range, costs: dict[int, float]) -> dict[int, float]:
        """Tokens/s of every k in range `r`: tokens per step from the acceptance measured
        at each draft position (pooled over all steps: far less noisy than one range's
        token counts), over the step cost measured at k, or interpolated between the
        speculative ks measured."""
        spec_costs = sorted((k, c) for k, c in costs.items() if k >= 1)
        batch = statistics.fmean(r.batches) if r.batches else 1.0
        out: dict[int, float] = {}
        for k in range(self.max_k + 1):
            cost = costs.get(k) or (_interpolate(spec_costs, k) if k and spec_costs else None)
            if cost:
                out[k] = batch * self.tokens_per_step(k) / cost
        return out

    def _cheap_verdict(self, r: _Range, costs: dict[int, float]) -> int | None:
        """After an off period, speculation is measured afresh from its cheap end: k=1 and
        k=2 first, which bound what any k could make (`rate_bound`). A draft that cannot
        beat the paused engine by `ar_margin` even so goes back off without running the
        largest k, and the ranges not seen since the off period with it. The k to measure
        or 0; None when the bound leaves room (the full search goes on)."""
        off = self.off_rate(r)
        if self.max_k < 3 or off is None:
            return None  # nothing to bound (k <= 2 is the whole search) or to beat
        for anchor in (1, 2):
            if anchor not in costs:
                return anchor
        if self._requests[1] < self.cfg.cheap_drafts:
            return r.k  # acceptance at the second position still too uncertain
        if self.rate_bound(r, costs) >= off * self.cfg.ar_margin:
            return None
        r.verdict = 0  # and the ranges not searched since the off period follow it
        return 0

    def rate_bound(self, r: _Range, costs: dict[int, float]) -> float:
        """The most any k could make in range `r`, from the step costs of k=1 and k=2 and
        the acceptance at the first two positions: acceptance never rises with the
        position (a later draft token counts only when the earlier ones were accepted),
        so no later position accepts more than the second, and each costs what the second
        added (linear in k; step costs measured here grow about so)."""
        a1, a2 = self.acceptance()[:2]
        slope = max(costs[2] - costs[1], 0.0)
        batch = statistics.fmean(r.batches)
        best = batch * (1 + a1) / costs[1]
        for k in range(2, self.max_k + 1):
            best = max(best, batch * (1 + a1 + (k - 1) * a2) / (costs[2] + (k - 2) * slope))
        return best

    def _choose(self, r: _Range) -> int:
        costs = self.costs(r)
        if self._after_off and (cheap := self._cheap_verdict(r, costs)) is not None:
            return cheap
        learning = r.steps % self._renew_steps < self.cfg.refresh_steps // 8
        fresh_deep = self.deep_drafts - r.deep_mark
        if r.k == self.max_k and fresh_deep < self.cfg.deep_drafts and learning:
            # acceptance at the deepest position still too uncertain (bounded: a drafter
            # that rarely proposes the full k, like n-gram, moves on after a while). It is
            # pooled over ranges, so drafts verified there by any range since this one's
            # measurements were renewed count: a rarely visited range (batch 2 in the
            # tails of a batch-4 run) no longer holds the largest k until it has verified
            # deep_drafts itself
            return r.k
        for anchor in dict.fromkeys((self.max_k, 0, 1)):
            if anchor not in costs:
                return anchor
        rates = self.rates(r, costs)
        # from AR back to speculation takes min_gain more: no flapping at the margin (and a
        # drafter paused at k=0 everywhere recomputes what is in flight when it resumes)
        bar = rates[0] * self.cfg.ar_margin * (self.cfg.min_gain if r.k == 0 else 1.0)
        worth = {k: rate for k, rate in rates.items() if k and rate >= bar}
        measured = [k for k in worth if k in costs]
        r.verdict = max(measured, key=worth.__getitem__) if measured else 0
        if not worth:
            # no k beats AR by the margin: a wash goes to AR
            return self._recheck(r, costs, rates) if r.k == 0 else 0
        best = max(worth, key=worth.__getitem__)
        if best not in costs:
            return best  # predicted best: measure it
        if r.k in worth and r.k in costs and worth[best] <= worth[r.k] * self.cfg.min_gain:
            return self._recheck(r, costs, rates)
        return best

    def _recheck(self, r: _Range, costs: dict[int, float], rates: dict[int, float]) -> int:
        """The k in force stays, or its runner-up is measured again (see the module
        docstring): the measured k rated next, when within `recheck_margin` and measured
        `recheck_steps` ago. Its old steps are dropped, so it is judged on fresh ones."""
        others = [k for k in costs if k != r.k]
        if not others:
            return r.k
        runner = max(others, key=rates.__getitem__)
        stale = r.steps - r.measured.get(runner, 0) >= self.cfg.recheck_steps
        if not stale or rates[runner] * self.cfg.recheck_margin < rates[r.k]:
            return r.k
        del r.seconds[runner]
        return runner


def _k_at(schedule: Sequence[tuple[int, int, int]] | None, batch: int, default: int) -> int:
    for first, last, k in schedule or ():
        if first <= batch <= last:
            return k
    return default


def _non_decreasing(values: Sequence[float]) -> list[float]:
    """The non-decreasing sequence nearest `values` in least squares (pool adjacent
    violators: a run that falls is replaced by its mean)."""
    blocks: list[list[float]] = []  # [mean, count]
    for v in values:
        blocks.append([v, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m1, n1), (m2, n2) = blocks.pop(-2), blocks.pop()
            blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
    return [m for m, n in blocks for _ in range(int(n))]


def _upper_bound(successes: int, trials: int, z: float = 3.0) -> float:
    """Wilson score upper bound of a success probability."""
    p, z2 = successes / trials, z * z
    centre = p + z2 / (2 * trials)
    spread = z * (p * (1 - p) / trials + z2 / (4 * trials * trials)) ** 0.5
    return min(1.0, (centre + spread) / (1 + z2 / trials))


def _interpolate(points: Sequence[tuple[int, float]], k: int) -> float:
    """Piecewise-linear cost at k through measured (k, seconds) points, extended by the
    slope of the two nearest points outside them (flat with one point)."""
    if len(points) == 1:
        return points[0][1]
    ks = [p[0] for p in points]
    i = min(max(bisect.bisect_left(ks, k), 1), len(points) - 1)
    (k0, c0), (k1, c1) = points[i - 1], points[i]
    return max(c0 + (c1 - c0) * (k - k0) / (k1 - k0), 1e-9)
