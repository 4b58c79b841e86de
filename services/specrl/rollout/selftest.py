"""Startup self-test of an engine's speculative sampler, run inside the engine's worker.

It feeds synthetic logits through vLLM's own `RejectionSampler` (the instance the model
runner uses, so every patch or bug of that process is in the path) and checks with exact
chi-square tests that what comes out follows the target distribution:
  - the first emitted token ~ processed target p0 (temperature 0.7, top-p 0.9);
  - given the first draft token was accepted, the second emitted token ~ p1;
both with greedy drafts (the engine's default: draft_probs=None) and sampled drafts.
A few seconds on CPU. The server refuses speculative rollouts when this fails.
"""

from __future__ import annotations

from collections import Counter

import torch

from specrl.stats.exact import goodness_of_fit, processed_probs

_VOCAB = 16
_K = 2
_TEMPERATURE = 0.7
_TOP_P = 0.9


def _spec_metadata(draft_ids: torch.Tensor):
    """SpecDecodeMetadata for B requests with K drafts each; request r owns logits rows
    [r*(K+1), r*(K+1)+K], the last being its bonus row (the model runner's layout)."""
    from vllm.v1.spec_decode.metadata import SpecDecodeMetadata

    b, k = draft_ids.shape
    rows = torch.arange(b * (k + 1), dtype=torch.int32).view(b, k + 1)
    return SpecDecodeMetadata(
        draft_token_ids=draft_ids.reshape(-1).to(torch.int32).contiguous(),
        num_draft_tokens=[k] * b,
        cu_num_draft_tokens=torch.arange(1, b + 1, dtype=torch.int32) * k,
        cu_num_sampled_tokens=torch.arange(1, b + 1, dtype=torch.int32) * (k + 1),
        target_logits_indices=rows[:, :k].reshape(-1).contiguous(),
        bonus_logits_indices=rows[:, k].contiguous(),
        logits_indices=rows.reshape(-1),
    )


def _sampling_metadata(b: int):
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    return SamplingMetadata(
        temperature=torch.full((b,), _TEMPERATURE, dtype=torch.float32),
        all_greedy=False,
        all_random=True,
        top_p=torch.full((b,), _TOP_P, dtype=torch.float32),
        top_k=None,
        generators={},
        max_num_logprobs=None,
        no_penalties=True,
        prompt_token_ids=None,
        frequency_penalties=torch.zeros(b),
        presence_penalties=torch.zeros(b),
        repetition_penalties=torch.ones(b),
        output_token_ids=[[] for _ in range(b)],
        allowed_token_ids_mask=None,
        bad_words_token_ids={},
        logitsprocs=LogitsProcessors(),
    )


def _check(rejection_sampler, trials: int, gen: torch.Generator, sampled_drafts: bool):
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
    out = rejection_sampler(_spec_metadata(draft), draft_probs, logits, _sampling_metadata(trials))
    tokens = out.sampled_token_ids.to(torch.long)  # [trials, K+1], -1 after a rejection
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


def run(rejection_sampler, *, trials: int, alpha: float, seed: int) -> dict:
    """Run both checks; Bonferroni-combined p-value. Returns a plain dict (it crosses the
    engine's process boundary)."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)  # the sampler draws its uniforms from the global generator
    p_values, details = [], []
    for sampled in (False, True):
        ps, detail = _check(rejection_sampler, trials, gen, sampled)
        p_values += ps
        details.append(detail)
    combined = min(1.0, min(p_values) * len(p_values))
    return {"passed": combined >= alpha, "p_value": combined, "detail": "; ".join(details)}


def standalone_rejection_sampler():
    """vLLM's RejectionSampler outside an engine (unit tests): the CPU kernel fallbacks
    must be registered first, as the worker does at start-up."""
    from vllm.platforms import current_platform
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler

    current_platform.register_triton_kernel_overrides()
    return RejectionSampler(Sampler(logprobs_mode="processed_logprobs"))
