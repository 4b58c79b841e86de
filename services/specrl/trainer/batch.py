"""Rollout samples -> padded training tensors, validated first.

A bad sample (token ids outside the vocabulary, an empty completion, logprobs that do
not line up with the tokens, a non-finite reward or logprob) fails the whole batch with
an error naming it: nothing is trained on a batch the trainer cannot trust.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch


class BatchError(ValueError):
    pass


@dataclass(frozen=True)
class Rollout:
    prompt_ids: Sequence[int]
    completion_ids: Sequence[int]
    reward: float
    # The rollout engine's logprobs of completion_ids (for truncated IS and mismatch
    # monitoring); empty when unknown.
    rollout_logprobs: Sequence[float] = ()


@dataclass
class TrainBatch:
    """Right-padded sequences; per-token tensors are over next-token positions [B, L-1]:
    position t holds the logprob of token t+1 given tokens <= t."""

    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    mask: torch.Tensor  # [B, L-1] 1 on completion tokens
    rewards: torch.Tensor  # [B]
    rollout_logprobs: torch.Tensor | None  # [B, L-1], zeros off the mask

    @property
    def size(self) -> int:
        return self.input_ids.shape[0]

    def to(self, device: torch.device) -> TrainBatch:
        return TrainBatch(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            self.mask.to(device),
            self.rewards.to(device),
            None if self.rollout_logprobs is None else self.rollout_logprobs.to(device),
        )

    def rows(self, index: slice | torch.Tensor) -> TrainBatch:
        return TrainBatch(
            self.input_ids[index],
            self.attention_mask[index],
            self.mask[index],
            self.rewards[index],
            None if self.rollout_logprobs is None else self.rollout_logprobs[index],
        )


def validate(rollouts: Sequence[Rollout], vocab_size: int, max_len: int | None = None) -> None:
    if not rollouts:
        raise BatchError("empty batch")
    with_lp = [bool(r.rollout_logprobs) for r in rollouts]
    if any(with_lp) and not all(with_lp):
        raise BatchError("rollout logprobs must be given for every sample or for none")
    for i, r in enumerate(rollouts):
        if not r.prompt_ids:
            raise BatchError(f"sample {i}: empty prompt")
        if not r.completion_ids:
            raise BatchError(f"sample {i}: empty completion")
        for part, ids in (("prompt", r.prompt_ids), ("completion", r.completion_ids)):
            bad = [t for t in ids if not 0 <= t < vocab_size]
            if bad:
                raise BatchError(
                    f"sample {i}: {part} token ids outside the vocabulary [0, {vocab_size}): {bad[:5]}"
                )
        if not math.isfinite(r.reward):
            raise BatchError(f"sample {i}: reward is {r.reward}")
        if r.rollout_logprobs:
            if len(r.rollout_logprobs) != len(r.completion_ids):
                raise BatchError(
                    f"sample {i}: {len(r.rollout_logprobs)} rollout logprobs for "
                    f"{len(r.completion_ids)} completion tokens"
                )
            if not all(math.isfinite(x) and x <= 0 for x in r.rollout_logprobs):
                raise BatchError(f"sample {i}: rollout logprobs must be finite and <= 0")
        if max_len is not None and len(r.prompt_ids) + len(r.completion_ids) > max_len:
            raise BatchError(
                f"sample {i}: {len(r.prompt_ids) + len(r.completion_ids)} tokens > max {max_len}"
            )


def collate(rollouts: Sequence[Rollout], vocab_size: int, pad_id: int = 0) -> TrainBatch:
    validate(rollouts, vocab_size)
    length = max(len(r.prompt_ids) + len(r.completion_ids) for r in rollouts)
    b = len(rollouts)
    input_ids = torch.full((b, length), pad_id, dtype=torch.long)
    attention = torch.zeros((b, length), dtype=torch.long)
    mask = torch.zeros((b, length - 1))
    rollout_lp = torch.zeros((b, length - 1)) if rollouts[0].rollout_logprobs else None
    for i, r in enumerate(rollouts):
        p, c = len(r.prompt_ids), len(r.completion_ids)
        input_ids[i, : p + c] = torch.tensor([*r.prompt_ids, *r.completion_ids])
        attention[i, : p + c] = 1
        mask[i, p - 1 : p + c - 1] = 1
        if rollout_lp is not None:
            rollout_lp[i, p - 1 : p + c - 1] = torch.tensor(list(r.rollout_logprobs))
    rewards = torch.tensor([r.reward for r in rollouts], dtype=torch.float32)
    return TrainBatch(input_ids, attention, mask, rewards, rollout_lp)
