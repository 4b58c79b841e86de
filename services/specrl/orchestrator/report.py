"""The run report: Markdown with the per-step table and a PNG of four panels (reward,
stage breakdown per step, acceptance length, exposed vs total generation), for one run
or several side by side (e.g. EAGLE-3 vs AR, sync vs async), with their ratios."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import NamedTuple

from specrl.stats.runs import reward_difference_p
from specrl.tables import markdown_table

BREAKDOWN = ("prepare", "data", "exposed_generation", "logprob", "train", "checkpoint", "other")


def read_steps(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def summary(records: list[dict]) -> dict:
    """Means over the steps after the first (which warms engines and caches up)."""
    rest = records[1:] or records
    mean = {k: statistics.fmean(r["time"][k] for r in rest) for k in (*BREAKDOWN, "gen", "step")}
    mismatch = [r["mismatch_max_abs"] for r in records if r["mismatch_max_abs"] is not None]
    return {
        "steps": len(records),
        "mismatch_max_abs": max(mismatch, default=None),
        "reward_mean": statistics.fmean(r["reward_mean"] for r in records),
        "reward_first": records[0]["reward_mean"],
        "reward_last": statistics.fmean(r["reward_mean"] for r in records[-3:]),
        "acceptance_length": statistics.fmean(r["acceptance_length"] for r in rest),
        "max_lag": max(r["lag"]["max"] for r in records),
        "time": mean,
        "gen_share": mean["exposed_generation"] / mean["step"] if mean["step"] else 0.0,
        "overhead_share": mean["other"] / mean["step"] if mean["step"] else 0.0,
    }


class SideBySide(NamedTuple):
    """How runs are compared: over their first `steps` steps, with ratios to `baseline`
    and exposed generation against the synchronous run `sync`'s generation."""

    steps: int | None
    baseline: str
    sync: str | None = None


def compare_runs(runs: dict[str, list[dict]], how: SideBySide) -> list[dict]:
    """One row per run (means per step over its first `how.steps`), with its ratios to the
    baseline run and, given a synchronous run, its exposed generation against that run's
    generation (asynchronous RL's goal: under 10%)."""
    runs = {label: records[: how.steps] for label, records in runs.items()}
    rows = [{"config": label, **_row(summary(records))} for label, records in runs.items()]
    by = {r["config"]: r for r in rows}
    base = by[how.baseline]
    for r in rows:
        r["reward_p_vs_ar"] = round(reward_difference_p(runs[r["config"]], runs[how.baseline]), 4)
        r["gen_speedup_vs_ar"] = round(base["gen_s"] / r["gen_s"], 3)
        r["step_speedup_vs_ar"] = round(base["step_s"] / r["step_s"], 3)
        if how.sync is not None:
            r["exposed_gen_vs_sync_gen"] = round(r["exposed_generation_s"] / by[how.sync]["gen_s"], 3)
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


SIDE_BY_SIDE_COLUMNS = (
    "config", "acceptance_length", "step_s", "gen_s", "exposed_generation_s", "logprob_s", "train_s",
    "gen_share", "gen_speedup_vs_ar", "step_speedup_vs_ar", "exposed_gen_vs_sync_gen", "reward_p_vs_ar",
)  # fmt: skip
SUMMARY_COLUMNS = (
    "run", "steps", "reward", "acceptance_length", "max_lag", "step_s", "exposed_gen_s", "gen_s",
    "logprob_s", "train_s", "prepare_s", "other_s", "exposed_gen_share",
)  # fmt: skip
STEP_COLUMNS = (
    "step", "reward", "acceptance_length", "lag_max", "step_s", "exposed_gen_s", "gen_s", "logprob_s",
    "train_s", "prepare_s", "loss", "entropy",
)  # fmt: skip


def _seconds(t: dict) -> dict:
    names = {"step": "step_s", "exposed_generation": "exposed_gen_s", "gen": "gen_s", "logprob": "logprob_s"}
    names |= {"train": "train_s", "prepare": "prepare_s", "other": "other_s"}
    return {col: f"{t[k]:.3f}" if k == "other" else f"{t[k]:.2f}" for k, col in names.items()}


def write_report(
    runs: dict[str, list[dict]],
    out: Path,
    *,
    title: str = "specrl run",
    side_by_side: SideBySide | None = None,
) -> Path:
    """`out`.md and `out`.png for the labelled runs (runs without steps are left out);
    with `side_by_side`, a table of their means and ratios over the same steps."""
    runs = {label: records for label, records in runs.items() if records}
    out.parent.mkdir(parents=True, exist_ok=True)
    png = out.with_suffix(".png")
    if side_by_side is None or side_by_side.baseline not in runs:  # several runs: vs the first
        side_by_side = SideBySide(None, next(iter(runs))) if len(runs) > 1 else None
    side = compare_runs(runs, side_by_side) if side_by_side is not None else None
    _plot(runs, png, title, side)
    rows = []
    for label, records in runs.items():
        s = summary(records)
        rows.append(
            {
                "run": label,
                "steps": s["steps"],
                "reward": f"{s['reward_first']:.3f} -> {s['reward_last']:.3f}",
                "acceptance_length": f"{s['acceptance_length']:.2f}",
                "max_lag": s["max_lag"],
                "exposed_gen_share": f"{s['gen_share']:.0%}",
                **_seconds(s["time"]),
            }
        )
    lines = [f"# {title}", "", f"![run]({png.name})", "", "## Summary", ""]
    lines += [
        "Means over the steps after the first (which warms engines up); reward: first step -> mean of "
        "the last three.",
        "",
        markdown_table(rows, SUMMARY_COLUMNS),
    ]
    if side is not None:
        lines += _side_by_side(side, side_by_side)
    for label, records in runs.items():
        steps = [
            {
                "step": r["step"],
                "reward": f"{r['reward_mean']:.3f}",
                "acceptance_length": f"{r['acceptance_length']:.2f}",
                "lag_max": r["lag"]["max"],
                "loss": f"{r['loss']:.4f}",
                "entropy": f"{r['entropy']:.3f}",
                **_seconds(r["time"]),
            }
            for r in records
        ]
        lines += ["", f"## {label}: per step", "", markdown_table(steps, STEP_COLUMNS)]
    out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return out.with_suffix(".md")


def _side_by_side(rows: list[dict], how: SideBySide) -> list[str]:
    columns = SIDE_BY_SIDE_COLUMNS if how.sync else tuple(c for c in SIDE_BY_SIDE_COLUMNS if "sync" not in c)
    which = "every step but the first" if how.steps is None else f"steps 2-{how.steps}"
    note = (
        f"Means per step over {which} of each run (the first warms engines up), every run "
        f"from the same weights, seeds and prompts; ratios to `{how.baseline}`. gen: a batch's "
        "whole generation; exposed: the part the trainer waited for; gen_share: exposed over step."
    )
    if how.sync:
        note += f" exposed_gen_vs_sync_gen: exposed generation over `{how.sync}`'s generation."
    note += (
        " reward_p_vs_ar: two-proportion z-test of the rewards against AR's over these steps: speculation"
        " is lossless, so a synchronous run with it should show no difference; an asynchronous run"
        " trains on older samples and may differ by design."
    )
    return ["", "## Side by side", "", note, "", markdown_table(rows, columns)]


def _plot(runs: dict[str, list[dict]], path: Path, title: str, rows: list[dict] | None) -> None:
    """Four panels; the stage breakdown per step is one stacked bar per step for one run,
    and one per run (its mean step, labelled with the step speedup) for runs compared."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(2, 2, figsize=(12, 8))
    for label, records in runs.items():
        steps = [r["step"] for r in records]
        ax[0, 0].plot(steps, [r["reward_mean"] for r in records], marker="o", label=label)
        ax[1, 0].plot(steps, [r["acceptance_length"] for r in records], marker="o", label=label)
        ax[1, 1].plot(steps, [r["time"]["gen"] for r in records], linestyle="--", label=f"{label}: gen")
        ax[1, 1].plot(
            steps, [r["time"]["exposed_generation"] for r in records], marker="o", label=f"{label}: exposed"
        )
    ax[0, 0].set(title="mean reward per step", xlabel="step", ylabel="reward")
    ax[1, 0].set(title="acceptance length (tokens per verification)", xlabel="step")
    ax[1, 1].set(title="generation time: total vs exposed to the trainer", xlabel="step", ylabel="seconds")
    if rows is None:
        (records,) = runs.values()
        means = [{"config": r["step"], **{f"{k}_s": r["time"][k] for k in BREAKDOWN}} for r in records]
        stage_bars(ax[0, 1], means)
        ax[0, 1].set(title="step time by stage", xlabel="step")
    else:
        stage_bars(ax[0, 1], rows, speedup=True)
        ax[0, 1].set(title="mean step by stage (label: step speedup vs AR)")
    for a in ax.flat:
        a.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def stage_bars(ax, rows: list[dict], *, speedup: bool = False) -> None:
    """One stacked bar of stage seconds (`<stage>_s`) per row, at its `config`; with
    `speedup`, each labelled with its `step_speedup_vs_ar`."""
    x = range(len(rows))
    bottom = [0.0] * len(rows)
    for stage in BREAKDOWN:
        h = [max(r[f"{stage}_s"], 0.0) for r in rows]
        ax.bar(x, h, bottom=bottom, label=stage.replace("_", " "))
        bottom = [b + v for b, v in zip(bottom, h)]
    ax.set_xticks(x, [str(r["config"]) for r in rows])
    if speedup:
        for i, r in enumerate(rows):
            ax.text(i, bottom[i], f"{r['step_speedup_vs_ar']:.2f}x", ha="center", va="bottom")
    ax.set_ylabel("seconds per RL step")
