"""The trainer's side of an RL step: logprob recomputation and the policy update on a
tensor x pipeline x data parallel layout, and whether its states fit.

Per pass over the batch (N_tok tokens, F(c) forward FLOPs per token at mean context c) on
G = tp * pp * dp GPUs, with M micro-batches per data-parallel rank:

  compute  = N_tok * F(c) / (G * peak)                       (seconds at 100% of peak)
  tp_comm  = M * layers/pp * 2 * all_reduce(one micro-batch's hidden states)   (tp > 1)
  bubble   = 1 + (pp - 1) / M                                (1F1B pipeline fill and drain)
  logprob  = passes * (compute / logprob_mfu + tp_comm) * bubble
  train    = epochs * (3 * compute / train_mfu + 2 * tp_comm) * bubble
             (backward = 2 forwards of FLOPs, and its own 2 all-reduces per layer)

Memory is ZeRO-3 / FSDP (specrl's trainer is FSDP2 + tensor parallel): weights, grads and
optimizer states sharded over all G GPUs. The data-parallel traffic that goes with it
(parameter all-gathers, gradient reduce-scatters) is assumed hidden behind compute by
prefetching and is not in the time: at a large dp over the NIC (e.g. 235B over 512 GPUs,
~9 s per all-gather of a bf16 copy at 50 GB/s) it would not be, so read such a layout's
training time as a lower bound.

Two MFUs: a forward-only pass and a training pass run different kernels and batch shapes
(specrl's CPU trainer measured its forward-only pass at under half the training pass's
FLOP rate)."""

from __future__ import annotations

import math

import numpy as np

from specrl.sim.errors import SimError
from specrl.sim.hardware import Efficiency, Hardware
from specrl.sim.models import ModelShape

OPTIMIZER_BYTES_PER_PARAM = 16  # bf16 weights + bf16 grads + fp32 master, Adam m and v
ACTIVATION_BYTES_PER_TOKEN_LAYER_HIDDEN = 4  # with full activation recomputation (stored inputs)


def trainer_memory_bytes(model: ModelShape, micro_batch_tokens: int, gpus: int) -> float:
    """Per-GPU training memory: weights, grads and Adam states sharded over `gpus`
    (distributed optimizer / FSDP), plus one micro-batch's recomputation checkpoints."""
    return OPTIMIZER_BYTES_PER_PARAM * model.params / gpus + _activation_bytes(model, micro_batch_tokens)


def _activation_bytes(model: ModelShape, micro_batch_tokens: int) -> float:
    return micro_batch_tokens * model.layers * model.hidden * ACTIVATION_BYTES_PER_TOKEN_LAYER_HIDDEN


def check_trainer_fits(model: ModelShape, hw: Hardware, micro_batch_tokens: int, gpus: int) -> None:
    need = trainer_memory_bytes(model, micro_batch_tokens, gpus)
    if need > hw.mem_bytes:
        room = hw.mem_bytes - _activation_bytes(model, micro_batch_tokens)
        hint = (
            f"use at least {int(np.ceil(OPTIMIZER_BYTES_PER_PARAM * model.params / room))} training GPUs"
            if room > 0
            else "one micro-batch's activations alone do not fit: lower micro_batch_tokens"
        )
        raise SimError(
            f"training {model.name} on {gpus} x {hw.name} needs {need / 1e9:.0f} GB per GPU "
            f"(> {hw.mem_bytes / 1e9:.0f} GB): {hint}"
        )


def trainer_seconds(
    *,
    model: ModelShape,
    hw: Hardware,
    eff: Efficiency,
    tokens: float,
    context: float,
    gpus: int,
    tp: int = 1,
    pp: int = 1,
    micro_batch_tokens: int,
    logprob_passes: int,
    epochs: int,
) -> tuple[float, float]:
    """(logprob seconds, train seconds) of one RL step's batch of `tokens` tokens (see the
    module docstring)."""
    if gpus % (tp * pp):
        raise SimError(f"training tp {tp} x pp {pp} must divide the {gpus} training GPUs")
    dp = gpus // (tp * pp)
    micro = max(1, math.ceil(tokens / dp / micro_batch_tokens))
    bubble = 1 + (pp - 1) / micro
    compute = tokens * model.flops_per_token(context) / (gpus * hw.peak_flops)
    tp_comm = 0.0
    if tp > 1:
        message = tokens / dp / micro * model.hidden * hw.dtype_bytes
        all_reduce = eff.collective_latency_s + message * 2 * (tp - 1) / tp / hw.nvlink_bw
        tp_comm = micro * model.layers / pp * 2 * all_reduce
    logprob = logprob_passes * (compute / eff.logprob_mfu + tp_comm) * bubble
    train = epochs * (3 * compute / eff.train_mfu + 2 * tp_comm) * bubble
    return logprob, train
