"""The run report: Markdown with the per-step table and a PNG of four panels (reward,
stage breakdown per step, acceptance length, exposed vs total generation), for one run
or several side by side (e.g. EAGLE-3 vs AR, sync vs async)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from specrl.bench.report import markdown_table

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


def write_report(runs: dict[str, list[dict]], out: Path, *, title: str = "specrl run") -> Path:
    """`out`.md and `out`.png for the labelled runs (runs without steps are left out)."""
    runs = {label: records for label, records in runs.items() if records}
    out.parent.mkdir(parents=True, exist_ok=True)
    png = out.with_suffix(".png")
    _plot(runs, png, title)
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


def _plot(runs: dict[str, list[dict]], path: Path, title: str) -> None:
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
    # stage breakdown: stacked bars per step, runs side by side
    width = 0.8 / len(runs)
    colors = plt.get_cmap("tab10").colors
    for i, records in enumerate(runs.values()):
        x = [r["step"] + (i - (len(runs) - 1) / 2) * width for r in records]
        bottom = [0.0] * len(records)
        for j, stage in enumerate(BREAKDOWN):
            h = [max(r["time"][stage], 0.0) for r in records]
            ax[0, 1].bar(x, h, width, bottom=bottom, color=colors[j], label=stage if i == 0 else None)
            bottom = [b + v for b, v in zip(bottom, h)]
    ax[0, 1].set(title="step time by stage (" + " | ".join(runs) + ")", xlabel="step", ylabel="seconds")
    for a in ax.flat:
        a.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
