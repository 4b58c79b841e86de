"""One RL step: data, weight sync, generation, logprob recomputation and the policy update,
synchronous or asynchronous with a policy-lag bound, on a given layout.

  logprob = passes * N_tok * F(c) / (G_train * peak * logprob_mfu)
  train   = epochs * 3 * N_tok * F(c) / (G_train * peak * train_mfu)   (forward + backward = 3x)
(two MFUs: a forward-only pass and a training pass run different kernels and batch shapes;
on specrl's CPU trainer the forward-only pass measured about half as efficient)
  sync    = (policy + draft) weight bytes / TP / link bandwidth + fixed overhead
            (link: NVLink when training and generation share GPUs, the NIC otherwise)
where F(c) is forward FLOPs per token (2 x active params + attention at mean context c).

Synchronous: step = data + sync + gen + logprob + train; all of gen is exposed.
Asynchronous with lag L (disaggregated only): generation for step t+1 runs on its own
GPUs while the trainer works on step t, and up to L batches may be in flight on the
generators (lag L allows starting a batch L steps ahead), so one step's generation costs
generate(L batches together) / L: the next batch fills the slots the long tail leaves.
  exposed = max(0, gen - (logprob + train)),  step = data + sync + logprob + train + exposed.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator
from scipy.stats import lognorm

from specrl.sim.decode import Replica, generate
from specrl.sim.errors import SimError
from specrl.sim.hardware import Efficiency, Hardware
from specrl.sim.models import ModelShape
from specrl.sim.speculation import Speculation

OPTIMIZER_BYTES_PER_PARAM = 16  # bf16 weights + bf16 grads + fp32 master, Adam m and v
ACTIVATION_BYTES_PER_TOKEN_LAYER_HIDDEN = 4  # with full activation recomputation (stored inputs)
REPRESENTATIVES = 256  # quantiles of the length distribution simulated per replica


class Workload(BaseModel):
    """What one RL step generates and trains on."""

    model_config = ConfigDict(frozen=True)

    prompts_per_step: int = Field(gt=0)
    group_size: int = Field(gt=0, description="samples per prompt (the GRPO group)")
    prompt_tokens: int = Field(gt=0)
    response_mean_tokens: float = Field(gt=0, description="mean of the (uncapped) lognormal")
    response_sigma: float = Field(0.8, ge=0, description="lognormal shape: the long tail")
    max_response_tokens: int = Field(gt=0, description="responses are cut here")
    epochs: int = Field(1, gt=0, description="optimizer passes over the batch (PPO epochs)")
    logprob_passes: int = Field(1, ge=0, description="forward-only passes (old policy, reference)")
    micro_batch_tokens: int = Field(16384, gt=0, description="tokens per trainer micro-batch and GPU")

    @property
    def samples(self) -> int:
        return self.prompts_per_step * self.group_size

    def response_lengths(self, count: int = REPRESENTATIVES) -> np.ndarray:
        """`count` equally likely response lengths (quantiles of the capped lognormal), in a
        fixed shuffled order: arrival order does not follow length."""
        q = (np.arange(count) + 0.5) / count
        if self.response_sigma == 0:
            raw = np.full(count, self.response_mean_tokens)
        else:
            median = self.response_mean_tokens * np.exp(-(self.response_sigma**2) / 2)
            raw = lognorm.ppf(q, s=self.response_sigma, scale=median)
        lengths = np.clip(np.round(raw), 1, self.max_response_tokens)
        return np.random.default_rng(0).permutation(lengths)


class Layout(BaseModel):
    """Where generation and training run. Colocated: both on the same GPUs in turn."""

    model_config = ConfigDict(frozen=True)

    gen_gpus: int = Field(gt=0)
    train_gpus: int = Field(gt=0)
    gen_tp: int = Field(1, gt=0, description="GPUs per rollout replica (TP x EP)")
    colocated: bool = False
    max_num_seqs: int = Field(1024, gt=0, description="vLLM's cap on sequences per replica")

    @model_validator(mode="after")
    def _divides(self) -> Layout:
        if self.gen_gpus % self.gen_tp:
            raise SimError(f"gen_tp {self.gen_tp} must divide gen_gpus {self.gen_gpus}")
        if self.colocated and self.gen_gpus != self.train_gpus:
            raise SimError("a colocated layout runs generation and training on the same GPUs")
        return self

    @property
    def replicas(self) -> int:
        return self.gen_gpus // self.gen_tp

    @property
    def total_gpus(self) -> int:
        return self.gen_gpus if self.colocated else self.gen_gpus + self.train_gpus


@dataclass(frozen=True)
class StepResult:
    """Seconds per stage of one (steady-state) RL step, and what each role waits."""

    gen_s: float
    logprob_s: float
    train_s: float
    weight_sync_s: float
    data_s: float
    exposed_gen_s: float
    step_s: float
    idle_gen_s: float
    idle_train_s: float
    acceptance_length: float
    mean_batch: float

    def as_dict(self, digits: int = 4) -> dict[str, float]:
        return {key: round(value, digits) for key, value in asdict(self).items()}


def trainer_memory_bytes(model: ModelShape, workload: Workload, gpus: int) -> float:
    """Per-GPU training memory: weights, grads and Adam states sharded over `gpus`
    (distributed optimizer / FSDP), plus one micro-batch's recomputation checkpoints."""
    return OPTIMIZER_BYTES_PER_PARAM * model.params / gpus + _activation_bytes(model, workload)


def _activation_bytes(model: ModelShape, workload: Workload) -> float:
    return workload.micro_batch_tokens * model.layers * model.hidden * ACTIVATION_BYTES_PER_TOKEN_LAYER_HIDDEN


def check_trainer_fits(model: ModelShape, hw: Hardware, workload: Workload, gpus: int) -> None:
    need = trainer_memory_bytes(model, workload, gpus)
    if need > hw.mem_bytes:
        room = hw.mem_bytes - _activation_bytes(model, workload)
        hint = (
            f"use at least {int(np.ceil(OPTIMIZER_BYTES_PER_PARAM * model.params / room))} training GPUs"
            if room > 0
            else "one micro-batch's activations alone do not fit: lower micro_batch_tokens"
        )
        raise SimError(
            f"training {model.name} on {gpus} x {hw.name} needs {need / 1e9:.0f} GB per GPU "
            f"(> {hw.mem_bytes / 1e9:.0f} GB): {hint}"
        )


def simulate_step(
    *,
    model: ModelShape,
    hw: Hardware,
    eff: Efficiency,
    workload: Workload,
    layout: Layout,
    speculation: Speculation,
    lag: int = 0,
    representatives: int = REPRESENTATIVES,
) -> StepResult:
    """The stage times of one steady-state RL step (see the module docstring);
    `representatives` length quantiles stand for the batch (fewer: faster, coarser)."""
    if lag < 0:
        raise SimError(f"policy lag must be >= 0, got {lag}")
    if lag and layout.colocated:
        raise SimError("asynchronous RL (lag >= 1) needs separate generation and training GPUs")
    check_trainer_fits(model, hw, workload, layout.train_gpus)
    replica = Replica(model, hw, eff, layout.gen_tp, speculation, layout.max_num_seqs)
    # the longest response must fit beside the weights (slots are counted at the mean length)
    replica.kv_slots(workload.prompt_tokens + workload.max_response_tokens)

    in_flight = max(lag, 1)
    lengths = workload.response_lengths(representatives)
    per_replica = in_flight * workload.samples / layout.replicas
    gen = generate(replica, lengths, per_replica / lengths.size, workload.prompt_tokens)
    gen_s = gen.seconds / in_flight

    tokens = workload.samples * (workload.prompt_tokens + float(lengths.mean()))
    context = (workload.prompt_tokens + float(lengths.mean())) / 2
    forward_flops = tokens * model.flops_per_token(context) / (layout.train_gpus * hw.peak_flops)
    logprob_s = workload.logprob_passes * forward_flops / eff.logprob_mfu
    train_s = workload.epochs * 3 * forward_flops / eff.train_mfu

    link = hw.nvlink_bw if layout.colocated else hw.network_bw
    sync_s = replica.weight_bytes / layout.gen_tp / link + eff.sync_overhead_s  # policy + draft
    busy_train = logprob_s + train_s
    exposed = gen_s if lag == 0 else max(0.0, gen_s - busy_train)
    step_s = eff.data_s + sync_s + busy_train + exposed
    shared = layout.colocated
    return StepResult(
        gen_s=gen_s,
        logprob_s=logprob_s,
        train_s=train_s,
        weight_sync_s=sync_s,
        data_s=eff.data_s,
        exposed_gen_s=exposed,
        step_s=step_s,
        idle_gen_s=0.0 if shared else max(0.0, step_s - gen_s - sync_s),
        idle_train_s=0.0 if shared else step_s - busy_train,
        acceptance_length=speculation.acceptance_length,
        mean_batch=gen.mean_batch,
    )
