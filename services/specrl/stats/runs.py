"""Whole RL runs compared: with and without speculation, the runs' rewards must not differ
by more than chance (torch-free: the orchestrator's run report uses it)."""

from __future__ import annotations

from collections.abc import Sequence


def reward_difference_p(a: Sequence[dict], b: Sequence[dict]) -> float:
    """Two-sided p-value of a two-proportion z-test that two runs' (0/1) rewards, from
    their step records, have the same mean.

    Lossless speculation leaves the rollout distribution, hence the distribution of the
    whole reward trajectory, unchanged. Exact for the first step (both runs sample the same
    initial policy on the same prompts); after it, the runs' policies drift apart through
    their different samples, a variance the test ignores (small at RL learning rates), so
    a low p is a reason to look rather than a proof of bias."""
    from scipy.stats import norm

    n1, n2 = sum(r["samples"] for r in a), sum(r["samples"] for r in b)
    k1 = sum(r["reward_mean"] * r["samples"] for r in a)
    k2 = sum(r["reward_mean"] * r["samples"] for r in b)
    pooled = (k1 + k2) / (n1 + n2)
    se = (pooled * (1 - pooled) * (1 / n1 + 1 / n2)) ** 0.5
    return 1.0 if se == 0 else float(2 * norm.sf(abs(k1 / n1 - k2 / n2) / se))


def detectable_reward_difference(
    n1: int, n2: int, reward: float, *, alpha: float, power: float = 0.8
) -> float:
    """The difference in mean reward that `reward_difference_p` detects at `alpha` with
    probability `power`, for runs of n1 and n2 samples around `reward` (normal approximation)."""
    from scipy.stats import norm

    se = (reward * (1 - reward) * (1 / n1 + 1 / n2)) ** 0.5
    return float((norm.isf(alpha / 2) + norm.isf(1 - power)) * se)
