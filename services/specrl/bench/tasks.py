"""The benchmarks' two tasks, the paper's two columns: "rl-zero" (the zoo target: short,
rigid answers) and "rl-think" (the zoo's RL-Think variant, `zoo:think/...`: the target
fine-tuned on long reasoning traces, with its own heads; zoo/think.py). One definition,
so `bench draft` and `bench adaptive` serve a task the same way."""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Console

from specrl.bench.report import machine
from specrl.bench.rollout import MAX_TOKENS, TEMPERATURE, zoo_prompts


@dataclass(frozen=True)
class Task:
    """The policy and drafts (zoo names under `zoo`), how long its answers may run, and
    how much of it to sample (long traces cost more per prompt: fewer prompts per RL
    step and per measured level)."""

    name: str
    zoo: str  # "" (the zoo: zoo:target, zoo:eagle3-*) or "think/" (its RL-Think variant)
    max_tokens: int
    prompts_per_step: int
    prompt_share: float  # of a benchmark's prompts per concurrency level

    def prompts(self, count: int) -> int:
        """How many of `count` prompts per level this task measures."""
        return max(8, round(count * self.prompt_share))


TASKS = {
    "rl-zero": Task("rl-zero", "", MAX_TOKENS, 16, 1.0),
    # traces of ~110 tokens (up to ~135): 160 leaves none cut short
    "rl-think": Task("rl-think", "think/", 160, 8, 0.5),
}


def pick_tasks(names: list[str] | None) -> list[str]:
    """The task names asked for, checked (all of TASKS for None or [])."""
    if unknown := sorted(set(names or ()) - set(TASKS)):
        raise ValueError(f"unknown task(s) {', '.join(unknown)}; choose from {', '.join(TASKS)}")
    return list(names or TASKS)


def task_prompts(tasks: list[Task], count: int, console: Console, distinct: bool = False) -> list[str]:
    """Build (or reuse) the zoo, and its RL-Think variant when a task serves it (minutes
    the first time); `count` prompts of the zoo task's test split, the same for both
    (`distinct`: different prompts, of its training split: rollout.zoo_prompts)."""
    from specrl.zoo.think import build_think

    prompts = zoo_prompts(count, console, distinct)
    if any(t.zoo for t in tasks):
        build_think(console=console)
    return prompts


def bench_meta(**extra: object) -> dict:
    """What a task benchmark's output records about how it measured, with `extra`."""
    return {
        "machine": machine(),
        "max_tokens": {t.name: t.max_tokens for t in TASKS.values()},
        "temperature": TEMPERATURE,
        **extra,
    }
