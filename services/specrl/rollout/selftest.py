"""Startup self-test of an engine's speculative sampler, run inside the engine's worker.

It feeds synthetic logits through the engine's own speculative (rejection) sampler (the
instance its model runner uses, so every patch or bug of that process is in the path)
and checks with exact chi-square tests that what comes out follows the target
distribution:
  - the first emitted token ~ processed target p0 (temperature 0.7, top-p 0.9);
  - given the first draft token was accepted, the second emitted token ~ p1;
both with greedy drafts (the engine's default: no draft probabilities) and sampled drafts.
A few seconds on CPU. The server refuses speculative rollouts when this fails.

The test and its statistics are the same for every engine; each engine hands in its own
sampler as a `SpeculativeSampler` (rollout/engines/<kind>/selftest.py).
"""

from __future__ import annotations

from collections import Counter
from typing import Protocol

import torch

from specrl.stats.exact import goodness_of_fit, processed_probs

_VOCAB = 16
_K = 2
_TEMPERATURE = 0.7
_TOP_P = 0.9


class SpeculativeSampler(Protocol):
    """One verification step of B requests with K drafts each, through an engine's sampler
    at one temperature and top-p for all. Request r owns target logits rows
    [r*(K+1), r*(K+1)+K], the last being its bonus row (the usual model-runner layout)."""

    def __call__(
        self,
        target_logits: torch.Tensor,  # [B * (K+1), V]
        draft_token_ids: torch.Tensor,  # [B, K]
        draft_probs: torch.Tensor | None,  # [B * K, V]; None: greedy drafts (point masses)
        *,
        temperature: float,
        top_p: float,
    ) -> torch.Tensor:  # [B, K+1] emitted token ids, -1 after the first rejection
        ...


def _check(sample: SpeculativeSampler, trials: int, gen: torch.Generator, sampled_drafts: bool):
    """p-values of the two fits, and a one-line description."""
    # Zipf-shaped logits in a random order per position: after temperature 0.7 and top-p
    # 0.9 several tokens keep real mass at every position, whatever the seed.
    zipf = -torch.log(torch.arange(1, _VOCAB + 1, dtype=torch.float32))
    target_logits = torch.stack([zipf[torch.randperm(_VOCAB, generator=gen)] for _ in range(_K + 1)])
    p = processed_probs(target_logits, temperature=_TEMPERATURE, top_p=_TOP_P)
    noise = torch.randn(_K, _VOCAB, generator=gen)
    q = torch.softmax(target_logits[:_K] / _TEMPERATURE + noise, -1)
    if sampled_drafts:
        draft = torch.multinomial(q.repeat(trials, 1), 1, generator=gen).view(trials, _K)
        draft_probs = q.repeat(trials, 1).to(torch.float32).contiguous()
    else:  # greedy drafter: its argmax, treated as a point mass by the sampler
        draft = q.argmax(-1).repeat(trials, 1)
        draft_probs = None
    logits = target_logits.repeat(trials, 1).to(torch.float32).contiguous()
    tokens = sample(logits, draft, draft_probs, temperature=_TEMPERATURE, top_p=_TOP_P).to(torch.long)
    first = Counter(tokens[:, 0].tolist())
    fit0 = goodness_of_fit(first, {i: float(p[0, i]) for i in range(_VOCAB)})
    accepted = tokens[:, 0] == draft[:, 0]
    second = Counter(tokens[accepted, 1].tolist())
    if sum(second.values()) >= 50:
        fit1 = goodness_of_fit(second, {i: float(p[1, i]) for i in range(_VOCAB)})
        p1, tv1 = fit1.p_value, fit1.total_variation
    else:
        p1, tv1 = 1.0, 0.0
    kind = "sampled" if sampled_drafts else "greedy"
    detail = f"{kind} drafts: pos0 p={fit0.p_value:.3g} tv={fit0.total_variation:.3f}, "
    detail += f"pos1 p={p1:.3g} tv={tv1:.3f}"
    return [fit0.p_value, p1], detail


def run(sample: SpeculativeSampler, *, trials: int, alpha: float, seed: int) -> dict:
    """Run both checks; Bonferroni-combined p-value. Returns a plain dict (it crosses the
    engine's process boundary)."""
    gen = torch.Generator().manual_seed(seed)
    p_values, details = [], []
    for sampled in (False, True):
        ps, detail = _check(sample, trials, gen, sampled)
        p_values += ps
        details.append(detail)
    combined = min(1.0, min(p_values) * len(p_values))
    return {"passed": combined >= alpha, "p_value": combined, "detail": "; ".join(details)}
