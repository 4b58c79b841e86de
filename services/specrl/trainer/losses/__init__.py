"""The policy-gradient objective behind one small interface, chosen by `trainer.loss`.

A loss is one module: `trainer.loss: NAME` loads `specrl.trainer.losses.NAME` (GRPO
today: `grpo`), and a dotted name (`mypkg.myloss`) loads that module instead, so a
variant can live outside specrl. The module defines `build(cfg: GRPOConfig) -> Loss`;
`trainer.grpo` holds the hyperparameters the GRPO family shares (clip range, KL
coefficient, importance-sampling cap, std normalization).

The statistics a loss returns are the step statistics, under the names it gives them:
the step adds only its own (`step.STEP_STATS`: the objective `loss`, `entropy`,
`grad_norm`), and they reach `StepMetrics.stats` on the wire and
`specrl_trainer_step_value{stat=...}` as they are. A new statistic is one edit, here.

Torch-free at import: the config's check that `trainer.loss` names a module imports
this package (not the loss).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from specrl.config import loss_module

if TYPE_CHECKING:
    import torch

    from specrl.config import GRPOConfig


@dataclass
class LossOutput:
    """One micro-batch's objective and statistics, as sums over its masked tokens: the
    step divides them by the global number of completion tokens, so they do not depend on
    how the batch is split across ranks and micro-batches."""

    loss: torch.Tensor  # scalar with a graph: the summed per-token objective
    stats: dict[str, float]  # named token sums, e.g. GRPO's pg_loss, kl, clip_fraction


class Loss(Protocol):
    """A policy-gradient objective on per-token tensors.

    Shapes: [B, T] for per-token tensors (T = next-token positions), [B] for per-sample
    ones; `mask` is 1 on completion tokens that count (never prompt or padding)."""

    # Whether the objective reads a frozen reference policy's logprobs: the trainer keeps
    # a reference model (and runs its forward) only when it does.
    uses_reference: bool

    def advantages(self, rewards: torch.Tensor, group_size: int) -> torch.Tensor:
        """[B] advantages of [B] rewards in groups of `group_size` consecutive samples."""
        ...

    def __call__(
        self,
        logprobs: torch.Tensor,
        old_logprobs: torch.Tensor,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        *,
        ref_logprobs: torch.Tensor | None,
        rollout_logprobs: torch.Tensor | None,
    ) -> LossOutput: ...


def build_loss(name: str, cfg: GRPOConfig) -> Loss:
    """The loss `trainer.loss` names, built from its hyperparameters."""
    module = importlib.import_module(loss_module(name))
    build = getattr(module, "build", None)
    if build is None:
        raise ValueError(f"trainer.loss {name!r}: module {module.__name__} defines no build(cfg)")
    return build(cfg)
