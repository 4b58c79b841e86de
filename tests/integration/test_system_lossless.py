"""Lossless at the system level: two short synchronous RL runs of `specrl run` (every
service a real process), identical but for speculation, with the same seeds, so the same
prompts at every step and the same initial policy: one run and its AR comparison run
(`compare.runs: [ar]`, whose side-by-side report is checked too). The speculative run is
the hard case:
EAGLE-3 (k = 3) from the generic-init draft while the draft-trainer adapts it and
publishes a new draft at every step, so the draft changes under the sampler mid-run.

The test (stated): a two-proportion z-test of the runs' 0/1 rewards over all steps
(`specrl.stats.lossless.reward_difference_p`; exact for the first step, approximate after,
as the runs' policies drift apart through their own samples) must not reject at ALPHA; the
difference it would detect with 80% power is printed. And the trainer's logprob mismatch
(its recomputed logprobs against the engine's, same tokens, same weights) is no worse with
speculation: within a factor of AR's, where a rollout server that returned its draft's
logprobs instead of the target's would be off by orders of magnitude.

The token-level proof, with far more power, is tests/integration/test_lossless.py; this
one shows that nothing between the engine and the trainer (orchestrator, Redis, rewards,
weight pushes) changes the picture."""

from __future__ import annotations

import pytest

from specrl.stats.runs import detectable_reward_difference, reward_difference_p

pytestmark = [pytest.mark.vllm, pytest.mark.zoo, pytest.mark.timed, pytest.mark.timeout(1200)]  # adapted_run

ALPHA = 1e-3
# Float32 on both sides; the step benchmark measured a max abs mismatch of ~1e-5 with
# either method (docs/benchmarks.md, RL step).
MISMATCH_FACTOR, MISMATCH_FLOOR = 5.0, 1e-4


def test_rl_runs_with_and_without_speculation_are_indistinguishable(adapted_run):
    spec, ar = adapted_run.records, adapted_run.compared["ar"]

    assert [r["group_ids"] for r in ar] == [r["group_ids"] for r in spec]
    assert all(r["acceptance_length"] == 1.0 for r in ar)
    # a speculating engine accepts some draft tokens at every step (an engine that is not
    # gives exactly 1.0); the generic-init head starts weak: 1.15-1.25 at the first step on
    # different builds of the zoo
    lengths = [round(r["acceptance_length"], 3) for r in spec]
    print(f"acceptance length per step: {lengths}")
    assert all(al > 1.05 for al in lengths), f"EAGLE-3 speculation is not doing anything: {lengths}"
    assert spec[-1]["draft"]["version"] >= 1, "the draft was not replaced mid-run"

    p = reward_difference_p(spec, ar)
    n_ar, n_spec = sum(r["samples"] for r in ar), sum(r["samples"] for r in spec)
    mean_ar = sum(r["reward_mean"] * r["samples"] for r in ar) / n_ar
    mean_spec = sum(r["reward_mean"] * r["samples"] for r in spec) / n_spec
    mde = detectable_reward_difference(n_ar, n_spec, (mean_ar + mean_spec) / 2, alpha=ALPHA)
    print(
        f"reward per step: AR {[round(r['reward_mean'], 3) for r in ar]}, "
        f"EAGLE-3 {[round(r['reward_mean'], 3) for r in spec]}; means {mean_ar:.3f} vs {mean_spec:.3f}, "
        f"p = {p:.3f}; detectable difference at alpha {ALPHA:g} with 80% power: {mde:.3f}"
    )
    assert p > ALPHA, f"rewards differ with speculation: {mean_spec:.3f} vs AR {mean_ar:.3f} (p = {p:.2g})"

    worst_ar = max(r["mismatch_max_abs"] for r in ar)
    worst_spec = max(r["mismatch_max_abs"] for r in spec)
    print(f"trainer vs engine logprob mismatch (max abs): AR {worst_ar:.2e}, EAGLE-3 {worst_spec:.2e}")
    assert worst_spec <= MISMATCH_FACTOR * worst_ar + MISMATCH_FLOOR


def test_the_report_puts_the_run_beside_its_ar_comparison(adapted_run):
    """Both runs' step logs kept, and the report's side-by-side table: AR is the baseline
    (ratios 1.0), the speculative run's ratios are its own times against AR's."""
    run_dir = adapted_run.run_dir
    assert len((run_dir / "compare" / "ar" / "steps.jsonl").read_text().splitlines()) == 3
    report = adapted_run.report.read_text()
    table = report[report.index("## Side by side") :].split("\n\n")[2].splitlines()
    rows = {line.split("|")[1].strip(): [c.strip() for c in line.split("|")[1:-1]] for line in table[2:]}
    header = [c.strip() for c in table[0].split("|")[1:-1]]
    col = {name: header.index(name) for name in ("gen_s", "gen_speedup_vs_ar", "acceptance_length")}
    ar, spec = rows["AR, lag 0"], rows["eagle3 k=3, lag 0"]
    assert float(ar[col["gen_speedup_vs_ar"]]) == 1.0 and float(ar[col["acceptance_length"]]) == 1.0
    expected = float(ar[col["gen_s"]]) / float(spec[col["gen_s"]])
    assert float(spec[col["gen_speedup_vs_ar"]]) == pytest.approx(expected, rel=0.01)
    assert float(spec[col["acceptance_length"]]) > 1.2
    assert adapted_run.report.with_suffix(".png").stat().st_size > 10_000
