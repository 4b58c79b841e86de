"""The adaptive draft-length controller against simulated engines whose true best k is
known: it must find it (or a k within its gain margin), turn speculation off where it
costs time, follow acceptance when the draft degrades, and lose little to exploration.

The engine here is a simulation (a cost model and Bernoulli acceptance), which is the
point: the true optimum is computable. The controller in a real vLLM engine is tested in
tests/integration/test_rollout_server.py."""

from __future__ import annotations

import random
import statistics

import pytest

from specrl.config import AdaptiveSpeculationConfig, RolloutServerConfig
from specrl.rollout.adaptive import OFF, PROBING, SPECULATING, AdaptiveK, batch_ranges
from specrl.rollout.engines.base import EngineStep

CFG = AdaptiveSpeculationConfig(enabled=True)


class SimEngine:
    """Step seconds = base(b) + (draft_fixed + per_pos * k) * (1 + b / knee) for k > 0,
    base(b) + k0_overhead at vLLM's k=0 (the drafter still running), base(b) with the
    drafter paused (k=0 at every batch size); each drafted position accepted with
    probability `alpha` while the previous was."""

    def __init__(
        self, *, alpha: float, base=0.010, draft_fixed=0.004, per_pos=0.002, knee=1e9, noise=0.05, seed=0,
        k0_overhead=0.0,
    ) -> None:  # fmt: skip
        self.alpha, self.base, self.draft_fixed, self.per_pos = alpha, base, draft_fixed, per_pos
        self.knee, self.noise, self.k0_overhead = knee, noise, k0_overhead
        self.rng = random.Random(seed)

    def cost(self, k: int, batch: int, paused: bool = False) -> float:
        spec = (self.draft_fixed + self.per_pos * k) * (1 + batch / self.knee) if k else 0.0
        return self.base * (1 + batch / 32) + spec + (0.0 if k or paused else self.k0_overhead)

    def expected_rate(self, k: int, batch: int, paused: bool = False) -> float:
        tokens = 1 + sum(self.alpha**i for i in range(1, k + 1))
        return batch * tokens / self.cost(k, batch, paused)

    def best_k(self, max_k: int, batch: int) -> int:
        return max(range(max_k + 1), key=lambda k: self.expected_rate(k, batch))

    def step(self, k: int, batch: int, paused: bool = False) -> tuple[EngineStep, int]:
        """One step at draft length k: what the engine reports, and the tokens it made."""
        drafted, accepted, tokens = [0] * k, [0] * k, 0
        for _ in range(batch):
            n = 0
            while n < k and self.rng.random() < self.alpha:
                n += 1
            for i in range(k):
                drafted[i] += 1
                accepted[i] += i < n
            tokens += n + 1
        seconds = self.cost(k, batch, paused) * (1 + self.noise * self.rng.uniform(-1, 1))
        return EngineStep(
            batch=batch, seconds=seconds, drafted=tuple(drafted), accepted=tuple(accepted)
        ), tokens


def paused(ctl: AdaptiveK) -> bool:
    """The engine's rule (VllmEngine.set_k_schedule): the drafter pauses at k=0 everywhere."""
    return all(k == 0 for _, _, k in ctl.schedule())


def run(ctl: AdaptiveK, engine: SimEngine, batch: int, steps: int) -> tuple[float, int]:
    """Drive `steps` decode steps at `batch`; returns (seconds, tokens)."""
    seconds, tokens = 0.0, 0
    for _ in range(steps):
        s, made = engine.step(ctl.k_for(batch), batch, paused(ctl))
        ctl.observe(s)
        seconds += s.seconds
        tokens += made
    return seconds, tokens


def serve(ctl: AdaptiveK, engine: SimEngine, steps: int) -> tuple[float, int, int]:
    """Drive `steps` steps at batch 1, the drafter paused as the engine would; returns
    (tokens per second, steps served paused, drafter resumes)."""
    seconds, tokens, off, resumes = 0.0, 0, 0, 0
    for _ in range(steps):
        s, made = engine.step(ctl.k_for(1), 1, was_paused := paused(ctl))
        off += was_paused
        ctl.observe(s)
        resumes += was_paused and not paused(ctl)
        seconds += s.seconds
        tokens += made
    return tokens / seconds, off, resumes


def test_batch_ranges_cover_every_batch_size_once():
    for max_batch in (1, 2, 5, 64, 100, 256):
        ranges = batch_ranges(max_batch)
        covered = [b for first, last in ranges for b in range(first, last + 1)]
        assert covered == list(range(1, max_batch + 1))
    assert batch_ranges(16)[:6] == [(1, 1), (2, 2), (3, 4), (5, 6), (7, 8), (9, 12)]


@pytest.mark.parametrize("alpha", [0.7, 0.8, 0.95])
def test_finds_the_best_k_when_speculation_pays(alpha):
    engine, ctl = SimEngine(alpha=alpha), AdaptiveK(CFG, 7, 128)
    run(ctl, engine, 1, 600)
    chosen, best = ctl.range_of(1).k, engine.best_k(7, 1)
    assert chosen > 0
    # the choice is the optimum or within the controller's gain margin of it
    assert engine.expected_rate(chosen, 1) >= engine.expected_rate(best, 1) / CFG.min_gain**2


def test_a_gain_below_the_ar_margin_goes_to_ar():
    """alpha 0.55: the best k is ~6% faster than AR in truth, not clearly enough."""
    engine, ctl = SimEngine(alpha=0.55), AdaptiveK(CFG, 7, 128)
    assert 1.0 < engine.expected_rate(engine.best_k(7, 1), 1) / engine.expected_rate(0, 1) < CFG.ar_margin
    run(ctl, engine, 1, 600)
    assert ctl.k_for(1) == 0


def test_turns_speculation_off_where_it_costs_time():
    engine, ctl = SimEngine(alpha=0.15), AdaptiveK(CFG, 5, 128)
    assert engine.best_k(5, 1) == 0
    run(ctl, engine, 1, 400)
    assert ctl.k_for(1) == 0
    assert ctl.schedule() == ((1, 128, 0),)  # off everywhere: the drafter is paused


def test_a_draft_that_only_beats_vllms_k0_is_turned_off_globally():
    """k=1 beats vLLM's k=0 (drafter running) but not the paused engine: a per-range
    choice would speculate forever at ~0.96x AR; the probe's global comparison pauses the
    drafter, held for whole refresh periods (the drafter resumes once per period)."""
    engine = SimEngine(alpha=0.3, draft_fixed=0.002, per_pos=0.0015, k0_overhead=0.003)
    ar = engine.expected_rate(0, 1, paused=True)
    assert engine.expected_rate(1, 1) < ar
    assert engine.expected_rate(1, 1) > engine.expected_rate(0, 1) * CFG.ar_margin  # beats vLLM's k=0
    steps = 5 * CFG.refresh_steps
    rate, off, resumes = serve(AdaptiveK(CFG, 3, 128), engine, steps)
    assert off / steps > 0.6
    assert resumes <= 5  # one per refresh period at most
    assert rate >= 0.95 * ar


def test_a_draft_that_keeps_losing_is_measured_afresh_ever_more_rarely():
    """Every re-measurement of a draft that never pays drafts for a while (at k <= 2, see
    below) and resumes the drafter (a recompute of what is in flight); doubling the off
    period after each loss makes both ever rarer, where a fixed period pays them every
    period."""
    engine = SimEngine(alpha=0.15, draft_fixed=0.006, per_pos=0.003)
    ar = engine.expected_rate(0, 1, paused=True)
    assert engine.expected_rate(3, 1) < 0.55 * ar
    steps = 24 * CFG.refresh_steps
    backoff = serve(AdaptiveK(CFG, 3, 128), engine, steps)
    fixed = serve(AdaptiveK(CFG.model_copy(update={"off_backoff_max": 1}), 3, 128), engine, steps)
    assert backoff[2] <= 6 < fixed[2]  # off for 1, 2, 4, 8 periods: 4 resumes (18 without)
    assert backoff[0] >= 0.97 * ar
    assert backoff[0] > fixed[0]


def test_speculation_at_the_ar_margin_does_not_flap():
    """A draft whose best k is right at the AR margin: going back from AR to speculation
    takes `min_gain` more, so the schedule changes a few times per refresh period (the
    re-measured anchors), not at every noisy decision."""
    changes = []
    for seed in range(6):
        engine = SimEngine(alpha=0.35, base=0.0105, draft_fixed=0.0012, per_pos=0.0012, seed=seed)
        ctl = AdaptiveK(CFG, 3, 128)
        n = 0
        for _ in range(5 * CFG.refresh_steps):
            step, _ = engine.step(ctl.range_of(1).k, 1)
            n += ctl.observe(step)
        changes.append(n)
    assert sum(changes) / len(changes) <= 4 * 5, changes


class SlowSpellEngine(SimEngine):
    """Every step `slowdown` times slower for the first `spell` steps (an engine warming
    up, a busy neighbour on the node), then as SimEngine."""

    def __init__(self, *, spell: int, slowdown: float, **params) -> None:
        super().__init__(**params)
        self.spell, self.slowdown, self.n = spell, slowdown, 0

    def step(self, k: int, batch: int, paused: bool = False) -> tuple[EngineStep, int]:
        step, tokens = super().step(k, batch, paused)
        self.n += 1
        if self.n <= self.spell:
            step = EngineStep(step.batch, step.seconds * self.slowdown, step.drafted, step.accepted)
        return step, tokens


def test_a_k_chosen_on_a_slow_spell_is_measured_again_next_to_its_runner_up():
    """The generic head at batch 64 (CI's failure, 2026-11-26): k=1 makes 0.91x vLLM's k=0,
    but the first 20 steps, where k=3 and k=0 are measured, run 30% slow, so k=1 looks
    1.18x k=0 and is chosen. Without a recheck it holds until the anchors are renewed;
    the runner-up measured again next to it puts the range back at k=0."""
    cfg = CFG.model_copy(update={"refresh_steps": 10**5})  # the per-range choice alone
    costs = dict(alpha=0.25, draft_fixed=0.012, per_pos=0.0047, k0_overhead=0.004)
    assert SimEngine(**costs).best_k(3, 64) == 0
    at_k0 = {}
    for recheck in (cfg.recheck_steps, 10**9):
        ctl = AdaptiveK(cfg.model_copy(update={"recheck_steps": recheck}), 3, 64)
        engine, ks = SlowSpellEngine(seed=3, spell=20, slowdown=1.3, **costs), []
        for _ in range(2000):
            run(ctl, engine, 64, 1)
            ks.append(ctl.k_for(64))
        assert 1 in ks[:100]  # the slow spell misled the first choice
        at_k0[recheck] = ks[1000:].count(0) / 1000
    assert at_k0[cfg.recheck_steps] > 0.95 and at_k0[10**9] == 0, at_k0


def test_each_batch_range_gets_its_own_k():
    """Verification cost growing with the batch (compute-bound at large batches): long
    drafts at batch 1, none at batch 96."""
    engine, ctl = SimEngine(alpha=0.8, knee=8), AdaptiveK(CFG, 7, 128)
    assert engine.best_k(7, 1) >= 3 and engine.best_k(7, 96) == 0
    for _ in range(10):
        run(ctl, engine, 1, 60)
        run(ctl, engine, 96, 60)
    assert ctl.range_of(1).k >= 2
    assert ctl.range_of(96).k == 0
    ranges = {(a, b): k for a, b, k in ctl.schedule()}
    assert sum(b - a + 1 for a, b in ranges) == 128  # the schedule still covers 1..128


def test_exploration_costs_little_against_the_best_fixed_k():
    """Over a realistic serving stretch, the adaptive run's throughput is within a few
    percent of the best fixed k chosen with hindsight, and far above the worst."""
    steps = 3000
    engine = SimEngine(alpha=0.8, seed=1)
    seconds, tokens = run(AdaptiveK(CFG, 7, 128), engine, 4, steps)
    adaptive = tokens / seconds
    best = max(engine.expected_rate(k, 4) for k in range(8))
    worst = min(engine.expected_rate(k, 4) for k in range(8))
    assert adaptive >= 0.95 * best
    assert adaptive > worst * 1.3


def test_follows_a_draft_that_stops_matching_the_policy():
    """Acceptance collapses (a stale draft): speculation goes off within a refresh period
    or two; when the draft recovers, it comes back within a few (speculation is measured
    afresh at the end of each off period)."""
    cfg = AdaptiveSpeculationConfig(enabled=True, refresh_steps=300)
    ctl = AdaptiveK(cfg, 3, 128)

    def speculating(engine: SimEngine, steps: int) -> list[bool]:
        out = []
        for _ in range(steps):
            ctl.observe(engine.step(ctl.k_for(1), 1, paused(ctl))[0])
            out.append(ctl.k_for(1) > 0)
        return out

    assert sum(speculating(SimEngine(alpha=0.9), 300)[100:]) / 200 > 0.8
    assert sum(speculating(SimEngine(alpha=0.05, seed=2), 900)[600:]) / 300 < 0.3
    assert sum(speculating(SimEngine(alpha=0.9, seed=3), 1200)[600:]) / 600 > 0.8


def test_starts_from_the_configured_schedule_and_ignores_steps_of_an_older_k():
    ctl = AdaptiveK(CFG, 5, 16, start=[(1, 4, 2), (5, 16, 0)])
    assert ctl.schedule() == ((1, 4, 2), (5, 16, 0))
    assert AdaptiveK(CFG, 5, 16, start=[(1, 16, 0)]).mode == OFF  # k=0 everywhere: starts off
    # a step at batch 1 verifying 5 drafted positions belongs to a k it no longer runs
    stale = EngineStep(batch=1, seconds=0.01, drafted=(1, 1, 1, 1, 1), accepted=(1, 1, 0, 0, 0))
    for _ in range(50):
        ctl.observe(stale)
    assert not ctl.range_of(1).seconds and ctl.acceptance() == [0.0] * 5


def test_a_drafter_that_proposes_less_than_k_is_credited_per_request():
    """n-gram finds no match for some requests: acceptance counts per request in the
    step, so the expected gain of a step is what the step actually yielded."""
    ctl = AdaptiveK(CFG, 3, 16)
    # 4 requests; only 2 drafted (3 tokens each), both accepted at position 1, one at 2
    step = EngineStep(batch=4, seconds=0.01, drafted=(2, 2, 2), accepted=(2, 1, 0))
    for _ in range(10):
        ctl.observe(step)
    assert ctl.acceptance() == [0.5, 0.25, 0.0]
    assert ctl.tokens_per_step(3) == pytest.approx(1.75)


def test_config_errors():
    with pytest.raises(ValueError, match="adaptive needs a speculation method"):
        RolloutServerConfig.model_validate({"speculation": {"adaptive": {"enabled": True}}})
    with pytest.raises(ValueError, match="window must be >= min_samples"):
        AdaptiveSpeculationConfig(enabled=True, min_samples=16, window=8)
    with pytest.raises(ValueError, match="min_gain"):
        AdaptiveSpeculationConfig(min_gain=0.9)
    with pytest.raises(ValueError, match="keep_margin must be <= ar_margin"):
        AdaptiveSpeculationConfig(keep_margin=1.2, ar_margin=1.1)


def test_k0_everywhere_stops_the_engine_cores_per_step_draft_fetch():
    """engines/vllm/control.py's set_k_schedule on the engine core's attributes, with vLLM's own lookup
    builder. The engine core is a stand-in object here (a real one needs a whole engine);
    on real engines test_rollout_server.py's schedule tests show drafting resuming after
    k=0 everywhere, which needs the fetch back on."""
    from types import SimpleNamespace

    from specrl.rollout.engines.vllm.control import set_k_schedule

    scheduler = SimpleNamespace(
        dynamic_sd_lookup=[3] * 9, scheduler_config=SimpleNamespace(max_num_seqs=8), num_spec_tokens=3
    )
    core = SimpleNamespace(scheduler=scheduler, use_spec_decode=True, check_for_draft_tokens=True)
    set_k_schedule(core, [[1, 8, 0]])
    assert scheduler.dynamic_sd_lookup[1:] == [0] * 8 and not core.check_for_draft_tokens
    set_k_schedule(core, [[1, 4, 0], [5, 8, 2]])
    assert scheduler.dynamic_sd_lookup[1:] == [0] * 4 + [2] * 4 and core.check_for_draft_tokens


def test_a_losing_draft_is_measured_afresh_from_its_cheap_end():
    """After an off period speculation is measured at k=1 and k=2 first: acceptance never
    rises with the draft position, so they bound every k, and a draft that cannot beat the
    paused engine even so goes back off without drafting deeper (the full search would
    run k=7 first, at ~0.4x AR here). Serving it costs about nothing after the first off
    decision."""
    engine = SimEngine(alpha=0.15, draft_fixed=0.006, per_pos=0.003)
    ar = engine.expected_rate(0, 1, paused=True)
    assert engine.expected_rate(7, 1) < 0.45 * ar
    ctl = AdaptiveK(CFG, 7, 128)
    deepest, drafting, seconds, tokens = 0, 0, 0.0, 0
    seen_off = False
    for _ in range(24 * CFG.refresh_steps):
        k = ctl.k_for(1)
        step, made = engine.step(k, 1, paused(ctl))
        ctl.observe(step)
        if seen_off:
            deepest, drafting = max(deepest, k), drafting + (k > 0)
            seconds, tokens = seconds + step.seconds, tokens + made
        seen_off |= ctl.mode == OFF
    assert seen_off and deepest == 2
    # each of the 4 re-measurements (off 1, 2, 4, 8 periods, then the last one's
    # rest) drafts a few dozen steps: anchors and the second position's acceptance
    assert drafting <= 4 * (2 * CFG.min_samples + CFG.cheap_drafts + 2 * CFG.min_samples)
    assert tokens / seconds >= 0.99 * ar


def test_a_probe_during_an_anchor_measurement_credits_the_range_with_its_best_measured_k():
    """The probe comes on a timer, so it can fall while a range measures an anchor it has
    too few steps of (seen on a real engine: k=3 measured, then k=0 for two steps, then
    the probe). The range is credited with the best k it has measured; it used to be left
    out, and with no range left the decision defaulted to speculation."""
    cfg = CFG.model_copy(update={"refresh_steps": 40})  # first probe after 10 steps
    engine = SimEngine(alpha=0.15, draft_fixed=0.006, per_pos=0.003)
    assert engine.expected_rate(3, 1) < 0.6 * engine.expected_rate(0, 1, paused=True)
    ctl = AdaptiveK(cfg, 3, 128)
    modes = []
    while len(modes) < 2:
        ctl.observe(engine.step(ctl.k_for(1), 1, paused(ctl))[0])
        if not modes or modes[-1] != ctl.mode:
            modes.append(ctl.mode)
    run(ctl, engine, 1, 3 * CFG.min_samples + 2)
    assert modes == ["speculating", "probing"] and ctl.mode == OFF


def test_a_draft_just_above_the_ar_margin_is_not_turned_off_by_noisy_probes():
    """Speculation ~11% faster than the paused engine: a probe that reads it below the 10%
    needed to turn it on must not turn it off (the adapted generic head on the RL-Think
    policy, 1.11-1.16x AR at k=3, was off a quarter of a bench draft run that way).
    Keeping it takes `keep_margin` (5%); with the full margin it is off ~a fifth of the
    time and slower (over a third with the 256-draft acceptance window used before)."""
    params = dict(alpha=0.45, draft_fixed=0.003, per_pos=0.001, k0_overhead=0.003)
    ar = SimEngine(**params).expected_rate(0, 1, paused=True)
    assert 1.10 < max(SimEngine(**params).expected_rate(k, 1) for k in (1, 2, 3)) / ar < 1.12
    steps, got = 12 * CFG.refresh_steps, {}
    for keep in (CFG.keep_margin, CFG.ar_margin):
        cfg = CFG.model_copy(update={"keep_margin": keep})
        runs = [serve(AdaptiveK(cfg, 3, 128), SimEngine(**params, seed=seed), steps) for seed in range(4)]
        got[keep] = (sum(r[1] for r in runs) / (4 * steps), sum(r[0] for r in runs) / (4 * ar))
    (off, rate), (off_full, rate_full) = got[CFG.keep_margin], got[CFG.ar_margin]
    assert off < 0.1 < 0.15 < off_full, got
    assert rate > 1.09 and rate > rate_full, got


def test_a_rarely_visited_range_uses_the_deep_acceptance_other_ranges_measured():
    """Acceptance per position is pooled over ranges, so a range seen one step in ten
    (batch 2 in the tails of a batch-4 run) leaves the largest k after its own
    `min_samples` steps there, not after verifying a quarter window of deep drafts
    itself (32 steps at batch 2: minutes of tails at the worst k of a weak draft)."""
    engine, ctl = SimEngine(alpha=0.5, seed=3), AdaptiveK(CFG, 7, 64)
    at_max = 0
    for i in range(240):  # before the first probe
        batch = 2 if i % 10 == 0 else 4
        at_max += batch == 2 and ctl.k_for(2) == 7
        s, _ = engine.step(ctl.k_for(batch), batch, paused(ctl))
        ctl.observe(s)
    assert ctl.range_of(2).k < 7
    assert at_max <= CFG.min_samples + 2  # + the steps ignored after a schedule change


def test_a_range_renews_its_anchors_every_renew_periods_probe_periods():
    """Re-measuring the anchors a range does not run (the largest k, vLLM's k=0 with the
    drafter running, k=1) costs time: for a medium draft the largest k runs well below its
    best k for a quarter acceptance window. Acceptance is tracked all along and the ks a
    range runs are re-measured as it runs them, so anchors are renewed every
    `renew_periods` refresh periods of the range's steps, while probes keep their period."""

    def anchors_and_probes(renew_periods: int) -> tuple[int, int]:
        cfg = CFG.model_copy(update={"renew_periods": renew_periods})
        engine, ctl = SimEngine(alpha=0.8, seed=2), AdaptiveK(cfg, 7, 64)
        anchors = probes = 0
        for _ in range(8 * CFG.refresh_steps):
            s, _ = engine.step(ctl.k_for(1), 1, paused(ctl))
            if ctl.observe(s):
                anchors += ctl.mode == SPECULATING and ctl.range_of(1).k == 0
                probes += ctl.mode == PROBING
        return anchors, probes

    every_period, every_fourth = anchors_and_probes(1), anchors_and_probes(4)
    assert every_period[0] >= 6 and every_fourth[0] <= 3
    assert every_period[1] == every_fourth[1] >= 6


class PromptMixEngine(SimEngine):
    """Acceptance that differs by prompt: each request (c=1, `length` steps) draws its
    `alpha` from `alphas`, as real prompts range from predictable to hard."""

    def __init__(self, *, alphas: tuple[float, ...], length: int, seed: int, **params) -> None:
        super().__init__(alpha=alphas[0], seed=seed, **params)
        self.alphas, self.length, self.n, self.mix = alphas, length, 0, random.Random(seed + 1000)

    def step(self, k: int, batch: int, paused: bool = False) -> tuple[EngineStep, int]:
        if self.n % self.length == 0:
            self.alpha = self.mix.choice(self.alphas)
        self.n += 1
        return super().step(k, batch, paused)

    def mixed_rate(self, k: int) -> float:
        """Expected tokens/s at a fixed k (requests are equally long in steps)."""
        tokens = statistics.fmean(1 + sum(a**i for i in range(1, k + 1)) for a in self.alphas)
        return tokens / self.cost(k, 1)


def test_acceptance_that_differs_by_prompt_is_pooled_over_many_requests():
    """Hard and easy prompts alternate (acceptance 0.3 / 0.9, 80 steps each): the best fixed
    k is the largest. A window of a few requests (256 drafts, the default before) chases
    each prompt, switching k and turning speculation off on a run of hard prompts (~0.8x
    the best fixed k); pooled over 4096 drafts the controller stays near it."""
    params = dict(alphas=(0.3, 0.9), length=80, draft_fixed=0.002, per_pos=0.0015, k0_overhead=0.006)
    best = max(PromptMixEngine(seed=0, **params).mixed_rate(k) for k in range(8))
    got = {}
    for window in (CFG.acceptance_window, 256):
        cfg = CFG.model_copy(update={"acceptance_window": window})
        got[window] = statistics.fmean(
            serve(AdaptiveK(cfg, 7, 64), PromptMixEngine(seed=seed, **params), 30000)[0] / best
            for seed in range(3)
        )
    assert got[CFG.acceptance_window] > 0.94 and got[256] < 0.9, got


# A cost signal that reads vLLM's k=0 (drafter running) dearer than k=1: not physical (a
# k=1 step does k=0's work and verifies a token more per request) but what a noisy or
# slow spell can measure; on a 2-core machine the engine's cycle time rated a k=1 step
# ~10% cheaper than k=0 (config.py, ar_margin). Here 20% at batch 64.
INVERTED = dict(draft_fixed=0.002, per_pos=0.001, k0_overhead=0.010)


def serve_mixed(
    ctl: AdaptiveK, engine: SimEngine, batches: tuple[int, ...], steps: int
) -> list[tuple[int, bool]]:
    """Drive `steps` steps, cycling through `batches` in blocks of 20 steps (a rollout's
    batch moves); per step, the k in force and whether the drafter was paused."""
    out = []
    for i in range(steps):
        batch = batches[(i // 20) % len(batches)]
        out.append((ctl.k_for(batch), paused(ctl)))
        ctl.observe(engine.step(out[-1][0], batch, out[-1][1])[0])
    return out


@pytest.mark.parametrize("acceptance_bound", [True, False], ids=["acceptance", "costs-alone"])
def test_a_never_accepted_draft_ends_off_at_every_batch_size_whatever_the_costs_read(acceptance_bound):
    """A random head (acceptance 0) served at batches 1, 8 and 64, on a machine whose
    cost signal reads k=1 cheaper than vLLM's k=0, with no global probe in the run (the
    per-range choices alone must get there): within a bounded number of steps the engine
    is off (k=0 everywhere, the drafter paused) and stays off. From acceptance alone
    (`tokens_bound`: no k beats AR by the margin when a step yields fewer than ar_margin
    tokens per request) and, with that bound held back, from step costs made
    non-decreasing in k and batch ranges never measured following the measured ones.
    Before: k=1 wherever the cost signal read it cheaper, and the largest k at every
    batch size not yet measured, until a probe (issue 36). Re-measurements after an off
    period: test_a_losing_draft_is_measured_afresh_from_its_cheap_end."""
    engine = SimEngine(alpha=0.0, **INVERTED)
    assert engine.cost(1, 64) < engine.cost(0, 64) / 1.2  # the inverted reading
    ctl = AdaptiveK(CFG.model_copy(update={"refresh_steps": 10**5}), 3, 128)
    if not acceptance_bound:
        ctl.tokens_bound = lambda: None  # type: ignore[method-assign]
    steps = serve_mixed(ctl, engine, (1, 8, 64), 2000)
    first_off = next((i for i, (_, off) in enumerate(steps) if off), None)
    # acceptance: 261 drafts at the first position bound it below 0.1 / 3 (z = 3); costs:
    # the three anchors, min_samples steps each, in the first range served
    assert first_off is not None and first_off <= (60 if acceptance_bound else 140), first_off
    assert all(off for _, off in steps[first_off:])
    assert ctl.schedule() == ((1, 128, 0),) and ctl.mode == OFF


def test_a_batch_size_never_measured_starts_from_its_measured_neighbours():
    """Long drafts pay at batch 1 and cost at batch 96 (verification compute-bound): once
    each has a verdict, every batch range not measured yet runs the verdict of the
    nearest measured range, not the largest k it started with (before: k=7 at batch 2
    as at batch 128, issue 36). A range that is then served searches on its own."""
    engine, ctl = (
        SimEngine(alpha=0.8, knee=8),
        AdaptiveK(CFG.model_copy(update={"refresh_steps": 10**5}), 7, 128),
    )
    assert ctl.schedule() == ((1, 128, 7),)  # nothing measured: the start
    run(ctl, engine, 1, 300)
    at_1 = ctl.range_of(1).verdict
    assert at_1 is not None and at_1 >= 2
    assert {ctl.k_for(b) for b in (2, 8, 96, 128)} == {at_1}  # all nearest to batch 1
    run(ctl, engine, 96, 300)
    assert ctl.range_of(96).verdict == 0
    assert [ctl.k_for(b) for b in (2, 8, 32, 64, 128)] == [at_1, at_1, 0, 0, 0]
    run(ctl, engine, 8, 300)  # served: its own search
    assert ctl.range_of(8).searched and ctl.range_of(8).k == ctl.range_of(8).verdict


def test_the_speedup_is_the_rate_in_force_over_the_rate_without_drafts():
    """The net gain as the controller estimates it: near the engine's true ratio when
    speculation pays, exactly 1 once the controller runs without drafts."""
    engine, ctl = SimEngine(alpha=0.9, noise=0.0), AdaptiveK(CFG, 5, 128)
    r = ctl.range_of(1)
    assert ctl.speedup(r) is None  # nothing measured yet
    run(ctl, engine, 1, 600)
    k = ctl.k_for(1)
    truth = engine.expected_rate(k, 1) / engine.expected_rate(0, 1, paused=True)
    assert k > 0 and truth > 1.5
    assert ctl.speedup(r) == pytest.approx(truth, rel=0.1)
    weak, off = SimEngine(alpha=0.1, noise=0.0), AdaptiveK(CFG, 5, 128)
    run(off, weak, 1, 600)
    assert off.k_for(1) == 0 and off.speedup(off.range_of(1)) == 1.0
