"""The history drafter's index (specrl.rollout.history): what it drafts from the prompt,
sibling samples and earlier responses of the same prompt, checked by hand."""

from __future__ import annotations

from specrl.rollout.history import HistoryIndex

P = b"prompt-1"
PROMPT = [1, 2, 3, 4]


def _response(index: HistoryIndex, key: bytes, tokens: list[int], *, finish: bool = True) -> int:
    seq = index.start(key, PROMPT)
    index.extend(key, seq, tokens)
    if finish:
        index.finish(key, seq)
    return seq


def test_a_sibling_response_is_continued_from_where_the_context_meets_it():
    h = HistoryIndex(min_match=2)
    _response(h, P, [10, 11, 12, 13, 14, 15])
    seq = h.start(P, PROMPT)
    h.extend(P, seq, [9, 11, 12])
    assert h.propose(P, seq, [*PROMPT, 9, 11, 12], 3) == [13, 14, 15]
    assert h.propose(P, seq, [*PROMPT, 9, 11, 12], 2) == [13, 14]
    assert h.propose(P, seq, [*PROMPT, 9, 99, 98], 3) == []  # no match
    assert h.propose(b"another prompt", seq, [*PROMPT, 11, 12], 3) == []  # history is per prompt


def test_the_prompt_itself_is_looked_up_and_the_own_end_is_not_a_match():
    h = HistoryIndex(min_match=2)
    seq = h.start(P, PROMPT)
    h.extend(P, seq, [2, 3])  # the response repeats the prompt's 2, 3: then came 4
    assert h.propose(P, seq, [*PROMPT, 2, 3], 3) == [4, 2, 3]  # and after 3, 4 came 2, 3
    fresh = h.start(b"p2", [5, 6])
    assert h.propose(b"p2", fresh, [5, 6], 3) == []  # only itself ends with 5, 6


def test_the_longest_match_wins_and_a_split_vote_stops_the_draft():
    h = HistoryIndex(min_match=1, max_depth=8, min_share=0.6)
    _response(h, P, [7, 8, 5, 20, 21])  # ... 8, 5 -> 20
    _response(h, P, [9, 9, 5, 30, 31])  # ... 9, 5 -> 30
    seq = h.start(P, PROMPT)
    h.extend(P, seq, [8, 5])
    assert h.propose(P, seq, [*PROMPT, 8, 5], 2) == [20, 21]  # 2 tokens agree with the first
    other = h.start(P, PROMPT)
    h.extend(P, other, [6, 5])  # only "5" matches either: 20 and 30 split 1:1 < 0.6
    assert h.propose(P, other, [*PROMPT, 6, 5], 2) == []


def test_old_responses_age_out_and_each_prompt_keeps_a_bounded_history():
    h = HistoryIndex(min_match=2, max_age=1, max_sequences_per_prompt=2, max_prompts=2)
    _response(h, P, [10, 11, 12])  # written at version 0
    h.set_version(1)
    seq = h.start(P, PROMPT)
    assert h.propose(P, seq, [*PROMPT, 10, 11], 1) == [12]  # one version old: kept
    h.set_version(2)
    assert h.propose(P, seq, [*PROMPT, 10, 11], 1) == []  # two: gone
    for tokens in ([20, 21, 22], [30, 31, 32], [40, 41, 42]):
        _response(h, P, tokens)
    assert h.propose(P, seq, [*PROMPT, 20, 21], 1) == []  # the oldest beyond 2 dropped
    assert h.propose(P, seq, [*PROMPT, 40, 41], 1) == [42]
    h.start(b"p2", [5, 6])
    h.start(b"p3", [7, 8])  # a third prompt: the least recently used (P) goes
    assert h.propose(P, seq, [*PROMPT, 40, 41], 1) == []


def test_a_live_sibling_drafts_for_another_while_both_generate():
    h = HistoryIndex(min_match=2)
    a = _response(h, P, [50, 51], finish=False)
    b = h.start(P, PROMPT)
    assert h.propose(P, b, PROMPT, 2) == [50, 51]  # b's first tokens: where a went
    h.extend(P, a, [52])
    h.extend(P, b, [50, 51])
    assert h.propose(P, b, [*PROMPT, 50, 51], 3) == [52]


def test_a_token_budget_evicts_the_least_recently_used_prompts():
    h = HistoryIndex(min_match=2, max_tokens=40)
    _response(h, b"old", [10, 11, 12] * 4)  # 4 prompt + 4 seed + 12 = 20 tokens
    _response(h, b"new", [20, 21, 22] * 4)  # 20 more: at the budget
    assert h.tokens == 40
    probe = h.start(b"old", PROMPT)  # "old" used again: "new" is now the least recent
    _response(h, b"newest", [30, 31, 32])
    assert h.tokens <= 40
    assert h.propose(b"old", probe, [*PROMPT, 10, 11], 1) == [12]
    assert h.propose(b"new", 1, [*PROMPT, 20, 21], 1) == []  # evicted
