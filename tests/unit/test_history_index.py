"""The history drafter's index (specrl.rollout.history, Arctic Inference's native suffix
trees, one per prompt): what it drafts from the prompt, sibling samples and earlier
responses of the same prompt, checked by hand (a draft token's probability is the product
of the branch shares leading to it: a node's count is the suffixes through it, not the
request's own end: a request's newest token is held out of the tree)."""

from __future__ import annotations

import re
import sys

import pytest
from pydantic import ValidationError

from specrl.config import HistoryConfig
from specrl.rollout.history import ARCTIC_INFERENCE, HistoryIndex

P = b"prompt-1"
PROMPT = [1, 2, 3, 4]


def _response(index: HistoryIndex, key: bytes, tokens: list[int], *, finish: bool = True) -> int:
    seq = index.start(key, PROMPT)
    index.extend(key, seq, tokens)
    if finish:
        index.finish(key, seq)
    return seq


def _draft(h: HistoryIndex, key: bytes, seq: int, response: list[int], k: int, **kwargs) -> list[int]:
    """What `h` drafts for a request of PROMPT whose response so far is `response`."""
    return h.propose(key, seq, [*PROMPT, *response], len(response), k, **kwargs)


def test_a_sibling_response_is_continued_from_where_the_context_meets_it():
    h = HistoryIndex(min_match=2)
    _response(h, P, [10, 11, 12, 13, 14, 15])
    seq = h.start(P, PROMPT)
    h.extend(P, seq, [9, 11, 12])
    # "11, 12" matches over 2 tokens: at most 2 drafted (max_spec_factor 1)
    assert _draft(h, P, seq, [9, 11, 12], 3) == [13, 14]
    assert _draft(h, P, seq, [9, 11, 12], 1) == [13]
    assert _draft(h, P, seq, [9, 99, 98], 3) == []  # no match
    assert _draft(h, b"another prompt", seq, [11, 12], 3) == []  # history is per prompt
    wide = HistoryIndex(min_match=2, max_spec_factor=2.0)
    _response(wide, P, [10, 11, 12, 13, 14, 15])
    assert _draft(wide, P, wide.start(P, PROMPT), [9, 11, 12], 3) == [13, 14, 15]


def test_a_response_starts_where_earlier_responses_started_whatever_the_prompt_ends_with():
    h = HistoryIndex(min_match=2)
    _response(h, P, [10, 11, 12, 13])
    seq = h.start(P, PROMPT)
    assert _draft(h, P, seq, [], 3) == [10, 11, 12]
    h.extend(P, seq, [10])
    assert _draft(h, P, seq, [10], 3) == [11, 12, 13]


def test_the_prompt_itself_is_looked_up_and_the_own_end_is_not_a_match():
    h = HistoryIndex(min_match=2)
    seq = h.start(P, PROMPT)
    h.extend(P, seq, [2, 3])  # the response repeats the prompt's 2, 3: then came 4
    assert _draft(h, P, seq, [2, 3], 3) == [4]
    fresh = h.start(b"p2", [5, 6])
    assert h.propose(b"p2", fresh, [5, 6], 0, 3) == []  # only the prompt, which ends with 5, 6


def test_a_response_quoting_the_prompt_at_its_start_is_drafted_across_the_prompts_end():
    """The zoo's RL-Zero answers restate the question: a response's first tokens match the
    prompt's text over the prompt's end (its last token and the response's first)."""
    prompt = [4, 2, 3, 5, 6, 4]
    h = HistoryIndex(min_match=1)
    seq = h.start(P, prompt)
    h.extend(P, seq, [2])
    # from the response's start, "2" alone (a draft of 1); across the prompt's end, "4, 2"
    assert h.propose(P, seq, [*prompt, 2], 1, 3) == [3, 5]


def test_a_response_quoting_the_prompts_tail_drafts_what_responses_did_there():
    """The prompt's text is counted once, not once per response (a response's sequence
    used to start with a copy of the prompt's tail): three responses that quote the
    prompt's 7, 8 and go on with 50 outweigh the prompt's 9."""
    prompt = [1, 7, 8, 9]
    h = HistoryIndex(min_match=2)
    for _ in range(3):
        seq = h.start(P, prompt)
        h.extend(P, seq, [20, 7, 8, 50, 51])
        h.finish(P, seq)
    seq = h.start(P, prompt)
    h.extend(P, seq, [30, 7, 8])
    assert h.propose(P, seq, [*prompt, 30, 7, 8], 3, 2) == [50, 51]


def test_the_most_frequent_continuation_is_drafted_while_likely_enough():
    """After "5": 20 in 3 of the 4 suffixes through it (the request's own end is not one),
    then 21 in 2 of the 3 after "5, 20": probabilities 0.75 and 0.5."""
    for min_token_prob, expected in ((0.5, [20, 21]), (0.6, [20]), (0.8, [])):
        h = HistoryIndex(min_match=1, max_spec_factor=4, min_token_prob=min_token_prob)
        for tokens in ([8, 5, 20, 21], [8, 5, 20, 22], [9, 5, 30, 31], [7, 5, 20, 21]):
            _response(h, P, tokens)
        seq = h.start(P, PROMPT)
        h.extend(P, seq, [6, 5])
        assert _draft(h, P, seq, [6, 5], 3) == expected, min_token_prob
    # after "8, 5", 20 in 2 of the 2 suffixes (1.0), after "5" alone in 3 of 4 (0.75):
    # the longer match drafts where the shorter one is not likely enough
    h = HistoryIndex(min_match=1, max_spec_factor=4, min_token_prob=0.8)
    for tokens in ([8, 5, 20, 21], [8, 5, 20, 22], [9, 5, 30, 31], [7, 5, 20, 21]):
        _response(h, P, tokens)
    seq = h.start(P, PROMPT)
    h.extend(P, seq, [8, 5])
    assert _draft(h, P, seq, [8, 5], 3) == [20]


def test_one_earlier_response_is_drafted_with_certainty():
    """The request's own end used to count at every node its context matches: one earlier
    response's continuation had probability 1/2 there."""
    h = HistoryIndex(min_match=2, min_token_prob=0.9)
    _response(h, P, [10, 11, 12, 13])
    seq = h.start(P, PROMPT)
    h.extend(P, seq, [9, 11, 12])
    assert _draft(h, P, seq, [9, 11, 12], 2) == [13]


def test_a_confident_match_is_one_over_min_depth_tokens():
    h = HistoryIndex(min_match=2)
    _response(h, P, [10, 11, 12, 13])
    seq = h.start(P, PROMPT)
    h.extend(P, seq, [9, 11, 12])  # agrees with the earlier response over "11, 12" only
    assert _draft(h, P, seq, [9, 11, 12], 1, min_depth=2) == [13]
    assert _draft(h, P, seq, [9, 11, 12], 1, min_depth=3) == []
    other = h.start(P, PROMPT)
    h.extend(P, other, [10, 11, 12])  # from the response's start: as deep as the tree, less the draft
    assert _draft(h, P, other, [10, 11, 12], 1, min_depth=h.max_depth - 1) == [13]
    assert _draft(h, P, other, [10, 11, 12], 1, min_depth=h.max_depth) == []


def test_old_responses_age_out_and_each_prompt_keeps_a_bounded_history():
    h = HistoryIndex(min_match=2, max_age=1, max_sequences_per_prompt=2, max_prompts=2)
    _response(h, P, [10, 11, 12])  # written at version 0
    h.set_version(1)
    seq = h.start(P, PROMPT)
    assert _draft(h, P, seq, [10, 11], 1) == [12]  # one version old: kept
    h.set_version(2)
    assert _draft(h, P, seq, [10, 11], 1) == []  # two: gone
    for tokens in ([20, 21, 22], [30, 31, 32], [40, 41, 42]):
        _response(h, P, tokens)
    assert _draft(h, P, seq, [20, 21], 1) == []  # the oldest beyond 2 dropped
    assert _draft(h, P, seq, [40, 41], 1) == [42]
    h.start(b"p2", [5, 6])
    h.start(b"p3", [7, 8])  # a third prompt: the least recently used (P) goes
    assert _draft(h, P, seq, [40, 41], 1) == []


def test_a_live_sibling_drafts_for_another_while_both_generate():
    h = HistoryIndex(min_match=2)
    a = _response(h, P, [50, 51, 52], finish=False)  # its newest, 52, not in the tree yet
    b = h.start(P, PROMPT)
    assert _draft(h, P, b, [], 3) == [50, 51]  # b's first tokens: where a went
    h.extend(P, a, [53])
    h.extend(P, b, [50, 51])
    assert _draft(h, P, b, [50, 51], 3) == [52]
    assert h.finished(P) == 0  # both in flight: the hybrid's "fresh" kind
    h.finish(P, a)
    assert h.finished(P) == 1 and h.finished(b"another") == 0


def test_a_token_budget_evicts_the_least_recently_used_prompts():
    h = HistoryIndex(min_match=2, max_depth=4, max_tokens=42)
    _response(h, b"old", [10, 11, 12] * 4)  # 4 prompt + a boundary of 5 + 12 = 21 tokens
    _response(h, b"new", [20, 21, 22] * 4)  # 21 more: at the budget
    assert h.tokens == 42
    probe = h.start(b"old", PROMPT)  # "old" used again: "new" is now the least recent
    _response(h, b"newest", [30, 31, 32])
    assert h.tokens <= 42
    assert _draft(h, b"old", probe, [10, 11], 1) == [12]
    assert _draft(h, b"new", 1, [20, 21], 1) == []  # evicted


def test_without_arctic_inference_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "arctic_inference.suffix_decoding._C", None)  # not importable
    with pytest.raises(RuntimeError, match=re.escape(f"pip install --no-build-isolation {ARCTIC_INFERENCE}")):
        HistoryIndex()


def test_a_match_and_its_draft_must_fit_the_trees_depth():
    with pytest.raises(ValidationError, match="min_match must be < max_depth"):
        HistoryConfig(min_match=4, max_depth=4)
    with pytest.raises(ValidationError, match="hybrid_min_match must be < max_depth"):
        HistoryConfig(hybrid=True, hybrid_min_match=16, max_depth=16)


def test_an_update_ages_out_responses_that_still_look_live():
    """vLLM tells the drafter a request ended only at its next step: the last requests
    before a policy update still look live then, and must age out all the same."""
    h = HistoryIndex(min_match=2, max_age=0)
    seq = _response(h, P, [10, 11, 12], finish=False)
    h.set_version(1)
    assert h.tokens == len(PROMPT)  # the prompt only
    h.extend(P, seq, [13])  # a request really in flight: its growth is ignored
    h.finish(P, seq)
    assert h.tokens == len(PROMPT)
    assert _draft(h, P, h.start(P, PROMPT), [10, 11], 1) == []
