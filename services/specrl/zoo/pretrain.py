"""Next-token pretraining of the zoo's causal LMs (the target and the external draft)."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

Progress = Callable[[int, int, float], None]  # (step, total_steps, loss)


def encode_batch(
    tokenizer: PreTrainedTokenizerBase, texts: Sequence[str]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded ids with an EOS after every text, and the attention mask."""
    eos = tokenizer.eos_token_id
    rows = [tokenizer(t, add_special_tokens=False)["input_ids"] + [eos] for t in texts]
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), eos, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r)
        mask[i, : len(r)] = 1
    return ids, mask


def train_causal_lm(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    *,
    steps: int,
    batch_size: int,
    lr: float,
    seed: int,
    progress: Progress | None = None,
) -> float:
    """Train in place with AdamW and a warmup + cosine schedule; returns the final loss."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    warmup = max(1, steps // 20)

    def schedule(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
    model.train()
    loss_value = float("nan")
    for step in range(steps):
        ids, mask = encode_batch(tokenizer, rng.sample(list(texts), batch_size))
        labels = ids.masked_fill(mask == 0, -100)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        loss_value = loss.item()
        if progress is not None:
            progress(step + 1, steps, loss_value)
    model.eval()
    return loss_value
