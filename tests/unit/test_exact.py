"""The statistics that prove losslessness: the reference distribution is right, the test
accepts an exact sampler and rejects a biased one at the sample sizes we use."""

import numpy as np
import pytest
import torch

from specrl.stats.exact import goodness_of_fit, noncentral_power, processed_probs


@pytest.mark.parametrize(
    "temperature, top_p, top_k", [(1.0, 1.0, -1), (0.7, 0.9, -1), (1.3, 0.5, 5), (0.5, 1.0, 3)]
)
def test_processed_probs_matches_vllm_sampler_filtering(temperature, top_p, top_k):
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

    torch.manual_seed(0)
    logits = torch.randn(64, 50) * 2
    ours = processed_probs(logits, temperature=temperature, top_p=top_p, top_k=top_k)
    theirs = torch.softmax(
        apply_top_k_top_p_pytorch(
            (logits / temperature).clone(),
            torch.full((64,), top_k) if top_k > 0 else None,
            torch.full((64,), top_p) if top_p < 1 else None,
        ),
        -1,
    )
    assert torch.allclose(ours.float(), theirs, atol=1e-5)


def test_greedy_is_a_point_mass():
    p = processed_probs(torch.tensor([[0.1, 3.0, 2.9]]), temperature=0.0)
    assert p.tolist() == [[0.0, 1.0, 0.0]]


def biased(p: np.ndarray, tv: float) -> np.ndarray:
    """Move `tv` of mass from the most likely outcome to the least likely ones."""
    q = p.copy()
    order = np.argsort(p)
    q[order[-1]] -= tv
    q[order[: len(p) // 2]] += tv / (len(p) // 2)
    assert np.isclose(0.5 * np.abs(q - p).sum(), tv)
    return q


def run_tests(p: np.ndarray, sampler: np.ndarray, n: int, alpha: float, reps: int) -> float:
    rng = np.random.default_rng(0)
    exact = dict(enumerate(p))
    rejections = 0
    for _ in range(reps):
        draws = rng.choice(len(p), size=n, p=sampler)
        counts = dict(zip(*np.unique(draws, return_counts=True)))
        rejections += not goodness_of_fit(counts, exact).passed(alpha)
    return rejections / reps


def test_chi_square_rejects_a_5pct_biased_sampler_and_accepts_an_exact_one():
    rng = np.random.default_rng(1)
    p = rng.dirichlet(np.full(30, 0.5))  # peaked, with a long tail like a real LM
    n, alpha = 6000, 1e-3
    assert run_tests(p, biased(p, 0.05), n, alpha, reps=40) >= 0.95
    assert run_tests(p, p, n, alpha, reps=40) <= 0.05


def test_power_bound_is_conservative():
    # the bound from chi-square divergence >= 4 TV^2 is never above the simulated power
    rng = np.random.default_rng(2)
    p = rng.dirichlet(np.full(12, 1.0))
    n, alpha = 2000, 1e-3
    bound = noncentral_power(n=n, tv=0.05, dof=len(p) - 1, alpha=alpha)
    assert run_tests(p, biased(p, 0.05), n, alpha, reps=60) >= bound - 0.1


def test_impossible_outcomes_fail_immediately():
    fit = goodness_of_fit({0: 500, 1: 499, 2: 1}, {0: 0.5, 1: 0.5, 2: 0.0})
    assert fit.impossible == 1 and not fit.passed(1e-9)
    # an outcome that is merely not enumerated belongs to the pooled rest, it is not impossible
    fit = goodness_of_fit({0: 495, 1: 500, 3: 5}, {0: 0.495, 1: 0.5})
    assert fit.impossible == 0 and fit.passed(1e-3)
