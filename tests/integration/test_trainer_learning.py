"""GRPO on the zoo task moves the policy the right way: after a few steps on a fixed
batch of its own rollouts, completions with positive advantage became more likely and
those with negative advantage less likely (total logprob per completion)."""

from __future__ import annotations

import pytest
import torch

from specrl.config import TrainerConfig, resolve_model_path
from specrl.trainer.batch import Rollout, collate
from specrl.trainer.grpo import group_advantages
from specrl.trainer.policy import Policy
from specrl.zoo import task

pytestmark = pytest.mark.zoo

GROUP = 8


@torch.no_grad()
def _rollouts(policy: Policy, tok, problems) -> list[Rollout]:
    torch.manual_seed(7)
    policy.model.eval()
    out = []
    for p in problems:
        ids = tok(p.prompt, add_special_tokens=False)["input_ids"]
        x = torch.tensor([ids] * GROUP)
        y = policy.model.generate(
            x, attention_mask=torch.ones_like(x), do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
            max_new_tokens=32, eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id,
        )  # fmt: skip
        for row in y[:, len(ids) :].tolist():
            if tok.eos_token_id in row:
                row = row[: row.index(tok.eos_token_id) + 1]
            out.append(Rollout(ids, row, task.reward(tok.decode(row), p.answer)))
    return out


def test_grpo_steps_raise_rewarded_completions_and_lower_the_rest(zoo):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve_model_path("zoo:target"))
    policy = Policy(TrainerConfig.model_validate({"micro_batch_size": 64, "optim": {"lr": 1e-5}}))
    problems = task.take(16, seed=5, split="train", max_operand=20, max_terms=2)
    batch = collate(_rollouts(policy, tok, problems), policy.vocab_size)
    adv = group_advantages(batch.rewards, GROUP, normalize_std=True)
    assert (adv > 0).sum() >= 4, "too few rewarded samples for a signal; pick other problems"
    before = (policy.logprobs(batch) * batch.mask).sum(1)
    for _ in range(10):
        m = policy.train_step(batch, group_size=GROUP)
        assert m.tokens == batch.mask.sum().item() and m.grad_norm > 0
    delta = (policy.logprobs(batch) * batch.mask).sum(1) - before
    up, down = delta[adv > 0].mean().item(), delta[adv < 0].mean().item()
    assert up > 0.2 and down < -0.2, f"positive-advantage dlogp {up:.2f}, negative {down:.2f}"
