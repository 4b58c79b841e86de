"""The GRPO loss against a straightforward per-token reference written independently
(plain Python floats, one token at a time), on hand-made inputs chosen so that a wrong
sign, clip side, KL direction or mask would change the number."""

from __future__ import annotations

import math

import pytest
import torch

from specrl.config import GRPOConfig
from specrl.trainer.losses.grpo import group_advantages, grpo_token_loss


def reference_loss(logp, old, adv, mask, *, eps_low, eps_high, kl_coef=0.0, ref=None, rollout=None, cap=None):
    total, count = 0.0, 0
    for i, row in enumerate(logp):
        for t, lp in enumerate(row):
            if not mask[i][t]:
                continue
            r = math.exp(lp - old[i][t])
            a = adv[i]
            # the pessimistic (smaller) of the unclipped and clipped objectives, negated
            objective = min(r * a, max(1 - eps_low, min(r, 1 + eps_high)) * a)
            w = min(math.exp(old[i][t] - rollout[i][t]), cap) if cap is not None else 1.0
            loss = -objective * w
            if kl_coef:
                # k3 estimate of KL(pi || ref) with samples from pi
                x = ref[i][t] - lp
                loss += kl_coef * (math.exp(x) - x - 1)
            total += loss
            count += 1
    return total / count


LOGP = [[-1.0, -0.5, -2.0, -0.1], [-0.3, -1.2, -0.7, -3.0]]
OLD = [[-1.4, -0.4, -1.0, -0.1], [-0.3, -0.2, -1.5, -0.9]]  # ratios well inside and outside the clip range
REF = [[-0.9, -0.8, -2.5, -0.3], [-0.1, -1.0, -0.6, -2.0]]
ROLL = [[-1.2, -0.6, -1.1, -0.4], [-0.5, -0.2, -1.9, -0.8]]
MASK = [[0, 1, 1, 1], [1, 1, 1, 0]]  # a prompt position and a padding position


def _t(x):
    return torch.tensor(x, dtype=torch.float64)


@pytest.mark.parametrize("adv", [[1.5, -0.7], [-2.0, 0.9], [0.0, 1.0]])
@pytest.mark.parametrize(
    "cfg",
    [
        GRPOConfig(eps_low=0.2, eps_high=0.28),
        GRPOConfig(eps_low=0.1, eps_high=0.5, kl_coef=0.05),
        GRPOConfig(eps_low=0.2, eps_high=0.2, kl_coef=0.3, is_cap=1.2),
    ],
)
def test_loss_matches_reference(adv, cfg):
    out = grpo_token_loss(
        _t(LOGP), _t(OLD), _t(adv), _t(MASK), cfg, ref_logprobs=_t(REF), rollout_logprobs=_t(ROLL)
    )
    want = reference_loss(
        LOGP, OLD, adv, MASK, eps_low=cfg.eps_low, eps_high=cfg.eps_high, kl_coef=cfg.kl_coef,
        ref=REF, rollout=ROLL, cap=cfg.is_cap,
    )  # fmt: skip
    assert out.loss.item() / 6 == pytest.approx(want, rel=1e-12)  # 6 masked tokens
    assert sorted(out.stats) == ["clip_fraction", "is_weight", "kl", "pg_loss"]


def test_masked_positions_do_not_matter():
    cfg = GRPOConfig(kl_coef=0.1)
    a = grpo_token_loss(_t(LOGP), _t(OLD), _t([1.0, -1.0]), _t(MASK), cfg, ref_logprobs=_t(REF))
    logp = _t(LOGP)
    logp[0, 0], logp[1, 3] = -9.0, -0.01  # change only masked (prompt / padding) positions
    b = grpo_token_loss(logp, _t(OLD), _t([1.0, -1.0]), _t(MASK), cfg, ref_logprobs=_t(REF))
    assert a.loss.item() == b.loss.item()


def test_gradient_raises_good_tokens_and_lowers_bad_ones():
    logp = _t([[-1.0, -1.0]]).requires_grad_()
    grpo_token_loss(logp, _t([[-1.0, -1.0]]), _t([1.0]), _t([[1, 1]]), GRPOConfig()).loss.backward()
    assert (logp.grad < 0).all()  # descending the loss increases logp of positive-advantage tokens
    logp.grad = None
    grpo_token_loss(logp, _t([[-1.0, -1.0]]), _t([-1.0]), _t([[1, 1]]), GRPOConfig()).loss.backward()
    assert (logp.grad > 0).all()


def test_clipped_tokens_get_no_gradient_and_are_counted():
    # ratio e^1 > 1 + eps_high with positive advantage: clipped, so no gradient
    logp = _t([[0.0, -1.0]]).requires_grad_()
    out = grpo_token_loss(logp, _t([[-1.0, -1.0]]), _t([1.0]), _t([[1, 1]]), GRPOConfig())
    out.loss.backward()
    assert logp.grad[0, 0] == 0 and logp.grad[0, 1] != 0
    assert out.stats["clip_fraction"] == 1  # a token sum: the step divides by the tokens


def test_kl_is_zero_at_the_reference_and_positive_elsewhere():
    cfg = GRPOConfig(kl_coef=1.0)
    same = grpo_token_loss(_t(LOGP), _t(LOGP), _t([0.0, 0.0]), _t(MASK), cfg, ref_logprobs=_t(LOGP))
    assert same.stats["kl"] == 0
    diff = grpo_token_loss(_t(LOGP), _t(LOGP), _t([0.0, 0.0]), _t(MASK), cfg, ref_logprobs=_t(REF))
    assert diff.stats["kl"] > 0


def test_group_advantages():
    r = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0])
    a = group_advantages(r, 4, normalize_std=True)
    assert a[:4].tolist() == pytest.approx([3 / 3**0.5, -1 / 3**0.5, -1 / 3**0.5, -1 / 3**0.5], rel=1e-5)
    assert a[4:].tolist() == [0, 0, 0, 0]  # a group that all agree teaches nothing
    assert group_advantages(r, 4, normalize_std=False)[:4].tolist() == pytest.approx(
        [0.75, -0.25, -0.25, -0.25]
    )
    with pytest.raises(ValueError, match="groups of 3"):
        group_advantages(r, 3, normalize_std=True)


def test_is_correction_needs_rollout_logprobs():
    with pytest.raises(ValueError, match="rollout logprobs"):
        grpo_token_loss(_t(LOGP), _t(OLD), _t([1.0, 1.0]), _t(MASK), GRPOConfig(is_cap=2.0))
