"""Generation on one rollout replica: a roofline per engine step and a continuous-batching
simulation of a batch of responses whose lengths have a long tail.

One forward over `tokens` query tokens with `batch` sequences of mean context c, on g
tensor-parallel devices per pipeline stage, costs

  t = max(bytes / (g * bw * mem_eff), flops / (g * peak * compute_eff)) + comm + overheads
  bytes = streamed weights + batch * c * KV bytes/token + logits (tokens * vocab * 4 B * 2)
  flops = tokens * flops_per_token(c)
  comm  = per layer (g > 1): 2 all-reduces of the tokens' hidden states over NVLink

Expert parallelism is vLLM's data-parallel attention with expert-parallel MoE layers
(`--data-parallel-size g --enable-expert-parallel`, the layout whose MoE layers use
all-to-all): every device holds every dense weight and the output head and runs its 1/g
of the sequences; the experts are split over the g devices; each MoE layer dispatches
and combines the tokens' top-k copies, (g-1)/g of which leave their device, in two
all-to-alls (uniform routing, no load imbalance).

With pp pipeline stages (each 1/pp of the layers on its own devices; the last also holds
the output head) the batch runs as m = min(pp, batch) micro-batches in flight, as vLLM's
pipeline-parallel engine does, and a step of every sequence takes pp stage times (each
timed as the last, the slowest) plus pp - 1 activation hops. So pipelining divides KV
reads and compute by pp but not weight reads (each micro-batch reads its stage's weights
again): it buys memory capacity, not decode speed.

Decode reads every weight once per step whatever the batch, so small batches are
memory-bound and verifying k+1 tokens per sequence is nearly free there; large batches
approach the compute roof where verification costs k+1 times a plain step. As sequences
finish the batch shrinks (the long tail) and the step slides back to the memory roof,
which is where speculation pays most."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from specrl.sim.errors import SimError
from specrl.sim.hardware import Efficiency, Hardware
from specrl.sim.models import ModelShape
from specrl.sim.speculation import Speculation

LOGIT_BYTES = 4 * 2  # fp32 logits written by the head and read by the sampler


@dataclass(frozen=True)
class Replica:
    """One rollout engine: a model served on `gpus` devices with a speculation config."""

    model: ModelShape
    hw: Hardware
    eff: Efficiency
    gpus: int = 1  # tensor-parallel devices per pipeline stage
    speculation: Speculation = field(default_factory=Speculation)
    max_num_seqs: int = 1024
    pp: int = 1  # pipeline stages
    expert_parallel: bool = False  # MoE experts split over a stage's devices (all-to-all)

    @property
    def devices(self) -> int:
        return self.gpus * self.pp

    @property
    def draft(self) -> ModelShape | None:
        return self.speculation.draft_shape(self.model)

    @property
    def weight_bytes(self) -> float:
        """Weights held across the replica's devices (policy + draft); with expert
        parallelism every device holds its own copy of all but the experts."""
        replicated = 0.0
        if self.expert_parallel:
            shapes = [self.model] + ([self.draft] if self.draft else [])
            replicated = sum(m.params - m.layers * m.experts * m.expert_params for m in shapes)
        draft = self.draft.params if self.draft else 0
        return (self.model.params + draft + (self.gpus - 1) * replicated) * self.hw.dtype_bytes

    def kv_bytes_per_token(self) -> float:
        draft = self.draft.kv_elements_per_token if self.draft else 0
        return (self.model.kv_elements_per_token + draft) * self.hw.dtype_bytes

    def kv_slots(self, tokens_per_sequence: float) -> int:
        """Sequences whose KV cache fits beside the weights (vLLM's memory budget), capped by
        max_num_seqs; a replica whose weights leave no room is an error, not a zero."""
        budget = self.devices * self.hw.mem_bytes * self.eff.kv_fraction - self.weight_bytes
        per_seq = self.kv_bytes_per_token() * tokens_per_sequence
        if budget < per_seq:
            need = (self.weight_bytes + per_seq) / (self.hw.mem_bytes * self.eff.kv_fraction)
            raise SimError(
                f"{self.model.name} does not fit on {self.devices} x {self.hw.name}: weights "
                f"{self.weight_bytes / 1e9:.1f} GB + one sequence's KV {per_seq / 1e9:.2f} GB exceed "
                f"{self.eff.kv_fraction:.0%} of {self.devices * self.hw.mem_bytes / 1e9:.0f} GB; "
                f"use at least {int(np.ceil(need))} GPUs per replica"
            )
        return int(min(self.max_num_seqs, budget // per_seq))

    def forward_seconds(self, shape: ModelShape, batch: float, query: int, context: float) -> float:
        """Roofline time of one forward of `shape` over `batch` sequences x `query` tokens
        through every pipeline stage (see the module docstring)."""
        hw, eff, g, pp = self.hw, self.eff, self.gpus, self.pp
        micro = max(1.0, min(pp, batch))  # micro-batches in flight
        tokens = batch / micro * query  # per micro-batch
        head = shape.head_params + shape.extra_params  # on the last stage
        dense = shape.layers * shape.dense_layer_params
        experts = shape.streamed_params(tokens) - dense - head  # the experts the tokens reach
        layer_flops = tokens * (shape.flops_per_token(context) - 2.0 * head)
        kv = batch / micro * context * shape.kv_elements_per_token
        logits = tokens * shape.vocab * LOGIT_BYTES
        if self.expert_parallel:  # per device: all dense weights, 1/g of experts and sequences
            weights = (dense / pp + head) + experts / pp / g
            device_bytes = weights * hw.dtype_bytes + (kv / pp * hw.dtype_bytes + logits) / g
        else:  # per device: 1/g of everything
            device_bytes = ((dense + experts) / pp + head + kv / pp) * hw.dtype_bytes / g + logits / g
        device_flops = (layer_flops / pp + tokens * 2.0 * head) / g
        stage = max(
            device_bytes / (hw.mem_bw * eff.mem_eff), device_flops / (hw.peak_flops * eff.compute_eff)
        )
        stage += shape.layers / pp * (self._layer_comm_seconds(shape, tokens) + eff.layer_overhead_s)
        hops = 0.0
        if pp > 1:  # the activations' way to the next stage, inside the NVLink domain or not
            link = hw.nvlink_bw if self.devices <= hw.nvlink_domain else hw.network_bw
            hops = (pp - 1) * (eff.collective_latency_s + tokens * shape.hidden * hw.dtype_bytes / link)
        return pp * stage + hops

    def _layer_comm_seconds(self, shape: ModelShape, tokens: float) -> float:
        """One layer's collectives over a stage's g devices for `tokens` tokens."""
        g, hw, latency = self.gpus, self.hw, self.eff.collective_latency_s
        if g == 1:
            return 0.0
        hidden_bytes = tokens * shape.hidden * hw.dtype_bytes
        if not self.expert_parallel:  # tensor parallel: attention and MLP outputs, ring
            return 2 * (latency + hidden_bytes * 2 * (g - 1) / g / hw.nvlink_bw)
        if not shape.is_moe:  # data parallel: nothing to exchange
            return 0.0
        # dispatch and combine: each device's 1/g of the tokens, top-k copies, (g-1)/g leave
        return 2 * (latency + hidden_bytes / g * shape.experts_per_token * (g - 1) / g / hw.nvlink_bw)

    def step_seconds(self, batch: float, context: float) -> float:
        """One engine step: k sequential draft forwards, then the target verifying k+1
        tokens per sequence (k = 0: a plain decode step)."""
        k = self.speculation.k
        verify = self.forward_seconds(self.model, batch, k + 1, context)
        eff = self.eff
        step = verify + eff.step_overhead_s + eff.token_overhead_s * batch * (k + 1)
        step += eff.emit_overhead_s * batch * self.speculation.acceptance_length
        if k:
            draft = self.draft
            step += eff.spec_step_overhead_s
            if draft is not None:  # the first forward runs over the step's k+1 verified positions
                fixed = eff.draft_overhead_s
                if self.speculation.method == "draft_model":
                    fixed += eff.draft_model_overhead_s
                step += self.forward_seconds(draft, batch, k + 1, context) + fixed
                step += (k - 1) * (self.forward_seconds(draft, batch, 1, context) + fixed)
            elif self.speculation.method == "ngram":  # the lookup scans each context on the host
                step += eff.ngram_lookup_s * batch * context
        return step

    def tokens_per_second(self, batch: float, context: float) -> float:
        """Steady-state output rate at a fixed batch (no tail)."""
        return batch * self.speculation.acceptance_length / self.step_seconds(batch, context)

    def prefill_seconds(self, prompts: float, prompt_tokens: float) -> float:
        """One forward over `prompts` prompts of `prompt_tokens` tokens (rounded up)."""
        tokens = int(np.ceil(prompt_tokens))
        return self.forward_seconds(self.model, prompts, tokens, tokens / 2)


@dataclass(frozen=True)
class Generation:
    """What generating one set of responses on one replica costs."""

    seconds: float
    engine_steps: float
    mean_batch: float
    tokens: float


def generate(
    replica: Replica, lengths: np.ndarray, weight: float, prompt_tokens: float | np.ndarray
) -> Generation:
    """Continuous batching of responses of `lengths` tokens after prompts of
    `prompt_tokens` (one length for all, or one per response), each standing for `weight`
    sequences, admitted in the given order as KV slots free up. Every step advances each
    running sequence by the acceptance length (in expectation), so a response of R tokens
    needs R / AL steps; time is integrated between completions with the step cost at the
    interval's mean context. The sequences admitted together are prefilled together at
    their mean prompt length."""
    lengths = np.asarray(lengths, dtype=float)
    if lengths.size == 0:
        return Generation(0.0, 0.0, 0.0, 0.0)
    prompts = np.broadcast_to(np.asarray(prompt_tokens, dtype=float), lengths.shape)
    if np.any(lengths <= 0) or np.any(prompts <= 0) or weight <= 0:
        raise SimError("prompt and response lengths and their weight must be positive")
    al = replica.speculation.acceptance_length
    slots = replica.kv_slots(float(prompts.mean()) + float(lengths.mean()))
    capacity = max(1, int(slots // weight))
    pending = list(zip(lengths[::-1], prompts[::-1]))  # pop() from the end admits in order
    remaining = np.empty(0)
    context = np.empty(0)
    seconds = steps = batch_steps = 0.0
    while pending or remaining.size:
        admit = min(capacity - remaining.size, len(pending))
        if admit:
            new, new_prompts = np.array([pending.pop() for _ in range(admit)]).T
            remaining = np.concatenate([remaining, new])
            context = np.concatenate([context, new_prompts])
            seconds += replica.prefill_seconds(admit * weight, float(new_prompts.mean()))
        n = float(remaining.min()) / al
        batch = remaining.size * weight
        seconds += n * replica.step_seconds(batch, float(context.mean()) + al * n / 2)
        steps += n
        batch_steps += n * batch
        remaining = remaining - al * n
        context = context + al * n
        keep = remaining > 1e-9
        remaining, context = remaining[keep], context[keep]
    return Generation(seconds, steps, batch_steps / steps, float(lengths.sum() * weight))
