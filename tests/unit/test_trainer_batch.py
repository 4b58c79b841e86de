"""Rollouts -> training tensors: alignment of completion tokens with next-token positions,
and bad input refused with the offending sample named."""

from __future__ import annotations

import math

import pytest
import torch

from specrl.trainer.api import Rollout
from specrl.trainer.batch import BatchError, collate


def test_collate_aligns_completion_tokens_with_next_token_positions():
    b = collate(
        [Rollout([5, 6, 7], [8, 9], 1.0, [-0.1, -0.2]), Rollout([5], [4, 3, 2], 0.0, [-1, -2, -3])], 16
    )
    assert b.input_ids.tolist() == [[5, 6, 7, 8, 9], [5, 4, 3, 2, 0]]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]
    # position t predicts token t+1: the completion of sample 0 is predicted at positions 2, 3
    assert b.mask.tolist() == [[0, 0, 1, 1], [1, 1, 1, 0]]
    assert b.rollout_logprobs[0, 2:4].tolist() == pytest.approx([-0.1, -0.2])
    assert b.rollout_logprobs[1, :3].tolist() == [-1, -2, -3]
    assert torch.equal(b.rewards, torch.tensor([1.0, 0.0]))


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        (
            Rollout([1, 2], [3, 99], 1.0),
            r"sample 1: completion token ids outside the vocabulary \[0, 16\): \[99\]",
        ),
        (Rollout([-1], [3], 1.0), "sample 1: prompt token ids outside"),
        (Rollout([1], [], 1.0), "sample 1: empty completion"),
        (Rollout([1], [2], math.nan), "sample 1: reward is nan"),
        (Rollout([1], [2, 3], 1.0, [-0.5]), "sample 1: 1 rollout logprobs for 2 completion tokens"),
        (Rollout([1], [2], 1.0, [math.inf]), "sample 1: rollout logprobs must be finite"),
    ],
)
def test_bad_samples_are_named(bad, match):
    good = Rollout([1], [2], 0.0, [-0.3]) if bad.rollout_logprobs else Rollout([1], [2], 0.0)
    with pytest.raises(BatchError, match=match):
        collate([good, bad], 16)


def test_logprobs_for_some_samples_only_is_refused():
    with pytest.raises(BatchError, match="every sample or for none"):
        collate([Rollout([1], [2], 0.0, [-0.3]), Rollout([1], [2], 0.0)], 16)
