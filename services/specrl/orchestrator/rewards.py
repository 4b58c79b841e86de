"""Verifiable rewards. `math` is an exact-answer checker for math datasets (the zoo task,
GSM8K, DAPO-Math style): it finds the completion's final answer and compares it with the
reference as a number when both parse as one, else as normalized text. Other reward
functions are plugged in as `module:function` (completion, answer) -> float.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from fractions import Fraction

RewardFn = Callable[[str, str], float]

_BOXED = "\\boxed{"
_STATED = re.compile(r"(?:answer is:?|answer:|####)\s*\$?\s*(-?\d[\d,./]*|[^\s.,;:$]+)", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")
_FRAC = re.compile(r"\\d?frac\{([^{}]+)\}\{([^{}]+)\}")


def last_boxed(text: str) -> str | None:
    """Content of the last \\boxed{...}, braces balanced."""
    start = text.rfind(_BOXED)
    if start < 0:
        return None
    depth, i = 1, start + len(_BOXED)
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


def extract_answer(completion: str) -> str | None:
    """The final answer a completion states: the last \\boxed{}, else the last "the
    answer is X" / "answer: X" / "#### X", else the last number; None if none."""
    boxed = last_boxed(completion)
    if boxed is not None:
        return boxed.strip()
    stated = _STATED.findall(completion)
    if stated:
        return stated[-1].strip().rstrip(".,").strip()
    numbers = _NUMBER.findall(completion)
    return numbers[-1].rstrip(",") if numbers else None


def _as_number(text: str) -> Fraction | None:
    t = _FRAC.sub(r"(\1)/(\2)", text)
    t = t.replace("$", "").replace("\\!", "").replace(" ", "").replace("(", "").replace(")", "")
    t = t.rstrip(".")
    if re.fullmatch(r"-?\d{1,3}(,\d{3})+(\.\d+)?", t):
        t = t.replace(",", "")
    try:
        return Fraction(t)
    except (ValueError, ZeroDivisionError):
        return None


def _normalize(text: str) -> str:
    return re.sub(r"\s+", "", text.replace("$", "").replace("\\text", "")).rstrip(".").lower()


def answers_match(predicted: str, reference: str) -> bool:
    a, b = _as_number(predicted), _as_number(reference)
    if a is not None and b is not None:
        return a == b
    return _normalize(predicted) == _normalize(reference)


def math_reward(completion: str, answer: str) -> float:
    """1.0 when the completion's final answer equals the reference, else 0.0."""
    predicted = extract_answer(completion)
    return 1.0 if predicted is not None and answers_match(predicted, str(answer)) else 0.0


def load_reward(spec: str) -> RewardFn:
    """`math`, or `module:function` importable from the orchestrator's environment."""
    if spec == "math":
        return math_reward
    module, _, name = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"reward.fn {spec!r}: cannot import: {e}") from None
    if not callable(fn):
        raise ValueError(f"reward.fn {spec!r} is not callable")
    return fn
