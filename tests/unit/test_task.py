import pytest

from specrl.data import task


def test_generator_is_seed_deterministic_and_splits_are_disjoint():
    a = task.take(200, seed=7)
    assert a == task.take(200, seed=7)
    assert a != task.take(200, seed=8)
    test = {p.prompt for p in task.take(200, seed=7, split="test")}
    assert not test & {p.prompt for p in task.take(2000, seed=7)}


def test_take_distinct_gives_different_problems_in_stream_order_and_says_when_a_split_has_too_few():
    zoo = {"max_operand": 20, "max_terms": 2}  # the zoo's task: ~800 problems, ~80 in test
    repeated = task.take(192, seed=99, split="test", **zoo)
    assert len({p.prompt for p in repeated}) < 100  # why take_distinct exists
    distinct = task.take_distinct(192, seed=99, split="train", **zoo)
    assert len({p.prompt for p in distinct}) == 192
    assert distinct == task.take_distinct(192, seed=99, split="train", **zoo)
    first = list(dict.fromkeys(p.prompt for p in task.take(2000, seed=99, split="train", **zoo)))
    assert [p.prompt for p in distinct] == first[:192]
    with pytest.raises(ValueError, match=r"asked for 100 different problems; the split holds only \d\d\b"):
        task.take_distinct(100, seed=99, split="test", **zoo)


def test_solutions_are_correct_and_rewarded():
    for p in task.take(300, seed=1, max_terms=4, max_operand=99):
        assert task.extract_answer(p.solution) == p.answer
        assert task.reward(p.solution, p.answer) == 1.0
        assert task.reward(p.solution, p.answer + 1) == 0.0
        assert eval(p.prompt[3:].split("=")[0]) == p.answer  # the expression itself


def test_answer_extraction_is_robust():
    assert task.extract_answer(" 3+4=7. The answer is -12.\n") == -12
    assert task.extract_answer("so it is 5 or maybe 6") == 6
    assert task.extract_answer("no digits") is None
    assert task.reward("The answer is 7", 7) == 1.0


def test_reasoning_traces_are_correct_long_and_varied():
    import random
    import re

    problems = task.take(400, seed=2, max_terms=2, max_operand=20)
    traces = [task.reasoning_trace(p, random.Random(i)) for i, p in enumerate(problems)]
    assert traces == [task.reasoning_trace(p, random.Random(i)) for i, p in enumerate(problems)]
    for p, t in zip(problems, traces):
        assert task.reward(t, p.answer) == 1.0 and t.endswith(".\n")
        for a, op, b, c in re.findall(r"(-?\d+)([+-])(\d+)=(-?\d+)", t):  # every step and the check
            assert int(a) + (int(b) if op == "+" else -int(b)) == int(c), t
    mean = sum(map(len, traces)) / len(traces)
    assert 3 * sum(len(p.solution) for p in problems) / len(problems) < mean < 160
    assert len({t.split(".")[0] for t in traces}) >= 5  # openers drawn, not fixed
    long = task.take(50, seed=3, min_terms=4, max_terms=4, max_operand=99)
    assert all(task.reward(task.reasoning_trace(p, random.Random(0)), p.answer) == 1.0 for p in long)
    with pytest.raises(ValueError, match="not a task prompt"):
        task.reasoning_trace(task.Problem("What is 2+2?", 4, ""), random.Random(0))
