"""The math verifier finds the stated final answer and compares it as a number."""

from __future__ import annotations

import pytest

from specrl.data.rewards import extract_answer, load_reward, math_reward


@pytest.mark.parametrize(
    ("completion", "answer", "reward"),
    [
        (" 12+7=19; 19-5=14. The answer is 14.\n", "14", 1.0),  # the zoo task's format
        (" 12+7=19; 19-5=14. The answer is 15.\n", "14", 0.0),
        ("so we get \\boxed{\\frac{1}{2}} in the end", "0.5", 1.0),  # DAPO-Math style
        ("\\boxed{\\dfrac{3}{4}}", "3/4", 1.0),
        ("\\boxed{x^{2}+1}", "x^{2} + 1", 1.0),  # non-numeric: normalized text
        ("Natalia sold 48 clips... #### 72", "72", 1.0),  # GSM8K style
        ("the total is $1,000.", "1000", 1.0),
        ("answer: -3", "-3", 1.0),
        ("answer: -3", "3", 0.0),
        ("The answer is 7. Wait, the answer is 8.", "8", 1.0),  # the last statement counts
        ("The answer is: 12", "12", 1.0),
        ("so the total is 42, which is even", "42", 1.0),
        ("no number here", "1", 0.0),
        ("", "0", 0.0),
    ],
)
def test_math_reward(completion, answer, reward):
    assert math_reward(completion, answer) == reward


def test_extract_answer_prefers_boxed_over_trailing_numbers():
    assert extract_answer("\\boxed{12} and then 99 more words 3") == "12"


def test_plug_in_reward_functions_load_by_name():
    fn = load_reward("specrl.data.task:reward")
    assert fn(" The answer is 3.", 3) == 1.0
    with pytest.raises(ValueError, match="cannot import"):
        load_reward("specrl.nothing:here")
