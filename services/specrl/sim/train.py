"""The trainer's side of an RL step: logprob recomputation and the policy update on a
tensor x pipeline x data parallel layout, and whether its states fit.

Per pass over the batch (N_tok tokens, F(c) forward FLOPs per token at mean context c) on
G = tp * pp * dp GPUs, with M micro-batches per data-parallel rank:

  forward  = (N_tok * F(c) / (G * peak * mfu) + M * layers/pp * 2 * all_reduce(tp)) * bubble
  bubble   = 1 + (pp - 1) / M                               (1F1B pipeline fill and drain)
  logprob  = passes * forward                                (logprob_mfu)
  train    = epochs * (3 * forward + the data-parallel gradient sync the backward pass
             does not hide)                                  (train_mfu; backward = 2 forwards,
                                                              with its own 2 all-reduces per layer)
  grad sync = reduce-scatter + all-gather of the bf16 shard of weights over dp
             (NVLink inside the NVLink domain, the NIC beyond it)

Two MFUs: a forward-only pass and a training pass run different kernels and batch shapes
(specrl's CPU trainer measured its forward-only pass at under half the training pass's
FLOP rate). The MFUs are the kernels' efficiency: tensor-parallel all-reduces, pipeline
bubbles and exposed gradient sync are added explicitly."""

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
    flops_s = tokens * model.flops_per_token(context) / (gpus * hw.peak_flops)  # at 100% of peak
    all_reduce = 0.0
    if tp > 1:
        message = tokens / dp / micro * model.hidden * hw.dtype_bytes
        all_reduce = eff.collective_latency_s + message * 2 * (tp - 1) / tp / hw.nvlink_bw
    tp_comm = micro * model.layers / pp * 2 * all_reduce  # one forward's all-reduces
    logprob = logprob_passes * (flops_s / eff.logprob_mfu + tp_comm) * bubble
    forward = flops_s / eff.train_mfu
    train_pass = (3 * forward + 2 * tp_comm) * bubble  # forward and backward all-reduce
    grad_sync = 0.0
    if dp > 1:
        link = hw.nvlink_bw if gpus <= hw.nvlink_domain else hw.network_bw
        shard = model.params / (tp * pp) * hw.dtype_bytes
        grad_sync = 2 * shard * (dp - 1) / dp / link
    exposed_sync = max(0.0, grad_sync - 2 * forward * bubble)  # overlapped with the backward pass
    return logprob, epochs * (train_pass + exposed_sync)
