"""`specrl run`: start (or reach) the services, run the RL loop with progress on the
terminal, save the final checkpoint and write the report. Ctrl-C stops everything that
was started here."""

from __future__ import annotations

import json
import logging
import os
import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path

import grpc
import redis
from pydantic import ValidationError
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from specrl.config import ZOO_SCHEME, CompareRun, RunConfig, resolve_model_path
from specrl.data.check import STARTUP_ROWS, check_data, policy_tokenizer
from specrl.data.rewards import load_reward
from specrl.data.sources import DataError, PromptSource
from specrl.draft.api import DraftTrainerClient
from specrl.metrics import OrchestratorMetrics
from specrl.orchestrator.autoscale import Autoscaler
from specrl.orchestrator.compare import comparison, describe
from specrl.orchestrator.loop import GenerationStalled, Orchestrator, TrainerLost
from specrl.orchestrator.report import SideBySide, write_report
from specrl.orchestrator.status import StatusPage
from specrl.orchestrator.system import ServiceDied, StartupError, System
from specrl.queue.streams import RunStreams
from specrl.rollout.api import RolloutClient
from specrl.trainer.api import TrainerClient

log = logging.getLogger("specrl.run")

# What a run writes into its directory: all that --fresh removes (never anything else
# that may live in a user-chosen output_dir).
RUN_FILES = ("config.json", "steps.jsonl", "summary.json", "report.md", "report.png")
RUN_DIRS = ("checkpoint", "checkpoint.partial", "checkpoint.old", "draft", "logs", "redis", "compare")


# What stops a run with its state kept for `--resume`: a service gone or restarted.
INTERRUPTIONS = (
    grpc.RpcError,
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    GenerationStalled,
    ServiceDied,
    TrainerLost,
)


class RunExists(RuntimeError):
    pass


class RunInterrupted(RuntimeError):
    """A service failed mid-run; the run's state is kept for `--resume`."""


@dataclass
class RunResult:
    run_dir: Path
    records: list[dict]
    report: Path
    checkpoint: str
    # comparison run -> its step records (none for one that failed)
    compared: dict[str, list[dict]]


def step_line(r: dict, steps: int) -> str:
    t = r["time"]
    line = (
        f"step {r['step'] + 1}/{steps}  reward {r['reward_mean']:.3f}  "
        f"accept len {r['acceptance_length']:.2f}  lag<={r['lag']['max']}  |  step {t['step']:.1f}s: "
        f"gen {t['gen']:.1f}s (exposed {t['exposed_generation']:.1f}s) logprob {t['logprob']:.1f}s "
        f"train {t['train']:.1f}s prepare {t['prepare']:.1f}s"
    )
    if r.get("zero_variance_groups", 0.0) == 1.0:
        line += (
            "\n[yellow]  no learning signal: every group's samples got the same reward "
            f"({r['reward_mean']:.3f}); `specrl data check` shows whether the answers are read right[/yellow]"
        )
    return line


def _clean(run_dir: Path) -> None:
    for name in RUN_FILES:
        (run_dir / name).unlink(missing_ok=True)
    for name in RUN_DIRS:
        shutil.rmtree(run_dir / name, ignore_errors=True)


def _check_resumable(cfg: RunConfig, run_dir: Path) -> None:
    """A resumed run must be the same run: same config (more steps allowed), and its
    Redis state must have survived (an append-only file, or a Redis server elsewhere)."""
    if not (run_dir / "config.json").exists():
        raise RunExists(f"{run_dir} holds no run to resume")
    if not cfg.redis.url and not cfg.redis.aof:
        raise RunExists("--resume needs the run's Redis data: redis.aof is off, so none was kept")
    try:  # read through the model: a field added to specrl since takes its default
        kept = RunConfig.model_validate_json((run_dir / "config.json").read_text())
    except ValidationError as e:
        raise RunExists(f"--resume: the run's config.json does not load in this version: {e}") from None
    saved = json.loads(kept.model_dump_json())
    now = json.loads(cfg.model_dump_json())
    for c in (saved, now):
        c["orchestrator"].pop("steps")
    if saved != now:
        changed = sorted(k for k in now.keys() | saved.keys() if now.get(k) != saved.get(k))
        raise RunExists(
            f"--resume: the config differs from the run's ({', '.join(changed)}); only steps may change"
        )


def run(
    cfg: RunConfig,
    *,
    console: Console,
    fresh: bool = False,
    resume: bool = False,
    metrics: bool = True,
) -> RunResult:
    """Start the services and run the loop; `resume` continues the run in the run
    directory from its last checkpoint (docs/orchestrator.md, Resume). Then the
    comparison runs (`compare.runs`), each with services of its own, and the report."""
    records, saved = _run(cfg, console=console, fresh=fresh, resume=resume, metrics=metrics)
    run_dir = cfg.run_dir
    title = f"specrl run: {cfg.name}"
    (run_dir / "summary.json").write_text(json.dumps({"steps": len(records), "checkpoint": saved}))
    report = write_report({describe(cfg): records}, run_dir / "report", title=title)  # kept if the rest fails
    labels, compared = {}, {}
    for name in cfg.compare.runs:
        labels[name], compared[name] = _compare(cfg, name, console)
    done = {labels[n]: r for n, r in compared.items() if r}
    if done:
        how = SideBySide(
            steps=cfg.compare.steps,
            baseline=labels["ar"] if compared.get("ar") else describe(cfg),
            sync=describe(cfg) if compared.get("async") else None,
        )
        runs = {describe(cfg): records} | done
        report = write_report(runs, run_dir / "report", title=title, side_by_side=how)
    console.print(f"report: {report}; checkpoint: {saved}")
    return RunResult(run_dir, records, report, saved, compared)


def _compare(cfg: RunConfig, name: CompareRun, console: Console) -> tuple[str, list[dict]]:
    """Comparison run `name`: its label and step records, none when it fails (the main
    run is complete and its report is written without it)."""
    c = comparison(cfg, name)
    label = describe(c)
    console.rule(f"comparison run {name!r}: {label}, {c.orchestrator.steps} steps")
    try:
        return label, _run(c, console=console, fresh=True, resume=False, metrics=False)[0]
    except (RunInterrupted, StartupError) as e:  # services that failed, or would not start
        console.print(f"[yellow]comparison run {name!r} left out[/yellow]: {e}")
        return label, []


def _run(
    cfg: RunConfig, *, console: Console, fresh: bool, resume: bool, metrics: bool
) -> tuple[list[dict], str]:
    """One run: its services, its loop; (step records, final checkpoint)."""
    if fresh and resume:
        raise ValueError("--fresh and --resume exclude each other")
    cfg.redis.password()  # an unset variable fails here, before anything starts
    run_dir = cfg.run_dir
    if resume:
        _check_resumable(cfg, run_dir)
    elif (run_dir / "steps.jsonl").exists():
        if not fresh:
            raise RunExists(
                f"{run_dir} holds a run already: --resume continues it, --fresh replaces it, "
                "or choose another name"
            )
        _clean(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(cfg.model_dump_json(indent=2))
    registry = OrchestratorMetrics() if metrics else None
    if metrics and cfg.orchestrator.metrics_port is not None:
        from specrl import metrics as m

        console.print(f"metrics on :{m.serve(cfg.orchestrator.metrics_port)}/metrics")

    unbuilt = [
        r for r in cfg.local_models() if r.startswith(ZOO_SCHEME) and not Path(resolve_model_path(r)).exists()
    ]
    if unbuilt:
        raise StartupError(f"{', '.join(unbuilt)}: the zoo is not built here (`specrl zoo build`)")
    checked = _check_data_here(cfg, console)  # its tokenizer, or None
    with console.status("starting services (Redis, rollout replicas, trainer, draft-trainer)"):
        system = System(cfg, run_dir).start()
    try:
        draft_trainer = f", draft-trainer {system.draft_address}" if system.draft_address else ""
        console.print(
            f"[green]services up[/green]: rollout {system.replicas}, trainer {system.trainer_address}"
            f"{draft_trainer}, redis {system.redis_url}"
        )
        return _loop(
            cfg, system, run_dir, console, registry, fresh=fresh, resume=resume, checked_with=checked
        )
    except INTERRUPTIONS as e:
        if isinstance(e, grpc.RpcError):
            what = f"{e.code().name}: {e.details()}"
        elif isinstance(e, redis.exceptions.RedisError):
            what = f"Redis: {e}"
        else:
            what = str(e)
        what = what.rstrip(".")
        raise RunInterrupted(
            f"the run stopped: {what}. Its state is kept; `specrl run --resume` continues it from "
            f"the last checkpoint (logs in {run_dir / 'logs'})"
        ) from e
    finally:
        with console.status("stopping services"):
            system.stop()


def _check_data(cfg: RunConfig, tok, reward_fn, max_prompt_tokens: int, console: Console) -> None:
    """The data read as `specrl data check` reads it: a format not understood stops the run
    before its first step, not after GPU hours of zero-variance groups."""
    report = check_data(cfg.data, tok, reward_fn, max_prompt_tokens=max_prompt_tokens, rows=STARTUP_ROWS)
    console.print(report.summary())
    if report.problem:
        raise DataError(f"{report.problem} (`specrl data check --config ...` shows the rows)")


def _check_data_here(cfg: RunConfig, console: Console):
    """Check the data before any service starts (on a cluster, minutes of engine start)
    when this process knows what the services will: the policy's tokenizer (a trainer
    started here) and the served context (replicas started here, at engine.max_model_len).
    Returns the tokenizer it checked with (the loop's), or None: the loop then checks once
    the services answer."""
    if cfg.trainer.address or cfg.rollout.elsewhere:
        return None
    tok = policy_tokenizer(cfg.trainer.server.trainer.model)
    max_prompt_tokens = cfg.rollout.server.engine.max_model_len - cfg.sampling.max_tokens
    _check_data(cfg, tok, load_reward(cfg.reward.fn), max_prompt_tokens, console)
    return tok


def _loop(
    cfg: RunConfig,
    system: System,
    run_dir: Path,
    console: Console,
    registry: OrchestratorMetrics | None,
    *,
    fresh: bool,
    resume: bool,
    checked_with=None,
) -> tuple[list[dict], str]:
    from transformers import AutoTokenizer

    streams = RunStreams.connect(
        system.redis_url,
        cfg.name,
        password=cfg.redis.password(),
        reclaim_idle_s=cfg.orchestrator.reclaim_idle_s,
    )
    with RolloutClient(system.replicas[0]) as c:
        max_model_len = c.status().max_model_len  # the served context, wherever the replica runs
    with TrainerClient(system.trainer_address) as t:
        status = t.status()
        version = _restore(t, run_dir / "checkpoint", status.step, console) if resume else status.step
    reward_fn = load_reward(cfg.reward.fn)
    max_prompt_tokens = max_model_len - cfg.sampling.max_tokens
    if checked_with is not None:  # before the services started, with the policy's tokenizer
        tok = checked_with
    else:  # the policy or its served context is known only from the services
        tok = AutoTokenizer.from_pretrained(status.model)
        _check_data(cfg, tok, reward_fn, max_prompt_tokens, console)
    earlier: list[dict] = []
    begun = streams.exists() or (run_dir / "steps.jsonl").exists()
    if resume and version == 0 and not begun:
        console.print("nothing to resume yet (no step begun): starting the run")
    elif resume:
        earlier = _roll_back(streams, version, run_dir / "steps.jsonl", console)
    elif streams.exists() and not fresh:
        raise RunExists(f"redis {system.redis_url} holds a run named {cfg.name!r}: --fresh replaces it")
    else:
        streams.clear()
        if cfg.trainer.address and cfg.orchestrator.checkpoint_every:
            # a trainer elsewhere outlives this process: a resume before the first periodic
            # checkpoint must find one to bring it back to
            with TrainerClient(system.trainer_address) as t:
                t.save(str((run_dir / "checkpoint").resolve()))
    source = PromptSource(
        cfg.data,
        tok,
        max_prompt_tokens=max_prompt_tokens,
        position=int(streams.get_state().get("data_position", 0)),
    )
    steps = cfg.orchestrator.steps
    draft = DraftTrainerClient(system.draft_address) if system.draft_address else None
    autoscaler = None
    if cfg.rollout.autoscale.enabled:
        from specrl.orchestrator.kube import WorkloadScale

        scale = cfg.rollout.autoscale
        # the run's own rollout actors on Ray (System.discovery: RayFleet), else the workload
        ray = cfg.launcher == "ray"
        workload = system.discovery if ray else WorkloadScale(scale.workload, scale.namespace)
        autoscaler = Autoscaler(scale, workload, registry)
    with (
        TrainerClient(system.trainer_address) as trainer,
        Progress(
            TextColumn("[bold]RL steps"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
        ) as progress,
    ):
        task = progress.add_task("steps", total=steps)
        page = _status_page(cfg, run_dir, system.replicas, console)

        def on_step(r: dict) -> None:
            progress.console.print(step_line(r, steps))
            progress.update(task, completed=r["step"] + 1)
            if page is not None:
                page.status.on_step(r, orchestrator.checkpoint)

        orchestrator = Orchestrator(
            cfg.orchestrator,
            sampling=cfg.sampling,
            seed=cfg.seed,
            prompts_per_step=cfg.data.prompts_per_step,
            streams=streams,
            trainer=trainer,
            replicas=system.replicas,
            source=source,
            reward_fn=reward_fn,
            metrics=registry,
            log_path=run_dir / "steps.jsonl",
            on_step=on_step,
            checkpoint_dir=run_dir / "checkpoint",
            check_alive=system.check_alive,
            draft=draft,
            control=page.control if page is not None else None,
            discover=system.discovery,
            discover_every_s=system.discovery.every_s if system.discovery else cfg.rollout.discover_every_s,
            autoscaler=autoscaler,
            rewind=resume,
        )
        if page is not None:
            page.status.running(orchestrator.version)
        try:
            records = earlier + orchestrator.run()
        finally:
            if draft is not None:
                draft.close()
            if page is not None:
                page.stop()
        saved = (
            orchestrator.checkpoint or trainer.find_checkpoint(str((run_dir / "checkpoint").resolve())).path
        )
    if source.skipped:
        console.print(f"[yellow]skipped dataset rows[/yellow]: {dict(source.skipped)}")
    return records, saved


def _status_page(cfg: RunConfig, run_dir: Path, replicas: list[str], console: Console) -> StatusPage | None:
    """The status page and control API, when `orchestrator.status_port` is set; the control
    token comes from the environment, or is made and kept in the run directory."""
    o = cfg.orchestrator
    if o.status_port is None:
        return None
    token = os.environ.get(o.control_token_env)
    where = f"${o.control_token_env}"
    if not token:
        token = secrets.token_urlsafe(24)
        path = run_dir / "control-token"
        path.touch(mode=0o600)
        path.chmod(0o600)
        path.write_text(token + "\n")
        where = str(path)
    page = StatusPage(cfg.name, o.steps, replicas, port=o.status_port, token=token)
    console.print(f"status page on :{page.port} (control token: {where})")
    return page


def _restore(trainer: TrainerClient, checkpoint_dir: Path, step: int, console: Console) -> int:
    """Bring the trainer to the run's last checkpoint (none: the initial weights, v0) and
    return its version. The trainer finds it on its own disk: one started here began on
    its initial weights, one running elsewhere held on to later steps (only the
    orchestrator failed) or restarted on its initial weights (its pod failed too)."""
    saved = trainer.find_checkpoint(str(checkpoint_dir.resolve()))
    if step == saved.step:
        return step
    if not saved.path:
        raise RunExists(
            f"the trainer holds policy v{step} but the run has no checkpoint to go back to: restart the "
            "trainer (it starts from its initial weights) and resume again"
        )
    version = trainer.load(saved.path).step
    console.print(f"trainer restored to the run's checkpoint (v{version}; it held v{step}): {saved.path}")
    return version


def _roll_back(streams: RunStreams, version: int, log_path: Path, console: Console) -> list[dict]:
    """Bring the run's queues and step log back to the trainer's `version` (the step
    its checkpoint holds); returns the step records kept."""
    state = streams.get_state()
    if not state:
        raise RunExists(f"redis holds no state of this run ({streams.prefix}*): nothing to resume")
    recorded = int(state.get("version", 0))
    if version > recorded:
        raise RunExists(
            f"the trainer is at version {version} but the run's Redis state at {recorded}: Redis lost "
            "writes (its data is not the run's), so the run cannot be resumed safely"
        )
    counts = streams.resume(version)
    lines = log_path.read_text().splitlines() if log_path.exists() else []
    kept = [r for r in map(json.loads, lines) if r["step"] < version]
    tmp = log_path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
    tmp.replace(log_path)
    console.print(
        f"[green]resumed[/green] at version {version} (Redis had {recorded}): "
        f"{counts['replayed']} groups to train again, {counts['retired']} from a lost policy generated "
        f"again, {counts['requeued']} prompts requeued"
    )
    return kept
