"""`specrl bench adaptive`: is the adaptive k controller ever slower than AR, or than the
best fixed k? Interleaved and repeated, because on a small shared machine one pass of
one server is not enough to tell differences of 10-20% apart.

All servers of one speculator run at once (AR, the speculator at each fixed k, and with
`speculation.adaptive` choosing k up to the largest); every round measures each of them
at each concurrency, in orders that change from one measurement to the next, so drift of
the machine spreads evenly over the variants, and every server follows every other one
equally often (an engine busy-polls for a second after its last request, vLLM's
shared-memory queues; `closed_loop` waits for that to end, and the balanced orders
spread whatever remains). Round 0 is a
warm-up for every server (and the controller's learning pass) and is not counted; the
table gives the median tokens/s of the other rounds, their spread, and the ratio of
medians to AR's.

Whether a variant is slower than AR is a paired question: each counted round measures
both within minutes of each other, so the round's ratio cancels most of the machine's
drift that separates rounds. The rows carry the geometric mean of those per-round
ratios with a 95% confidence interval (Student's t on the log ratios), against AR and,
for the controller, against the best fixed k of that concurrency; "slower" and "faster"
are claimed only when the interval excludes 1, and its width is the resolution the run
had.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path

from rich.console import Console

from specrl.bench.report import machine
from specrl.bench.rollout import TEMPERATURE, Variant, chosen_k, closed_loop
from specrl.bench.tasks import TASKS, Task, task_prompts
from specrl.launcher import ServiceProcess
from specrl.tables import markdown_table, print_table

TABLE_COLUMNS = (
    "speculator",
    "variant",
    "concurrency",
    "tokens_per_s",
    "min",
    "max",
    "speedup_vs_ar",
    "paired_vs_ar",
    "vs_ar",
    "paired_vs_best_k",
    "vs_best_k",
    "k_at_c",
)
PRINTED = (
    "speculator", "variant", "concurrency", "tokens_per_s", "speedup_vs_ar", "vs_ar", "vs_best_k", "k_at_c",
)  # fmt: skip


def run_adaptive_bench(
    out: Path,
    *,
    speculators: list[tuple[str, str]],
    ks: list[int],
    concurrency: list[int],
    rounds: int = 3,
    paused: bool = False,
    task: Task = TASKS["rl-zero"],
    console: Console | None = None,
) -> list[dict]:
    """`paused`: also each speculator's server held at k=0 everywhere with its drafter
    paused, the engine the controller leaves running when it turns speculation off.
    `task`: whose target and drafts are served, on how many prompts (its share of
    max(32, 4c) per level) of how many tokens."""
    console = console or Console(stderr=True)
    per_level = {c: task.prompts(max(32, 4 * c)) for c in concurrency}
    prompts = task_prompts([task], max(per_level.values()), console)
    rows: list[dict] = []
    for method, draft in speculators:
        variants = [Variant("none", "", 0, zoo=task.zoo)]
        variants += [Variant(method, draft, k, zoo=task.zoo) for k in ks]
        variants.append(Variant(method, draft, max(ks), adaptive=True, zoo=task.zoo))
        if paused:
            variants.append(Variant(method, draft, max(ks), paused=True, zoo=task.zoo))
        name = task.zoo + draft if draft else method
        console.print(f"[bold]{name}[/bold]: {', '.join(v.label for v in variants)}")
        with ExitStack() as stack:
            procs = [stack.enter_context(ServiceProcess(v.config())) for v in variants]
            rates: dict[tuple[int, int], list[float]] = {}
            busy = 0
            orders = itertools.cycle(balanced_orders(len(variants)))
            for rnd in range(rounds + 1):
                for c in concurrency:
                    for i in next(orders):
                        r = closed_loop(procs[i].address, prompts[: per_level[c]], c, task.max_tokens)
                        if rnd:
                            rates.setdefault((i, c), []).append(r["tokens"] / r["seconds"])
                            busy += r["busy_start"]
                console.print(f"  round {rnd}{' (warm-up, not counted)' if not rnd else ''} done")
            k_now = {
                (i, c): chosen_k(procs[i].address, c)
                for i, v in enumerate(variants)
                if v.adaptive
                for c in concurrency
            }
            rows += [  # busy_starts: counted measurements of this speculator's servers, all of them
                row | {"busy_starts": busy} for row in table_rows(variants, rates, concurrency, name, k_now)
            ]
            if busy:
                console.print(
                    f"  [yellow]{busy} measurement(s) began on a busy CPU (never went quiet)[/yellow]"
                )
            for row in rows[-len(variants) * len(concurrency) :]:
                console.print(
                    f"  {row['variant']:<10} c={row['concurrency']:<3} {row['tokens_per_s']:>8.1f} tok/s "
                    f"[{row['min']}, {row['max']}]  {row['speedup_vs_ar']:.2f}x AR  k {row['k_at_c']}"
                    f"  {row.get('vs_ar', '')}"
                )
        _write(out, rows, rounds, task)
    print_table(rows, PRINTED, "adaptive k vs fixed k vs AR (medians of interleaved rounds)", console)
    return rows


def balanced_orders(n: int) -> list[list[int]]:
    """Orders of range(n) in which every item directly follows every other one equally
    often (a Williams design: n orders for even n, 2n for odd n)."""
    first, low, high = [0], 1, n - 1
    while len(first) < n:
        first.append(low)
        low += 1
        if len(first) < n:
            first.append(high)
            high -= 1
    orders = [[(x + shift) % n for x in first] for shift in range(n)]
    return orders if n % 2 == 0 else orders + [order[::-1] for order in orders]


def paired_ratio(
    got: list[float], base: list[float], blocks: Sequence[int] | None = None
) -> tuple[float, float, float]:
    """Geometric mean of the per-round ratios got[r] / base[r] and its 95% confidence
    interval (Student's t on the log ratios; unbounded with fewer than two rounds).
    `blocks`: each round's block of servers (rounds between two starts of the servers).
    With two blocks or more the interval is over the blocks' mean log ratios: a server
    keeps a speed offset of its own for as long as it runs (4.4% a step between two
    identical servers on the CPU testbed), which rounds on the same servers share and do
    not average out."""
    from scipy.stats import t

    if len(got) != len(base) or not got or (blocks is not None and len(blocks) != len(got)):
        raise ValueError(f"paired rounds needed, got {len(got)} and {len(base)}")
    logs = [math.log(a / b) for a, b in zip(got, base)]
    if blocks is not None and len(set(blocks)) > 1:
        by_block: dict[int, list[float]] = {}
        for block, x in zip(blocks, logs):
            by_block.setdefault(block, []).append(x)
        logs = [statistics.fmean(xs) for xs in by_block.values()]
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return math.exp(mean), 0.0, math.inf
    half = t.ppf(0.975, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


def verdict(lo: float, hi: float) -> str:
    """What a paired interval lets one claim."""
    if hi < 1:
        return f"slower [{lo:.2f}, {hi:.2f}]"
    if lo > 1:
        return f"faster [{lo:.2f}, {hi:.2f}]"
    return f"not resolved [{lo:.2f}, {hi:.2f}]"


def table_rows(
    variants: list[Variant],
    rates: dict[tuple[int, int], list[float]],
    concurrency: list[int],
    speculator: str,
    adaptive_k: dict[tuple[int, int], int],
) -> list[dict]:
    """One row per variant and concurrency from `rates[(variant index, c)]` (counted
    rounds in order; variant 0 is AR). `adaptive_k[(i, c)]`: the k the controller of
    variant i ended at for concurrency c."""
    rows = []
    fixed = [i for i, v in enumerate(variants) if v.method != "none" and not v.adaptive and not v.paused]
    for c in concurrency:
        ar = statistics.median(rates[(0, c)])
        best = max(fixed, key=lambda i: statistics.median(rates[(i, c)])) if fixed else None
        for i, v in enumerate(variants):
            got = rates[(i, c)]
            kind = "paused" if v.paused else ("adaptive" if v.adaptive else f"k={v.k}")
            name = "ar" if v.method == "none" else kind
            row = {
                "speculator": speculator,
                "variant": name,
                "concurrency": c,
                "tokens_per_s": round(statistics.median(got), 1),
                "min": round(min(got), 1),
                "max": round(max(got), 1),
                "rounds": [round(x, 1) for x in got],
                "speedup_vs_ar": round(statistics.median(got) / ar, 3),
                "k_at_c": adaptive_k[(i, c)] if v.adaptive else (0 if v.paused else v.k),
            }
            if i:
                row |= _paired("ar", got, rates[(0, c)])
            if v.adaptive and best is not None:
                row |= _paired("best_k", got, rates[(best, c)]) | {"best_k": variants[best].k}
            rows.append(row)
    return rows


def _paired(against: str, got: list[float], base: list[float]) -> dict:
    ratio, lo, hi = paired_ratio(got, base)
    return {
        f"paired_vs_{against}": round(ratio, 3),
        f"ci95_vs_{against}": [round(lo, 3), round(hi, 3)],
        f"vs_{against}": verdict(lo, hi),
    }


def _write(out: Path, rows: list[dict], rounds: int, task: Task) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "machine": machine(),
        "task": task.name,
        "max_tokens": task.max_tokens,
        "temperature": TEMPERATURE,
        "rounds": rounds,
    }
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    out.with_suffix(".md").write_text(markdown_table(rows, TABLE_COLUMNS) + "\n")
