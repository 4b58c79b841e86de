"""The GRPO objective on per-token tensors. Pure functions of tensors, no model: the loss
is tested against an independent reference on hand-made inputs.

Shapes: [B, T] for per-token tensors (T = completion positions), [B] for per-sample
ones. `mask` is 1 on completion tokens that count (never prompt or padding).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specrl.config import GRPOConfig


def group_advantages(
    rewards: torch.Tensor, group_size: int, *, normalize_std: bool, eps: float = 1e-6
) -> torch.Tensor:
    """Advantage of each sample within its group of `group_size` consecutive samples:
    reward minus the group mean, divided by the group std (unbiased=False) when asked.
    A group whose rewards are all equal carries no signal: its advantages are 0."""
    if rewards.ndim != 1 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    g = rewards.view(-1, group_size).float()
    centred = g - g.mean(dim=1, keepdim=True)
    if normalize_std:
        centred = centred / (g.std(dim=1, unbiased=False, keepdim=True) + eps)
    return centred.reshape(-1)


@dataclass
class LossParts:
    """Sums over masked tokens (divide by the global token count to get means)."""

    loss: torch.Tensor  # the objective's sum; has a graph
    pg: torch.Tensor
    kl: torch.Tensor
    clipped: torch.Tensor
    is_weight: torch.Tensor
    tokens: torch.Tensor


def grpo_token_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: GRPOConfig,
    *,
    ref_logprobs: torch.Tensor | None = None,
    rollout_logprobs: torch.Tensor | None = None,
) -> LossParts:
    """Per-token clipped surrogate + k3 KL, summed over masked tokens.

    ratio = exp(logp - old_logp); pg = -min(ratio A, clip(ratio, 1-eps_low, 1+eps_high) A);
    kl = exp(ref - logp) - (ref - logp) - 1, an unbiased, non-negative estimate of
    KL(pi || pi_ref) under samples of pi; with truncated IS each token's pg is weighted
    by min(exp(old_logp - rollout_logp), is_cap) (no gradient through the weight)."""
    mask = mask.to(logprobs.dtype)
    adv = advantages[:, None].to(logprobs.dtype)
    ratio = torch.exp(logprobs - old_logprobs)
    unclipped = ratio * adv
    clipped = torch.clamp(ratio, 1 - cfg.eps_low, 1 + cfg.eps_high) * adv
    pg = -torch.minimum(unclipped, clipped)
    weight = torch.ones_like(pg)
    if cfg.is_cap is not None:
        if rollout_logprobs is None:
            raise ValueError("grpo.is_cap is set but the batch has no rollout logprobs")
        weight = torch.exp(old_logprobs - rollout_logprobs).clamp(max=cfg.is_cap).detach()
    per_token = weight * pg
    kl = torch.zeros_like(pg)
    if cfg.kl_coef > 0:
        if ref_logprobs is None:
            raise ValueError("grpo.kl_coef > 0 needs reference logprobs")
        delta = ref_logprobs - logprobs
        kl = torch.exp(delta) - delta - 1
        per_token = per_token + cfg.kl_coef * kl
    return LossParts(
        loss=(per_token * mask).sum(),
        pg=(pg * mask).sum().detach(),
        kl=(kl * mask).sum().detach(),
        clipped=((clipped < unclipped).to(mask.dtype) * mask).sum().detach(),
        is_weight=(weight * mask).sum().detach(),
        tokens=mask.sum().detach(),
    )
