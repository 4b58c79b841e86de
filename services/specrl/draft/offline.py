"""Offline EAGLE-3 training: capture the target's aux hidden states and next-token
distributions on a set of sequences, then fit the head with training-time test.

The capture is the same computation the trainer performs during its logprob pass
(aux ids from `specrl.features`, everything detached), so a head trained here and
one adapted online see identical features.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from specrl.draft.eagle3 import Eagle3Head, ttt_loss, ttt_update
from specrl.features import gather_aux_hidden_states

Progress = Callable[[int, int, float], None]


@dataclass
class Features:
    input_ids: torch.Tensor  # [N, T] right-padded
    loss_mask: torch.Tensor  # [N, T] 1 where the target's prediction is a training signal
    aux: torch.Tensor  # [N, T, n_aux * H]
    target_logprobs: torch.Tensor  # [N, T, V] log-softmax of the target's logits

    def select(self, idx: list[int]) -> Features:
        i = torch.tensor(idx)
        return Features(self.input_ids[i], self.loss_mask[i], self.aux[i], self.target_logprobs[i])


def pad(
    sequences: Sequence[Sequence[int]], masks: Sequence[Sequence[int]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-pad to [N, T]; returns ids, attention mask and loss mask."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    attn = torch.zeros_like(ids)
    loss = torch.zeros_like(ids)
    for i, (s, m) in enumerate(zip(sequences, masks)):
        ids[i, : len(s)] = torch.tensor(s)
        attn[i, : len(s)] = 1
        loss[i, : len(m)] = torch.tensor(m)
    return ids, attn, loss


@torch.no_grad()
def capture(
    target: torch.nn.Module,
    sequences: Sequence[Sequence[int]],
    loss_masks: Sequence[Sequence[int]],
    aux_layer_ids: Sequence[int],
    *,
    pad_id: int,
    batch_size: int = 64,
) -> Features:
    """Run the target over `sequences` once, keeping aux hidden states and log-probs (on
    the target's device, in float32 as the head trains, whatever the target's dtype)."""
    device = next(target.parameters()).device
    ids, attn, loss = (t.to(device) for t in pad(sequences, loss_masks, pad_id))
    aux_parts, lp_parts = [], []
    for start in range(0, len(ids), batch_size):
        sl = slice(start, start + batch_size)
        out = target(input_ids=ids[sl], attention_mask=attn[sl], output_hidden_states=True)
        aux_parts.append(gather_aux_hidden_states(out.hidden_states, aux_layer_ids).float())
        lp_parts.append(torch.log_softmax(out.logits.float(), dim=-1))
    return Features(ids, loss * attn, torch.cat(aux_parts), torch.cat(lp_parts))


def train_head(
    head: Eagle3Head,
    draw: Callable[[list[int]], Features],
    n: int,
    *,
    steps: int,
    batch_size: int,
    lr: float,
    ttt_steps: int,
    seed: int,
    progress: Progress | None = None,
) -> dict[str, list[float] | float]:
    """Fit the head with AdamW and cosine decay on batches of `batch_size` of the `n`
    sequences, `draw(indices)` giving their features (`Features.select` of features
    captured once, or a capture per batch when all of them would not fit in memory);
    returns the last batch's loss and per-position top-1 agreement."""
    rng = random.Random(seed)
    torch.manual_seed(seed)
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps, eta_min=lr * 0.1)
    head.train()
    stats: dict[str, list[float] | float] = {}
    for step in range(steps):
        f = draw(rng.sample(range(n), min(batch_size, n)))
        loss, stats = ttt_update(
            head, opt, f.aux, f.input_ids, f.target_logprobs, f.loss_mask, ttt_steps=ttt_steps
        )  # fmt: skip
        sched.step()
        stats["loss"] = loss
        if progress is not None:
            progress(step + 1, steps, loss)
    head.eval()
    return stats


def frequent_tokens(sequences: Sequence[Sequence[int]], vocab_size: int, n: int) -> torch.Tensor:
    """The `n` token ids most frequent in `sequences` (ties to the lower id; ids never seen
    fill up from the lowest), ascending: a draft vocabulary, as EAGLE-3 picks it from its
    training data."""
    tokens = torch.tensor([t for seq in sequences for t in seq], dtype=torch.long)
    counts = torch.bincount(tokens, minlength=vocab_size)[:vocab_size]
    return torch.sort(-counts, stable=True).indices[:n].sort().values


@torch.no_grad()
def evaluate_head(head: Eagle3Head, feats: Features, ttt_steps: int) -> list[float]:
    """Top-1 agreement with the target per draft position on held-out features."""
    logits = head.ttt_forward(feats.aux, feats.input_ids, ttt_steps)
    _, stats = ttt_loss(logits, feats.target_logprobs, feats.loss_mask, vocab=head.vocab_map())
    return stats["top1_agreement"]
