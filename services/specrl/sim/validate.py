"""The validation table: the paper's published points beside what the model predicts from
the inputs the paper states, with the error of each.

What the paper does not state is an assumption written down here once (the workloads,
the EAGLE-3 acceptance at 8B, the n-gram draft length) and never adjusted per point. A
row is `bounded` when docs/simulator.md sets an error bound for it in advance (the test
regenerates the table and checks those bounds); rows that depend only on assumed inputs,
or that miss for a reason the model does not cover, say why they are not bounded.
`implied_acceptance_length` answers the inverse question for speedup rows: what
acceptance length would make the model match the paper."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from scipy.optimize import brentq

from specrl.sim.hardware import GPU_EFFICIENCY, get_hardware
from specrl.sim.models import ModelShape, get_model
from specrl.sim.planner import plan
from specrl.sim.speculation import Speculation
from specrl.sim.step import Layout, StepResult, Workload, simulate_step

RATIO_BOUND = 0.35  # |predicted / paper - 1| for the bounded rows (docs/simulator.md)
# Ratio rows the bound was set for and the model misses, with the reason (docs/simulator.md,
# "misses"): they stay in the table, outside the bounded set.
K_TREND_MISS = (
    "miss: decode of 8B on GB200 is memory-bound here, so verifying k+1 tokens is nearly free and "
    "the roofline cannot produce the paper's drop past k=3 (it needs per-draft-position engine costs)"
)
MISSES = {
    "8b_rlthink_gen_speedup_k3": "miss: RL-Think acceptance is not stated; the model matches at AL ~1.8, "
    "below the assumed 3 (the paper: reasoning traces are harder to draft)",
    "8b_rlzero_gen_speedup_k5": K_TREND_MISS,
    "8b_rlzero_gen_speedup_k7": K_TREND_MISS,
    "8b_rlthink_gen_speedup_k5": K_TREND_MISS,
    "8b_rlthink_gen_speedup_k7": K_TREND_MISS,
    "235b_2048_async_lag2_rollout_speedup": "miss: the paper's 2048-GPU split is not stated; on the "
    "planner's split the model gives the same ~2.2x as at 512 GPUs (rollout speedup depends on batch "
    "per replica and acceptance, not on lag), the paper ~3.5x",
    "235b_2048_async_lag2_e2e_speedup": "miss: the paper's baseline is not stated; against AR sync "
    "colocated on the same GPUs the model's lag-2 split hides most of the generation behind "
    "training (docs/simulator.md), so its end-to-end gain exceeds the paper's",
}

# Assumed workloads (the paper names DAPO-Math, not its batch): the DAPO recipe's 512
# prompts x 16 samples and 20480-token cap, a 200-token prompt, lognormal lengths with a
# long tail (sigma 1); RL-Zero starts from a base model with short answers, RL-Think
# continues a reasoning model with long traces.
RL_ZERO = Workload(
    prompts_per_step=512,
    group_size=16,
    prompt_tokens=200,
    response_mean_tokens=1500,
    response_sigma=1.0,
    max_response_tokens=20480,
)
RL_THINK = RL_ZERO.model_copy(update={"response_mean_tokens": 5000})
# EAGLE-3 acceptance: the only value the paper states is acceptance length 3 at k = 3
# (the 235B projection); it is assumed for 8B too, geometric over positions.
EAGLE3 = Speculation.from_acceptance_length("eagle3", 3, 3.0)
NGRAM_K = 3  # the paper states n-gram acceptance lengths, not its k

QWEN3_8B, QWEN3_235B, GB200 = get_model("qwen3-8b"), get_model("qwen3-235b-a22b"), get_hardware("gb200")
COLOCATED_32 = Layout(gen_gpus=32, train_gpus=32, colocated=True)
ASYNC_16_NODES = Layout(gen_gpus=48, train_gpus=16)  # 12 generation + 4 training nodes
COLOCATED_512 = Layout(gen_gpus=512, train_gpus=512, gen_tp=8, colocated=True)
COLOCATED_2048 = COLOCATED_512.model_copy(update={"gen_gpus": 2048, "train_gpus": 2048})


@dataclass(frozen=True)
class Point:
    """One published number and how the model reproduces it."""

    name: str
    paper_value: float
    predict: Callable[[Speculation], float]  # model's value given the speculation
    speculation: Speculation | None
    source: str
    bounded: bool
    note: str

    def row(self) -> dict:
        spec = self.speculation or Speculation()
        predicted = self.predict(spec)
        bounded = self.bounded and self.name not in MISSES
        return {
            "name": self.name,
            "paper_value": self.paper_value,
            "predicted": round(predicted, 3),
            "rel_error": round(predicted / self.paper_value - 1, 3),
            "bounded": bounded,
            "bound": RATIO_BOUND if bounded else None,
            "acceptance_length": round(spec.acceptance_length, 3),
            "implied_acceptance_length": self._implied(),
            "source": self.source,
            "note": MISSES.get(self.name, self.note),
        }

    def _implied(self) -> float | None:
        """The acceptance length at this k for which the model gives the paper's value."""
        spec = self.speculation
        if spec is None or spec.k == 0:
            return None
        k = spec.k

        def gap(length: float) -> float:
            return self.predict(Speculation.from_acceptance_length(spec.method, k, length)) - self.paper_value

        low, high = gap(1.0), gap(k + 1.0)
        if low * high > 0:
            return None
        return round(float(brentq(gap, 1.0, k + 1.0, xtol=1e-3)), 2)


Predict = Callable[[Speculation], float]
WORKLOAD_NOTE = "absolute seconds depend on the assumed workload (batch, lengths): not bounded"


def scenario_step(
    workload: Workload, layout: Layout, spec: Speculation, lag: int = 0, model: ModelShape = QWEN3_8B
) -> StepResult:
    """One RL step of the paper's setting: GB200 with the GPU priors."""
    return simulate_step(
        model=model, hw=GB200, eff=GPU_EFFICIENCY, workload=workload, layout=layout, speculation=spec, lag=lag
    )


def _seconds(stage: str, workload: Workload, layout: Layout, lag: int = 0) -> Predict:
    return lambda spec: getattr(scenario_step(workload, layout, spec, lag), stage)


def _speedup(
    stage: str, workload: Workload, layout: Layout, lag: int = 0, model: ModelShape = QWEN3_8B
) -> Predict:
    """`stage` seconds without speculation over with it, on the same layout and lag."""
    ar = getattr(scenario_step(workload, layout, Speculation(), lag, model), stage)
    return lambda spec: ar / getattr(scenario_step(workload, layout, spec, lag, model), stage)


def _large_async() -> tuple[Layout, Predict]:
    """235B on 2048 GB200, lag 2: the split the planner picks for k = 3, and the end-to-end
    speedup over AR sync colocated on the same 2048 GPUs."""
    chosen = plan(
        model=QWEN3_235B,
        hw=GB200,
        eff=GPU_EFFICIENCY,
        workload=RL_THINK,
        gpus=2048,
        draft=EAGLE3,
        ks=(3,),
        lags=(2,),
    )
    baseline = scenario_step(RL_THINK, COLOCATED_2048, Speculation(), model=QWEN3_235B).step_s
    return (
        chosen.layout,
        lambda spec: baseline / scenario_step(RL_THINK, chosen.layout, spec, 2, QWEN3_235B).step_s,
    )


def _ratio(name: str, paper: float, predict: Predict, spec: Speculation, source: str, note: str) -> Point:
    """A speedup row: bounded unless it is a documented miss."""
    return Point(name, paper, predict, spec, source, True, note)


def _absolute(name: str, paper: float, predict: Predict, spec: Speculation | None, source: str) -> Point:
    return Point(name, paper, predict, spec, source, False, WORKLOAD_NOTE)


def points() -> list[Point]:
    """Every published point, in the paper's order."""
    assumed = "acceptance assumed (AL 3 at k=3)"
    stated = "stated inputs: k=3, AL 3; workload assumed"
    rows = []
    for label, workload, gen in (
        ("rlzero", RL_ZERO, (100.0, 56.6, 1.77, 1.41)),
        ("rlthink", RL_THINK, (133.6, 87.0, 1.53, 1.35)),
    ):
        ar_s, eagle_s, gen_speedup, step_speedup = gen
        rows += [
            _absolute(
                f"8b_{label}_gen_ar_s",
                ar_s,
                _seconds("gen_s", workload, COLOCATED_32),
                None,
                "headline table",
            ),
            _absolute(
                f"8b_{label}_gen_eagle3_s",
                eagle_s,
                _seconds("gen_s", workload, COLOCATED_32),
                EAGLE3,
                "headline table",
            ),
            _ratio(
                f"8b_{label}_gen_speedup_k3",
                gen_speedup,
                _speedup("gen_s", workload, COLOCATED_32),
                EAGLE3,
                "draft length finding",
                assumed,
            ),
            _ratio(
                f"8b_{label}_step_speedup",
                step_speedup,
                _speedup("step_s", workload, COLOCATED_32),
                EAGLE3,
                "headline table",
                assumed,
            ),
        ]
    trend = "acceptance extrapolated geometrically from AL 3 at k=3"
    for label, workload, values in (("rlzero", RL_ZERO, (1.44, 1.21)), ("rlthink", RL_THINK, (0.84, 0.71))):
        for k, value in zip((5, 7), values):
            rows.append(
                _ratio(
                    f"8b_{label}_gen_speedup_k{k}",
                    value,
                    _speedup("gen_s", workload, COLOCATED_32),
                    EAGLE3.with_k(k),
                    "draft length finding",
                    trend,
                )
            )
    for label, workload, length, value in (("rlzero", RL_ZERO, 2.47, 0.7), ("rlthink", RL_THINK, 2.05, 0.5)):
        spec = Speculation.from_acceptance_length("ngram", NGRAM_K, length)
        rows.append(
            Point(
                f"8b_{label}_ngram_gen_speedup",
                value,
                _speedup("gen_s", workload, COLOCATED_32),
                spec,
                "n-gram finding",
                False,
                "stated AL; the slowdown comes from engine costs the roofline lacks (see docs)",
            )
        )
    exposed = _seconds("exposed_gen_s", RL_THINK, ASYNC_16_NODES, lag=1)
    large_layout, large_e2e = _large_async()
    rows += [
        _absolute("8b_async_lag1_exposed_gen_ar_s", 10.4, exposed, None, "async finding"),
        _absolute("8b_async_lag1_exposed_gen_eagle3_s", 0.6, exposed, EAGLE3, "async finding"),
        _ratio(
            "8b_async_lag1_step_speedup",
            round(75.0 / 60.5, 3),
            _speedup("step_s", RL_THINK, ASYNC_16_NODES, 1),
            EAGLE3,
            "async finding",
            assumed,
        ),
        _ratio(
            "235b_512_sync_rollout_speedup",
            2.72,
            _speedup("gen_s", RL_THINK, COLOCATED_512, model=QWEN3_235B),
            EAGLE3,
            "235B projection",
            stated,
        ),
        _ratio(
            "235b_512_sync_e2e_speedup",
            1.70,
            _speedup("step_s", RL_THINK, COLOCATED_512, model=QWEN3_235B),
            EAGLE3,
            "235B projection",
            stated,
        ),
        _ratio(
            "235b_2048_async_lag2_rollout_speedup",
            3.5,
            _speedup("gen_s", RL_THINK, large_layout, 2, QWEN3_235B),
            EAGLE3,
            "235B projection",
            f"planner's split {large_layout.gen_gpus} gen / {large_layout.train_gpus} train, AR on it",
        ),
        _ratio(
            "235b_2048_async_lag2_e2e_speedup",
            2.5,
            large_e2e,
            EAGLE3,
            "235B projection",
            "vs AR sync colocated on 2048 GPUs",
        ),
    ]
    return rows


def validation_table() -> list[dict]:
    return [point.row() for point in points()]
