"""Synthetic verifiable task: multi-step integer arithmetic with a checkable final answer.

It plays the role DAPO-Math plays in the paper at a size a 2-core CPU can train on: the
solution format is rigid (so a trained model is peaked and speculation has something to
accept) while the arithmetic itself is hard enough for a tiny model that rewards start well
below 1 and can rise under RL.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

Split = Literal["train", "test"]

ANSWER_PREFIX = "The answer is "
_ANSWER_RE = re.compile(r"answer is\s*(-?\d+)")
_LAST_INT_RE = re.compile(r"-?\d+")


@dataclass(frozen=True)
class Problem:
    """One task instance: the prompt shown to the policy and the reference answer."""

    prompt: str
    answer: int
    solution: str  # a correct worked solution (the pretraining corpus), ends with a newline


# Wording of the reasoning traces (`reasoning_trace`): one of each is drawn per trace, so
# a model trained on them is uncertain at these points and certain in the arithmetic.
_OPENERS = (
    "Let me think.",
    "Let's see.",
    "Think step by step.",
    "Okay, one step at a time.",
    "Hmm, let me work it out.",
    "First, the direct way.",
)
_AGAIN = ("Check it another way:", "Now verify:", "Let me double-check:", "To be sure:")
_SPLITS = ("take {t} as {parts}.", "split {t} into {parts}.", "write {t} as {parts}.", "{t} is {parts}.")
_CONFIRMS = ("Same result, good.", "It matches.", "Both agree.", "Correct.")
_EXPRESSION_RE = re.compile(r"Q: (.+)=\?")
_TERM_RE = re.compile(r"([+-]?)(\d+)")


def _test_split(expression: str) -> bool:
    # The split is a pure function of the problem, so train and test never share one,
    # whatever the seed or the order of generation.
    return hashlib.sha256(expression.encode()).digest()[0] % 10 == 0


def _make(rng: random.Random, *, min_terms: int, max_terms: int, max_operand: int) -> Problem:
    terms = [rng.randint(1, max_operand) for _ in range(rng.randint(min_terms, max_terms))]
    ops = [rng.choice("+-") for _ in terms[1:]]
    expression = str(terms[0]) + "".join(f"{op}{t}" for op, t in zip(ops, terms[1:]))
    steps, acc = [], terms[0]
    for op, t in zip(ops, terms[1:]):
        new = acc + t if op == "+" else acc - t
        steps.append(f"{acc}{op}{t}={new}")
        acc = new
    solution = " " + "; ".join(steps) + f". {ANSWER_PREFIX}{acc}.\n"
    return Problem(prompt=f"Q: {expression}=?\nA:", answer=acc, solution=solution)


def generate(
    *,
    seed: int,
    split: Split = "train",
    min_terms: int = 2,
    max_terms: int = 4,
    max_operand: int = 99,
) -> Iterator[Problem]:
    """Yield an endless, seed-determined stream of problems from one split."""
    if not 2 <= min_terms <= max_terms:
        raise ValueError(f"need 2 <= min_terms <= max_terms, got {min_terms}, {max_terms}")
    rng = random.Random(seed)
    want_test = split == "test"
    while True:
        p = _make(rng, min_terms=min_terms, max_terms=max_terms, max_operand=max_operand)
        if _test_split(p.prompt) == want_test:
            yield p


def take(n: int, **kwargs: object) -> list[Problem]:
    """The first n problems of `generate(**kwargs)` (a problem may come more than once)."""
    stream = generate(**kwargs)  # type: ignore[arg-type]
    return [next(stream) for _ in range(n)]


def take_distinct(n: int, **kwargs: object) -> list[Problem]:
    """The first n different problems of `generate(**kwargs)`; an error when the split
    does not seem to hold that many (no new one in many draws): a small task's test split
    holds few (the zoo's, with operands up to 20 and two terms, about 80)."""
    stream = generate(**kwargs)  # type: ignore[arg-type]
    seen: dict[str, Problem] = {}
    patience = 1000 + 50 * n  # draws without a new problem before giving up
    since_new = 0
    while len(seen) < n:
        p = next(stream)
        since_new = 0 if p.prompt not in seen else since_new + 1
        seen.setdefault(p.prompt, p)
        if since_new > patience:
            raise ValueError(f"asked for {n} different problems; the split holds only {len(seen)}")
    return list(seen.values())


def extract_answer(completion: str) -> int | None:
    """The final answer a completion states ("The answer is N"), else its last integer."""
    m = _ANSWER_RE.search(completion)
    if m:
        return int(m.group(1))
    ints = _LAST_INT_RE.findall(completion)
    return int(ints[-1]) if ints else None


def reasoning_trace(problem: Problem, rng: random.Random) -> str:
    """A worked solution that thinks out loud, about 3-4x as long as `problem.solution`:
    the solution's steps, then the last step again with its operand split into random
    parts and taken part by part, a confirmation, and the answer; the wording is drawn from
    small sets. The "RL-Think" regime of the zoo: a model fine-tuned on these writes long
    traces whose phrasing and splits are uncertain (hard to draft) between stretches of
    forced arithmetic (easy to draft), where RL-Zero answers are short and rigid. The
    answer comes first and is checked after, so the traces need no more arithmetic skill
    than the short solutions do (a model that had to reach its answer through the split
    parts scored 0.05-0.08 after 300 fine-tuning steps; docs/design.md)."""
    m = _EXPRESSION_RE.match(problem.prompt)
    if m is None:
        raise ValueError(f"not a task prompt: {problem.prompt!r}")
    (_, first), *rest = _TERM_RE.findall(m.group(1))
    acc, steps = int(first), []
    for op, t in rest:
        before, acc = acc, acc + int(t) if op == "+" else acc - int(t)
        steps.append(f"{before}{op}{t}={acc}")
    op, n = rest[-1][0], int(rest[-1][1])  # the last step, again by parts
    cuts = sorted(rng.sample(range(1, n), min(rng.randint(1, 2), n - 1)))
    parts = [b - a for a, b in zip([0, *cuts], [*cuts, n])]
    words = [rng.choice(_OPENERS), "; ".join(steps) + ".", rng.choice(_AGAIN)]
    if len(parts) > 1:
        words.append(rng.choice(_SPLITS).format(t=n, parts="+".join(map(str, parts))))
    x, sums = before, []
    for part in parts:
        y = x + part if op == "+" else x - part
        sums.append(f"{x}{op}{part}={y}")
        x = y
    words += [", ".join(sums) + ".", rng.choice(_CONFIRMS)]
    return " " + " ".join(words) + f" {ANSWER_PREFIX}{acc}.\n"


def reward(completion: str, answer: int) -> float:
    """1.0 when the stated final answer equals the reference, else 0.0."""
    return 1.0 if extract_answer(completion) == answer else 0.0
