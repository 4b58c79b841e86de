"""GPU roofline efficiencies fitted to a GPU's measured forward cost, judged on points
the fit did not see.

`scripts/gpu_layer_cost.py` times, on one GPU, a Qwen3-8B-shaped verification forward
(T = k + 1 new tokens per sequence over a KV cache) by batch size, replayed as one CUDA
graph (docs/benchmarks.md, "Forward cost on a GPU"). The decode roofline
(`decode.Replica.forward_seconds`) has two constants that such a measurement decides:
the achieved share of HBM bandwidth (`mem_eff`, small batches) and of dense bf16 FLOP/s
(`compute_eff`, large batches x tokens). They are fitted by least squares on
log(predicted / measured) over every row; each row's held-out error comes from the fit
without that row's batch size (leave one batch size out: the batches at either end are
then extrapolations), so no constant is judged on a row it was fitted to.

What graph replays cannot decide is fitted elsewhere: the engine's costs outside the
forward (per verified token and n-gram lookup: sim/validate.py fits them to the paper's
rows on top of this roofline; per step and per draft forward: not identifiable from
those rows, 0 until vLLM is measured on a GPU). Efficiencies of other GPUs are not
measured: the fit names the one it ran on, and specrl applies it to every GPU in the
table (hardware.MEASURED_ROOFLINE, docs/simulator.md)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from specrl.sim.calibrate import error_summary, read_json, rel_error
from specrl.sim.decode import Replica
from specrl.sim.errors import SimError
from specrl.sim.hardware import HARDWARE, Efficiency, get_hardware
from specrl.sim.models import get_model

FITTED = ("mem_eff", "compute_eff")
COMMAND = "python3 scripts/gpu_layer_cost.py"


def hardware_of(device: str) -> str:
    """The hardware table's name for a CUDA device name ("NVIDIA H200" -> h200)."""
    words = device.lower().replace("-", " ").split()
    found = [name for name in HARDWARE if name in words]
    if len(found) != 1:
        raise SimError(f"device {device!r} is none of the hardware table's GPUs ({', '.join(HARDWARE)})")
    return found[0]


def _fit(replica: Replica, rows: list[dict]) -> Efficiency:
    measured = np.array([r["ms_median"] / 1e3 for r in rows])

    def predict(x: np.ndarray) -> np.ndarray:
        eff = replica.eff.model_copy(update=dict(zip(FITTED, map(float, x))))
        r = Replica(replica.model, replica.hw, eff, 1)
        return np.array([r.forward_seconds(r.model, p["batch"], p["tokens"], p["context"]) for p in rows])

    x = least_squares(lambda x: np.log(predict(x) / measured), [0.7, 0.6], bounds=([1e-3] * 2, [1.0] * 2)).x
    return replica.eff.model_copy(update={k: round(float(v), 4) for k, v in zip(FITTED, x)})


def _predicted_ms(replica: Replica, eff: Efficiency, row: dict) -> float:
    r = Replica(replica.model, replica.hw, eff, 1)
    return round(r.forward_seconds(r.model, row["batch"], row["tokens"], row["context"]) * 1e3, 3)


def fit_forward(path: Path) -> dict:
    """The fit of `path` (the JSON of scripts/gpu_layer_cost.py): constants fitted on
    every row of the target model, per-row errors in sample and held out, and a summary
    of each."""
    data = read_json(path, COMMAND)
    if not isinstance(data, dict) or not isinstance(data.get("rows"), list) or "device" not in data:
        raise SimError(f"{path}: not the JSON of `{COMMAND}` (no 'device' and 'rows')")
    hardware = hardware_of(data["device"])
    try:
        rows = [r for r in data["rows"] if r["model"] == "qwen3-8b"]
        batches = sorted({r["batch"] for r in rows})
    except (KeyError, TypeError) as e:
        raise SimError(f"{path}: a row lacks the field {e}") from None
    if len(batches) < 3:
        raise SimError(f"{path}: {len(batches)} batch sizes; a fit held out by batch size needs 3 at least")
    replica = Replica(get_model("qwen3-8b"), get_hardware(hardware), Efficiency(), 1)
    fitted = _fit(replica, rows)
    without = {b: _fit(replica, [r for r in rows if r["batch"] != b]) for b in batches}
    out = []
    for r in rows:
        point = {k: r[k] for k in ("batch", "tokens", "context")} | {"measured_ms": r["ms_median"]}
        point["predicted_ms"] = _predicted_ms(replica, fitted, r)
        point["held_out_predicted_ms"] = _predicted_ms(replica, without[r["batch"]], r)
        point["rel_error"] = rel_error(point["predicted_ms"], r["ms_median"])
        point["held_out_rel_error"] = rel_error(point["held_out_predicted_ms"], r["ms_median"])
        out.append(point)
    held = [{"rel_error": p["held_out_rel_error"]} for p in out]
    return {
        "hardware": hardware,
        "device": data["device"],
        "measured": {k: data.get(k) for k in ("command", "torch", "dtype", "what")},
        "model": "qwen3-8b",
        "constants": {k: getattr(fitted, k) for k in FITTED},
        "constants_without_batch": {str(b): {k: getattr(e, k) for k in FITTED} for b, e in without.items()},
        "in_sample": error_summary(out),
        "held_out": error_summary(held),
        "rows": out,
    }
