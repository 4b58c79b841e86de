"""Hybrid drafting (speculation.history.hybrid): history's drafts overlaid on the draft
model's (rollout/engines/vllm/history.py install_hybrid), on a stand-in for vLLM's model
runner (named as such: the real one runs in tests/integration/test_lossless.py's hybrid
cell, which proves it lossless). The stand-in has the attributes the overlay reads."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from specrl.config import SpeculationConfig
from specrl.rollout.engines.vllm.history import install_hybrid
from specrl.rollout.history import HistoryIndex

PROMPT = [1, 2, 3, 4]
MODEL_TOKEN = 9  # what the stand-in draft model drafts at every position


class _Runner:
    """Stand-in for vLLM's GPUModelRunner: an input batch and a draft model that drafts
    MODEL_TOKEN everywhere."""

    def __init__(self) -> None:
        spec = SimpleNamespace(num_speculative_tokens=3)
        self.vllm_config = SimpleNamespace(
            speculative_config=spec, model_config=SimpleNamespace(max_model_len=64)
        )
        self._draft_probs = None

    def batch(self, rows: dict[str, list[int]]) -> None:
        """The requests in the batch: id -> prompt + response so far."""
        tokens = np.zeros((len(rows), 64), dtype=np.int32)
        for i, seq in enumerate(rows.values()):
            tokens[i, : len(seq)] = seq
        self.input_batch = SimpleNamespace(
            req_ids=list(rows),
            req_id_to_index={r: i for i, r in enumerate(rows)},
            num_prompt_tokens=np.array([len(PROMPT)] * len(rows)),
            num_tokens_no_spec=np.array([len(s) for s in rows.values()]),
            token_ids_cpu=tokens,
        )

    def propose_draft_token_ids(self, scheduler_output, sampled_token_ids, *args, **kwargs):
        return torch.full((len(sampled_token_ids), 3), MODEL_TOKEN, dtype=torch.int32)


def _hybrid(min_draft: int, min_match: int = 1) -> tuple[_Runner, object]:
    runner = _Runner()
    history = install_hybrid(runner, {"min_match": 1}, min_draft, min_match)
    runner.batch({"a": [*PROMPT, 5, 6, 7, 8]})  # an earlier response to the prompt
    runner.propose_draft_token_ids(None, [[8]])
    return runner, history


def test_a_row_with_history_takes_its_draft_and_the_model_fills_the_rest():
    runner, history = _hybrid(min_draft=2)
    # "b" samples the prompt again and has 5, 6: history continues with 7, 8 (two tokens,
    # then the earlier response ends); "c" has a prompt history never saw
    runner.batch({"b": [*PROMPT, 5, 6], "c": [20, 21, 22, 23, 24]})
    drafts = runner.propose_draft_token_ids(None, [[6], [24]])
    assert drafts.tolist() == [[7, 8, MODEL_TOKEN], [MODEL_TOKEN] * 3]
    assert history.rows == {"history": 1, "model": 2}  # "a" earlier, "c" now


def test_a_match_shorter_than_min_draft_leaves_the_models_draft():
    runner, history = _hybrid(min_draft=3)
    runner.batch({"b": [*PROMPT, 5, 6]})
    assert runner.propose_draft_token_ids(None, [[6]]).tolist() == [[MODEL_TOKEN] * 3]
    assert history.rows["history"] == 0


def test_a_match_over_fewer_than_min_match_tokens_leaves_the_models_draft():
    """ "b"'s six tokens so far agree with "a"'s over all six: confident at min_match 6,
    not at 7 (its context has no seventh token to agree on)."""
    for min_match, expected in ((6, [7, 8, MODEL_TOKEN]), (7, [MODEL_TOKEN] * 3)):
        runner, _ = _hybrid(min_draft=1, min_match=min_match)
        runner.batch({"b": [*PROMPT, 5, 6]})
        assert runner.propose_draft_token_ids(None, [[6]]).tolist() == [expected], min_match


def test_draft_probabilities_are_refused():
    """With probabilistic draft sampling vLLM verifies against the draft model's
    probabilities, which an overlaid row no longer follows: not lossless, so refused."""
    runner, _ = _hybrid(min_draft=1)
    runner._draft_probs = torch.ones(1, 3, 4)
    runner.batch({"b": [*PROMPT, 5, 6]})
    with pytest.raises(RuntimeError, match="deterministic"):
        runner.propose_draft_token_ids(None, [[6]])


def test_hybrid_needs_a_draft_model_and_the_index_gets_only_its_settings():
    for method in ("history", "ngram", "none"):
        with pytest.raises(ValidationError, match="hybrid needs a draft model"):
            SpeculationConfig(method=method, history={"hybrid": True})
    spec = SpeculationConfig(method="eagle3", draft="zoo:eagle3-domain", history={"hybrid": True})
    assert spec.drafts_from_history and not SpeculationConfig(method="eagle3", draft="x").drafts_from_history
    HistoryIndex(**spec.history.index_settings())  # no key the index does not take
