"""`specrl data check`, and the same check at the start of `specrl run`: the data read
exactly as the run reads it, with each row's reference scored against itself.

Why: a format the run does not understand costs nothing visible. Every reward is 0 (or
1), every group has zero reward variance, GRPO learns nothing, and the run goes on for
GPU hours (issue 29: GSM8K's `#### N` answers compared whole scored every completion 0).
A reference is the one completion known to be right, so scored against its own answer it
must get the full reward; when fewer than `MIN_SELF_SCORE` of the references do, the
answers are not read the way the reward reads completions, and the check fails.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from specrl.config import DataConfig
from specrl.data.rewards import RewardFn, last_boxed
from specrl.data.sources import PromptSource

MIN_SELF_SCORE = 0.99  # share of references that must score full reward against themselves
STARTUP_ROWS = 256  # rows `specrl run` checks before its first step
SHOWN = 3  # rendered prompts printed


@dataclass
class DataReport:
    source: str
    read: int = 0
    kept: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    full_reward: int = 0  # kept references that scored full reward against themselves
    examples: list[dict] = field(default_factory=list)
    failed: list[dict] = field(default_factory=list)  # references that did not (a few)
    chat: bool = False  # prompts rendered with the chat template
    chat_available: bool = False  # the tokenizer has one
    stop_token_ids: list[int] = field(default_factory=list)

    @property
    def problem(self) -> str | None:
        """Why the run must not start on this data, or None."""
        if self.kept == 0:
            return (
                f"data.source {self.source}: none of the {self.read} rows checked is usable: {self.skipped}"
            )
        if self.full_reward < MIN_SELF_SCORE * self.kept:
            worst = "; ".join(f"{f['reference']!r} -> {f['answer']!r}" for f in self.failed)
            return (
                f"data.source {self.source}: only {self.full_reward} of {self.kept} references score full "
                f"reward against themselves (need {MIN_SELF_SCORE:.0%}): the answers are not read the way "
                f"the reward reads completions (data.answer_key, data.answer_format, reward.fn). E.g. {worst}"
            )
        return None

    def summary(self) -> str:
        skipped = ", ".join(f"{n} {reason}" for reason, n in sorted(self.skipped.items())) or "none"
        return (
            f"data check: {self.kept} of {self.read} rows usable (skipped: {skipped}); "
            f"{self.full_reward} of {self.kept} references score full reward against themselves; "
            f"prompts {'through the chat template' if self.chat else 'as plain text'}"
        )

    @property
    def chat_unused(self) -> bool:
        """The policy has a chat template and the prompts do not go through it: right for a
        base model, wrong for a chat model (it samples from text it was not tuned on)."""
        return self.chat_available and not self.chat


def check_data(
    data: DataConfig, tokenizer, reward_fn: RewardFn, *, max_prompt_tokens: int, rows: int
) -> DataReport:
    """Read the first `rows` rows as the run does (`PromptSource`) and score each usable
    row's reference against its own answer (`self_completion`)."""
    source = PromptSource(data, tokenizer, max_prompt_tokens=max_prompt_tokens)
    report = DataReport(
        data.source,
        chat=source.uses_chat,
        chat_available=bool(getattr(tokenizer, "chat_template", None)),
        stop_token_ids=source.stop_token_ids(),
    )
    for prompt, answer in source.head(rows):
        report.read += 1
        item = source.item(prompt, answer)
        if item is None:
            continue
        report.kept += 1
        completion = self_completion(item.reference, item.answer)
        reward = float(reward_fn(completion, item.answer))
        report.full_reward += reward >= 1.0
        shown = {
            "prompt": item.prompt,
            "tokens": len(item.prompt_ids),
            "reference": item.reference,
            "answer": item.answer,
            "reward": reward,
        }
        if len(report.examples) < SHOWN:
            report.examples.append(shown)
        if reward < 1.0 and len(report.failed) < SHOWN:
            report.failed.append(shown)
    report.skipped = dict(source.skipped)
    return report


def self_completion(reference: str, answer: str) -> str:
    """The completion a reference stands for: the reference itself where it states its
    answer as completions do (a worked solution ending in `#### N` or `\\boxed{}`), else
    the answer as a model is asked to state it (`\\boxed{answer}`: a bare ground truth is
    not a completion)."""
    if "####" in reference or last_boxed(reference) is not None:
        return reference
    return f"\\boxed{{{answer}}}"


def policy_tokenizer(model: str):
    """The policy's tokenizer, for a model reference as configs give it (a path, a hub id
    in the local cache, or zoo:NAME)."""
    from transformers import AutoTokenizer

    from specrl.config import resolve_model_path

    return AutoTokenizer.from_pretrained(resolve_model_path(model))


def print_report(report: DataReport, console) -> None:
    """What `specrl data check` shows: counts, a few prompts as the policy sees them, the
    references and their answers, and the verdict."""
    from rich.table import Table

    console.print(report.summary())
    if report.chat_unused:
        console.print(
            "[yellow]note: the policy's tokenizer has a chat template and the prompts do not go "
            "through it: right for a base model; a chat model would sample from text it was not "
            "tuned on (data.chat.enabled: true)[/yellow]"
        )
    console.print(f"generation stops at token ids {report.stop_token_ids}")
    table = Table("prompt (as the policy sees it)", "tokens", "reference", "answer", "reward")
    for e in report.examples + [f for f in report.failed if f not in report.examples]:
        table.add_row(
            repr(e["prompt"])[:400],
            str(e["tokens"]),
            repr(e["reference"])[:120],
            e["answer"],
            f"{e['reward']:g}",
        )
    console.print(table)
    if report.problem:
        console.print(f"[red]{report.problem}[/red]")
    else:
        console.print("[green]the data is read as the reward expects[/green]")
