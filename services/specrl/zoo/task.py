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
    """The first n problems of `generate(**kwargs)`."""
    stream = generate(**kwargs)  # type: ignore[arg-type]
    return [next(stream) for _ in range(n)]


def extract_answer(completion: str) -> int | None:
    """The final answer a completion states ("The answer is N"), else its last integer."""
    m = _ANSWER_RE.search(completion)
    if m:
        return int(m.group(1))
    ints = _LAST_INT_RE.findall(completion)
    return int(ints[-1]) if ints else None


def reward(completion: str, answer: int) -> float:
    """1.0 when the stated final answer equals the reference, else 0.0."""
    return 1.0 if extract_answer(completion) == answer else 0.0
