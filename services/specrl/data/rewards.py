"""Verifiable rewards. `math` is an exact-answer checker for math datasets (the zoo task,
GSM8K, MATH, DAPO-Math style): it finds the completion's final answer (after its
reasoning block, when it has one) and compares it with the reference answer as a number
when both parse as one, else as normalized text. Other reward functions are plugged in as
`module:function` (completion, answer) -> float.

The reference answer is what a dataset's answer field holds after its own convention is
applied (`reference_answer`): GSM8K's worked solution ends in `#### N`, MATH's in
`\\boxed{...}`, DAPO-Math-17k's `reward_model.ground_truth` is the answer itself. Compared
with the whole solution text, every completion scored 0 (issue 29).
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


THINK_END = "</think>"
ANSWER_FORMATS = ("auto", "gsm8k", "boxed", "plain")  # DataConfig.answer_format


def after_reasoning(completion: str) -> str | None:
    """The part of a completion after its reasoning block (`<think>...</think>`, as Qwen3
    and DeepSeek-R1 write it); the whole completion when it has none; None when the
    reasoning never ended (a completion cut off while thinking states no answer)."""
    if THINK_END in completion:
        return completion.rsplit(THINK_END, 1)[1]
    return None if "<think>" in completion else completion


def math_reward(completion: str, answer: str) -> float:
    """1.0 when the completion's final answer (after its reasoning) equals the reference
    answer, else 0.0."""
    stated = after_reasoning(completion)
    predicted = extract_answer(stated) if stated is not None else None
    return 1.0 if predicted is not None and answers_match(predicted, str(answer)) else 0.0


def reference_answer(reference: object, answer_format: str = "auto") -> str | None:
    """The final answer of a dataset's reference by the dataset's convention: `gsm8k`,
    the text after the last `####`; `boxed`, the last `\\boxed{...}` (MATH solutions);
    `plain`, the whole text (a bare number, DAPO-Math-17k's ground truth); `auto`, the
    first of these that applies. None when the convention finds no answer."""
    text = str(reference).strip()
    fmt = answer_format
    if fmt == "auto":
        fmt = "gsm8k" if "####" in text else "boxed" if _BOXED in text else "plain"
    if fmt == "gsm8k":
        return (text.rsplit("####", 1)[1].strip() if "####" in text else "") or None
    if fmt == "boxed":
        return (last_boxed(text) or "").strip() or None
    if fmt != "plain":
        raise ValueError(f"answer format {answer_format!r}: use one of {', '.join(ANSWER_FORMATS)}")
    return text or None


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
