"""Capacity planner: for a model, a GPU count and a workload, search the split of GPUs
between generation and training, the GPUs per rollout replica, the draft length k and
the policy lag for the fastest RL step whose weights, KV cache and optimizer states fit.

specrl deploys generation and training as separate pods (deploy/helm/specrl), so plans
are disaggregated; the baseline beside each plan is the same layout with AR sync. Plans
use only what the chart deploys: tensor-parallel replicas (the model also takes pipeline
stages and expert parallelism, `Layout.gen_pp` / `gen_ep`, which specrl's engine config
does not set) and a trainer that is tensor parallel inside a node and data parallel
across nodes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specrl.sim.errors import SimError
from specrl.sim.hardware import Efficiency, Hardware
from specrl.sim.models import ModelShape
from specrl.sim.speculation import Speculation
from specrl.sim.step import Layout, StepResult, Workload, simulate_step

MAX_SPLITS = 32  # generation GPU counts tried (evenly spaced when there are more)
REPRESENTATIVES = 64  # length quantiles per simulated batch: coarser than validation, 4x faster
TP_CHOICES = (1, 2, 4, 8, 16)
TIE = 0.01  # steps within 1% of the fastest count as equally fast (below the model's precision)
# The model's held-out error on the paper's step speedups (rms; `specrl simulate validate`,
# docs/bench/simulator.json gpu_fit.held_out_rms_step): the band a planned speedup
# carries, and the margin by which a longer draft (or speculation at all) must beat the
# simpler choice to be recommended.
HELD_OUT_BAND = 0.093


@dataclass(frozen=True)
class Plan:
    """The chosen layout and speculation, its step, and the fastest AR sync step on the
    same GPUs (what the plan replaces), for the workload it was planned for."""

    layout: Layout
    speculation: Speculation
    lag: int
    result: StepResult
    baseline: StepResult
    gpus_per_node: int
    workload: Workload
    band: float = HELD_OUT_BAND

    @property
    def speedup(self) -> float:
        return self.baseline.step_s / self.result.step_s

    def summary(self) -> str:
        """The plan in two lines: the layout and speculation, then the step it predicts."""
        layout, r, spec = self.layout, self.result, self.speculation
        return (
            f"{layout.gen_gpus} generation GPUs ({layout.replicas} replicas x {layout.gen_tp}), "
            f"{layout.train_gpus} training GPUs, {spec.method} k={spec.k} "
            f"(AL {spec.acceptance_length:.2f}), lag {self.lag}\n"
            f"step {r.step_s:.1f} s (gen {r.gen_s:.1f}, exposed {r.exposed_gen_s:.1f}, "
            f"logprob {r.logprob_s:.1f}, train {r.train_s:.1f}, sync {r.weight_sync_s:.1f}); idle: "
            f"generation {r.idle_gen_s:.1f} s, training {r.idle_train_s:.1f} s; "
            f"{self.speedup:.2f}x over the best AR sync layout ({self.baseline.step_s:.1f} s), "
            f"held-out error band +-{self.band:.0%}: {self.speedup * (1 - self.band):.2f}-"
            f"{self.speedup * (1 + self.band):.2f}x"
        )

    def helm_values(self) -> str:
        """The values of deploy/helm/specrl that deploy this plan: rollout replicas (each
        across several pods when its tensor-parallel group outgrows a node) with the
        engine's sequence cap and length the model assumed, trainer nodes x processes, and
        the workload it was planned for (batch, group, length cap; enough Generate calls
        in flight per replica to fill its sequence slots)."""
        layout, work = self.layout, self.workload
        per_node, dp = layout.train_tp, layout.train_dp
        tp = layout.gen_tp
        pods = max(1, tp // self.gpus_per_node)
        if self.speculation.k == 0:
            speculation = "      method: none\n      draft: null\n"
        else:
            speculation = f"      method: {self.speculation.method}\n"
            speculation += f"      num_speculative_tokens: {self.speculation.k}\n"
        return (
            "rollout:\n"
            f"  replicas: {layout.replicas}\n"
            f"  gpusPerReplica: {tp}\n" + (f"  podsPerReplica: {pods}\n" if pods > 1 else "") + "  config:\n"
            "    engine:\n"
            f"      tensor_parallel_size: {tp}\n"
            f"      max_num_seqs: {layout.max_num_seqs}\n"
            f"      max_model_len: {work.max_sequence_tokens()}\n"
            "    speculation:\n" + speculation + "trainer:\n"
            f"  nodes: {dp}\n"
            f"  procsPerNode: {per_node}\n"
            f"  gpusPerNode: {per_node}\n"
            "  config:\n"
            "    trainer:  # tensor parallel inside a node, data parallel across nodes\n"
            f"      tp: {per_node}\n"
            f"      dp: {dp}\n"
            "orchestrator:\n"
            "  config:\n"
            "    data:\n"
            f"      prompts_per_step: {work.prompts_per_step}\n"
            "    sampling:\n"
            f'      "n": {work.group_size}\n'
            f"      max_tokens: {work.max_response_tokens}\n"
            "    orchestrator:\n"
            f"      max_lag: {self.lag}  # slots per replica: from its max_num_seqs and n\n"
        )

    def as_dict(self) -> dict:
        return {
            "layout": self.layout.model_dump(),
            "k": self.speculation.k,
            "method": self.speculation.method,
            "acceptance_length": round(self.speculation.acceptance_length, 3),
            "lag": self.lag,
            "step": self.result.as_dict(),
            "baseline_best_ar_sync": self.baseline.as_dict(),
            "speedup_vs_ar_sync": round(self.speedup, 3),
            "held_out_band": self.band,
            "workload": self.workload.model_dump(),
            "helm_values": self.helm_values(),
        }


def deployable_layout(gen: int, train: int, tp: int, gpus_per_node: int) -> Layout:
    """A disaggregated layout as the chart deploys it: replicas of `tp` GPUs, the trainer
    tensor parallel inside a node and data parallel across nodes."""
    return Layout(gen_gpus=gen, train_gpus=train, gen_tp=tp, train_tp=min(gpus_per_node, train))


def _gen_counts(total: int, tp: int, gpus_per_node: int, samples: int) -> list[int]:
    """Generation GPU counts to try: multiples of whole nodes and replicas whose remaining
    training GPUs give a trainer dp that divides the batch (the trainer refuses a batch
    its ranks cannot share), at most MAX_SPLITS of them, evenly spaced."""
    unit = int(np.lcm(tp, gpus_per_node))
    counts = [
        g
        for g in range(unit, total, unit)
        if samples % deployable_layout(g, total - g, tp, gpus_per_node).train_dp == 0
    ]
    if len(counts) > MAX_SPLITS:
        counts = sorted({counts[int(i)] for i in np.linspace(0, len(counts) - 1, MAX_SPLITS)})
    return counts


def plan(
    *,
    model: ModelShape,
    hw: Hardware,
    eff: Efficiency,
    workload: Workload,
    gpus: int,
    draft: Speculation,
    ks: tuple[int, ...] = (0, 1, 2, 3, 4, 5, 6, 7),
    lags: tuple[int, ...] = (0, 1, 2),
    band: float = HELD_OUT_BAND,
) -> Plan:
    """The fastest feasible (split, TP, k, lag), except that a longer draft must beat the
    shortest one within `band` of it (k=0, AR, first): the model cannot tell steps apart
    closer than its held-out error. An error naming the reason when nothing fits."""
    if gpus < 2 * hw.gpus_per_node or gpus % hw.gpus_per_node:
        raise SimError(
            f"--gpus must be a multiple of {hw.name}'s {hw.gpus_per_node} GPUs per node and at least two "
            f"nodes (generation and training run on separate nodes), got {gpus}"
        )
    reasons: set[str] = set()

    def step(layout: Layout, spec: Speculation, lag: int) -> StepResult | None:
        try:
            return simulate_step(
                model=model,
                hw=hw,
                eff=eff,
                workload=workload,
                layout=layout,
                speculation=spec,
                lag=lag,
                representatives=REPRESENTATIVES,
            )
        except SimError as e:  # this layout does not fit: remember why, try the next
            reasons.add(str(e))
            return None

    candidates: list[tuple[Layout, Speculation, int, StepResult]] = []
    for tp in (t for t in TP_CHOICES if t <= hw.nvlink_domain):
        gens = _gen_counts(gpus, tp, hw.gpus_per_node, workload.samples)
        if not gens:
            reasons.add(
                f"with {tp} GPUs per replica, no split leaves a trainer dp (training nodes) that divides "
                f"the {workload.samples} samples per step"
            )
        for gen in gens:
            layout = deployable_layout(gen, gpus - gen, tp, hw.gpus_per_node)
            for spec in (draft.with_k(k) for k in sorted({0, *ks})):
                for lag in sorted({0, *lags}):
                    result = step(layout, spec, lag)
                    if result is not None:
                        candidates.append((layout, spec, lag, result))
    baseline = min(
        (c[3] for c in candidates if c[1].k == 0 and c[2] == 0), key=lambda r: r.step_s, default=None
    )
    allowed = [c for c in candidates if c[1].k in ks and c[2] in lags]
    if baseline is None or not allowed:
        raise SimError(f"no layout of {gpus} x {hw.name} fits {model.name}: " + "; ".join(sorted(reasons)))
    fastest = min(c[3].step_s for c in allowed)
    best = {k: min(c[3].step_s for c in allowed if c[1].k == k) for k in {c[1].k for c in allowed}}
    k = min(k for k, step_s in best.items() if step_s <= fastest * (1 + band))
    # ties (within TIE of that k's fastest step: e.g. replicas of more GPUs that only
    # shorten the weight push) go to the fewest GPUs per replica (no replica spanning pods
    # where none is needed), then to the fastest generation (the most headroom for the tail)
    tied = [c for c in allowed if c[1].k == k and c[3].step_s <= best[k] * (1 + TIE)]
    layout, spec, lag, result = min(tied, key=lambda c: (c[0].gen_tp, c[3].gen_s))
    return Plan(layout, spec, lag, result, baseline, hw.gpus_per_node, workload, band)
