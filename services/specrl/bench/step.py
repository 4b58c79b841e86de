"""`specrl bench step`: the paper's RL step breakdown on our testbed, one run.

Four configurations of the same RL job (the zoo task, GRPO, same data, seeds and batch;
the example's 64 prompts come back every 2 steps): one `specrl run` and its three
comparison runs (`compare.runs`), each with its own Redis, rollout server and trainer
started from the same initial weights:
  ar            synchronous, no speculation;
  eagle3        synchronous, EAGLE-3 (domain init), k = 3;
  eagle3-async  asynchronous with policy lag bound 1, EAGLE-3, k = 3;
  eagle3-hybrid synchronous, EAGLE-3 with drafts from history where history has a
                confident match (speculation.history.hybrid), k = 3.
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

from specrl.config import RunConfig
from specrl.orchestrator.report import SideBySide, compare_runs, stage_bars
from specrl.orchestrator.run import run
from specrl.tables import markdown_table, print_table
from specrl.zoo.build import build_if_used

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "tiny-rl-zero.yaml"
EAGLE3 = {"method": "eagle3", "num_speculative_tokens": 3, "draft": "zoo:eagle3-domain"}
# the benchmark's labels for the main run and its comparison runs (compare.runs)
LABELS = {"main": "eagle3", "ar": "ar", "async": "eagle3-async", "hybrid": "eagle3-hybrid"}
HOW = SideBySide(steps=None, baseline="ar", sync="eagle3")


def bench_config(base: dict, steps: int, out_dir: Path) -> RunConfig:
    """The job of `base` as the benchmark runs it: synchronous EAGLE-3 (domain init, k=3)
    with AR, asynchronous (lag 1) and hybrid comparison runs of as many steps."""
    cfg = json.loads(json.dumps(base))
    cfg["name"] = "bench-step"
    cfg["output_dir"] = str(out_dir / "{name}")
    cfg["orchestrator"] = {**cfg.get("orchestrator", {}), "steps": steps, "max_lag": 0}
    cfg["rollout"]["server"]["speculation"] = EAGLE3
    cfg["rollout"]["server"].setdefault("self_test", {})["enabled"] = False
    cfg["compare"] = {"runs": ["ar", "async", "hybrid"], "steps": steps}
    return RunConfig.model_validate(cfg)


def run_step_bench(out: Path, *, steps: int, config: Path | None, console: Console) -> list[dict]:
    base = yaml.safe_load((config or EXAMPLE).read_text())
    with tempfile.TemporaryDirectory(prefix="specrl-bench-step-") as d:
        cfg = bench_config(base, steps, Path(d))
        build_if_used(cfg.local_models(), console)
        result = run(cfg, console=console, metrics=False)
    runs = {LABELS["ar"]: result.compared["ar"], LABELS["main"]: result.records}
    runs |= {LABELS[name]: result.compared[name] for name in ("async", "hybrid")}
    rows = compare(runs)
    _write(out, rows, runs, steps=steps, config=config or EXAMPLE)
    print_table(rows, TABLE_COLUMNS, "RL step benchmark (means per step)", console)
    return rows


def compare(runs: dict[str, list[dict]]) -> list[dict]:
    """One row per configuration (means per step), with its ratios to the AR run and, for
    async, its exposed generation against the synchronous EAGLE-3 run's generation."""
    missing = [label for label, records in runs.items() if not records]
    if missing:
        raise RuntimeError(f"bench step: the {', '.join(missing)} run failed (its logs are above)")
    return compare_runs(runs, HOW)


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
        runs,
        out.with_name(out.stem + "-report"),
        title="specrl bench step: AR vs EAGLE-3, sync vs async, EAGLE-3 vs hybrid with history",
        side_by_side=HOW,
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
    stage_bars(ax, rows, speedup=True)
    ax.set_ylabel("seconds per RL step (mean)")
    ax.set_title("RL step breakdown (label: step speedup vs AR)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
