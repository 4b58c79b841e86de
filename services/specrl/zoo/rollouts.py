"""Sampling from a zoo model with transformers (build-time only: training data for the
drafts and the accuracy figures in the manifest). Serving goes through vLLM."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from specrl.data.task import Problem, reward


@torch.no_grad()
def sample_completions(
    model: PreTrainedModel,
    tok: PreTrainedTokenizerBase,
    prompts: Sequence[str],
    *,
    max_new_tokens: int,
    temperature: float,
    seed: int = 0,
    batch_size: int = 128,
) -> list[list[int]]:
    """Completion token ids per prompt, up to and including EOS when it was sampled."""
    torch.manual_seed(seed)
    tok.padding_side = "left"
    eos = tok.eos_token_id
    out: list[list[int]] = []
    for start in range(0, len(prompts), batch_size):
        enc = tok(
            list(prompts[start : start + batch_size]),
            return_tensors="pt",
            padding=True,
            add_special_tokens=False,
        )
        gen = model.generate(
            **enc,
            max_new_tokens=max_new_tokens,
            do_sample=temperature > 0,
            temperature=temperature if temperature > 0 else None,
            top_k=None,
            top_p=None,
            pad_token_id=eos,
            eos_token_id=eos,
        )
        for row in gen[:, enc["input_ids"].shape[1] :].tolist():
            if eos in row:
                row = row[: row.index(eos) + 1]
            out.append(row)
    return out


def accuracy(
    model: PreTrainedModel,
    tok: PreTrainedTokenizerBase,
    problems: Sequence[Problem],
    *,
    temperature: float,
    seed: int = 0,
    max_new_tokens: int = 48,
) -> float:
    """Mean task reward of one completion per problem."""
    comps = sample_completions(
        model,
        tok,
        [p.prompt for p in problems],
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        seed=seed,
    )
    texts = tok.batch_decode(comps, skip_special_tokens=True)
    return sum(reward(t, p.answer) for t, p in zip(texts, problems)) / len(problems)


def test_accuracy(
    model: PreTrainedModel,
    tok: PreTrainedTokenizerBase,
    problems: Sequence[Problem],
    *,
    seed: int,
    max_new_tokens: int,
) -> dict[str, float]:
    """The manifest's accuracy figures: greedy and sampled at temperature 1."""
    return {
        "test_accuracy_greedy": accuracy(
            model, tok, problems, temperature=0.0, max_new_tokens=max_new_tokens
        ),
        "test_accuracy_sampled": accuracy(
            model, tok, problems, temperature=1.0, seed=seed, max_new_tokens=max_new_tokens
        ),
    }
