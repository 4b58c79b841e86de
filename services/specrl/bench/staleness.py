"""`specrl bench staleness`: how fast a frozen draft goes stale as RL moves the policy
away from the one the draft was made for, beside the draft adapted online, one run.

For each task a real RL run (`specrl run`, every service a real process, EAGLE-3 from the
domain draft with the draft-trainer adapting it online) is taken in `segments` of `steps`
synchronous steps, each segment continuing the last one's policy and adapted draft on
training batches of its own (the data seed is the segment's number). At
policy step 0 and after each segment, fresh rollout servers of the policy at that step are
measured together (bench/epochs.py): AR; EAGLE-3 with the draft frozen at step 0 and with
the draft adapted up to that step; the history drafter carried the responses written at
step 0 (history frozen: ever older) and those of the previous measurement (history
renewed, as RL renews it each epoch). The curve of acceptance length and speedup over AR
against policy steps says whether a draft is worth keeping, adapting or renewing. How far
the policy has moved is recorded beside it (meta.policy: per measured step, the relative
distance of its weights from step 0's and the mean training reward of the segment that
ended there), since a flat curve means nothing for a policy that did not move; `lr` sets
how fast it moves.
"""

from __future__ import annotations

from pathlib import Path

import torch
from rich.console import Console
from safetensors.torch import load_file

from specrl.bench.draft import rl_run_config
from specrl.bench.epochs import Cell, run_over_versions
from specrl.bench.tasks import Task
from specrl.config import resolve_model_path

INIT = "eagle3-domain"

TABLE_COLUMNS = (
    "task",
    "step",
    "draft",
    "concurrency",
    "tokens_per_s",
    "acceptance_length",
    "speedup_vs_ar",
    "vs_ar",
)


def cells(frozen: str, adapted: str) -> list[Cell]:
    return [
        Cell("ar", "none"),
        Cell("eagle3-frozen", "eagle3", frozen),
        Cell("eagle3-adapted", "eagle3", adapted),
        Cell("history-frozen", "history", history={}, carry="first"),
        Cell("history-renewed", "history", history={}, carry="last"),
    ]


def _weights(model: str) -> dict[str, torch.Tensor]:
    files = sorted(Path(resolve_model_path(model)).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{model}: no safetensors weights")
    return {name: t for f in files for name, t in load_file(str(f)).items()}


def policy_drift(start: str, now: str) -> float:
    """||w_now - w_start|| / ||w_start|| over the weights both hold: how far RL has moved
    the policy from `start` (model paths or zoo names)."""
    a, b = _weights(start), _weights(now)
    common = sorted(set(a) & set(b))
    if not common:
        raise ValueError(f"{start} and {now} share no weight names: not the same model")
    diff = sum(float((b[n].double() - a[n].double()).pow(2).sum()) for n in common)
    base = sum(float(a[n].double().pow(2).sum()) for n in common)
    return (diff / base) ** 0.5


def run_staleness_bench(
    out: Path,
    *,
    segments: int = 3,
    steps: int = 4,
    k: int = 3,
    concurrency: list[int],
    tasks: list[str] | None = None,
    rounds: int = 2,
    lr: float = 1e-4,
    console: Console | None = None,
    blocks: int = 1,
) -> list[dict]:
    """`tasks`: names in TASKS (default: all), measured in that order; `lr`: the policy's
    learning rate in the RL segments; `blocks`: run_over_versions."""
    from specrl.orchestrator.run import run

    console = console or Console(stderr=True)
    state: dict[str, tuple[str, str]] = {}  # per task: the policy and adapted draft so far
    # per task and policy step, written with the rows: how far the weights moved, and the
    # mean training reward of the segment that ended there
    motion: dict[str, dict[int, dict[str, float]]] = {}

    def advance(task: Task, segment: int, tmp: Path) -> tuple[int, str, list[Cell]]:
        frozen, step = f"zoo:{task.zoo}{INIT}", segment * steps
        moved: dict[str, float] = {}
        if not segment:
            state[task.name] = (f"zoo:{task.zoo}target", frozen)
        else:
            console.print(f"[bold]{task.name}[/bold]: RL steps {step - steps + 1}-{step}, draft adapted")
            policy, adapted = state[task.name]
            cfg = rl_run_config(
                task,
                INIT,
                steps,
                tmp,
                policy=policy,
                draft=adapted,
                name=f"{task.name}-s{step}",
                data_seed=segment,  # each segment trains on batches of its own
                lr=lr,
            )
            result = run(cfg, console=console, metrics=False)
            moved["reward"] = round(sum(r["reward_mean"] for r in result.records) / len(result.records), 4)
            if (result.run_dir / "draft" / "config.json").is_file():  # else every candidate held back
                adapted = str(result.run_dir / "draft")
            state[task.name] = (str(Path(result.checkpoint) / "hf"), adapted)
        served, adapted = state[task.name]
        moved["drift"] = round(policy_drift(f"zoo:{task.zoo}target", served), 5)
        motion.setdefault(task.name, {})[step] = moved
        console.print(f"[bold]{task.name}[/bold]: step {step}: weights {moved['drift']:.2%} from step 0's")
        return step, served, cells(frozen, adapted)

    return run_over_versions(
        out,
        advance,
        versions=segments + 1,
        keys=("draft", "step"),
        columns=TABLE_COLUMNS,
        meta={"rl_steps_per_segment": steps, "lr": lr, "policy": motion},
        k=k,
        concurrency=concurrency,
        tasks=tasks,
        rounds=rounds,
        console=console,
        blocks=blocks,
    )
