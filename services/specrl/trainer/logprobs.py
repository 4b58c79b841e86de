"""Logprobs of the global batch under the policy or its reference: the old-logprob pass of
every step (which also feeds the capturer) and `ComputeLogprobs`.

Every rank calls with the same global batch (rank 0 receives it and the service
broadcasts it); each data-parallel rank takes its contiguous share of the rows,
tensor-parallel ranks the same rows, in micro-batches of `trainer.micro_batch_size`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from specrl.features import Captured
from specrl.trainer.batch import TrainBatch
from specrl.trainer.model import forward
from specrl.trainer.parallel import ParallelDims
from specrl.trainer.state import TrainState


def local_rows(batch: TrainBatch, dims: ParallelDims) -> tuple[TrainBatch, slice]:
    """This data-parallel rank's contiguous rows of the global batch."""
    if batch.size % dims.dp:
        raise ValueError(f"batch of {batch.size} does not split across dp={dims.dp} ranks")
    n = batch.size // dims.dp
    rows = slice(dims.dp_rank * n, (dims.dp_rank + 1) * n)
    return batch.rows(rows), rows


def micro_batches(size: int, micro_batch_size: int) -> list[slice]:
    return [slice(i, min(i + micro_batch_size, size)) for i in range(0, size, micro_batch_size)]


@torch.no_grad()
def logprobs(
    state: TrainState, batch: TrainBatch, *, reference: bool = False, capture: bool = False
) -> torch.Tensor:
    """Next-token logprobs [B, L-1] of the global batch under the current policy (or the
    frozen reference), computed in micro-batches and gathered across DP ranks. With
    `capture`, the same forward also hands the draft-trainer its features."""
    model = state.reference if reference else state.model
    if model is None:
        raise ValueError(f"no reference policy (trainer.loss {state.cfg.loss!r} reads none)")
    capturer = state.capturer if capture and not reference else None
    dims = state.dims
    local, _ = local_rows(batch.to(state.device), dims)
    parts, taken = [], []
    for s in micro_batches(local.size, state.cfg.micro_batch_size):
        mb = local.rows(s)
        f = forward(model, mb, hidden_states=capturer is not None)
        if capturer is not None:
            assert f.hidden_states is not None
            taken.append(
                capturer.capture(
                    f.hidden_states, f.logp, mb.input_ids, mb.attention_mask, mb.mask, state.step_count
                )
            )
        parts.append(f.tokens)
    if capturer is not None:
        for c in _gather_captures(taken, dims):
            capturer.queue.put(c)
    out = torch.cat(parts)
    if dims.dp > 1:
        gathered = [torch.empty_like(out) for _ in range(dims.dp)]
        dist.all_gather(gathered, out, group=dims.dp_group)
        out = torch.cat(gathered)
    return out


def _gather_captures(taken: list[Captured], dims: ParallelDims) -> list[Captured]:
    """Every DP rank's captured micro-batches, in rank order, on DP rank 0 (the one that
    serves them to the draft-trainer); an empty list on the others. Only the TP-rank-0
    ranks capture, and the DP group of TP rank 0 is exactly them."""
    if dims.dp == 1:
        return taken
    gathered: list[list[Captured]] | None = [[] for _ in range(dims.dp)] if dims.dp_rank == 0 else None
    dist.gather_object(taken, gathered, dst=dist.get_global_rank(dims.dp_group, 0), group=dims.dp_group)
    return [c for part in gathered for c in part] if gathered is not None else []


@dataclass
class Mismatch:
    """Training-inference mismatch on completion tokens: mean(rollout - trainer) logprob
    (an estimate of KL(engine || trainer) on the engine's samples) and the max |diff|."""

    kl: float
    max_abs: float
    tokens: int


def mismatch(trainer: torch.Tensor, rollout: torch.Tensor | None, mask: torch.Tensor) -> Mismatch | None:
    if rollout is None:
        return None
    on = mask.bool()
    diff = (rollout - trainer)[on]
    if diff.numel() == 0:
        return Mismatch(0.0, 0.0, 0)
    return Mismatch(diff.mean().item(), diff.abs().max().item(), int(diff.numel()))
