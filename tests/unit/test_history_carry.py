"""The orchestrator's carried history (orchestrator/carry.py): what it sends to which
replica instance, and its token budget."""

from __future__ import annotations

from specrl.orchestrator.carry import HistoryCarry


def test_a_prompt_is_carried_once_per_replica_instance_that_did_not_generate_it():
    carry = HistoryCarry(max_tokens=100)
    carry.observe("a", "a1")
    carry.observe("b", "b1")
    assert carry.to_send("a", b"p") == []  # nothing kept yet
    carry.generated("a", b"p", [[1, 2], [3]])
    assert carry.to_send("a", b"p") == []  # "a" generated it: it has them
    assert carry.to_send("b", b"p") == [[1, 2], [3]]  # the prompt moved to "b"
    carry.generated("b", b"p", [[4]])  # "b"'s group: now the last one carried
    assert carry.to_send("b", b"p") == []
    carry.observe("a", "a1")  # the same instance read again: nothing changes
    assert carry.to_send("a", b"p") == []
    carry.observe("a", "a2")  # "a" restarted
    assert carry.to_send("a", b"p") == [[4]]
    assert carry.to_send("c", b"p") == []  # a replica not read yet: its instance unknown
    carry.forget("a")
    assert carry.instance("a") is None and carry.instance("b") == "b1"


def test_the_least_recently_generated_prompts_go_over_the_budget():
    carry = HistoryCarry(max_tokens=5)
    carry.observe("r", "r1")
    carry.observe("s", "s1")
    carry.generated("r", b"p", [[1, 2]])
    carry.generated("r", b"q", [[3, 4]])
    carry.generated("r", b"p", [[5, 6]])  # p renewed: q is now the oldest
    carry.generated("r", b"x", [[7]])  # 5 tokens: all fit
    assert carry.tokens == 5
    carry.generated("r", b"y", [[8]])  # 6: over, q goes
    assert carry.tokens == 4
    assert carry.to_send("s", b"q") == [] and carry.to_send("s", b"p") == [[5, 6]]
    carry.generated("r", b"z", [[0] * 6])  # larger than the budget alone: not kept
    assert carry.to_send("s", b"z") == [] and carry.tokens == 4
