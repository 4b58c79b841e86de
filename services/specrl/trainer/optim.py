"""AdamW and its learning-rate schedule, from `trainer.optim` alone."""

from __future__ import annotations

from collections.abc import Iterable

import torch

from specrl.config import OptimConfig


def build_optimizer(params: Iterable[torch.nn.Parameter], cfg: OptimConfig) -> torch.optim.Optimizer:
    # foreach=False: the per-parameter path handles plain and DTensor parameters alike
    return torch.optim.AdamW(params, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, foreach=False)


def learning_rate(cfg: OptimConfig, step: int) -> float:
    """The learning rate of optimizer step `step` (0-based): linear warmup over
    `warmup_steps`, then constant. A function of the step count alone, so a resumed run
    continues the schedule exactly."""
    return cfg.lr * min(1.0, (step + 1) / cfg.warmup_steps) if cfg.warmup_steps else cfg.lr
