from specrl.rollout.engines.base import Acceptance


def test_acceptance_from_vllm_histogram():
    # 4 verification steps with k=3: accepted 0, 1, 3, 3 drafts
    a = Acceptance.from_histogram([1, 1, 0, 2], draft_tokens=12)
    assert (a.drafts, a.draft_tokens, a.accepted_tokens) == (4, 12, 7)
    assert a.accepted_per_position == [3, 2, 2]
    assert a.acceptance_length == 1 + 7 / 4


def test_no_drafts_means_acceptance_length_one():
    assert Acceptance().acceptance_length == 1.0
    assert Acceptance.from_histogram([0, 0], 0).acceptance_length == 1.0
