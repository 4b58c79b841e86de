"""GRPO: group-normalized advantages, the clipped surrogate with DAPO-style asymmetric
clipping (eps_low / eps_high), k3 KL to a frozen reference, truncated importance
sampling against the rollout engine's logprobs; token-level sums. Pure functions of
tensors, no model: the loss is tested against an independent reference on hand-made
inputs (tests/unit/test_grpo.py).

Shapes: [B, T] for per-token tensors (T = completion positions), [B] for per-sample
ones. `mask` is 1 on completion tokens that count (never prompt or padding).
"""

from __future__ import annotations

import torch

from specrl.config import GRPOConfig
from specrl.trainer.losses import LossOutput


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


def grpo_token_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cfg: GRPOConfig,
    *,
    ref_logprobs: torch.Tensor | None = None,
    rollout_logprobs: torch.Tensor | None = None,
) -> LossOutput:
    """Per-token clipped surrogate + k3 KL, summed over masked tokens.

    ratio = exp(logp - old_logp); pg = -min(ratio A, clip(ratio, 1-eps_low, 1+eps_high) A);
    kl = exp(ref - logp) - (ref - logp) - 1, an unbiased, non-negative estimate of
    KL(pi || pi_ref) under samples of pi; with truncated IS each token's pg is weighted
    by min(exp(old_logp - rollout_logp), is_cap) (no gradient through the weight).

    Statistics (token sums): pg_loss (the unweighted surrogate), kl, clip_fraction
    (tokens whose clipped objective was the smaller) and is_weight."""
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
    return LossOutput(
        loss=(per_token * mask).sum(),
        stats={
            "pg_loss": (pg * mask).sum().item(),
            "kl": (kl * mask).sum().item(),
            "clip_fraction": ((clipped < unclipped).to(mask.dtype) * mask).sum().item(),
            "is_weight": (weight * mask).sum().item(),
        },
    )


class GRPOLoss:
    """`trainer.loss: grpo`, its hyperparameters in `trainer.grpo`."""

    def __init__(self, cfg: GRPOConfig) -> None:
        self.cfg = cfg
        self.uses_reference = cfg.kl_coef > 0

    def advantages(self, rewards: torch.Tensor, group_size: int) -> torch.Tensor:
        return group_advantages(rewards, group_size, normalize_std=self.cfg.normalize_std)

    def __call__(
        self,
        logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        *,
        ref_logprobs: torch.Tensor | None,
        rollout_logprobs: torch.Tensor | None,
    ) -> LossOutput:
        return grpo_token_loss(
            logprobs,
            old_logprobs,
            advantages,
            mask,
            self.cfg,
            ref_logprobs=ref_logprobs,
            rollout_logprobs=rollout_logprobs,
        )


def build(cfg: GRPOConfig) -> GRPOLoss:
    return GRPOLoss(cfg)
