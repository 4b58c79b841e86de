"""`specrl run`: start (or reach) the services, run the RL loop with progress on the
terminal, save the final checkpoint and write the report. Ctrl-C stops everything that
was started here."""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from specrl.config import ZOO_SCHEME, RunConfig
from specrl.metrics import OrchestratorMetrics
from specrl.orchestrator.data import PromptSource
from specrl.orchestrator.loop import Orchestrator
from specrl.orchestrator.report import write_report
from specrl.orchestrator.rewards import load_reward
from specrl.orchestrator.system import System
from specrl.queue.streams import RunStreams
from specrl.rollout.client import RolloutClient
from specrl.trainer.client import TrainerClient

log = logging.getLogger("specrl.run")

# What a run writes into its directory: all that --fresh removes (never anything else
# that may live in a user-chosen output_dir).
RUN_FILES = ("config.json", "steps.jsonl", "summary.json", "report.md", "report.png")
RUN_DIRS = ("checkpoint", "checkpoint.partial", "checkpoint.old", "logs", "redis")


class RunExists(RuntimeError):
    pass


@dataclass
class RunResult:
    run_dir: Path
    records: list[dict]
    report: Path
    checkpoint: str


def step_line(r: dict, steps: int) -> str:
    t = r["time"]
    return (
        f"step {r['step'] + 1}/{steps}  reward {r['reward_mean']:.3f}  "
        f"accept len {r['acceptance_length']:.2f}  lag<={r['lag']['max']}  |  step {t['step']:.1f}s: "
        f"gen {t['gen']:.1f}s (exposed {t['exposed_generation']:.1f}s) logprob {t['logprob']:.1f}s "
        f"train {t['train']:.1f}s prepare {t['prepare']:.1f}s"
    )


def _clean(run_dir: Path) -> None:
    for name in RUN_FILES:
        (run_dir / name).unlink(missing_ok=True)
    for name in RUN_DIRS:
        shutil.rmtree(run_dir / name, ignore_errors=True)


def run(cfg: RunConfig, *, console: Console, fresh: bool = False, metrics: bool = True) -> RunResult:
    run_dir = cfg.run_dir
    if (run_dir / "steps.jsonl").exists():
        if not fresh:
            raise RunExists(f"{run_dir} holds a run already: --fresh replaces it, or choose another name")
        _clean(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(cfg.model_dump_json(indent=2))
    registry = OrchestratorMetrics() if metrics else None
    if metrics and cfg.orchestrator.metrics_port is not None:
        from specrl import metrics as m

        console.print(f"metrics on :{m.serve(cfg.orchestrator.metrics_port)}/metrics")

    draft = cfg.rollout.server.speculation.draft
    if any(ref and ref.startswith(ZOO_SCHEME) for ref in (cfg.trainer.server.trainer.model, draft)):
        from specrl.zoo.build import build_zoo

        build_zoo(console=console)  # cached after the first time (minutes)
    with console.status("starting services (Redis, rollout replicas, trainer)"):
        system = System(cfg, run_dir).start()
    try:
        console.print(
            f"[green]services up[/green]: rollout {system.replicas}, trainer {system.trainer_address}, "
            f"redis {system.redis_url}"
        )
        return _loop(cfg, system, run_dir, console, registry, fresh=fresh)
    finally:
        with console.status("stopping services"):
            system.stop()


def _loop(
    cfg: RunConfig,
    system: System,
    run_dir: Path,
    console: Console,
    registry: OrchestratorMetrics | None,
    *,
    fresh: bool,
) -> RunResult:
    from transformers import AutoTokenizer

    streams = RunStreams.connect(system.redis_url, cfg.name, reclaim_idle_s=cfg.orchestrator.reclaim_idle_s)
    if streams.exists() and not fresh:
        raise RunExists(f"redis {system.redis_url} holds a run named {cfg.name!r}: --fresh replaces it")
    streams.clear()  # a fresh run (resuming a run is not supported yet)
    with RolloutClient(system.replicas[0]) as c:
        max_model_len = c.status().max_model_len  # the served context, wherever the replica runs
    with TrainerClient(system.trainer_address) as t:
        tok = AutoTokenizer.from_pretrained(t.status().model)
    source = PromptSource(cfg.data, tok, max_prompt_tokens=max_model_len - cfg.sampling.max_tokens)
    steps = cfg.orchestrator.steps
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

        def on_step(r: dict) -> None:
            progress.console.print(step_line(r, steps))
            progress.update(task, completed=r["step"] + 1)

        orchestrator = Orchestrator(
            cfg,
            streams=streams,
            trainer=trainer,
            replicas=system.replicas,
            source=source,
            reward_fn=load_reward(cfg.reward.fn),
            metrics=registry,
            log_path=run_dir / "steps.jsonl",
            on_step=on_step,
            checkpoint_dir=run_dir / "checkpoint",
        )
        records = orchestrator.run()
        checkpoint = trainer.save(str((run_dir / "checkpoint").resolve())).path
    if source.skipped:
        console.print(f"[yellow]skipped dataset rows[/yellow]: {dict(source.skipped)}")
    report = write_report({cfg.name: records}, run_dir / "report", title=f"specrl run: {cfg.name}")
    (run_dir / "summary.json").write_text(json.dumps({"steps": len(records), "checkpoint": checkpoint}))
    console.print(f"report: {report}; checkpoint: {checkpoint}")
    return RunResult(run_dir, records, report, checkpoint)
