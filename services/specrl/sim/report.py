"""`specrl simulate validate`: calibration, the validation table and the sweeps behind the
plots, written as one JSON (docs/bench/simulator.json) with a PNG and the tables as
Markdown (docs/bench/simulator.md) beside it; docs/simulator.md quotes the validation
table, and a test checks the quote against the model."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

from rich.console import Console

from specrl.sim.calibrate import calibrate, error_summary
from specrl.sim.decode import Replica
from specrl.sim.hardware import GPU_EFFICIENCY
from specrl.sim.speculation import EAGLE3_DECAY, Speculation
from specrl.sim.validate import (
    COLOCATED_32,
    COLOCATED_512,
    GB200,
    QWEN3_8B,
    QWEN3_235B,
    RL_THINK,
    RL_ZERO,
    scenario_step,
    validate,
)
from specrl.tables import markdown_table, print_table

COLUMNS = ("name", "paper_value", "predicted", "rel_error", "in_sample_rel_error", "fitted")
VALIDATION_COLUMNS = (
    "name",
    "paper_value",
    "predicted",
    "rel_error",
    "in_sample",
    "in_sample_rel_error",
    "note",
)
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
KS = tuple(range(1, 9))
LENGTHS = (1.5, 2.0, 2.5, 3.0, 3.5, 4.0)
# EAGLE-3 at AL 3 (k=3), longer drafts along the fitted decay
EAGLE3 = Speculation.from_acceptance_length("eagle3", 3, 3.0, EAGLE3_DECAY)
SCENARIOS = {
    "8b-rlzero-32": (QWEN3_8B, RL_ZERO, COLOCATED_32),
    "235b-rlthink-512": (QWEN3_235B, RL_THINK, COLOCATED_512),
}


def sweeps() -> dict:
    """Speedup vs k, vs acceptance length and vs batch, and stage breakdowns (the plots)."""
    out: dict = {"vs_k": {}, "vs_acceptance_length": {}, "vs_batch": {}, "breakdown": {}}
    for label, (model, workload, layout) in SCENARIOS.items():
        ar = scenario_step(workload, layout, Speculation(), model=model)
        out["vs_k"][label] = [
            [k, round(ar.gen_s / scenario_step(workload, layout, EAGLE3.with_k(k), model=model).gen_s, 3)]
            for k in KS
        ]
        out["vs_acceptance_length"][label] = [
            [
                al,
                round(
                    ar.gen_s
                    / scenario_step(
                        workload, layout, Speculation.from_acceptance_length("eagle3", 3, al), model=model
                    ).gen_s,
                    3,
                ),
            ]
            for al in LENGTHS
        ]
        spec = scenario_step(workload, layout, EAGLE3, model=model)
        out["breakdown"][label] = {"ar": ar.as_dict(2), "eagle3_k3": spec.as_dict(2)}
        ar_replica = Replica(model, GB200, GPU_EFFICIENCY, layout.gen_tp)
        spec_replica = Replica(model, GB200, GPU_EFFICIENCY, layout.gen_tp, EAGLE3)
        context = workload.prompt_tokens + workload.response_mean_tokens
        out["vs_batch"][label] = [
            [
                b,
                round(ar_replica.tokens_per_second(b, context), 1),
                round(
                    spec_replica.tokens_per_second(b, context) / ar_replica.tokens_per_second(b, context), 3
                ),
            ]
            for b in BATCHES
        ]
    return out


def plot(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 9))
    s = report["sweeps"]
    for label in SCENARIOS:
        axes[0, 0].plot(*zip(*s["vs_k"][label]), marker="o", label=label)
        axes[0, 1].plot(*zip(*s["vs_acceptance_length"][label]), marker="o", label=label)
        batch, _, speedup = zip(*s["vs_batch"][label])
        axes[1, 0].semilogx(batch, speedup, marker="o", base=2, label=label)
    paper_k = {3: 1.77, 5: 1.44, 7: 1.21}
    axes[0, 0].scatter(list(paper_k), list(paper_k.values()), color="k", marker="x", label="paper 8B RL-Zero")
    titles = (
        ("generation speedup vs k (EAGLE-3, AL 3 at k=3, fitted decay)", "k", "speedup"),
        ("generation speedup vs acceptance length (k=3)", "acceptance length", "speedup"),
        ("steady-state tokens/s speedup vs batch (k=3)", "sequences per replica", "speedup"),
    )
    for ax, (title, xlabel, ylabel) in zip((axes[0, 0], axes[0, 1], axes[1, 0]), titles):
        ax.set(title=title, xlabel=xlabel, ylabel=ylabel)
        ax.axhline(1.0, color="grey", lw=0.5)
        ax.legend()
    stages = ("data_s", "weight_sync_s", "exposed_gen_s", "logprob_s", "train_s")
    bars = [
        (f"{label}\n{mode}", s["breakdown"][label][mode])
        for label in SCENARIOS
        for mode in ("ar", "eagle3_k3")
    ]
    bottom = [0.0] * len(bars)
    ax = axes[1, 1]
    for stage in stages:
        heights = [b[stage] for _, b in bars]
        ax.bar([name for name, _ in bars], heights, bottom=bottom, label=stage.removesuffix("_s"))
        bottom = [x + h for x, h in zip(bottom, heights)]
    ax.set(title="RL step breakdown (sync, model)", ylabel="seconds")
    ax.tick_params(axis="x", labelsize=8)
    ax.legend()
    fig.suptitle("specrl simulator: Qwen3 on GB200 (model, fitted GPU constants; docs/simulator.md)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def validation_markdown(rows: list[dict]) -> str:
    """The validation table as docs/simulator.md shows it (names as code)."""
    return markdown_table([r | {"name": f"`{r['name']}`"} for r in rows], VALIDATION_COLUMNS)


def _per_method(rows: list[dict]) -> list[dict]:
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["method"], r["draft"]), []).append(r)
    return [{"method": m, "draft": d, **error_summary(group)} for (m, d), group in groups.items()]


def tables_markdown(report: dict) -> str:
    """Every table of the report, as Markdown (docs/bench/simulator.md)."""
    cal, gpu = report["calibration"], report["gpu_fit"]
    constants = [{"constant": k, "value": v} for k, v in cal["constants"].items()]
    unknowns = [{"unknown": k, "value": v} for k, v in gpu["unknowns"].items()]
    decode = cal["decode_fit"]
    fits = [
        {"fit": name, **{k: cal[name][k] for k in ("points", "rms_rel_error", "max_abs_rel_error")}}
        for name in ("decode_fit", "trainer_fit", "generation_check")
    ] + [{"fit": "decode_fit held out", **decode["held_out"]}]
    per_method = ("method", "draft", "points", "rms_rel_error", "max_abs_rel_error")
    per_row = ("method", "draft", "k", "concurrency", "measured_ms", "predicted_ms", "rel_error")
    step_rows = cal["trainer_fit"]["rows"] + cal["generation_check"]["rows"]
    sections = [
        ("Validation against the paper (`rel_error` = held-out predicted / paper - 1)", validation_markdown(
            report["validation"])),
        ("GPU unknowns fitted to the paper's rows", markdown_table(unknowns, ("unknown", "value"))),
        (f"Calibration on {cal['hardware']} ({cal['model']}): fitted constants", markdown_table(
            constants, ("constant", "value"))),
        ("Fit errors", markdown_table(fits, ("fit", "points", "rms_rel_error", "max_abs_rel_error"))),
        ("Decode fit per method (`specrl bench rollout` rows)", markdown_table(
            _per_method(decode["rows"]), per_method)),
        ("Decode fit, every row (ms per engine step)", markdown_table(
            decode["rows"], (*per_row, "held_out_rel_error"))),
        ("Trainer fit and the generation check (`specrl bench step` sync rows)", markdown_table(
            step_rows, ("config", "stage", "measured_s", "predicted_s", "rel_error"))),
    ]  # fmt: skip
    head = f"Generated by `{report['meta']['command']}` on {report['meta']['date']}; see docs/simulator.md."
    return "\n\n".join([head, *(f"## {title}\n\n{table}" for title, table in sections)]) + "\n"


def run_validate(out: Path, console: Console) -> dict:
    """Calibrate, fit and validate (held out), sweep; write JSON and PNG; print the table."""
    with console.status("fitting the GPU unknowns to the paper's rows") as status:
        validation = validate(progress=lambda message: status.update(message))
    report = {
        "meta": {
            "command": f"specrl simulate validate --out {out}",
            "date": datetime.date.today().isoformat(),
            "gpu_constants": GPU_EFFICIENCY.model_dump(),
        },
        "calibration": calibrate(),
        "gpu_fit": {
            "unknowns": {k: float(f"{v:.4g}") for k, v in validation.unknowns.model_dump().items()},
            **validation.summary(),
        },
        "validation": validation.rows,
        "sweeps": sweeps(),
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    plot(report, out.with_suffix(".png"))
    out.with_suffix(".md").write_text(tables_markdown(report))
    print_table(report["validation"], COLUMNS, "paper vs model (held out)", console)
    gpu = report["gpu_fit"]
    console.print(
        f"paper rows: {gpu['speedup_rows_within_goal']} of {gpu['speedup_rows']} speedups within "
        f"{gpu['goal']:.0%} held out; fitted rows rms {gpu['held_out_rms']:.1%} held out, "
        f"{gpu['in_sample_rms']:.1%} in sample"
    )
    fits = {k: report["calibration"][k] for k in ("decode_fit", "trainer_fit", "generation_check")}
    for name, fit in fits.items():
        console.print(
            f"{name}: {fit['points']} points, rms rel error {fit['rms_rel_error']:.1%}, "
            f"max {fit['max_abs_rel_error']:.1%}"
            + (f"; held out {fit['held_out']['rms_rel_error']:.1%}" if "held_out" in fit else "")
        )
    console.print(f"wrote {out}, {out.with_suffix('.png')} and {out.with_suffix('.md')}")
    return report
