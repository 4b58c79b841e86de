"""The sampler self-test on its own, without an engine: every engine hands it its sampler
(rollout/engines/<kind>/selftest.py), so it must pass an exact speculative sampler and
fail one that resamples a rejected position from the target instead of the residual."""

import pytest
import torch

from specrl.rollout import selftest
from specrl.stats.exact import processed_probs


def reference_sampler(*, residual: bool) -> selftest.SpeculativeSampler:
    """Textbook speculative sampling, written for the test (a fake engine sampler): accept
    draft d with probability min(1, p(d) / q(d)), on rejection draw from
    normalise(max(p - q, 0)) (from p itself when `residual` is off: the bug) and stop, after
    K acceptances draw the bonus token from the last row's p."""

    def sample(target_logits, draft_token_ids, draft_probs, *, temperature, top_p):
        b, k = draft_token_ids.shape
        p = processed_probs(target_logits, temperature=temperature, top_p=top_p).view(b, k + 1, -1)
        if draft_probs is None:  # greedy drafts: point masses
            q = torch.nn.functional.one_hot(draft_token_ids, p.shape[-1]).to(p.dtype)
        else:
            q = draft_probs.to(p.dtype).view(b, k, -1)
        out = torch.full((b, k + 1), -1, dtype=torch.long)
        alive = torch.ones(b, dtype=torch.bool)
        for i in range(k):
            d = draft_token_ids[:, i]
            ratio = p[:, i].gather(1, d[:, None]).squeeze(1) / q[:, i].gather(1, d[:, None]).squeeze(1)
            accept = torch.rand(b, dtype=p.dtype) < ratio
            fallback = (p[:, i] - q[:, i]).clamp(min=0) if residual else p[:, i]
            # p == q leaves no residual, but then the draft is always accepted: any row will do
            fallback = torch.where(fallback.sum(1, keepdim=True) > 0, fallback, p[:, i])
            drawn = torch.multinomial(fallback / fallback.sum(1, keepdim=True), 1).squeeze(1)
            out[alive, i] = torch.where(accept, d, drawn)[alive]
            alive &= accept
        out[alive, k] = torch.multinomial(p[alive, k], 1).squeeze(1)
        return out

    return sample


def test_an_exact_speculative_sampler_passes():
    for seed in (1, 2):
        torch.manual_seed(seed)  # the fake sampler draws from the global generator
        result = selftest.run(reference_sampler(residual=True), trials=20000, alpha=1e-4, seed=seed)
        assert result["passed"], result


def test_resampling_a_rejection_from_the_target_fails():
    torch.manual_seed(0)
    result = selftest.run(reference_sampler(residual=False), trials=20000, alpha=1e-4, seed=1234)
    assert not result["passed"], result
    assert result["p_value"] == pytest.approx(0.0, abs=1e-6)
