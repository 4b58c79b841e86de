"""Fit the model's free constants to specrl's own measurements and report the fit error.

The CPU testbed (docs/benchmarks.md) is the one machine specrl has measured end to end,
so it is where the model's functional form is tested:
  1. decode: every `specrl bench rollout` row with a per-step cost (AR, EAGLE-3 domain
     and generic, draft model; n-gram is left out because its ms_per_engine_step does
     not count the steps that drafted nothing) is predicted from the zoo model's shape
     with six free constants (compute efficiency and the costs per step, per draft
     forward, per emitted token, per layer of a forward and what an external draft
     model's forward costs beyond an EAGLE-3 head's), fitted by least squares on
     log(predicted / measured); each row is also predicted held out (the fit without it);
  2. trainer: two constants, the MFU of the forward-only logprob pass and of the
     training pass, fitted to the logprob and train times of the synchronous
     `specrl bench step` rows;
  3. an out-of-sample check: those rows' generation time, predicted by the step model
     with the constants of (1) and the step's own workload.
The benchmarks serve the zoo, so the model is the zoo target; the hardware is the machine
they ran on (`specrl simulate calibrate --hardware`). GPU constants are priors until
someone runs the two benchmarks on a GPU and calibrates on them (docs/simulator.md);
`specrl simulate plan --calibration` plans with fitted constants on their hardware."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from pydantic import ValidationError
from scipy.optimize import least_squares

from specrl.sim.decode import Replica
from specrl.sim.errors import SimError
from specrl.sim.hardware import Efficiency, get_hardware
from specrl.sim.models import get_model
from specrl.sim.speculation import Speculation
from specrl.sim.step import Layout, Workload, simulate_step
from specrl.speculation import HISTORY_DRAFT

DOCS_BENCH = Path(__file__).resolve().parents[3] / "docs" / "bench"
TESTBED = "cpu-testbed"
TARGET = "zoo-target"
# "Q: 16+18=?\nA:": the zoo task's prompts (one operation, build 3) average 12.0
# characters, which are its tokens
PROMPT_TOKENS = 12
DECODE_FIT = (
    "compute_eff",
    "step_overhead_s",
    "draft_overhead_s",
    "emit_overhead_s",
    "layer_overhead_s",
    "draft_model_overhead_s",
)
DECODE_START = (0.1, 1e-2, 1e-3, 1e-4, 1e-4, 1e-3)
TRAINER_FIT = ("logprob_mfu", "train_mfu")
METHODS = {"ar": "none", "eagle3": "eagle3", "draft_model": "draft_model"}
# The step benchmark's job (examples/tiny-rl-zero.yaml): 32 prompts x 8, <= 48 tokens,
# 16 concurrent Generate calls of one group each (128 sequences in flight), 2 epochs.
STEP_WORKLOAD = {"prompts_per_step": 32, "group_size": 8, "max_response_tokens": 48, "epochs": 2}
STEP_SLOTS = 16 * 8


def error_summary(rows: list[dict], key: str = "rel_error") -> dict:
    """Count, RMS and largest absolute `key` (an error) of fit rows."""
    errors = np.array([r[key] for r in rows], dtype=float)
    return {
        "points": len(rows),
        "rms_rel_error": round(float(np.sqrt(np.mean(errors**2))), 4),
        "max_abs_rel_error": round(float(np.abs(errors).max()), 4),
    }


@dataclass(frozen=True)
class Fit:
    """Fitted constants and per-point errors (rel_error = predicted / measured - 1)."""

    efficiency: Efficiency
    rows: list[dict]

    def summary(self) -> dict:
        """In-sample errors, and held-out ones where the rows have them."""
        out = error_summary(self.rows)
        if self.rows and "held_out_rel_error" in self.rows[0]:
            out["held_out"] = error_summary(self.rows, "held_out_rel_error")
        return out


def _speculation(row: dict) -> Speculation:
    method = METHODS[row["method"]]
    if method == "none":
        return Speculation()
    extra = {"draft_model": "zoo-draft"} if method == "draft_model" else {}
    return Speculation.from_acceptance_length(method, row["k"], row["acceptance_length"], **extra)


def rel_error(predicted: float, measured: float) -> float:
    return round(float(predicted) / measured - 1, 4)


def fit_decode(rows: list[dict], hardware: str = TESTBED, held_out: bool = True) -> Fit:
    """Fit the decode constants to the rollout benchmark's per-step costs; with `held_out`,
    each row is also predicted by the fit to the other rows (its `held_out_rel_error`)."""
    hw, target = get_hardware(hardware), get_model(TARGET)
    points = [r for r in rows if r["method"] in METHODS and r.get("ms_per_engine_step")]
    if len(points) <= len(DECODE_FIT):
        raise SimError(
            f"the rollout benchmark has {len(points)} rows with a per-step cost (methods "
            f"{', '.join(METHODS)}); fitting {len(DECODE_FIT)} constants needs more"
        )
    # mean context over a response: the prompt plus half the response
    contexts = [PROMPT_TOKENS + r["tokens"] / r["requests"] / 2 for r in points]
    specs = [_speculation(r) for r in points]
    measured = np.array([r["ms_per_engine_step"] / 1e3 for r in points])

    def predict(x: np.ndarray, rows: list[int]) -> np.ndarray:
        eff = Efficiency(**dict(zip(DECODE_FIT, x)))
        return np.array(
            [
                Replica(target, hw, eff, 1, specs[i]).step_seconds(points[i]["concurrency"], contexts[i])
                for i in rows
            ]
        )

    def fit(rows: list[int]) -> np.ndarray:
        start = np.array(DECODE_START)
        return least_squares(
            lambda x: np.log(predict(x, rows) / measured[rows]),
            start,
            bounds=([1e-4] + [0.0] * (len(start) - 1), [1.0] * len(start)),
            x_scale=start,
        ).x

    every = list(range(len(points)))
    x = fit(every)
    out = []
    for i, (r, p) in enumerate(zip(points, predict(x, every))):
        label = {"method": r["method"], "draft": r["draft"], "k": r["k"], "concurrency": r["concurrency"]}
        measured_ms = r["ms_per_engine_step"]
        predicted_ms = round(float(p) * 1e3, 2)
        out.append({**label, "measured_ms": measured_ms, "predicted_ms": predicted_ms})
        out[-1]["rel_error"] = rel_error(predicted_ms, measured_ms)
        if held_out:
            alone = float(predict(fit([j for j in every if j != i]), [i])[0]) * 1e3
            out[-1]["held_out_rel_error"] = rel_error(alone, measured_ms)
    return Fit(Efficiency(**dict(zip(DECODE_FIT, x))), out)


def _step_workload(record: dict) -> Workload:
    mean = float(np.mean([s["tokens"] / s["samples"] for s in record]))
    return Workload(
        **STEP_WORKLOAD, prompt_tokens=PROMPT_TOKENS, response_mean_tokens=mean, response_sigma=0.3
    )


def fit_trainer(step_bench: dict, decode: Efficiency, hardware: str = TESTBED) -> tuple[Fit, Fit]:
    """Fit the logprob and training MFUs to the synchronous step rows; the second Fit is
    the check of their generation time, predicted (not fitted) with the decode constants."""
    hw, target = get_hardware(hardware), get_model(TARGET)
    sync = [r for r in step_bench["rows"] if r["max_lag"] == 0]
    if not sync:
        raise SimError("the step benchmark has no synchronous rows (max_lag 0) to fit the trainer to")
    layout = Layout(gen_gpus=1, train_gpus=1, colocated=True, max_num_seqs=STEP_SLOTS)

    def simulate(row: dict, mfus: dict[str, float]) -> dict[str, float]:
        # EAGLE-3 at k=3; the hybrid's history drafts up to HISTORY_DRAFT tokens (the
        # comparison run's hybrid_max_draft), modelled as an EAGLE-3 draft that long: its
        # positions past the model's k are lookups, not forwards, so its gen check is high
        k = HISTORY_DRAFT if row["config"].endswith("hybrid") else 3
        spec = (
            Speculation()
            if row["config"] == "ar"
            else Speculation.from_acceptance_length("eagle3", k, row["acceptance_length"])
        )
        result = simulate_step(
            model=target,
            hw=hw,
            eff=decode.model_copy(update=mfus),
            workload=_step_workload(step_bench["steps"][row["config"]]),
            layout=layout,
            speculation=spec,
        )
        return {"gen_s": result.gen_s, "logprob_s": result.logprob_s, "train_s": result.train_s}

    def residuals(x: np.ndarray) -> list[float]:
        out = []
        for row in sync:
            sim = simulate(row, dict(zip(TRAINER_FIT, map(float, x))))
            out += [np.log(sim[f"{s}_s"] / row[f"{s}_s"]) for s in ("logprob", "train")]
        return out

    start = [0.1] * len(TRAINER_FIT)
    x = least_squares(residuals, start, bounds=([1e-4] * len(start), [1.0] * len(start)), x_scale=start).x
    mfus = dict(zip(TRAINER_FIT, map(float, x)))
    fitted, checks = [], []
    for row in sync:
        sim = simulate(row, mfus)
        for stage in ("logprob", "train", "gen"):
            measured = row[f"{stage}_s"]
            point = {"config": row["config"], "stage": stage, "measured_s": measured}
            point |= {
                "predicted_s": round(sim[f"{stage}_s"], 3),
                "rel_error": rel_error(sim[f"{stage}_s"], measured),
            }
            (checks if stage == "gen" else fitted).append(point)
    return Fit(decode.model_copy(update=mfus), fitted), Fit(decode, checks)


def read_json(path: Path, command: str) -> object:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise SimError(f"{path}: no such file (write it with `{command} --out {path}`)") from None
    except OSError as e:
        raise SimError(f"{path}: cannot read it ({e.strerror})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise SimError(f"{path}: not JSON ({e})") from None


def _bench_rows(path: Path, command: str, hardware: str) -> dict:
    data = read_json(path, command)
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list):
        raise SimError(f"{path}: not the JSON of `{command}` (no 'rows' list)")
    # benchmarks record the accelerator they ran on (None: CPU); older files do not say
    machine = (data.get("meta") or {}).get("machine") or {}
    if "accelerator" in machine and (machine["accelerator"] is None) != (hardware == TESTBED):
        ran = machine["accelerator"] or "the CPU"
        raise SimError(f"{path} ran on {ran}, not {hardware}: calibrate with --hardware for that machine")
    return data


def calibrate(
    rollout: Path = DOCS_BENCH / "rollout.json",
    step: Path = DOCS_BENCH / "step.json",
    hardware: str = TESTBED,
) -> dict:
    """Both fits from the JSON of `specrl bench rollout` and `specrl bench step` (the
    committed ones by default), run on `hardware`, as one report."""
    rollout_bench = _bench_rows(rollout, "specrl bench rollout", hardware)
    step_bench = _bench_rows(step, "specrl bench step", hardware)
    try:
        decode = fit_decode(rollout_bench["rows"], hardware)
        trainer, generation = fit_trainer(step_bench, decode.efficiency, hardware)
    except KeyError as e:
        raise SimError(
            f"a benchmark row lacks the field {e}: is the JSON from this version of specrl?"
        ) from None
    constants = trainer.efficiency.model_dump(include={*DECODE_FIT, *TRAINER_FIT})
    return {
        "hardware": hardware,
        "model": TARGET,
        "constants": {k: float(f"{v:.4g}") for k, v in constants.items()},
        "decode_fit": {**decode.summary(), "rows": decode.rows},
        "trainer_fit": {**trainer.summary(), "rows": trainer.rows},
        "generation_check": {**generation.summary(), "rows": generation.rows},
    }


def load_calibration(path: Path, hardware: str) -> Efficiency:
    """The constants a `specrl simulate calibrate --out` file fitted (the rest at their
    defaults, as in the fit), for planning on the hardware they were fitted on: fitted
    constants do not transfer to other hardware."""
    report = read_json(path, "specrl simulate calibrate")
    fitted = report.get("constants") if isinstance(report, dict) else None
    on = report.get("hardware") if isinstance(report, dict) else None
    if not isinstance(fitted, dict) or not isinstance(on, str):
        raise SimError(f"{path}: not the JSON of `specrl simulate calibrate --out`")
    if on.lower() != hardware.lower():
        raise SimError(
            f"{path} was fitted on {on}, not {hardware}: fitted constants do not transfer across "
            f"hardware (plan on {on}, or calibrate on benchmarks run on {hardware})"
        )
    unknown = sorted(set(fitted) - set(Efficiency.model_fields))
    if unknown:
        raise SimError(f"{path}: unknown constants {', '.join(unknown)}")
    try:
        return Efficiency(**fitted)
    except ValidationError as e:
        first = e.errors()[0]
        raise SimError(f"{path}: constant {first['loc'][0]}: {first['msg']}") from None
