"""`specrl bench draft`: the paper's draft table on the zoo, one run.

Two tasks, the paper's two columns: "rl-zero" (the zoo target: short, rigid answers) and
"rl-think" (the zoo's RL-Think variant, `zoo:think/...`: the target fine-tuned on long
reasoning traces, with its own heads; zoo/think.py). For each task and draft init
(domain, generic) a short synchronous RL run (`specrl run`, every
service a real process) trains the policy for `steps` steps with EAGLE-3 speculation
from that draft while the draft-trainer adapts it online. The policy drifts; the run
leaves its final policy (checkpoint/hf) and the adapted draft (<run>/draft). Then, on that
final policy, rollout servers measure generation throughput (closed loop, the task's test
prompts, temperature 1, up to the task's max_tokens) for: AR (first and last), the initial draft frozen
and the adapted draft at each k, and n-gram (on the generic run's policy). Speedup is
tokens/s over the faster AR run of the same policy and concurrency.

Each draft (frozen and adapted) is also served with the adaptive k controller
(speculation.adaptive, k up to the largest measured), measured twice per level: while it
learns, then with what it learned; the table shows the latter beside the fixed ks.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from specrl.bench.report import machine, markdown_table, print_table, speedups_over_ar
from specrl.bench.rollout import MAX_TOKENS, TEMPERATURE, closed_loop, passes, zoo_test_prompts
from specrl.config import RolloutServerConfig, RunConfig
from specrl.launcher import ServiceProcess

INITS = ("eagle3-domain", "eagle3-generic")


@dataclass(frozen=True)
class Task:
    """One column of the paper's table: the policy and drafts (zoo names under `zoo`), how
    long its answers may run, and how much of it to sample (long traces cost more per
    prompt: fewer prompts per RL step and per measured level)."""

    name: str
    zoo: str  # "" (the zoo: zoo:target, zoo:eagle3-*) or "think/" (its RL-Think variant)
    max_tokens: int
    prompts_per_step: int
    prompt_share: float  # of `prompts_per_level` measured per concurrency level


TASKS = {
    "rl-zero": Task("rl-zero", "", MAX_TOKENS, 16, 1.0),
    # traces of ~110 tokens (up to ~135): 160 leaves none cut short
    "rl-think": Task("rl-think", "think/", 160, 8, 0.5),
}
TABLE_COLUMNS = (
    "task",
    "init",
    "draft",
    "method",
    "k",
    "adaptive",
    "k_at_c",
    "concurrency",
    "tokens_per_s",
    "acceptance_length",
    "speedup_vs_ar",
)


def _run_config(task: Task, init: str, steps: int, root: Path) -> RunConfig:
    """A short sync RL run of the task's policy with EAGLE-3 from `init`, adapted online."""
    policy = f"zoo:{task.zoo}target"
    return RunConfig.model_validate(
        {
            "name": f"{task.name}-{init}",
            "output_dir": str(root / "{name}"),
            "data": {"prompts_per_step": task.prompts_per_step},
            "sampling": {"n": 8, "max_tokens": task.max_tokens},
            "orchestrator": {"steps": steps, "max_lag": 0, "concurrency": 8, "checkpoint_every": 0},
            "rollout": {
                "server": {
                    "port": 0,
                    "engine": {
                        "model": policy,
                        "dtype": "float32",
                        "max_model_len": 256,
                        "kv_cache_gib": 0.5,
                    },
                    "speculation": {
                        "method": "eagle3",
                        "num_speculative_tokens": 3,
                        "draft": f"zoo:{task.zoo}{init}",
                    },
                    "self_test": {"enabled": False},
                }
            },
            "trainer": {
                "server": {
                    "port": 0,
                    "trainer": {
                        "model": policy,
                        "micro_batch_size": 16,
                        "optim": {"lr": 1e-4},
                        "capture": {"enabled": True},
                    },
                }
            },
            "draft_trainer": {
                "enabled": True,
                "server": {"port": 0, "training": {"lr": 1e-3, "holdout_every": 5}},
            },
        }
    )


def _server(policy: str, method: str, draft: str, k: int, adaptive: bool) -> RolloutServerConfig:
    spec: dict = {"method": method, "num_speculative_tokens": max(1, k), "adaptive": {"enabled": adaptive}}
    if draft:
        spec["draft"] = draft
    return RolloutServerConfig.model_validate(
        {
            "port": 0,
            "engine": {"model": policy, "dtype": "float32"},
            "speculation": spec,
            "self_test": {"enabled": False},
        }
    )


Cell = tuple[str, str, str, int, bool]  # draft label, method, draft path, k, adaptive


def _measure(
    task: Task, init: str, policy: str, cell: Cell, prompts: list[str], levels: list[int], console
) -> list[dict]:
    """One rollout server of `policy` with the cell's speculation, measured at each level."""
    label, method, draft, k, adaptive = cell
    console.print(f"  {label} {method} {'adaptive k<=' if adaptive else 'k='}{k}: starting server")
    rows = []
    with ServiceProcess(_server(policy, method, draft, k, adaptive)) as proc:
        closed_loop(proc.address, prompts[:8], 4, task.max_tokens)  # warm-up
        for c in levels:
            for phase, r, k_at_c in passes(proc.address, prompts, c, k, adaptive, task.max_tokens):
                al = 1 + r["accepted"] / r["drafts"] if r["drafts"] else 1.0
                rows.append(
                    {
                        "task": task.name,
                        "init": init,
                        "draft": label,
                        "method": "ar" if method == "none" else method,
                        "k": k,
                        "adaptive": phase,
                        "k_at_c": k_at_c,
                        "concurrency": c,
                        "tokens": r["tokens"],
                        "seconds": round(r["seconds"], 3),
                        "tokens_per_s": round(r["tokens"] / r["seconds"], 1),
                        "acceptance_length": round(al, 3),
                    }
                )
                console.print(f"    c={c:<3} {phase:<8} {rows[-1]['tokens_per_s']:>8.1f} tok/s  AL {al:.2f}")
    return rows


def run_draft_bench(
    out: Path,
    *,
    steps: int,
    ks: list[int],
    concurrency: list[int],
    tasks: list[str] | None = None,
    prompts_per_level: int = 32,
    console: Console | None = None,
) -> list[dict]:
    """`tasks`: names in TASKS (default: all), measured in that order."""
    from specrl.orchestrator.run import run
    from specrl.zoo.think import build_think

    console = console or Console(stderr=True)
    chosen = [TASKS[name] for name in pick_tasks(tasks)]
    prompts = zoo_test_prompts(prompts_per_level, console)
    if any(t.zoo for t in chosen):
        build_think(console=console)  # cached after the first time (minutes)
    rows: list[dict] = []
    runs: dict[str, list[dict]] = {}
    with tempfile.TemporaryDirectory(prefix="specrl-bench-draft-") as tmp:
        for task in chosen:
            measured = prompts[: max(8, round(prompts_per_level * task.prompt_share))]
            for init in INITS:
                console.print(f"[bold]{task.name} {init}[/bold]: {steps} RL steps with online adaptation")
                result = run(_run_config(task, init, steps, Path(tmp)), console=console, metrics=False)
                runs[f"{task.name}/{init}"] = [
                    {"step": r["step"], "acceptance_length": r["acceptance_length"], "draft": r["draft"]}
                    for r in result.records
                ]
                policy = str(Path(result.checkpoint) / "hf")
                adapted = result.run_dir / "draft"
                published = (adapted / "config.json").is_file()
                cells: list[Cell] = [("ar", "none", "", 0, False)]
                drafts = [("frozen", f"zoo:{task.zoo}{init}")] + (
                    [("adapted", str(adapted))] if published else []
                )
                for label, path in drafts:
                    cells += [(label, "eagle3", path, k, False) for k in ks]
                    cells.append((label, "eagle3", path, max(ks), True))
                if init == "eagle3-generic":
                    cells.append(("-", "ngram", "", 3, False))
                cells.append(("ar", "none", "", 0, False))
                for cell in cells:
                    rows += _measure(task, init, policy, cell, measured, concurrency, console)
                if not published:  # the run served the initial draft throughout: adapted is frozen
                    console.print(f"  {init}: every adapted draft was held back; adapted = frozen")
                    held = "no draft published: every candidate was held back"
                    rows += [
                        r | {"draft": "adapted", "note": held}
                        for r in rows
                        if (r["task"], r["init"], r["draft"]) == (task.name, init, "frozen")
                    ]
                _write(out, rows, runs, steps)
    print_table(rows, TABLE_COLUMNS, "draft benchmark", console)
    for task in chosen:
        console.print(paper_table(rows, task.name, ks, concurrency[0]))
    return rows


def pick_tasks(names: list[str] | None) -> list[str]:
    """The task names asked for, checked (all of TASKS for None or [])."""
    if unknown := sorted(set(names or ()) - set(TASKS)):
        raise ValueError(f"unknown task(s) {', '.join(unknown)}; choose from {', '.join(TASKS)}")
    return list(names or TASKS)


def paper_table(rows: list[dict], task: str, ks: list[int], concurrency: int) -> str:
    """Speedup over AR of one task at one concurrency, shaped like the paper's table: a row
    per draft init x adaptation, a column per k."""
    rows = [r for r in rows if r["task"] == task]
    head = [f"k={k}" for k in ks] + [f"adaptive (k<={max(ks)})"]
    lines = ["| draft | " + " | ".join(head) + " |", "|---|" + "---|" * len(head)]
    for init in INITS:
        for label in ("frozen", "adapted"):
            cells = []
            for k, phase in [(k, "") for k in ks] + [(max(ks), "learned")]:
                hit = [
                    r
                    for r in rows
                    if (r["init"], r["draft"], r["k"], r["concurrency"], r.get("adaptive", ""))
                    == (init, label, k, concurrency, phase)
                ]
                chosen = f", k={hit[0]['k_at_c']}" if hit and phase else ""
                cells.append(
                    f"{hit[0]['speedup_vs_ar']:.2f}x (AL {hit[0]['acceptance_length']:.2f}{chosen})"
                    if hit
                    else ""
                )
            name = init.removeprefix("eagle3-")
            lines.append(
                f"| {name} init, {'online adaptation' if label == 'adapted' else 'frozen'} | "
                + " | ".join(cells)
                + " |"
            )
    ngram = [r for r in rows if r["method"] == "ngram" and r["concurrency"] == concurrency]
    if ngram:
        r = ngram[0]
        lines.append(
            f"| n-gram (k=3) | {r['speedup_vs_ar']:.2f}x (AL {r['acceptance_length']:.2f}) |" + " |" * len(ks)
        )
    return "\n".join(lines)


def _write(out: Path, rows: list[dict], runs: dict[str, list[dict]], steps: int) -> None:
    speedups_over_ar(rows, lambda r: (r["task"], r["init"], r["concurrency"]))
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "machine": machine(),
        "max_tokens": {t.name: t.max_tokens for t in TASKS.values()},
        "temperature": TEMPERATURE,
        "rl_steps": steps,
    }
    out.write_text(json.dumps({"meta": meta, "runs": runs, "rows": rows}, indent=2))
    ks = sorted({r["k"] for r in rows if r["method"] == "eagle3"})
    levels = sorted({r["concurrency"] for r in rows})
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    tables = [f"{t}, concurrency {c}:\n\n{paper_table(rows, t, ks, c)}" for t in tasks for c in levels]
    out.with_suffix(".md").write_text("\n\n".join([*tables, markdown_table(rows, TABLE_COLUMNS)]) + "\n")
    _plot(out.with_suffix(".png"), rows, runs, tasks, levels)


def _plot(
    path: Path, rows: list[dict], runs: dict[str, list[dict]], tasks: list[str], levels: list[int]
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(t, c) for t in tasks for c in levels]
    fig, axes = plt.subplots(1, len(panels) + 1, figsize=(4.2 * (len(panels) + 1), 3.6), squeeze=False)
    for ax, (task, c) in zip(axes[0], panels):
        for init in INITS:
            for label, style in (("frozen", "--"), ("adapted", "-")):
                mine = [
                    r
                    for r in rows
                    if (r["task"], r["init"], r["draft"], r["concurrency"]) == (task, init, label, c)
                ]
                pts = sorted((r["k"], r["speedup_vs_ar"]) for r in mine if not r.get("adaptive"))
                if not pts:
                    continue
                name = f"{init.removeprefix('eagle3-')} {label}"
                (line,) = ax.plot(*zip(*pts), style, marker="o", label=name)
                for r in mine:  # the adaptive controller, at the k it chose
                    if r.get("adaptive") == "learned":
                        ax.plot(
                            r["k_at_c"], r["speedup_vs_ar"], marker="*", markersize=13, color=line.get_color()
                        )
        ax.axhline(1.0, color="gray", linestyle=":", linewidth=1)
        ax.set(title=f"{task}: speedup vs AR, c={c}", xlabel="draft length k")
        ax.legend(fontsize=7)
    ax = axes[0][-1]
    for name, records in runs.items():
        ax.plot(
            [r["step"] for r in records], [r["acceptance_length"] for r in records], marker="o", label=name
        )
    ax.set(title="acceptance during the RL run (k=3)", xlabel="step")
    ax.legend(fontsize=7)
    fig.suptitle("specrl draft benchmark (zoo, vLLM-cpu)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
