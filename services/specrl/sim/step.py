"""One RL step: data, weight sync, generation, logprob recomputation and the policy update,
synchronous or asynchronous with a policy-lag bound, on a given layout.

  gen     = continuous batching on each replica (decode.py), the batch split evenly
  logprob, train: train.py (tensor x pipeline x data parallel, explicit communication)
  sync    = (policy + draft) weight bytes / GPUs per replica / link bandwidth + fixed overhead
            (link: NVLink when training and generation share GPUs, the NIC otherwise)

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
from specrl.sim.train import check_trainer_fits, trainer_seconds

REPRESENTATIVES = 256  # quantiles of the length distribution simulated per replica


class Workload(BaseModel):
    """What one RL step generates and trains on."""

    model_config = ConfigDict(frozen=True)

    prompts_per_step: int = Field(gt=0)
    group_size: int = Field(gt=0, description="samples per prompt (the GRPO group)")
    prompt_tokens: int = Field(gt=0, description="mean prompt length")
    prompt_sigma: float = Field(0.0, ge=0, description="lognormal shape of prompt lengths (0: all equal)")
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
        raw = _lognormal_quantiles(self.response_mean_tokens, self.response_sigma, count)
        lengths = np.clip(np.round(raw), 1, self.max_response_tokens)
        return np.random.default_rng(0).permutation(lengths)

    def prompt_lengths(self, count: int = REPRESENTATIVES) -> np.ndarray:
        """`count` equally likely prompt lengths, in another fixed order than the responses'
        (a prompt's length says nothing of its response's)."""
        raw = _lognormal_quantiles(self.prompt_tokens, self.prompt_sigma, count)
        return np.random.default_rng(1).permutation(np.maximum(np.round(raw), 1))

    def max_sequence_tokens(self, count: int = REPRESENTATIVES) -> int:
        """The longest of `count` prompt lengths plus the response cap: what a replica's KV
        and vLLM's max_model_len must hold."""
        return int(self.prompt_lengths(count).max()) + self.max_response_tokens


def _lognormal_quantiles(mean: float, sigma: float, count: int) -> np.ndarray:
    if sigma == 0:
        return np.full(count, float(mean))
    q = (np.arange(count) + 0.5) / count
    return lognorm.ppf(q, s=sigma, scale=mean * np.exp(-(sigma**2) / 2))


class Layout(BaseModel):
    """Where generation and training run. Colocated: both on the same GPUs in turn."""

    model_config = ConfigDict(frozen=True)

    gen_gpus: int = Field(gt=0)
    train_gpus: int = Field(gt=0)
    gen_tp: int = Field(1, gt=0, description="tensor-parallel GPUs per pipeline stage of a replica")
    gen_pp: int = Field(1, gt=0, description="pipeline stages per replica")
    gen_ep: bool = Field(False, description="MoE experts expert-parallel over a stage's GPUs")
    train_tp: int = Field(1, gt=0, description="trainer tensor parallel")
    train_pp: int = Field(1, gt=0, description="trainer pipeline stages (data parallel: the rest)")
    colocated: bool = False
    max_num_seqs: int = Field(1024, gt=0, description="vLLM's cap on sequences per replica")

    @model_validator(mode="after")
    def _divides(self) -> Layout:
        if self.gen_gpus % self.gpus_per_replica:
            raise SimError(
                f"gen_tp {self.gen_tp} x gen_pp {self.gen_pp} must divide gen_gpus {self.gen_gpus}"
            )
        if self.train_gpus % (self.train_tp * self.train_pp):
            raise SimError(
                f"train_tp {self.train_tp} x train_pp {self.train_pp} must divide "
                f"train_gpus {self.train_gpus}"
            )
        if self.colocated and self.gen_gpus != self.train_gpus:
            raise SimError("a colocated layout runs generation and training on the same GPUs")
        return self

    @property
    def gpus_per_replica(self) -> int:
        return self.gen_tp * self.gen_pp

    @property
    def replicas(self) -> int:
        return self.gen_gpus // self.gpus_per_replica

    @property
    def train_dp(self) -> int:
        return self.train_gpus // (self.train_tp * self.train_pp)

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
    check_trainer_fits(model, hw, workload.micro_batch_tokens, layout.train_gpus)
    replica = Replica(
        model,
        hw,
        eff,
        layout.gen_tp,
        speculation,
        layout.max_num_seqs,
        pp=layout.gen_pp,
        expert_parallel=layout.gen_ep,
    )
    # the longest sequence must fit beside the weights (slots are counted at the mean length)
    replica.kv_slots(workload.max_sequence_tokens(representatives))

    in_flight = max(lag, 1)
    lengths = workload.response_lengths(representatives)
    prompts = workload.prompt_lengths(representatives)
    per_replica = in_flight * workload.samples / layout.replicas
    gen = generate(replica, lengths, per_replica / lengths.size, prompts)
    gen_s = gen.seconds / in_flight

    sequence = float(prompts.mean() + lengths.mean())
    logprob_s, train_s = trainer_seconds(
        model=model,
        hw=hw,
        eff=eff,
        tokens=workload.samples * sequence,
        context=sequence / 2,
        gpus=layout.train_gpus,
        tp=layout.train_tp,
        pp=layout.train_pp,
        micro_batch_tokens=workload.micro_batch_tokens,
        logprob_passes=workload.logprob_passes,
        epochs=workload.epochs,
    )

    link = hw.nvlink_bw if layout.colocated else hw.network_bw
    sync_s = replica.weight_bytes / layout.gpus_per_replica / link + eff.sync_overhead_s  # policy + draft
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
