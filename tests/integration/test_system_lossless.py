"""Lossless at the system level: two short synchronous RL runs of `specrl run` (every
service a real process), identical but for speculation (none vs EAGLE-3, k = 3), with the
same seeds, so the same prompts at every step and the same initial policy.

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
from rich.console import Console

from specrl.config import RunConfig
from specrl.orchestrator.run import run
from specrl.stats.lossless import detectable_reward_difference, reward_difference_p

from conftest import tiny_run_config

pytestmark = [pytest.mark.vllm, pytest.mark.zoo, pytest.mark.timeout(1200)]

ALPHA = 1e-3
STEPS = 3
# Float32 on both sides; max abs mismatch is ~2e-5 with either method (docs/benchmarks.md).
MISMATCH_FACTOR, MISMATCH_FLOOR = 5.0, 1e-4


def _run(tmp_path, method: str) -> list[dict]:
    cfg = tiny_run_config(tmp_path, steps=STEPS, max_lag=0, concurrency=8)
    cfg["name"] = method
    cfg["data"]["prompts_per_step"] = 16
    cfg["sampling"]["n"] = 8
    cfg["trainer"]["server"]["trainer"]["optim"]["lr"] = 3e-5  # the demo's: little drift in 3 steps
    if method == "none":
        cfg["rollout"]["server"]["speculation"] = {"method": "none"}
    return run(RunConfig.model_validate(cfg), console=Console(quiet=True), metrics=False).records


def test_rl_runs_with_and_without_speculation_are_indistinguishable(zoo, servers, tmp_path):
    servers.close()  # two cores: no other engine while these run
    ar, spec = _run(tmp_path, "none"), _run(tmp_path, "eagle3")

    assert [r["group_ids"] for r in ar] == [r["group_ids"] for r in spec]
    assert all(r["acceptance_length"] == 1.0 for r in ar)
    assert all(r["acceptance_length"] > 1.5 for r in spec), "EAGLE-3 speculation is not doing anything"

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
