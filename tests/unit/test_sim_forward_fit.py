"""The GPU roofline efficiencies fitted to a GPU's measured forward cost
(specrl.sim.forward_fit): recovered from rows the roofline itself generated, judged on
held-out batch sizes, and the committed fit is what the committed measurement gives."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specrl.sim import SimError
from specrl.sim.decode import Replica
from specrl.sim.forward_fit import fit_forward, hardware_of
from specrl.sim.hardware import MEASURED_ROOFLINE, Efficiency, get_hardware
from specrl.sim.models import get_model

BENCH = Path(__file__).resolve().parents[2] / "docs" / "bench"


def _measurement(tmp_path: Path, eff: Efficiency, device: str = "NVIDIA H100 80GB HBM3") -> Path:
    """Rows a GPU with exactly these efficiencies would measure (the roofline's own times)."""
    replica = Replica(get_model("qwen3-8b"), get_hardware(hardware_of(device)), eff, 1)
    rows = [
        {"model": "qwen3-8b", "batch": b, "tokens": t, "context": 1024}
        | {"ms_median": replica.forward_seconds(replica.model, b, t, 1024) * 1e3}
        for b in (1, 16, 64, 256)
        for t in (1, 4, 8)
    ]
    rows.append({"model": "eagle3-head-qwen3-8b", "batch": 1, "tokens": 1, "context": 1024, "ms_median": 0.2})
    path = tmp_path / "forward.json"
    path.write_text(json.dumps({"device": device, "rows": rows}))
    return path


def test_the_fit_recovers_the_efficiencies_that_made_the_rows(tmp_path):
    report = fit_forward(_measurement(tmp_path, Efficiency(mem_eff=0.7, compute_eff=0.45)))
    assert report["hardware"] == "h100" and report["constants"] == pytest.approx(
        {"mem_eff": 0.7, "compute_eff": 0.45}, abs=2e-3
    )
    assert report["in_sample"]["max_abs_rel_error"] < 0.01 and report["held_out"]["points"] == 12
    # without the largest batch no row is compute-bound enough to decide compute_eff well,
    # but small batches still decide mem_eff
    assert report["constants_without_batch"]["256"]["mem_eff"] == pytest.approx(0.7, abs=2e-3)


def test_each_rows_held_out_error_comes_from_the_fit_without_its_batch(tmp_path):
    path = _measurement(tmp_path, Efficiency(mem_eff=0.7, compute_eff=0.45))
    data = json.loads(path.read_text())
    for r in data["rows"]:
        if r["batch"] == 256:
            r["ms_median"] *= 1.3  # the largest batch ran 30% slower than the rest say
    path.write_text(json.dumps(data))
    rows = fit_forward(path)["rows"]
    big = [r for r in rows if r["batch"] == 256]
    # fitted without them, the rest predict the slow rows ~1/1.3 - 1 = -23% off; with them
    # in the fit the error is spread and smaller
    assert all(r["held_out_rel_error"] == pytest.approx(1 / 1.3 - 1, abs=0.02) for r in big)
    assert all(abs(r["rel_error"]) < abs(r["held_out_rel_error"]) for r in big)


def test_bad_measurements_are_refused_with_the_reason(tmp_path):
    with pytest.raises(SimError, match="none of the hardware table's GPUs"):
        fit_forward(_measurement(tmp_path, Efficiency(), device="NVIDIA A100-SXM4-80GB"))
    (tmp_path / "x.json").write_text(json.dumps({"rows": []}))
    with pytest.raises(SimError, match="not the JSON of"):
        fit_forward(tmp_path / "x.json")
    path = _measurement(tmp_path, Efficiency())
    data = json.loads(path.read_text())
    data["rows"] = [r for r in data["rows"] if r["batch"] in (1, 16)]
    path.write_text(json.dumps(data))
    with pytest.raises(SimError, match="2 batch sizes"):
        fit_forward(path)


def test_the_committed_fit_is_what_the_committed_h200_measurement_gives():
    committed = json.loads((BENCH / "simulator_gpu_fit.json").read_text())
    assert fit_forward(BENCH / "gpu_layer_qwen3_8b.json") == committed
    assert committed["hardware"] == "h200" and committed["held_out"]["rms_rel_error"] < 0.1
    assert committed["constants"] == MEASURED_ROOFLINE  # the GPU constants use this fit
