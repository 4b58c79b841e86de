"""The history drafter's index (specrl.rollout.history, Arctic Inference's native suffix
trees, one per prompt): what it drafts from the prompt, sibling samples and earlier
responses of the same prompt, checked by hand (a draft token's probability is the product
of the branch shares leading to it: a node's count is the suffixes through it, the
request's own end included)."""

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


def test_a_sibling_response_is_continued_from_where_the_context_meets_it():
    h = HistoryIndex(min_match=2)
    _response(h, P, [10, 11, 12, 13, 14, 15])
    seq = h.start(P, PROMPT)
    h.extend(P, seq, [9, 11, 12])
    # "11, 12" matches over 2 tokens: at most 2 drafted (max_spec_factor 1)
    assert h.propose(P, seq, [*PROMPT, 9, 11, 12], 3) == [13, 14]
    assert h.propose(P, seq, [*PROMPT, 9, 11, 12], 1) == [13]
    assert h.propose(P, seq, [*PROMPT, 9, 99, 98], 3) == []  # no match
    assert h.propose(b"another prompt", seq, [*PROMPT, 11, 12], 3) == []  # history is per prompt
    wide = HistoryIndex(min_match=2, max_spec_factor=2.0)
    _response(wide, P, [10, 11, 12, 13, 14, 15])
    assert wide.propose(P, wide.start(P, PROMPT), [*PROMPT, 9, 11, 12], 3) == [13, 14, 15]


def test_the_prompt_itself_is_looked_up_and_the_own_end_is_not_a_match():
    h = HistoryIndex(min_match=2)
    seq = h.start(P, PROMPT)
    h.extend(P, seq, [2, 3])  # the response repeats the prompt's 2, 3: then came 4, 2
    assert h.propose(P, seq, [*PROMPT, 2, 3], 3) == [4, 2]
    fresh = h.start(b"p2", [5, 6])
    assert h.propose(b"p2", fresh, [5, 6], 3) == []  # only itself ends with 5, 6


def test_the_most_frequent_continuation_is_drafted_while_likely_enough():
    """After "5": 20 in 3 of the 5 suffixes through it (the request's own end is one),
    then 21 in 2 of the 3 after "5, 20": probabilities 0.6 and 0.4."""
    for min_token_prob, expected in ((0.4, [20, 21]), (0.5, [20]), (0.7, [])):
        h = HistoryIndex(min_match=1, max_spec_factor=4, min_token_prob=min_token_prob)
        for tokens in ([8, 5, 20, 21], [8, 5, 20, 22], [9, 5, 30, 31], [7, 5, 20, 21]):
            _response(h, P, tokens)
        seq = h.start(P, PROMPT)
        h.extend(P, seq, [6, 5])
        assert h.propose(P, seq, [*PROMPT, 6, 5], 3) == expected, min_token_prob
    # after "8, 5", 20 in 2 of the 3 suffixes (0.67), after "5" alone in 3 of 5 (0.6):
    # the longer match drafts where the shorter one is not likely enough
    h = HistoryIndex(min_match=1, max_spec_factor=4, min_token_prob=0.65)
    for tokens in ([8, 5, 20, 21], [8, 5, 20, 22], [9, 5, 30, 31], [7, 5, 20, 21]):
        _response(h, P, tokens)
    seq = h.start(P, PROMPT)
    h.extend(P, seq, [8, 5])
    assert h.propose(P, seq, [*PROMPT, 8, 5], 3) == [20]


def test_a_confident_match_is_one_over_min_depth_tokens():
    h = HistoryIndex(min_match=2)
    _response(h, P, [10, 11, 12, 13])
    seq = h.start(P, PROMPT)
    h.extend(P, seq, [9, 11, 12])  # agrees with the earlier response over "11, 12" only
    assert h.propose(P, seq, [*PROMPT, 9, 11, 12], 1, min_depth=2) == [13]
    assert h.propose(P, seq, [*PROMPT, 9, 11, 12], 1, min_depth=3) == []
    other = h.start(P, PROMPT)
    h.extend(P, other, [10, 11, 12])  # over the whole prompt and response: 7 tokens
    assert h.propose(P, other, [*PROMPT, 10, 11, 12], 1, min_depth=7) == [13]


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
    assert h.finished(P) == 0  # both in flight: the hybrid's "fresh" kind
    h.finish(P, a)
    assert h.finished(P) == 1 and h.finished(b"another") == 0


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
    assert h.propose(P, h.start(P, PROMPT), [*PROMPT, 10, 11], 1) == []
