"""The draft-trainer's core (specrl.draft.online) on captured batches: it learns the
target's next-token rule from them, keeps batches out for evaluation, refuses bad input
with its weights untouched, and never touches the policy that produced the features."""

from __future__ import annotations

import math

import pytest
import torch

from specrl.config import DraftTrainingConfig
from specrl.draft.eagle3 import Eagle3Config, Eagle3Head
from specrl.draft.online import DraftInputError, OnlineDraftTrainer, acceptance_length
from specrl.features import Captured, gather_aux_hidden_states

V, H, AUX = 12, 16, (2, 3, 4)


# the rule's two cycles 0 -> 3 -> 6 -> 9 and 1 -> 8 -> 7 -> 2 (the third, 4 -> 11 -> 10 -> 5, left out)
TWO_CYCLES = torch.tensor([0, 1, 2, 3, 6, 7, 8, 9])


def _head(seed: int = 0, draft_ids: torch.Tensor | None = None) -> Eagle3Head:
    cfg = Eagle3Config(
        hidden_size=H, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
        vocab_size=V, aux_layer_ids=AUX, target_num_layers=7,
        draft_vocab_size=None if draft_ids is None else len(draft_ids),
    )  # fmt: skip
    g = torch.Generator().manual_seed(seed)
    return Eagle3Head(cfg, torch.randn(V, H, generator=g), draft_ids)


def _rule(x: torch.Tensor) -> torch.Tensor:
    return (5 * x + 3) % V


def _batch(
    g: torch.Generator,
    n: int = 16,
    length: int = 10,
    topk: int | None = None,
    starts: torch.Tensor | None = None,
) -> Captured:
    """Sequences that follow the target's rule from `starts` (all tokens by default), with
    its peaked distribution (0.9 on the rule's token) as the target log-probs; aux states
    are noise."""
    ids = torch.empty((n, length), dtype=torch.long)
    pool = torch.arange(V) if starts is None else starts
    ids[:, 0] = pool[torch.randint(0, len(pool), (n,), generator=g)]
    for t in range(1, length):
        ids[:, t] = _rule(ids[:, t - 1])
    probs = torch.full((n, length - 1, V), 0.1 / (V - 1))
    probs.scatter_(-1, _rule(ids[:, :-1])[..., None], 0.9)
    lp, top = probs.log(), None
    if topk is not None:
        lp, top = lp.topk(topk, dim=-1)
    return Captured(
        policy_version=3,
        input_ids=ids,
        attention_mask=torch.ones_like(ids),
        loss_mask=torch.ones((n, length - 1)),
        aux=torch.randn((n, length, len(AUX) * H), generator=g),
        target_logprobs=lp,
        target_ids=top,
        aux_layer_ids=AUX,
    )


def _state(head: Eagle3Head) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in head.state_dict().items()}


@pytest.mark.parametrize("draft_ids", [None, TWO_CYCLES], ids=["full vocabulary", "draft vocabulary"])
@pytest.mark.parametrize("topk", [None, 3])
def test_online_training_learns_the_targets_rule_and_holds_batches_out(topk, draft_ids):
    """With a smaller draft vocabulary (8 of 12 tokens) on text that stays within it."""
    g = torch.Generator().manual_seed(0)
    cfg = DraftTrainingConfig(lr=3e-3, holdout_every=5, ttt_steps=3)
    trainer = OnlineDraftTrainer(_head(draft_ids=draft_ids), cfg)
    trained = [trainer.submit(_batch(g, topk=topk, starts=draft_ids)) for _ in range(5)]
    assert trained == [True] * 4 + [False], "every 5th batch is held out"
    before = trainer.evaluate()
    for _ in range(120):
        trainer.submit(_batch(g, topk=topk, starts=draft_ids))
    after = trainer.evaluate()
    assert len(after) == 3 and trainer.stats.steps == 100 and trainer.stats.policy_version == 3
    assert trainer.stats.tokens == 100 * 16 * 9 and math.isfinite(trainer.stats.last_loss)
    assert max(before) < 0.4 and min(after) > 0.85, (before, after)  # measured: ~0.15 -> ~0.96-1.0
    assert acceptance_length(after) > 3.5  # 1 + three drafted tokens, nearly always accepted


def test_acceptance_length_multiplies_agreement_along_the_draft():
    assert acceptance_length([]) == 1.0
    assert acceptance_length([0.5, 0.5]) == pytest.approx(1 + 0.5 + 0.25)
    assert acceptance_length([0.0, 1.0, 1.0]) == 1.0


def test_bad_batches_are_refused_and_the_head_keeps_its_weights():
    g = torch.Generator().manual_seed(1)
    trainer = OnlineDraftTrainer(_head(), DraftTrainingConfig(holdout_every=1000))
    trainer.submit(_batch(g))
    good = _state(trainer.head)

    wide = _batch(g)
    wide.aux = torch.randn(16, 10, 4 * H)  # four aux layers: a draft/target mismatch
    nan = _batch(g)
    nan.aux[0, 3, 5] = float("nan")
    vocab = _batch(g)
    vocab.target_logprobs = torch.log_softmax(torch.randn(16, 9, V + 4), -1)
    layers = _batch(g)
    layers.aux_layer_ids = (1, 3, 5)  # as wide as the draft's, other layers: silent garbage if taken
    short = _batch(g)
    short.loss_mask = short.loss_mask[:, :-2]
    huge = _batch(g)
    huge.aux = torch.full_like(huge.aux, 3e38)  # finite input, overflowing forward: refused at the update
    cases = [
        (wide, "this draft takes"), (nan, "NaN"), (vocab, "vocabulary"), (short, "do not"),
        (layers, "aux layers"), (huge, "non-finite"),
    ]  # fmt: skip
    for bad, message in cases:
        with pytest.raises(DraftInputError, match=message):
            trainer.submit(bad)
        after = _state(trainer.head)
        assert all(torch.equal(good[k], after[k]) for k in good), f"refused, yet changed: {message}"
    assert trainer.stats.refused == len(cases) and trainer.stats.steps == 1
    assert "non-finite" in trainer.stats.last_error and trainer.stats.tokens == 16 * 9
    assert trainer.submit(_batch(g)) and trainer.stats.steps == 2, "a good batch after bad ones still trains"


def test_training_the_draft_leaves_the_policy_untouched():
    """Features taken the way the trainer takes them (gather_aux_hidden_states on a
    forward with gradients on): the draft's updates reach no policy parameter."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    policy = Qwen3ForCausalLM(
        Qwen3Config(
            vocab_size=V, hidden_size=H, intermediate_size=32, num_hidden_layers=7, num_attention_heads=2,
            num_key_value_heads=1, head_dim=8, max_position_embeddings=64,
        )
    )  # fmt: skip
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    g = torch.Generator().manual_seed(2)
    batch = _batch(g)
    out = policy(input_ids=batch.input_ids, output_hidden_states=True)  # autograd on, as in training
    batch.aux = gather_aux_hidden_states(out.hidden_states, AUX)
    batch.target_logprobs = torch.log_softmax(out.logits[:, :-1].detach(), -1)
    trainer = OnlineDraftTrainer(_head(), DraftTrainingConfig(holdout_every=1000))
    for _ in range(3):
        assert trainer.submit(batch)
    assert all(p.grad is None for p in policy.parameters())
    assert all(torch.equal(before[k], v) for k, v in policy.state_dict().items())


def test_captured_batches_survive_the_wire_encoding():
    g = torch.Generator().manual_seed(3)
    for batch in (_batch(g), _batch(g, topk=3)):
        back = Captured.decode(batch.encode(), policy_version=3, aux_layer_ids=AUX)
        for k in ("input_ids", "attention_mask", "loss_mask", "aux", "target_logprobs", "target_ids"):
            a, b = getattr(batch, k), getattr(back, k)
            assert (a is None and b is None) or torch.equal(a, b), k
        assert (back.policy_version, back.aux_layer_ids) == (3, AUX)
