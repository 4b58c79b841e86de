from specrl.zoo import task


def test_generator_is_seed_deterministic_and_splits_are_disjoint():
    a = task.take(200, seed=7)
    assert a == task.take(200, seed=7)
    assert a != task.take(200, seed=8)
    test = {p.prompt for p in task.take(200, seed=7, split="test")}
    assert not test & {p.prompt for p in task.take(2000, seed=7)}


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
