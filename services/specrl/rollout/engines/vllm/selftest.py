"""The sampler self-test (specrl.rollout.selftest) on vLLM's `RejectionSampler`: the
metadata vLLM's model runner would hand it for a verification step, built for the test's
synthetic batch."""

from __future__ import annotations

import torch

from specrl.rollout import selftest


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


def _sampling_metadata(b: int, temperature: float, top_p: float):
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    return SamplingMetadata(
        temperature=torch.full((b,), temperature, dtype=torch.float32),
        all_greedy=False,
        all_random=True,
        top_p=torch.full((b,), top_p, dtype=torch.float32),
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


def speculative_sampler(rejection_sampler) -> selftest.SpeculativeSampler:
    """`rejection_sampler` (vLLM's, as the model runner holds it) as the self-test calls it."""

    def sample(
        target_logits: torch.Tensor,  # [B * (K+1), V]
        draft_token_ids: torch.Tensor,  # [B, K]
        draft_probs: torch.Tensor | None,  # [B * K, V]
        *,
        temperature: float,
        top_p: float,
    ) -> torch.Tensor:
        b = draft_token_ids.shape[0]
        metadata = _sampling_metadata(b, temperature, top_p)
        out = rejection_sampler(_spec_metadata(draft_token_ids), draft_probs, target_logits, metadata)
        return out.sampled_token_ids

    return sample


def run(rejection_sampler, *, trials: int, alpha: float, seed: int) -> dict:
    """The self-test of `rejection_sampler` (see selftest.run)."""
    torch.manual_seed(seed)  # vLLM's sampler draws its uniforms from the global generator
    return selftest.run(speculative_sampler(rejection_sampler), trials=trials, alpha=alpha, seed=seed)


def standalone_rejection_sampler():
    """vLLM's RejectionSampler outside an engine (unit tests): the CPU kernel fallbacks
    must be registered first, as the worker does at start-up."""
    from vllm.platforms import current_platform
    from vllm.v1.sample.rejection_sampler import RejectionSampler
    from vllm.v1.sample.sampler import Sampler

    current_platform.register_triton_kernel_overrides()
    return RejectionSampler(Sampler(logprobs_mode="processed_logprobs"))
