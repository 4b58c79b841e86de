"""What `bench history` and `bench staleness` share: a task's rollout servers of one
policy version measured together, in a warm-up round and counted rounds of balanced
orders (as `bench draft`), with each prompt's responses of an earlier version carried to
the servers that draft from history (Prompt.history, as the orchestrator carries them:
orchestrator/carry.py), and rows paired with AR and with the cells a benchmark names
(EAGLE-3 alone, history alone) in the same rounds.

A request samples a group (n = GROUP samples, siblings of each other; fewer below that
concurrency); concurrency counts sequences in flight: c/n client threads. Every (round,
concurrency) measurement has prompts of its own, different from every other's and the
same at every version, so a prompt comes back once per version, as RL's prompts come
back once per epoch: the task's training prompts (RL samples its training set), as the
test split's ~80 problems are fewer than a run measures (192 at 3 rounds), and a prompt
measured twice in one version would find history of that version on the server.

Servers are either started afresh for every version (`fresh`: each on the version's
checkpoint, carried the earlier responses its cell asks for) or started once and kept
across the versions (`kept`), the next version's weights pushed into them over the
weight-sync path as a run's trainer pushes them (weightsync/sender.py): a run keeps its
rollout servers from epoch to epoch, and what a server holds over an update (history
aged, not dropped; the draft model's state) only a kept server shows. Nothing is carried
to kept servers: they hold each prompt's earlier responses themselves."""

from __future__ import annotations

import itertools
import json
import statistics
import tempfile
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, get_args

import torch
from rich.console import Console

from specrl.bench.adaptive import balanced_orders, paired_ratio, verdict
from specrl.bench.draft import bench_server
from specrl.bench.rollout import closed_loop
from specrl.bench.tasks import TASKS, Task, bench_meta, pick_tasks, task_prompts
from specrl.config import WeightSenderConfig, resolve_model_path
from specrl.launcher import ServiceProcess, start_all
from specrl.rollout.api import RolloutClient
from specrl.tables import markdown_table, print_table
from specrl.weightsync.sender import WeightSender

GROUP = 4  # samples per request (a GRPO group)
# what a hybrid server did in a measurement (its GetStatus counters, rollout/server.py):
# rows drafted by each source, steps of history alone, steps some row drafted past k, rows
# left out of the draft model's pass, steps on vLLM's padded drafter path (an idle replica),
# rows whose draft model's draft history extended
HYBRID_COUNTS = (
    "history_rows",
    "model_rows",
    "first_pass_only_steps",
    "long_draft_steps",
    "left_out_rows",
    "padded_steps",
    "extended_rows",
)
Responses = dict[str, list[list[int]]]  # prompt -> its responses
Servers = Literal["fresh", "kept"]  # started for every version, or kept across them (module docstring)
SERVERS: tuple[str, ...] = get_args(Servers)
Done = dict[tuple[int, int], list[dict]]  # (cell index, level) -> its closed-loop results


@dataclass(frozen=True)
class Cell:
    """One server of a version: `name` in the rows, its speculation (`k`: its own draft
    length; None: the benchmark's), and which earlier responses it is carried: "" none,
    "last" the previous version's, "first" version 0's (history written by a policy ever
    further away)."""

    name: str
    method: str
    draft: str = ""
    history: dict | None = None
    carry: Literal["", "last", "first"] = ""
    k: int | None = None

    @property
    def hybrid(self) -> bool:
        return bool((self.history or {}).get("hybrid"))


# A benchmark's next version of a task: (its label, e.g. the epoch or policy step; the
# policy; the cells to measure), from the version's index and a scratch directory.
Advance = Callable[[Task, int, Path], tuple[int, str, list["Cell"]]]
# after each block of kept servers: every version's (label, cells, results so far), blocks done
BlockDone = Callable[[list[tuple[int, list[Cell], Done]], int], None]


def run_over_versions(
    out: Path,
    advance: Advance,
    *,
    versions: int,
    keys: tuple[str, str],
    columns: tuple[str, ...],
    meta: dict,
    k: int,
    concurrency: list[int],
    tasks: list[str] | None,
    rounds: int,
    console: Console,
    versus: tuple[str, ...] = (),
    blocks: int = 1,
    servers: Servers = "fresh",
) -> list[dict]:
    """For each task (names in TASKS; None: all) and each of `versions` versions, measure
    the cells `advance` gives, on servers `fresh` for each version (carrying earlier
    responses as each cell asks) or `kept` across them (module docstring). Rows name the
    cell and the version by `keys` (cell key, version key); written to `out` (JSON, and
    Markdown beside) after every version measured, so a long run that fails keeps what it
    did (kept: every version's rows after each block of servers, over the blocks so far,
    the meta's `partial` saying how many until the last). `blocks`: each version's servers
    (kept: each task's) are started that many times (measure)."""
    block_rounds(rounds, blocks)  # checked before any server starts
    if servers not in SERVERS:
        raise ValueError(f"servers are one of {', '.join(SERVERS)}, not {servers!r}")
    chosen = [TASKS[name] for name in pick_tasks(tasks)]
    pool = task_prompts(chosen, pool_size(concurrency, rounds), console, distinct=True)
    prompts = prompt_sets(pool, concurrency, rounds)
    cell_key, version_key = keys
    rows: list[dict] = []
    each = _on_fresh_servers if servers == "fresh" else _on_kept_servers
    measuring = {"k": k, "prompts": prompts, "levels": concurrency, "rounds": rounds, "blocks": blocks}
    full_meta = bench_meta(k=k, group=GROUP, rounds=rounds, blocks=blocks, **meta) | {"servers": servers}

    def rows_of(task: Task, label: int, cells: list[Cell], done: Done) -> list[dict]:
        return [
            {"task": task.name, version_key: label, cell_key: r.pop("name")} | r
            for r in paired_rows(cells, done, concurrency, versus)
        ]

    def write(table: list[dict], partial: str = "") -> None:
        out.parent.mkdir(parents=True, exist_ok=True)
        written = full_meta | ({"partial": partial} if partial else {})
        out.write_text(json.dumps({"meta": written, "rows": table}, indent=2))
        out.with_suffix(".md").write_text(markdown_table(table, columns) + "\n")

    def partial_rows(task: Task) -> BlockDone:
        """Kept servers: every version's rows of `task` over the blocks measured so far."""

        def written(measured: list[tuple[int, list[Cell], Done]], blocks_done: int) -> None:
            if blocks_done < blocks:
                so_far = [row for version in measured for row in rows_of(task, *version)]
                write(rows + so_far, f"{task.name}: {blocks_done} of {blocks} blocks measured")
                console.print(f"    {out}: every {version_key}'s rows over {blocks_done} of {blocks} blocks")

        return written

    with tempfile.TemporaryDirectory(prefix="specrl-bench-") as tmp:
        for task in chosen:
            kept = {"block_done": partial_rows(task)} if servers == "kept" else {}
            for label, cells, done in each(
                task, advance, versions, Path(tmp), version_key, console, **kept, **measuring
            ):
                got = rows_of(task, label, cells, done)
                for row in got:
                    against = "".join(f"  vs {v} {row[f'vs_{v}']}" for v in versus if f"vs_{v}" in row)
                    console.print(
                        f"    {row[cell_key]:<16} c={row['concurrency']:<3} {row['tokens_per_s']:>8.1f} tok/s"
                        f"  AL {row['acceptance_length']:.2f}  {row['speedup_vs_ar']:.2f}x AR {row['vs_ar']}"
                        f"{against}{_hybrid_summary(row)}"
                    )
                rows += got
                write(rows)
    print_table(rows, columns, out.stem, console)
    return rows


def _on_fresh_servers(
    task: Task, advance: Advance, versions: int, tmp: Path, version_key: str, console: Console, **measuring
) -> Iterator[tuple[int, list[Cell], Done]]:
    """Each version measured as it is made, on servers of its own, each cell carried the
    earlier responses it asks for: (the version's label, its cells, their results)."""
    carried: dict[str, Responses] = {}
    for index in range(versions):
        label, policy, cells = advance(task, index, tmp)
        console.print(f"[bold]{task.name}[/bold]: {version_key} {label}: measuring")
        done, written = measure(
            policy, cells=cells, carried=carried, max_tokens=task.max_tokens, console=console, **measuring
        )
        carried = {"first": carried.get("first", written), "last": written}
        yield label, cells, done


def _on_kept_servers(
    task: Task,
    advance: Advance,
    versions: int,
    tmp: Path,
    version_key: str,
    console: Console,
    block_done: BlockDone | None = None,
    **measuring,
) -> Iterator[tuple[int, list[Cell], Done]]:
    """Every version made first, then measured in order on servers kept across them
    (measure_kept): (each version's label, its cells, their results); `block_done` is
    told every version's results after each block."""
    made = [advance(task, index, tmp) for index in range(versions)]
    cells = made[0][2]
    if any(c != cells for _, _, c in made):
        raise ValueError("servers kept across versions measure the same cells at every version")
    console.print(f"[bold]{task.name}[/bold]: {version_key}s {', '.join(str(m[0]) for m in made)}: measuring")
    policies, labels = [policy for _, policy, _ in made], [label for label, _, _ in made]

    def each_block(done: list[Done], blocks_done: int) -> None:
        if block_done is not None:
            block_done([(label, cells, results) for label, results in zip(labels, done)], blocks_done)

    done = measure_kept(
        policies, cells=cells, max_tokens=task.max_tokens, console=console, block_done=each_block, **measuring
    )
    for label, results in zip(labels, done):
        yield label, cells, results


def group(c: int) -> int:
    return min(GROUP, c)


def threads(c: int) -> int:
    return max(1, c // group(c))


def requests_per_level(c: int) -> int:
    """Requests of one measurement at concurrency c: two per client thread, at least 4."""
    return max(4, 2 * threads(c))


def prompt_sets(pool: list[str], levels: list[int], rounds: int) -> dict[tuple[int, int], list[str]]:
    """Each (round, level) its own prompts from `pool` (warm-up round 0 included)."""
    share = iter(pool)
    return {
        (rnd, c): list(itertools.islice(share, requests_per_level(c)))
        for rnd in range(rounds + 1)
        for c in levels
    }


def pool_size(levels: list[int], rounds: int) -> int:
    return (rounds + 1) * sum(requests_per_level(c) for c in levels)


class _Rounds:
    """The rounds of one version's measurement: each cell's server in a balanced order per
    round and level, its results kept for the counted rounds (`done`) and AR's responses
    (`written`: cells[0] is AR)."""

    def __init__(
        self,
        cells: list[Cell],
        prompts: dict[tuple[int, int], list[str]],
        levels: list[int],
        max_tokens: int,
        orders: Iterator[tuple[int, ...]],
        carried: dict[str, Responses],
    ) -> None:
        self.cells, self.prompts, self.levels, self.max_tokens = cells, prompts, levels, max_tokens
        self.orders, self.carried = orders, carried
        self.done: Done = {}
        self.written: Responses = {}

    def run(self, procs: list[ServiceProcess], rnd: int, block: int, console: Console) -> None:
        for c in self.levels:
            for i in next(self.orders):
                cell = self.cells[i]
                before = _hybrid_counts(procs[i].address) if cell.hybrid else None
                r = closed_loop(
                    procs[i].address,
                    self.prompts[(rnd, c)],
                    threads(c),
                    self.max_tokens,
                    n=group(c),
                    history=self.carried.get(cell.carry) if cell.carry else None,
                )
                if before is not None:
                    after = _hybrid_counts(procs[i].address)
                    r["hybrid"] = {f: after[f] - before[f] for f in HYBRID_COUNTS}
                if i == 0:
                    self.written.update(r["responses"])
                if rnd:
                    self.done.setdefault((i, c), []).append(r | {"block": block})
        console.print(f"    round {rnd}{' (warm-up, not counted)' if not rnd else ''} done")


def _started(
    stack: ExitStack, configs: list, block: int, blocks: int, console: Console
) -> list[ServiceProcess]:
    """The servers of `configs` started (stopped when `stack` closes)."""
    procs = [ServiceProcess(cfg) for cfg in configs]
    for proc in procs:
        stack.callback(proc.stop)
    if blocks > 1:
        console.print(f"    block {block + 1}/{blocks}: servers started afresh")
    start_all(procs)
    return procs


def measure(
    policy: str,
    k: int,
    cells: list[Cell],
    prompts: dict[tuple[int, int], list[str]],
    levels: list[int],
    rounds: int,
    carried: dict[str, Responses],
    max_tokens: int,
    console: Console,
    blocks: int = 1,
) -> tuple[Done, Responses]:
    """Every cell's server of `policy` up at once; closed-loop results per (cell index,
    level) over the counted rounds, and AR's responses per prompt (what this version wrote,
    for later versions to carry: cells[0] is AR). `carried[cell.carry]`: the responses a
    cell is carried. The counted rounds are split into `blocks` runs of consecutive rounds,
    each on servers started afresh after a warm-up round of their own (round 0's prompts
    again); a result's "block" says which."""
    configs = [bench_server(policy, c.method, c.draft, c.k or k, False, c.history) for c in cells]
    rounds_ = _Rounds(
        cells, prompts, levels, max_tokens, itertools.cycle(balanced_orders(len(cells))), carried
    )
    for block, counted in enumerate(block_rounds(rounds, blocks)):
        with ExitStack() as stack:
            procs = _started(stack, configs, block, blocks, console)
            for rnd in [0, *counted]:
                rounds_.run(procs, rnd, block, console)
    return rounds_.done, rounds_.written


def measure_kept(
    policies: list[str],
    k: int,
    cells: list[Cell],
    prompts: dict[tuple[int, int], list[str]],
    levels: list[int],
    rounds: int,
    max_tokens: int,
    console: Console,
    blocks: int = 1,
    block_done: Callable[[list[Done], int], None] | None = None,
) -> list[Done]:
    """Every cell's server started on `policies[0]` and kept across the versions: each
    later version's weights pushed into all of them (a WeightSender, as a run's trainer
    pushes them), then a warm-up round after the push and the counted rounds. The counted
    rounds are split into `blocks` as in `measure`, each block's servers started afresh
    and taken through every version. Results per version, as `measure`'s; nothing is
    carried (the servers hold the earlier versions' responses). `block_done`: told the
    results so far and the blocks done after each block."""
    configs = [bench_server(policies[0], c.method, c.draft, c.k or k, False, c.history) for c in cells]
    orders = itertools.cycle(balanced_orders(len(cells)))
    per_version = [_Rounds(cells, prompts, levels, max_tokens, orders, {}) for _ in policies]
    for block, counted in enumerate(block_rounds(rounds, blocks)):
        with ExitStack() as stack:
            procs = _started(stack, configs, block, blocks, console)
            sender = WeightSender(WeightSenderConfig(kind="policy", timeout_s=600))
            stack.callback(sender.close)
            for proc in procs:
                sender.add_replica(proc.address)
            for version, (policy, rounds_) in enumerate(zip(policies, per_version)):
                if version:
                    seconds = push_policy(sender, version, policy)
                    console.print(
                        f"    version {version}'s weights pushed to the servers kept ({seconds:.1f} s)"
                    )
                for rnd in [0, *counted]:
                    rounds_.run(procs, rnd, block, console)
        if block_done is not None:
            block_done([rounds_.done for rounds_ in per_version], block + 1)
    return [rounds_.done for rounds_ in per_version]


def push_policy(sender: WeightSender, version: int, policy: str) -> float:
    """Push `policy` (a checkpoint, or a zoo name) to `sender`'s replicas as `version`;
    the push's seconds."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(resolve_model_path(policy), dtype=torch.float32)
    return sender.push(version, model.named_parameters).seconds


def block_rounds(rounds: int, blocks: int) -> list[list[int]]:
    """The counted rounds 1 .. `rounds` in `blocks` runs of consecutive rounds, as even as
    they split."""
    if not 1 <= blocks <= rounds:
        raise ValueError(f"--blocks must be 1 to {rounds} (the counted rounds), not {blocks}")
    return [list(range(1 + b * rounds // blocks, 1 + (b + 1) * rounds // blocks)) for b in range(blocks)]


def _hybrid_summary(row: dict) -> str:
    if "history_rows" not in row:
        return ""
    rows = row["history_rows"] + row["model_rows"]
    return (
        f"  rows from history {row['history_rows']}/{rows}, steps of history alone"
        f" {row['first_pass_only_steps']}, long {row['long_draft_steps']}, left out {row['left_out_rows']},"
        f" padded {row['padded_steps']}, extended {row['extended_rows']}"
    )


def _hybrid_counts(address: str) -> dict[str, int]:
    with RolloutClient(address) as client:
        state = client.status().speculation
    return {f: getattr(state, f) for f in HYBRID_COUNTS}


def paired_rows(
    cells: list[Cell],
    done: dict[tuple[int, int], list[dict]],
    levels: list[int],
    versus: tuple[str, ...] = (),
) -> list[dict]:
    """Per level and cell: the median rate, acceptance length and the rate paired with
    AR's (cells[0]) in the same rounds, and, for the cells drafting from history, with
    each other cell named in `versus` (the hybrid against EAGLE-3 alone and against
    history alone: it must beat both to earn its cost). With results from two blocks of
    servers or more, the intervals are over the blocks (paired_ratio)."""
    rows = []
    for c in levels:
        rate = {cell.name: [r["tokens"] / r["seconds"] for r in done[(i, c)]] for i, cell in enumerate(cells)}
        blocks = [r.get("block", 0) for r in done[(0, c)]]
        for i, cell in enumerate(cells):
            results = done[(i, c)]
            drafts = sum(r["drafts"] for r in results)
            ratio, lo, hi = paired_ratio(rate[cell.name], rate[cells[0].name], blocks)
            row = {
                "name": cell.name,
                "concurrency": c,
                "tokens_per_s": round(statistics.median(rate[cell.name]), 1),
                "acceptance_length": round(1 + sum(r["accepted"] for r in results) / drafts, 3)
                if drafts
                else 1.0,
                "speedup_vs_ar": round(ratio, 3),
                "rounds": len(results),
                "blocks": len(set(blocks)),
                "ci_low": round(lo, 3),
                "ci_high": round(hi, 3),
                "vs_ar": verdict(lo, hi) if i else "",
                "busy_starts": sum(r["busy_start"] for r in results),
            }
            if cell.hybrid:  # what the hybrid did, summed over the rounds
                row |= {f: sum(r["hybrid"][f] for r in results) for f in HYBRID_COUNTS}
            for other in versus if cell.history is not None else ():
                if other != cell.name:
                    v_ratio, v_lo, v_hi = paired_ratio(rate[cell.name], rate[other], blocks)
                    row |= {f"speedup_vs_{other}": round(v_ratio, 3), f"vs_{other}": verdict(v_lo, v_hi)}
            rows.append(row)
    return rows
