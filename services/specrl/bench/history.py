"""`specrl bench history`: drafts from the run's own history over the epochs of a real RL
run, beside AR and EAGLE-3 alone, one run.

For each task (RL-Zero, RL-Think: bench/tasks.py) the policy moves between epochs: epoch 0
measures the task's initial policy, and each later epoch first trains the previous one
for `steps` synchronous RL steps (`specrl run` on the task's training prompts, every
service a real process, EAGLE-3 from the domain draft, frozen). The servers
(bench/epochs.py) are started afresh every epoch on its policy (`--servers fresh`), or,
as a run keeps them, started once and kept across the epochs with each epoch's weights
pushed into them over the weight-sync path (`--servers kept`; every epoch's policy is
trained first): AR, EAGLE-3 alone, the history drafter alone and the hybrid (EAGLE-3 with
history: speculation.history.hybrid), the draft model at k and history up to
`history_draft` tokens (alone and in the hybrid: history has no sequential positions to
pay for), the EAGLE-3 head the task's domain head or, with `--head generic`, its weak
generic one.

The measured prompts (the task's training prompts) come back once every epoch. Fresh
history and hybrid servers get each prompt's responses of the previous epoch carried with
it (Prompt.history), as the orchestrator carries them to a replica that has not seen the
prompt since it started (orchestrator/carry.py); kept ones hold them, and the earlier
epochs', themselves (aged by the pushes: speculation.history.max_age): history written by
earlier policies. Epoch 0 has none (siblings and the prompt only). Each row carries the
geometric mean of the per-round ratios to AR (and, for history and the hybrid, to EAGLE-3
alone; for the hybrid also to history alone) with a 95% interval.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from specrl.bench.draft import rl_run_config
from specrl.bench.epochs import Cell, Servers, run_over_versions
from specrl.bench.tasks import Task
from specrl.speculation import HISTORY_DRAFT

INIT = "eagle3-domain"

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
    "vs_history",
)


def cells(
    task: Task,
    head: str = "domain",
    history_draft: int = HISTORY_DRAFT,
    extend: bool = False,
    tree: dict | None = None,
) -> list[Cell]:
    """The measured servers; `head`: the zoo's EAGLE-3 head of the eagle3 and hybrid cells
    (domain: trained on the task; generic: a weak one, which leaves history more to add);
    `history_draft`: history's longest draft, alone and in the hybrid (the hybrid chooses
    per request by measured agreement and step times, rollout/hybrid.py); `extend`: the
    hybrid's history.hybrid_extend; `tree`: history's index settings other than their
    defaults (speculation.history: max_depth, max_spec_factor, ...), alone and in the
    hybrid."""
    draft = f"zoo:{task.zoo}eagle3-{head}"
    return [
        Cell("ar", "none"),
        Cell("eagle3", "eagle3", draft),
        Cell("history", "history", history=dict(tree or {}), carry="last", k=history_draft),
        Cell("hybrid", "eagle3", draft, history=hybrid(history_draft, extend, tree), carry="last"),
    ]


def hybrid(history_draft: int, extend: bool = False, tree: dict | None = None) -> dict:
    """The hybrid's speculation.history in this bench."""
    return (tree or {}) | {"hybrid": True, "hybrid_max_draft": history_draft, "hybrid_extend": extend}


def run_history_bench(
    out: Path,
    *,
    epochs: int = 3,
    steps: int = 4,
    k: int = 3,
    concurrency: list[int],
    tasks: list[str] | None = None,
    rounds: int = 2,
    head: str = "domain",
    history_draft: int = HISTORY_DRAFT,
    extend: bool = False,
    tree: dict | None = None,
    console: Console | None = None,
    blocks: int = 1,
    servers: Servers = "fresh",
) -> list[dict]:
    """`tasks`: names in TASKS (default: all), measured in that order; `head`,
    `history_draft`, `extend`, `tree`: cells(); `blocks`, `servers`: run_over_versions."""
    from specrl.orchestrator.run import run

    console = console or Console(stderr=True)
    history_draft = max(k, history_draft)  # history drafts at least as far as the head
    policy: dict[str, str] = {}  # per task: the last epoch's

    def advance(task: Task, epoch: int, tmp: Path) -> tuple[int, str, list[Cell]]:
        if not epoch:
            policy[task.name] = f"zoo:{task.zoo}target"
        else:
            console.print(f"[bold]{task.name}[/bold]: epoch {epoch}: {steps} RL steps from the last policy")
            cfg = rl_run_config(
                task, INIT, steps, tmp, policy=policy[task.name], adapt=False, name=f"{task.name}-e{epoch}"
            )
            policy[task.name] = str(Path(run(cfg, console=console, metrics=False).checkpoint) / "hf")
        return epoch, policy[task.name], cells(task, head, history_draft, extend, tree)

    return run_over_versions(
        out,
        advance,
        versions=epochs,
        keys=("method", "epoch"),
        columns=TABLE_COLUMNS,
        meta={
            "rl_steps_per_epoch": steps,
            "hybrid": hybrid(history_draft, extend, tree),
            "history_k": history_draft,
            "eagle3_head": head,
        },
        k=k,
        concurrency=concurrency,
        tasks=tasks,
        rounds=rounds,
        console=console,
        versus=("eagle3", "history"),
        blocks=blocks,
        servers=servers,
    )
