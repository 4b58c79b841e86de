"""`specrl bench history`: drafts from the run's own history over the epochs of a real RL
run, beside AR and EAGLE-3 alone, one run.

For each task (RL-Zero, RL-Think: bench/tasks.py) the policy moves between epochs: epoch 0
measures the task's initial policy, and each later epoch first trains the previous one
for `steps` synchronous RL steps (`specrl run` on the task's training prompts, every
service a real process, EAGLE-3 from the domain draft, frozen). Each epoch starts fresh
rollout servers of its policy: AR, EAGLE-3 alone, the history drafter alone and the hybrid
(EAGLE-3 with history: speculation.history.hybrid), all at k.

The measured prompts (the task's test prompts) come back every epoch, as RL's prompts do,
once per epoch: every (round, concurrency) measurement has prompts of its own. A request
samples a group (n = 4 samples, siblings of each other; 1 at concurrency 1), and the
history and hybrid servers get each prompt's responses of the previous epoch carried with
it (Prompt.history), as the orchestrator carries them to a replica that has not seen the
prompt since it started (orchestrator/carry.py): history written by the previous policy.
Epoch 0 has none (siblings and the prompt only).

Concurrency counts sequences in flight: c/n client threads of n-sample requests. Timing as
in `bench draft`: a warm-up round, then `rounds` counted rounds, each measuring every server
at each level in balanced orders; each row carries the geometric mean of the per-round
ratios to AR (and, for history and the hybrid, to EAGLE-3 alone) with a 95% interval.
"""

from __future__ import annotations

import itertools
import json
import statistics
import tempfile
from contextlib import ExitStack
from pathlib import Path

from rich.console import Console

from specrl.bench.adaptive import balanced_orders, paired_ratio, verdict
from specrl.bench.draft import bench_server, rl_run_config
from specrl.bench.rollout import closed_loop
from specrl.bench.tasks import TASKS, Task, bench_meta, pick_tasks, task_prompts
from specrl.launcher import ServiceProcess, start_all
from specrl.tables import markdown_table, print_table

METHODS = ("ar", "eagle3", "history", "hybrid")
GROUP = 4  # samples per request (a GRPO group), fewer at concurrency below it
# history's settings in this bench: its defaults, the hybrid taking history's draft where
# it has at least 2 tokens
HYBRID = {"hybrid": True, "hybrid_min_draft": 2}

TABLE_COLUMNS = (
    "task",
    "method",
    "epoch",
    "concurrency",
    "tokens_per_s",
    "acceptance_length",
    "speedup_vs_ar",
    "vs_ar",
    "vs_eagle3",
)


def requests_per_level(c: int) -> int:
    """Requests of one measurement at concurrency c: two per client thread, at least 4."""
    return max(4, 2 * threads(c))


def threads(c: int) -> int:
    return max(1, c // group(c))


def group(c: int) -> int:
    return min(GROUP, c)


def _servers(task: Task, policy: str, k: int) -> list[ServiceProcess]:
    draft = f"zoo:{task.zoo}eagle3-domain"
    cells = {
        "ar": ("none", "", None),
        "eagle3": ("eagle3", draft, None),
        "history": ("history", "", {}),
        "hybrid": ("eagle3", draft, HYBRID),
    }
    return [
        ServiceProcess(bench_server(policy, m, d, k, False, h)) for m, d, h in (cells[x] for x in METHODS)
    ]


def _measure_epoch(
    task: Task,
    policy: str,
    k: int,
    prompts: dict[tuple[int, int], list[str]],
    levels: list[int],
    rounds: int,
    carried: dict[str, list[list[int]]],
    console: Console,
) -> tuple[dict[tuple[int, int], list[dict]], dict[str, list[list[int]]]]:
    """Every server of the epoch's policy up at once; results per (method index, level)
    over the counted rounds, and the history server's responses per prompt (the next
    epoch's carried history)."""
    procs = _servers(task, policy, k)
    done: dict[tuple[int, int], list[dict]] = {}
    responses: dict[str, list[list[int]]] = {}
    with ExitStack() as stack:
        for proc in procs:
            stack.callback(proc.stop)
        start_all(procs)
        orders = itertools.cycle(balanced_orders(len(procs)))
        for rnd in range(rounds + 1):
            for c in levels:
                for i in next(orders):
                    history = carried if METHODS[i] in ("history", "hybrid") else None
                    r = closed_loop(
                        procs[i].address,
                        prompts[(rnd, c)],
                        threads(c),
                        task.max_tokens,
                        n=group(c),
                        history=history,
                    )
                    if METHODS[i] == "history":
                        responses |= r["responses"]
                    if rnd:
                        done.setdefault((i, c), []).append(r)
            console.print(f"    round {rnd}{' (warm-up, not counted)' if not rnd else ''} done")
    return done, responses


def epoch_rows(
    task: str, epoch: int, done: dict[tuple[int, int], list[dict]], levels: list[int]
) -> list[dict]:
    """Rows of one epoch: each method's rate against AR's (and history's and the hybrid's
    against EAGLE-3 alone's) in the same rounds."""
    rows = []
    for c in levels:
        rate = {m: [r["tokens"] / r["seconds"] for r in done[(i, c)]] for i, m in enumerate(METHODS)}
        for i, method in enumerate(METHODS):
            results = done[(i, c)]
            drafts = sum(r["drafts"] for r in results)
            ratio, lo, hi = paired_ratio(rate[method], rate["ar"])
            row = {
                "task": task,
                "method": method,
                "epoch": epoch,
                "concurrency": c,
                "tokens_per_s": round(statistics.median(rate[method]), 1),
                "acceptance_length": round(1 + sum(r["accepted"] for r in results) / drafts, 3)
                if drafts
                else 1.0,
                "speedup_vs_ar": round(ratio, 3),
                "rounds": len(results),
                "ci_low": round(lo, 3),
                "ci_high": round(hi, 3),
                "vs_ar": "" if method == "ar" else verdict(lo, hi),
                "busy_starts": sum(r["busy_start"] for r in results),
            }
            if method in ("history", "hybrid"):
                e_ratio, e_lo, e_hi = paired_ratio(rate[method], rate["eagle3"])
                row |= {"speedup_vs_eagle3": round(e_ratio, 3), "vs_eagle3": verdict(e_lo, e_hi)}
            rows.append(row)
    return rows


def run_history_bench(
    out: Path,
    *,
    epochs: int = 3,
    steps: int = 4,
    k: int = 3,
    concurrency: list[int],
    tasks: list[str] | None = None,
    rounds: int = 2,
    console: Console | None = None,
) -> list[dict]:
    """`tasks`: names in TASKS (default: all), measured in that order."""
    from specrl.orchestrator.run import run

    console = console or Console(stderr=True)
    chosen = [TASKS[name] for name in pick_tasks(tasks)]
    per_round = sum(requests_per_level(c) for c in concurrency)
    pool = task_prompts(chosen, per_round * (rounds + 1), console)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="specrl-bench-history-") as tmp:
        for task in chosen:
            share = iter(pool)  # each (round, level) its own prompts, the same every epoch
            prompts = {
                (rnd, c): list(itertools.islice(share, requests_per_level(c)))
                for rnd in range(rounds + 1)
                for c in concurrency
            }
            policy, carried = f"zoo:{task.zoo}target", {}
            for epoch in range(epochs):
                if epoch:
                    console.print(
                        f"[bold]{task.name}[/bold]: epoch {epoch}: {steps} RL steps from the last policy"
                    )
                    cfg = rl_run_config(
                        task,
                        "eagle3-domain",
                        steps,
                        Path(tmp),
                        policy=policy,
                        adapt=False,
                        name=f"{task.name}-e{epoch}",
                    )
                    policy = str(Path(run(cfg, console=console, metrics=False).checkpoint) / "hf")
                console.print(f"[bold]{task.name}[/bold]: epoch {epoch}: measuring {len(METHODS)} servers")
                done, carried = _measure_epoch(
                    task, policy, k, prompts, concurrency, rounds, carried, console
                )
                got = epoch_rows(task.name, epoch, done, concurrency)
                for row in got:
                    console.print(
                        f"    {row['method']:<8} c={row['concurrency']:<3} {row['tokens_per_s']:>8.1f} tok/s"
                        f"  AL {row['acceptance_length']:.2f}  {row['speedup_vs_ar']:.2f}x AR {row['vs_ar']}"
                        f"  {row.get('vs_eagle3', '')}"
                    )
                rows += got
                _write(out, rows, steps=steps, k=k, rounds=rounds)
    print_table(rows, TABLE_COLUMNS, "history benchmark", console)
    return rows


def _write(out: Path, rows: list[dict], *, steps: int, k: int, rounds: int) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = bench_meta(k=k, group=GROUP, rl_steps_per_epoch=steps, rounds=rounds, hybrid=HYBRID)
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    out.with_suffix(".md").write_text(markdown_table(rows, TABLE_COLUMNS) + "\n")
