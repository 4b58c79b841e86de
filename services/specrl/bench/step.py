"""`specrl bench step`: the paper's RL step breakdown on our testbed, one run.

Three configurations of the same RL job (the zoo task, GRPO, same data, seeds and batch),
each a real `specrl run` with its own Redis, rollout server and trainer started from the
same initial weights:
  ar           synchronous, no speculation;
  eagle3       synchronous, EAGLE-3 (domain init), k = 3;
  eagle3-async asynchronous with policy lag bound 1, EAGLE-3, k = 3.
Per configuration the mean over the steps after the first (which warms engines up) of
every stage (prepare, data, exposed generation, logprob, train, other) and of gen (a
batch's whole generation, exposed or not); then gen share of the step, gen speedup and
step speedup over AR, and the orchestrator's overhead (other) as a share of the step.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import tempfile
from pathlib import Path

import yaml
from rich.console import Console

from specrl.bench.report import markdown_table, print_table
from specrl.config import RunConfig
from specrl.orchestrator.report import BREAKDOWN, summary
from specrl.orchestrator.run import run
from specrl.stats.lossless import reward_difference_p

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "tiny-rl-zero.yaml"
EAGLE3 = {"method": "eagle3", "num_speculative_tokens": 3, "draft": "zoo:eagle3-domain"}
CONFIGS = {
    "ar": {"speculation": {"method": "none"}, "max_lag": 0},
    "eagle3": {"speculation": EAGLE3, "max_lag": 0},
    "eagle3-async": {"speculation": EAGLE3, "max_lag": 1},
}


def _config(label: str, base: dict, steps: int, out_dir: Path) -> RunConfig:
    c = CONFIGS[label]
    cfg = json.loads(json.dumps(base))
    cfg["name"] = f"bench-step-{label}"
    cfg["output_dir"] = str(out_dir / "{name}")
    cfg["orchestrator"] = {**cfg.get("orchestrator", {}), "steps": steps, "max_lag": c["max_lag"]}
    cfg["rollout"]["server"]["speculation"] = c["speculation"]
    cfg["rollout"]["server"].setdefault("self_test", {})["enabled"] = False
    return RunConfig.model_validate(cfg)


def run_step_bench(out: Path, *, steps: int, config: Path | None, console: Console) -> list[dict]:
    base = yaml.safe_load((config or EXAMPLE).read_text())
    runs = {}
    with tempfile.TemporaryDirectory(prefix="specrl-bench-step-") as d:
        for label in CONFIGS:
            console.rule(f"{label}: {steps} RL steps")
            runs[label] = run(_config(label, base, steps, Path(d)), console=console, metrics=False).records
    rows = compare(runs)
    _write(out, rows, runs, steps=steps, config=config or EXAMPLE)
    print_table(rows, TABLE_COLUMNS, "RL step benchmark (means per step)", console)
    return rows


def compare(runs: dict[str, list[dict]]) -> list[dict]:
    """One row per configuration (means per step), with its ratios to the AR run and, for
    async, its exposed generation against the synchronous EAGLE-3 run's generation."""
    rows = [{"config": label, **_row(summary(records))} for label, records in runs.items()]
    by = {r["config"]: r for r in rows}
    for r in rows:
        r["reward_p_vs_ar"] = round(reward_difference_p(runs[r["config"]], runs["ar"]), 4)
        r["gen_speedup_vs_ar"] = round(by["ar"]["gen_s"] / r["gen_s"], 3)
        r["step_speedup_vs_ar"] = round(by["ar"]["step_s"] / r["step_s"], 3)
        # async's goal: exposed generation < 10% of the same job's synchronous gen time
        r["exposed_gen_vs_sync_gen"] = round(r["exposed_generation_s"] / by["eagle3"]["gen_s"], 3)
    return rows


def _row(s: dict) -> dict:
    t = s["time"]
    return {
        "steps": s["steps"],
        "acceptance_length": round(s["acceptance_length"], 3),
        "reward_first": round(s["reward_first"], 3),
        "reward_last": round(s["reward_last"], 3),
        "reward_mean": round(s["reward_mean"], 4),
        "mismatch_max_abs": s["mismatch_max_abs"],
        "max_lag": s["max_lag"],
        "step_s": round(t["step"], 3),
        "gen_s": round(t["gen"], 3),
        **{f"{k}_s": round(t[k], 3) for k in BREAKDOWN},
        "gen_share": round(t["exposed_generation"] / t["step"], 3),
        "overhead_share": round(s["overhead_share"], 4),
    }


TABLE_COLUMNS = (
    "config", "acceptance_length", "step_s", "gen_s", "exposed_generation_s", "logprob_s", "train_s",
    "prepare_s", "other_s", "gen_share", "gen_speedup_vs_ar", "step_speedup_vs_ar", "overhead_share",
    "reward_mean", "reward_p_vs_ar", "mismatch_max_abs",
)  # fmt: skip


def _write(out: Path, rows: list[dict], runs: dict[str, list[dict]], *, steps: int, config: Path) -> None:
    from specrl.orchestrator.report import write_report

    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "command": f"specrl bench step --out {out} --steps {steps}",
        "date": datetime.date.today().isoformat(),
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "config": _shown(config),
        "what": "mean per-step stage times over the steps after the first; speedups vs the AR row",
    }
    out.write_text(json.dumps({"meta": meta, "rows": rows, "steps": runs}, indent=2) + "\n")
    out.with_suffix(".md").write_text(markdown_table(rows, TABLE_COLUMNS) + "\n")
    write_report(
        runs, out.with_name(out.stem + "-report"), title="specrl bench step: AR vs EAGLE-3, sync vs async"
    )
    _plot(out.with_suffix(".png"), rows)


def _shown(path: Path) -> str:
    """A config path as a reader of the results can find it: relative to the repository
    when it is inside it (the default example), else as given."""
    try:
        return str(path.resolve().relative_to(EXAMPLE.parents[1]))
    except ValueError:
        return str(path)


def _plot(path: Path, rows: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    labels = [r["config"] for r in rows]
    bottom = [0.0] * len(rows)
    for stage in BREAKDOWN:
        h = [max(r[f"{stage}_s"], 0.0) for r in rows]
        ax.bar(labels, h, bottom=bottom, label=stage.replace("_", " "))
        bottom = [b + v for b, v in zip(bottom, h)]
    for i, r in enumerate(rows):
        ax.text(i, r["step_s"], f"{r['step_speedup_vs_ar']:.2f}x", ha="center", va="bottom")
    ax.set_ylabel("seconds per RL step (mean)")
    ax.set_title("RL step breakdown (label: step speedup vs AR)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
