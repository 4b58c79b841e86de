"""`specrl`: the single entry point. Commands parse and validate their config first and
import torch / vLLM only after, so `--help` and config errors are instant."""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from pathlib import Path

import typer
from rich.console import Console

from specrl import shutdown
from specrl.config import (
    ConfigError,
    DraftInitConfig,
    DraftTrainerServerConfig,
    RolloutServerConfig,
    RunConfig,
    TrainerServerConfig,
    load_config,
    validate,
)
from specrl.speculation import HISTORY_DRAFT

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="specrl: lossless speculative decoding for RL post-training.",
)
zoo_app = typer.Typer(no_args_is_help=True, help="The tiny deterministic model zoo (CPU testbed).")
serve_app = typer.Typer(no_args_is_help=True, help="Run a specrl service.")
draft_app = typer.Typer(no_args_is_help=True, help="EAGLE-3 drafts: offline initialization.")
verify_app = typer.Typer(no_args_is_help=True, help="Statistical checks against a running server.")
bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks (JSON + PNG outputs).")
simulate_app = typer.Typer(no_args_is_help=True, help="Performance model and capacity planner.")
data_app = typer.Typer(no_args_is_help=True, help="Your own data: read it as a run will, before the run.")
app.add_typer(zoo_app, name="zoo")
app.add_typer(serve_app, name="serve")
app.add_typer(draft_app, name="draft")
app.add_typer(verify_app, name="verify")
app.add_typer(bench_app, name="bench")
app.add_typer(simulate_app, name="simulate")
app.add_typer(data_app, name="data")

console = Console(stderr=True)


def _logging(verbose: bool) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


# sysexits.h: a retry may succeed. `specrl run` exits with it when a service failed and
# the run's state is kept (`--resume` / `--continue`); a Kubernetes Job retries on it,
# and fails at once on 2 (bad input, nothing to resume: a retry cannot help).
EX_TEMPFAIL = 75


def _fail(message: str, code: int = 2) -> None:
    console.print(f"[red]error:[/red] {message}")
    raise typer.Exit(code)


@zoo_app.command("build")
def zoo_build(
    home: Path = typer.Option(None, help="Zoo root (default: $SPECRL_HOME/zoo)."),
    seed: int = typer.Option(
        None, help="Seed of every random choice in the build (default: $SPECRL_ZOO_SEED, else 0)."
    ),
    force: bool = typer.Option(False, help="Rebuild even if a matching build is cached."),
    think: bool = typer.Option(
        False, help="Also the RL-Think variant (a reasoning-trace SFT of the target and its heads, ~13 min)."
    ),
) -> None:
    """Build (or reuse) the task, target, EAGLE-3 drafts and the external draft model."""
    from specrl.zoo.build import build_zoo, zoo_root
    from specrl.zoo.think import THINK_DIR, build_think

    root = home or zoo_root()
    manifest = build_zoo(root, seed=seed, force=force, console=console)
    listed = list(manifest["models"].items())
    if think:
        variant = build_think(root, seed=seed, force=force, console=console)
        listed += [(f"{THINK_DIR}/{name}", info) for name, info in variant["models"].items()]
    console.print(f"[green]zoo ready[/green] at {root}")
    for name, info in listed:
        console.print(f"  zoo:{name:<20} {info['summary']}")


@zoo_app.command("info")
def zoo_info(home: Path = typer.Option(None, help="Zoo root.")) -> None:
    """Show what the cached zoo holds (and its RL-Think variant, when built), with its
    fingerprint (SHA-256 of each model's files): two zoos with equal fingerprints are the
    same models. Exits 1 when the files no longer match the fingerprint they were built with."""
    import json

    from specrl.zoo.build import load_manifest, zoo_root
    from specrl.zoo.isolated import fingerprint
    from specrl.zoo.think import THINK_DIR

    root = home or zoo_root()
    manifest = load_manifest(root)
    if manifest is None:
        _fail(f"no zoo at {root}: run `specrl zoo build`")
    assert manifest is not None
    changed = []
    parts = {"": (root, manifest)}
    if think := load_manifest(root / THINK_DIR):  # the RL-Think variant (`zoo build --think`)
        manifest[THINK_DIR] = think
        parts[THINK_DIR] = (root / THINK_DIR, think)
    for label, (where, built) in parts.items():
        now = fingerprint(where, list(built["models"]))
        if built.get("fingerprint") != now:
            changed.append(label or "zoo")
    print(json.dumps(manifest, indent=2))
    if changed:
        console.print(
            f"[red]{', '.join(changed)}: files differ from the build's fingerprint "
            "(edited, or built before fingerprints): `specrl zoo build --force`[/red]"
        )
        raise typer.Exit(1)


@serve_app.command("rollout")
def serve_rollout(
    config: Path = typer.Option(..., "--config", "-c", help="RolloutServerConfig YAML."),
    port: int = typer.Option(None, help="Override the config's port (0: any free port)."),
    ready_file: Path = typer.Option(None, help="Write the bound port here once serving."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Serve generation with the configured (speculative) engine over gRPC (engine.kind)."""
    overrides = {} if port is None else {"port": port}
    try:
        cfg = load_config(config, RolloutServerConfig, overrides)
    except ConfigError as e:
        _fail(str(e))
    if why := cfg.node0_port_error():
        _fail(f"{config}: {why}")
    _logging(verbose)
    from specrl.rollout.engines.base import UnsupportedEngine
    from specrl.rollout.server import serve

    try:
        code = asyncio.run(serve(cfg, ready_file=str(ready_file) if ready_file else None))
    except UnsupportedEngine as e:
        _fail(str(e))
    shutdown.exit_now(code)  # its weight receiver ran gloo collectives (exit_now: why)


@serve_app.command("rollout-worker")
def serve_rollout_worker(
    config: Path = typer.Option(..., "--config", "-c", help="The replica's RolloutServerConfig YAML."),
    node_rank: int = typer.Option(
        None, min=1, help="This node's rank in the engine (default: $LWS_WORKER_INDEX, a LeaderWorkerSet's)."
    ),
    ready_file: Path = typer.Option(
        None, help="Taken as every serve command takes it; a worker node serves nothing, so none is written."
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Run node N > 0 of a rollout replica whose engine spans machines
    (engine.nnodes): its workers, driven by node 0's `specrl serve rollout`."""
    try:
        cfg = load_config(config, RolloutServerConfig)
    except ConfigError as e:
        _fail(str(e))
    if why := cfg.node0_port_error():
        _fail(f"{config}: {why}")
    if node_rank is None:
        index = os.environ.get("LWS_WORKER_INDEX", "")
        if not index.isdigit():
            _fail("--node-rank is needed (no LWS_WORKER_INDEX in the environment)")
        node_rank = int(index)
    _logging(verbose)
    from specrl.rollout.engines import serve_worker_node
    from specrl.rollout.engines.base import UnsupportedEngine

    try:
        serve_worker_node(cfg, node_rank)
    except (ValueError, UnsupportedEngine) as e:
        _fail(str(e))


@serve_app.command("trainer")
def serve_trainer(
    config: Path = typer.Option(..., "--config", "-c", help="TrainerServerConfig YAML."),
    port: int = typer.Option(None, help="Override the config's port (0: any free port)."),
    ready_file: Path = typer.Option(None, help="Write the bound port here once serving (rank 0)."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Serve the GRPO trainer over gRPC. One process per rank, torchrun-compatible
    (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT); rank 0 serves, the others follow."""
    overrides = {} if port is None else {"port": port}
    try:
        cfg = load_config(config, TrainerServerConfig, overrides)
    except ConfigError as e:
        _fail(str(e))
    _logging(verbose)
    from specrl.trainer.server import serve

    serve(cfg, ready_file=str(ready_file) if ready_file else None)


@serve_app.command("draft-trainer")
def serve_draft_trainer(
    config: Path = typer.Option(..., "--config", "-c", help="DraftTrainerServerConfig YAML."),
    port: int = typer.Option(None, help="Override the config's port (0: any free port)."),
    ready_file: Path = typer.Option(None, help="Write the bound port here once serving."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Adapt the EAGLE-3 draft on the trainer's captured features and publish it to the
    rollout servers (PushDraft) over gRPC."""
    overrides = {} if port is None else {"port": port}
    try:
        cfg = load_config(config, DraftTrainerServerConfig, overrides)
    except ConfigError as e:
        _fail(str(e))
    _logging(verbose)
    from specrl.draft.server import serve
    from specrl.draft.service import DraftConfigError

    try:
        code = serve(cfg, ready_file=str(ready_file) if ready_file else None)
    except DraftConfigError as e:
        _fail(str(e))
    shutdown.exit_now(code)  # its weight sender ran gloo collectives (exit_now: why)


def _overrides(items: list[str]) -> dict:
    """`--set a.b=value` pairs; values are parsed as YAML (numbers, booleans, lists)."""
    import yaml

    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            _fail(f"--set expects KEY=VALUE, got {item!r}")
        out[key] = yaml.safe_load(value)
    return out


@app.command("run")
def run_command(
    config: Path = typer.Option(..., "--config", "-c", help="RunConfig YAML (examples/tiny-rl-zero.yaml)."),
    set_: list[str] = typer.Option([], "--set", help="Override a config field: --set orchestrator.steps=5."),
    fresh: bool = typer.Option(False, help="Replace a previous run in the same run directory."),
    resume: bool = typer.Option(
        False, help="Continue the run in the run directory from its last checkpoint (after a crash or kill)."
    ),
    continue_: bool = typer.Option(
        False,
        "--continue",
        help="--resume when the run directory holds the run, else start it (a Kubernetes Job's retries).",
    ),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Run RL end to end: Redis, rollout replicas, trainer and the orchestrator's loop."""
    try:
        cfg = load_config(config, RunConfig, _overrides(set_))
    except ConfigError as e:
        _fail(str(e))
    _logging(verbose)
    from specrl.data.sources import DataError
    from specrl.orchestrator.run import RunExists, RunInterrupted, run
    from specrl.orchestrator.system import ServicesNotReady, StartupError

    if continue_ and (fresh or resume):
        _fail("--continue decides between starting and --resume by itself: give it alone")
    if continue_:
        resume = (cfg.run_dir / "config.json").exists()
        what = "resuming the run in" if resume else "starting a run in"
        console.print(f"--continue: {what} {cfg.run_dir}")
    from specrl.zoo.build import build_if_used

    build_if_used(cfg.local_models(), console)
    try:
        run(cfg, console=console, fresh=fresh, resume=resume)
    except (RunInterrupted, ServicesNotReady) as e:
        _fail(str(e), code=EX_TEMPFAIL)
    except (RunExists, DataError, StartupError, ValueError) as e:
        _fail(str(e))


@data_app.command("check")
def data_check(
    config: Path = typer.Option(..., "--config", "-c", help="The run's YAML (specrl run's)."),
    rows: int = typer.Option(1000, min=1, help="Rows to check, from the start of the data."),
    set_: list[str] = typer.Option([], "--set", help="Override a field: --set data.answer_format=gsm8k."),
) -> None:
    """Load the data exactly as `specrl run` will: rows kept and skipped by reason, a few
    prompts as the policy sees them with their token counts, the reference answers, and
    each reference scored against itself. Exits 1 when fewer than 99% of the references
    get the full reward (the answers are not read right) or no row is usable."""
    try:
        cfg = load_config(config, RunConfig, _overrides(set_))
    except ConfigError as e:
        _fail(str(e))
    from specrl.data.check import check_data, policy_tokenizer, print_report
    from specrl.data.rewards import load_reward
    from specrl.data.sources import DataError
    from specrl.zoo.build import build_if_used

    server = cfg.rollout.server
    build_if_used([cfg.trainer.server.trainer.model], console)
    try:
        report = check_data(
            cfg.data,
            policy_tokenizer(cfg.trainer.server.trainer.model),
            load_reward(cfg.reward.fn),
            max_prompt_tokens=server.engine.max_model_len - cfg.sampling.max_tokens,
            rows=rows,
        )
    except (DataError, ValueError, OSError) as e:
        _fail(str(e))
    print_report(report, console)
    if report.problem:
        raise typer.Exit(1)


@draft_app.command("init")
def draft_init(
    target: str = typer.Option(..., help="Target model: path, hub id in the local cache, or zoo:NAME."),
    out: Path = typer.Option(..., help="Directory to write the draft to (the layout vLLM loads)."),
    data: str = typer.Option("task", help="Prompts: 'task' (the zoo task) or a {prompt, answer} file."),
    start_from: str = typer.Option(
        None, "--from", help="An EAGLE-3 draft to continue from (default: fresh)."
    ),
    prompts: int = typer.Option(512, help="Prompts to sample the target on."),
    steps: int = typer.Option(300, help="Training steps."),
    server: str = typer.Option(None, help="A running rollout server of the target (default: start one)."),
    set_: list[str] = typer.Option([], "--set", help="Any other DraftInitConfig field: --set lr=3e-4."),
    verbose: bool = typer.Option(False, "--verbose", "-v"),
) -> None:
    """Initialize an EAGLE-3 draft offline on the target's own rollouts of the task."""
    fields = {"target": target, "out": str(out), "data": {"source": data}, "prompts": prompts, "steps": steps}
    fields |= {"start_from": start_from, "server": server}
    try:
        cfg = validate(fields, DraftInitConfig, "specrl draft init", _overrides(set_))
    except ConfigError as e:
        _fail(str(e))
    _logging(verbose)
    from rich.progress import Progress

    from specrl.data.sources import DataError
    from specrl.draft.init import init_draft
    from specrl.draft.service import DraftConfigError

    with Progress(console=console) as bars:
        tasks: dict[str, object] = {}

        def progress(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = bars.add_task(phase, total=total)
            bars.update(tasks[phase], completed=done)

        try:
            record = init_draft(cfg, progress)
        except (DraftConfigError, DataError) as e:
            _fail(str(e))
    before, after = record["acceptance_estimate_before"], record["acceptance_estimate_after"]
    agree = "/".join(f"{a:.2f}" for a in record["heldout_agreement_after"])
    console.print(
        f"[green]draft written to {out}[/green]: held-out top-1 agreement {agree}, acceptance estimate "
        f"{before:.2f} -> {after:.2f} ({record['rollouts']} rollouts, {record['seconds']:.0f} s)"
    )


@verify_app.command("lossless")
def verify_lossless(
    address: str = typer.Option("127.0.0.1:50051", help="Rollout server host:port."),
    model: str = typer.Option(None, help="Target model (default: the server's)."),
    samples: int = typer.Option(6000, help="Samples per sampling setting."),
    alpha: float = typer.Option(1e-3, help="Significance level of each test."),
    seed: int = typer.Option(
        None, help="Seed the samples (as the orchestrator does): a rerun samples the same. Default: unseeded."
    ),
    requests: int = typer.Option(
        1, help="Requests each setting's samples are split over, pooled (history drafts from earlier ones)."
    ),
    out: Path = typer.Option(None, help="Write the results as JSON here."),
) -> None:
    """Compare the server's sampled continuations with the exact target distribution."""
    from specrl.stats.lossless import verify_server

    try:
        report = verify_server(
            address, model=model, samples=samples, alpha=alpha, seed=seed, requests=requests, console=console
        )
    except ValueError as e:
        _fail(str(e))
    if out:
        import json

        out.write_text(json.dumps(report, indent=2))
    if not report["passed"]:
        _fail("the server's samples do not follow the target distribution", code=1)


@bench_app.command("rollout")
def bench_rollout(
    out: Path = typer.Option(Path("docs/bench/rollout.json"), help="JSON output (PNG beside)."),
    quick: bool = typer.Option(False, help="A small grid (for smoke tests)."),
    concurrency: str = typer.Option("1,4,16,64", help="Comma-separated concurrency levels."),
    ks: str = typer.Option("1,3,5,7", help="Comma-separated draft lengths."),
    only: str = typer.Option(
        "",
        help="Comma-separated speculators to run (eagle3-domain, eagle3-generic, draft, ngram); default all.",
    ),
    adaptive: bool = typer.Option(True, help="Also run each speculator with the adaptive k controller."),
) -> None:
    """AR vs EAGLE-3 (domain, generic) vs draft model vs n-gram, over k and concurrency,
    and each with the adaptive k controller (up to the largest of --ks)."""
    from specrl.bench.rollout import run_rollout_bench

    names = _speculators(only)
    run_rollout_bench(
        out,
        concurrency=[int(c) for c in concurrency.split(",")],
        ks=[int(k) for k in ks.split(",")],
        only=names,
        adaptive=adaptive,
        quick=quick,
        console=console,
    )


def _speculators(only: str) -> list[str]:
    """--only's names, checked (exit 2 naming an unknown one)."""
    from specrl.bench.rollout import pick_speculators

    names = [n for n in only.split(",") if n]
    try:
        pick_speculators(names)
    except ValueError as e:
        _fail(f"--only: {e}")
    return names


@bench_app.command("adaptive")
def bench_adaptive(
    out: Path = typer.Option(Path("docs/bench/adaptive.json"), help="JSON output (Markdown beside)."),
    only: str = typer.Option("eagle3-domain,eagle3-generic", help="Comma-separated speculators."),
    ks: str = typer.Option(
        "1,3", help="Comma-separated fixed draft lengths (the controller's limit: the largest)."
    ),
    concurrency: str = typer.Option("1,4,16,64", help="Comma-separated concurrency levels."),
    rounds: int = typer.Option(3, min=1, help="Counted rounds (after one warm-up round)."),
    paused: bool = typer.Option(
        False, "--paused", help="Also each speculator held at k=0 everywhere, its drafter paused."
    ),
    task: str = typer.Option(
        "rl-zero", help="rl-zero (the zoo target) or rl-think (its RL-Think variant, long traces)."
    ),
) -> None:
    """Adaptive k vs each fixed k vs AR, all servers up at once, interleaved and repeated."""
    from specrl.bench.adaptive import run_adaptive_bench
    from specrl.bench.rollout import pick_speculators
    from specrl.bench.tasks import TASKS, pick_tasks

    try:
        (picked,) = pick_tasks([task])
    except ValueError as e:
        _fail(f"--task: {e}")
    run_adaptive_bench(
        out,
        speculators=pick_speculators(_speculators(only)),
        ks=[int(k) for k in ks.split(",")],
        concurrency=[int(c) for c in concurrency.split(",")],
        rounds=rounds,
        paused=paused,
        task=TASKS[picked],
        console=console,
    )


# options several task benchmarks take
TASKS_OPTION = typer.Option(
    "rl-zero,rl-think",
    help="Comma-separated columns: rl-zero, rl-think (builds the zoo's RL-Think variant).",
)
K_OPTION = typer.Option(3, min=1, help="Draft length of every speculative server.")
BLOCKS_OPTION = typer.Option(
    1,
    min=1,
    help="Blocks the counted rounds are split into, each on servers started afresh after a"
    " warm-up round: the intervals are then over the blocks, so they include each server's"
    " own speed offset (at most --rounds).",
)


@bench_app.command("draft")
def bench_draft(
    out: Path = typer.Option(Path("docs/bench/draft.json"), help="JSON output (Markdown and PNG beside)."),
    steps: int = typer.Option(6, min=1, help="RL steps with online adaptation before measuring."),
    ks: str = typer.Option("3,5,7", help="Comma-separated draft lengths."),
    concurrency: str = typer.Option("1,4", help="Comma-separated concurrency levels."),
    prompts: int = typer.Option(32, min=8, help="Prompts per concurrency level (rl-think: half)."),
    rounds: int = typer.Option(3, min=1, help="Counted rounds (after one warm-up round)."),
    tasks: str = TASKS_OPTION,
) -> None:
    """Task (RL-Zero, RL-Think) x draft init (domain, generic) x k x online adaptation (off,
    on after an RL run), n-gram and the adaptive controller; each run's servers measured
    together in interleaved rounds."""
    from specrl.bench.draft import run_draft_bench

    run_draft_bench(
        out,
        steps=steps,
        ks=[int(k) for k in ks.split(",")],
        concurrency=[int(c) for c in concurrency.split(",")],
        tasks=_tasks(tasks),
        prompts_per_level=prompts,
        rounds=rounds,
        console=console,
    )


@bench_app.command("history")
def bench_history(
    out: Path = typer.Option(Path("docs/bench/history.json"), help="JSON output (Markdown beside)."),
    epochs: int = typer.Option(3, min=1, help="Epochs measured (the first on the initial policy)."),
    steps: int = typer.Option(4, min=1, help="RL steps that move the policy between epochs."),
    k: int = K_OPTION,
    concurrency: str = typer.Option("1,4,16,64", help="Comma-separated sequences in flight."),
    rounds: int = typer.Option(2, min=1, help="Counted rounds per epoch (after one warm-up round)."),
    tasks: str = TASKS_OPTION,
    head: str = typer.Option(
        "domain", help="EAGLE-3 head of the eagle3 and hybrid cells: domain, or generic (weak)."
    ),
    history_draft: int = typer.Option(
        HISTORY_DRAFT,
        min=1,
        help="History's longest draft, alone and in the hybrid (at least --k).",
    ),
    extend: bool = typer.Option(
        False,
        help="The hybrid extends the draft model's full drafts with history's tokens "
        "(speculation.history.hybrid_extend).",
    ),
    history_tree: str = typer.Option(
        "",
        help="History's index settings, alone and in the hybrid, as name=value pairs "
        "(speculation.history: e.g. max_depth=32,max_spec_factor=2).",
    ),
    blocks: int = BLOCKS_OPTION,
    servers: str = typer.Option(
        "fresh",
        help="fresh: servers started on each epoch's policy, history carried from the last; "
        "kept: started once, each epoch's weights pushed into them (as a run keeps them).",
    ),
) -> None:
    """AR, EAGLE-3 alone, the history drafter and the hybrid over the epochs of a real RL
    run (the policy trained between epochs), on servers fresh each epoch or kept across."""
    if head not in ("domain", "generic"):
        raise typer.BadParameter(f"--head is domain or generic, not {head!r}")
    if extend and history_draft <= k:
        raise typer.BadParameter(f"--extend needs --history-draft above --k ({k}): the room it drafts into")
    from specrl.bench.epochs import SERVERS
    from specrl.bench.history import run_history_bench

    if servers not in SERVERS:
        raise typer.BadParameter(f"--servers is {' or '.join(SERVERS)}, not {servers!r}")
    tree = _history_tree(history_tree)

    run_history_bench(
        out,
        epochs=epochs,
        steps=steps,
        k=k,
        concurrency=[int(c) for c in concurrency.split(",")],
        tasks=_tasks(tasks),
        rounds=rounds,
        head=head,
        history_draft=history_draft,
        extend=extend,
        tree=tree,
        console=console,
        blocks=_blocks(blocks, rounds),
        servers=servers,  # type: ignore[arg-type]  # checked against SERVERS above
    )


def _history_tree(pairs: str) -> dict:
    """--history-tree's name=value pairs, checked as speculation.history's index settings."""
    from pydantic import ValidationError

    from specrl.config import HistoryConfig

    tree = dict(pair.split("=", 1) if "=" in pair else (pair, "") for pair in pairs.split(",") if pair)
    if unknown := sorted(set(tree) - set(HistoryConfig().index_settings())):
        raise typer.BadParameter(
            f"--history-tree: {', '.join(unknown)} not an index setting of speculation.history"
        )
    try:
        checked = HistoryConfig(**tree)
    except ValidationError as e:
        raise typer.BadParameter(f"--history-tree: {e}") from e
    return {name: getattr(checked, name) for name in tree}


@bench_app.command("staleness")
def bench_staleness(
    out: Path = typer.Option(Path("docs/bench/staleness.json"), help="JSON output (Markdown beside)."),
    segments: int = typer.Option(3, min=1, help="RL segments; measured at step 0 and after each."),
    steps: int = typer.Option(4, min=1, help="RL steps per segment (draft adapted online)."),
    k: int = K_OPTION,
    concurrency: str = typer.Option("4", help="Comma-separated sequences in flight."),
    rounds: int = typer.Option(2, min=1, help="Counted rounds per measurement (after one warm-up round)."),
    tasks: str = TASKS_OPTION,
    lr: float = typer.Option(1e-4, min=0, help="Policy learning rate in the RL segments (how fast it moves)"),
    blocks: int = BLOCKS_OPTION,
) -> None:
    """Frozen EAGLE-3 draft and frozen history against the policy as RL moves it, beside
    the draft adapted online and history renewed: acceptance and speedup vs policy steps."""
    from specrl.bench.staleness import run_staleness_bench

    run_staleness_bench(
        out,
        segments=segments,
        steps=steps,
        k=k,
        concurrency=[int(c) for c in concurrency.split(",")],
        tasks=_tasks(tasks),
        rounds=rounds,
        lr=lr,
        console=console,
        blocks=_blocks(blocks, rounds),
    )


def _blocks(blocks: int, rounds: int) -> int:
    if blocks > rounds:
        raise typer.BadParameter(
            f"--blocks {blocks} is more than --rounds {rounds}: a block needs a counted round"
        )
    return blocks


def _tasks(names: str) -> list[str]:
    """The benchmark tasks named (comma-separated), checked."""
    from specrl.bench.tasks import pick_tasks

    try:
        return pick_tasks(names.split(","))
    except ValueError as e:
        _fail(str(e))


@bench_app.command("weightsync")
def bench_weightsync(
    out: Path = typer.Option(Path("docs/bench/weightsync.json"), help="JSON output (PNG beside)."),
    sizes: str = typer.Option("25M,100M,400M", help="Comma-separated model sizes (25M, 100M, 400M)."),
    repeats: int = typer.Option(3, min=1, help="Timed pushes per configuration (median reported)."),
    bucket_mb: float = typer.Option(64.0, min=1, help="Broadcast bucket size in MiB."),
) -> None:
    """Weight sync end to end into real rollout servers vs a raw broadcast of the same bytes."""
    from specrl.bench.weightsync import SIZES, run_weightsync_bench

    chosen = [s.strip() for s in sizes.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in SIZES]
    if unknown or not chosen:
        _fail(f"unknown sizes {unknown}; choose from {', '.join(SIZES)}")
    run_weightsync_bench(out, sizes=chosen, repeats=repeats, bucket_mb=bucket_mb, console=console)


@bench_app.command("trainer")
def bench_trainer(
    out: Path = typer.Option(Path("docs/bench/trainer.json"), help="JSON output (PNG beside)."),
    prompts: int = typer.Option(16, min=1, help="Prompts in the fixed batch (8 samples each)."),
    steps: int = typer.Option(6, min=2, help="GRPO steps per trainer (the first is a warm-up)."),
    micro_batch: int = typer.Option(32, min=1, help="Micro-batch size (must divide the batch)."),
) -> None:
    """specrl's trainer (TP=1/DP=1, TP=2, DP=2) vs TRL's GRPOTrainer, same batch, same run."""
    if (prompts * 8) % micro_batch:
        _fail(f"--micro-batch {micro_batch} must divide the batch of {prompts} x 8 samples")
    try:
        import trl  # noqa: F401
    except ImportError:
        _fail("TRL is not installed: `pip install -e '.[bench]'` (make setup installs it)")
    from specrl.bench.trainer import run_trainer_bench

    run_trainer_bench(out, prompts=prompts, steps=steps, micro=micro_batch, console=console)


@bench_app.command("step")
def bench_step(
    out: Path = typer.Option(Path("docs/bench/step.json"), help="JSON output (PNG and a run report beside)."),
    steps: int = typer.Option(8, min=2, help="RL steps per configuration (the first warms up)."),
    config: Path = typer.Option(None, help="Base RunConfig (default: examples/tiny-rl-zero.yaml)."),
) -> None:
    """RL step breakdown: AR vs EAGLE-3 (sync) vs EAGLE-3 async (lag 1) vs EAGLE-3 hybrid with
    history, same job, same run."""
    from specrl.bench.step import run_step_bench

    run_step_bench(out, steps=steps, config=config, console=console)


@bench_app.command("scale")
def bench_scale(
    out: Path = typer.Option(Path("docs/bench/scale.json"), help="JSON output."),
    replicas: str = typer.Option("16,64,128", help="Comma-separated numbers of rollout endpoints."),
    concurrency: int = typer.Option(512, min=1, help="Generation slots per replica."),
    steps: int = typer.Option(5, min=2, help="RL steps per configuration (the first fills the pipeline)."),
    prompts: int = typer.Option(256, min=1, help="Prompt groups per step."),
    n: int = typer.Option(16, min=1, help="Samples per group."),
    step_s: float = typer.Option(2.0, min=0.0, help="The trainer endpoint's time per step, seconds."),
    median_s: float = typer.Option(1.0, min=0.0, help="Median Generate latency (lognormal tail), seconds."),
) -> None:
    """The real orchestrator and Redis against load-generator rollout and trainer endpoints
    (no engine): threads, Redis connections, CPU and overhead as replicas x slots grow."""
    try:
        counts = [int(x) for x in replicas.split(",") if x.strip()]
    except ValueError:
        _fail(f"--replicas {replicas!r}: comma-separated integers, e.g. 16,64,128")
    if not counts or min(counts) < 1:
        _fail(f"--replicas {replicas!r}: at least one replica per configuration")
    from specrl.bench.scale import run_scale_bench

    run_scale_bench(
        out, replicas=counts, concurrency=concurrency, steps=steps, prompts=prompts, n=n,
        step_s=step_s, median_s=median_s, console=console,
    )  # fmt: skip


@simulate_app.command("validate")
def simulate_validate(
    out: Path = typer.Option(Path("docs/bench/simulator.json"), help="JSON output (PNG beside)."),
) -> None:
    """Calibrate on specrl's own benchmarks, then set the model beside the paper's points."""
    from specrl.sim.report import run_validate

    run_validate(out, console)


@simulate_app.command("calibrate")
def simulate_calibrate(
    rollout: Path = typer.Option(Path("docs/bench/rollout.json"), help="`specrl bench rollout` JSON."),
    step: Path = typer.Option(Path("docs/bench/step.json"), help="`specrl bench step` JSON."),
    hardware: str = typer.Option(
        "cpu-testbed", help="The machine both ran on (its row of the hardware table)."
    ),
    out: Path = typer.Option(
        None, help="Write the fitted constants and fit errors as JSON (for plan --calibration)."
    ),
) -> None:
    """Fit the model's free constants to your own benchmark runs and show the fit error."""
    from specrl.sim import SimError
    from specrl.sim.calibrate import calibrate
    from specrl.sim.hardware import get_hardware

    try:
        get_hardware(hardware)
        report = calibrate(rollout, step, hardware)
    except (SimError, ValueError) as e:
        _fail(str(e))
    _show_fit(report, ("decode_fit", "trainer_fit", "generation_check"), out)


@simulate_app.command("fit-forward")
def simulate_fit_forward(
    measured: Path = typer.Option(
        Path("docs/bench/gpu_layer_qwen3_8b.json"), help="scripts/gpu_layer_cost.py JSON (one GPU)."
    ),
    out: Path = typer.Option(None, help="Write the fitted constants and per-row errors as JSON."),
) -> None:
    """Fit the GPU roofline efficiencies to a GPU's measured forward cost; each row's
    held-out error is from the fit without its batch size."""
    from specrl.sim import SimError
    from specrl.sim.forward_fit import fit_forward

    try:
        report = fit_forward(measured)
    except SimError as e:
        _fail(str(e))
    _show_fit(report, ("in_sample", "held_out"), out)


def _show_fit(report: dict, summaries: tuple[str, ...], out: Path | None) -> None:
    """A fit's constants, its error summaries, and its JSON written to `out`."""
    import json

    from specrl.tables import print_table

    rows = [{"constant": k, "value": v} for k, v in report["constants"].items()]
    print_table(rows, ("constant", "value"), f"fitted on {report['hardware']} ({report['model']})", console)
    for name in summaries:
        fit = report[name]
        console.print(
            f"{name}: {fit['points']} points, rms rel error {fit['rms_rel_error']:.1%}, "
            f"max {fit['max_abs_rel_error']:.1%}"
        )
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")
        console.print(f"wrote {out}")


@simulate_app.command("plan")
def simulate_plan(
    model: str = typer.Option(..., help="Model shape (qwen3-8b, qwen3-32b, qwen3-235b-a22b, ...)."),
    gpus: int = typer.Option(..., min=1, help="GPUs for generation and training together."),
    hardware: str = typer.Option("gb200", help="Accelerator (h100, h200, b200, gb200)."),
    lag: int = typer.Option(None, min=0, max=8, help="Fix the policy lag (default: search 0, 1, 2)."),
    k: int = typer.Option(None, min=0, max=16, help="Fix the draft length (default: search 0-7)."),
    acceptance_length: float = typer.Option(
        None,
        help="EAGLE-3 acceptance length at k=3, spread over positions along the decay fitted to the "
        "paper's k series (default 3.0).",
    ),
    acceptance: str = typer.Option(
        None,
        help="EAGLE-3 conditional acceptance per draft position, comma-separated (e.g. 0.9,0.8,0.7, as "
        "vLLM's per-position counters give it); the last value extends to longer drafts.",
    ),
    prompts: int = typer.Option(512, min=1, help="Prompts per RL step."),
    group_size: int = typer.Option(16, min=1, help="Samples per prompt."),
    response_mean: float = typer.Option(1500, help="Mean response tokens (lognormal, sigma 1)."),
    max_response: int = typer.Option(20480, help="Response length cap."),
    calibration: Path = typer.Option(
        None, help="Constants from `specrl simulate calibrate --out` (default: the GPU constants)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the plan as JSON."),
) -> None:
    """Search the generation/training split, GPUs per replica, k and lag for the fastest step."""
    import json

    from specrl.sim import SimError
    from specrl.sim.calibrate import load_calibration
    from specrl.sim.hardware import GPU_EFFICIENCY, get_hardware
    from specrl.sim.models import get_model
    from specrl.sim.planner import plan
    from specrl.sim.speculation import parse_acceptance
    from specrl.sim.step import Workload

    try:
        hw = get_hardware(hardware)
        chosen = plan(
            model=get_model(model),
            hw=hw,
            eff=load_calibration(calibration, hw.name) if calibration else GPU_EFFICIENCY,
            workload=Workload(
                prompts_per_step=prompts,
                group_size=group_size,
                prompt_tokens=200,
                response_mean_tokens=response_mean,
                response_sigma=1.0,
                max_response_tokens=max_response,
            ),
            gpus=gpus,
            draft=parse_acceptance("eagle3", acceptance, acceptance_length),
            ks=(k,) if k is not None else tuple(range(8)),
            lags=(lag,) if lag is not None else (0, 1, 2),
        )
    except (SimError, ValueError) as e:
        _fail(str(e))
    if as_json:
        print(json.dumps(chosen.as_dict(), indent=2))
        return
    console.print(f"[green]plan[/green] for {model} on {gpus} x {hardware}: {chosen.summary()}")
    console.print("Helm values (deploy/helm/specrl):")
    print(chosen.helm_values(), end="")


@app.command("health")
def health(
    addresses: list[str] = typer.Argument(
        None,
        envvar="SPECRL_HEALTH_ADDRESS",
        help="host:port of specrl services (gRPC); dns:NAME:PORT or file:PATH: every replica found there.",
    ),
    timeout: float = typer.Option(10.0, help="Seconds to wait for each answer."),
) -> None:
    """Ask specrl services whether they serve (gRPC health); exit 1 unless all do.
    The Helm chart's `helm test` runs this against every service of a release."""
    from specrl.orchestrator.discovery import DiscoveryError, discover
    from specrl.serving import health_of

    if not addresses:
        _fail("no address: give host:port arguments or set SPECRL_HEALTH_ADDRESS")
    bad = 0
    for spec in addresses:
        found = [spec]
        if spec.startswith(("dns:", "file:")):
            try:
                found = discover(spec)
            except DiscoveryError as e:
                found, why = [], str(e)
            else:
                why = "no replica found"
            if not found:
                bad += 1
                console.print(f"{spec}: [red]{why}[/]")
        for address in found:
            status = health_of(address, timeout)
            bad += status != "SERVING"
            console.print(f"{address}: [{'green' if status == 'SERVING' else 'red'}]{status}[/]")
    if bad:
        raise typer.Exit(1)


@app.command("demo")
def demo() -> None:
    """Build the zoo, serve the target with EAGLE-3, self-test, verify and sample."""
    from specrl.demo import run_demo

    raise typer.Exit(run_demo(console))


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        console.print("interrupted")
        sys.exit(130)


if __name__ == "__main__":
    main()
