"""Exact sampling distributions and goodness-of-fit tests: how specrl proves losslessness.

`processed_probs` is the distribution a sampler must draw from for given logits and
sampling parameters, written independently of any engine. `goodness_of_fit` compares
observed counts of outcomes with exact probabilities by Pearson's chi-square test, lumping
outcomes whose expected count is small into one bin so that the chi-square approximation
holds. Used by the rollout server's startup self-test, `specrl verify lossless` and tests.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass

import torch

OTHER = "<other>"


def processed_probs(
    logits: torch.Tensor, *, temperature: float, top_p: float = 1.0, top_k: int = -1
) -> torch.Tensor:
    """softmax(logits / T) restricted by top-k then top-p and renormalised; [..., V].

    Conventions (vLLM's): top-k keeps the k largest logits (ties at the k-th value all
    kept); top-p keeps a token iff the mass of the tokens strictly more likely than it is
    < p, i.e. the smallest prefix of the sorted distribution whose mass reaches p.
    temperature 0 means greedy (a point mass on the argmax)."""
    logits = logits.to(torch.float64)
    if temperature == 0:
        return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).to(torch.float64)
    logits = logits / temperature
    if top_k > 0:
        kth = logits.topk(top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(-1)
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        mass_before = sorted_p.cumsum(-1) - sorted_p
        keep_sorted = mass_before < top_p
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        probs = probs * keep
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


@dataclass(frozen=True)
class FitResult:
    statistic: float
    dof: int
    p_value: float
    n: int
    total_variation: float  # TV between the empirical and exact distributions (all outcomes)
    impossible: int  # observations of outcomes with exact probability 0

    def passed(self, alpha: float) -> bool:
        return self.impossible == 0 and self.p_value >= alpha


def goodness_of_fit(
    counts: Mapping[Hashable, int],
    probs: Mapping[Hashable, float],
    *,
    min_expected: float = 5.0,
) -> FitResult:
    """Pearson chi-square of `counts` against exact `probs`. Outcomes missing from `probs`
    share its missing mass (an implicit "other" outcome); outcomes with expected count
    below `min_expected` are pooled. An observed outcome listed in `probs` with probability
    0 is reported in `impossible` and makes the test fail at any alpha."""
    from scipy.stats import chi2

    n = sum(counts.values())
    if n == 0:
        raise ValueError("no observations")
    impossible = sum(c for k, c in counts.items() if k in probs and probs[k] <= 0.0)
    tv = 0.5 * sum(abs(counts.get(k, 0) / n - p) for k, p in probs.items())
    tv += 0.5 * sum(c / n for k, c in counts.items() if k not in probs)
    bins_obs: list[float] = []
    bins_exp: list[float] = []
    pooled_obs, pooled_exp = 0.0, 0.0
    for k, p in probs.items():
        if p * n >= min_expected:
            bins_obs.append(counts.get(k, 0))
            bins_exp.append(p * n)
        else:
            pooled_obs += counts.get(k, 0)
            pooled_exp += p * n
    pooled_obs += sum(c for k, c in counts.items() if k not in probs)
    pooled_exp += max(0.0, 1.0 - sum(probs.values())) * n
    if pooled_exp > 0 or pooled_obs > 0:
        bins_obs.append(pooled_obs)
        bins_exp.append(pooled_exp)
    stat = 0.0
    for o, e in zip(bins_obs, bins_exp):
        if e > 0:
            stat += (o - e) ** 2 / e
        elif o > 0:
            stat = math.inf
    dof = max(1, len(bins_obs) - 1)
    p_value = 0.0 if math.isinf(stat) else float(chi2.sf(stat, dof))
    if impossible:
        p_value = 0.0
    return FitResult(stat, dof, p_value, n, tv, impossible)


def noncentral_power(*, n: int, tv: float, dof: int, alpha: float) -> float:
    """Lower bound on the chi-square test's power against any alternative at total
    variation `tv`: the chi-square divergence is >= (2 tv)^2, so the noncentrality is at
    least n (2 tv)^2. Used to choose sample sizes."""
    from scipy.stats import chi2, ncx2

    crit = chi2.isf(alpha, dof)
    return float(ncx2.sf(crit, dof, n * (2 * tv) ** 2))
