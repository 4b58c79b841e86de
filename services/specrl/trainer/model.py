"""The policy model: an HF causal LM (Qwen3 / Llama; the zoo target in tests, Qwen3-8B in
production) loaded as a plain module, and its forward as the trainer reads it
(next-token logprobs). Parallelism is applied from outside (`parallel.parallelize`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
from torch import nn

from specrl.config import resolve_model_path
from specrl.trainer.batch import TrainBatch

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def load_model(ref: str, *, dtype: Literal["float32", "bfloat16"], device: torch.device) -> nn.Module:
    """The HF model `ref` names (a path, `zoo:NAME` or a hub id), on `device`."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(resolve_model_path(ref), dtype=_DTYPES[dtype]).to(device)


@dataclass
class Forward:
    tokens: torch.Tensor  # [B, L-1] logprob of each next token, float32
    logp: torch.Tensor  # [B, L-1, V] next-token log-softmax
    hidden_states: tuple[torch.Tensor, ...] | None

    def entropy(self) -> torch.Tensor:
        return -(self.logp.exp() * self.logp).sum(-1)


def forward(model: nn.Module, batch: TrainBatch, *, hidden_states: bool = False) -> Forward:
    """One forward of `model` over the batch: next-token logprobs (and, for capture, the
    residual stream after every layer)."""
    out = model(
        input_ids=batch.input_ids, attention_mask=batch.attention_mask, output_hidden_states=hidden_states
    )
    logp = torch.log_softmax(out.logits[:, :-1].float(), dim=-1)
    tokens = logp.gather(-1, batch.input_ids[:, 1:, None])[..., 0]
    return Forward(tokens, logp, out.hidden_states if hidden_states else None)
