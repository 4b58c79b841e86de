"""One training step on the global batch: the behaviour policy's logprobs once (the pass
that also captures features for the draft-trainer), then `grpo.epochs` optimizer steps
over the whole batch against them (PPO epochs). The loss is whatever `trainer.loss`
built; this module knows none of its terms.

Losses are token-level: every micro-batch adds sum(per-token objective) / (global
completion tokens), and data-parallel ranks scale by dp because FSDP averages gradients,
so the result does not depend on how the batch is split across ranks or micro-batches.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from specrl.trainer import parallel
from specrl.trainer.batch import TrainBatch
from specrl.trainer.logprobs import Mismatch, local_rows, logprobs, micro_batches, mismatch
from specrl.trainer.model import forward
from specrl.trainer.state import TrainState

# The statistics every step reports besides its loss's: the objective (token mean),
# the policy's entropy on the completion tokens and the global gradient norm.
STEP_STATS = ("loss", "entropy", "grad_norm")


@dataclass
class StepMetrics:
    """What a step reports; the service sends it as the StepMetrics message field by field
    (same names) and exports `stats` under their own names."""

    # STEP_STATS and the loss's statistics, by name; token means except grad_norm; the
    # last epoch's
    stats: dict[str, float]
    tokens: int
    logprob_seconds: float
    train_seconds: float
    advantages_nonzero: float
    mismatch: Mismatch | None = None


def train_step(state: TrainState, batch: TrainBatch, group_size: int) -> StepMetrics:
    """One step on the global batch (groups of `group_size` consecutive samples); the
    policy version advances by one, whatever the number of epochs."""
    t0 = time.perf_counter()
    version = state.step_count  # the policy the batch's old logprobs come from
    batch = batch.to(state.device)
    old = logprobs(state, batch, capture=True)
    ref = logprobs(state, batch, reference=True) if state.reference is not None else None
    t1 = time.perf_counter()
    advantages = state.loss.advantages(batch.rewards, group_size)
    total_tokens = batch.mask.sum()
    state.model.train()
    for _ in range(state.cfg.grpo.epochs):
        sums, grad_norm = _update(state, batch, old, ref, advantages, total_tokens)
    state.step_count += 1
    t2 = time.perf_counter()
    totals = _sum_over_dp(sums, state.dims)
    n = total_tokens.item()
    return StepMetrics(
        stats={**{k: v / n for k, v in totals.items()}, "grad_norm": grad_norm},
        tokens=int(n),
        logprob_seconds=t1 - t0,
        train_seconds=t2 - t1,
        advantages_nonzero=(advantages != 0).float().mean().item(),
        mismatch=mismatch(old, batch.rollout_logprobs, batch.mask_of_version(version)),
    )


def _update(
    state: TrainState,
    batch: TrainBatch,
    old: torch.Tensor,
    ref: torch.Tensor | None,
    advantages: torch.Tensor,
    total_tokens: torch.Tensor,
) -> tuple[dict[str, float], float]:
    """One optimizer step over this rank's share of the batch, in micro-batches; returns
    this rank's token sums of the objective, entropy and the loss's statistics, and the
    global gradient norm."""
    dims, model = state.dims, state.model
    local, rows = local_rows(batch, dims)
    state.optimizer.zero_grad(set_to_none=True)
    sums: dict[str, float] = {"loss": 0.0, "entropy": 0.0}
    for s in micro_batches(local.size, state.cfg.micro_batch_size):
        mb = local.rows(s)
        idx = slice(rows.start + s.start, rows.start + s.stop)
        f = forward(model, mb)
        entropy = f.entropy()
        out = state.loss(
            f.tokens,
            old[idx],
            advantages[idx],
            mb.mask,
            ref_logprobs=None if ref is None else ref[idx],
            rollout_logprobs=mb.rollout_logprobs,
        )
        if clash := set(STEP_STATS) & out.stats.keys():
            raise ValueError(f"trainer.loss {state.cfg.loss!r} reports {sorted(clash)}: the step's own")
        # FSDP averages gradients over DP ranks; scale so the result is the global sum
        (out.loss * (dims.dp / total_tokens)).backward()
        sums["loss"] += out.loss.item()
        for k, v in out.stats.items():
            sums[k] = sums.get(k, 0.0) + v
        sums["entropy"] += (entropy.detach() * mb.mask).sum().item()
    parallel.sync_tp_partial_grads(model)
    grad_norm = parallel.clip_grad_norm(list(model.parameters()), state.cfg.optim.grad_clip)
    for group in state.optimizer.param_groups:
        group["lr"] = state.learning_rate()
    state.optimizer.step()
    return sums, grad_norm


def _sum_over_dp(sums: dict[str, float], dims: parallel.ParallelDims) -> dict[str, float]:
    if dims.dp == 1:
        return sums
    keys = sorted(sums)  # the same order on every rank
    t = torch.tensor([sums[k] for k in keys], dtype=torch.float64)
    dist.all_reduce(t, group=dims.dp_group)
    return dict(zip(keys, t.tolist()))
