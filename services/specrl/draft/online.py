"""Online EAGLE-3 adaptation: the draft-trainer's core, without its transport.

It consumes the trainer's captured batches (`specrl.features.Captured`: aux hidden
states and the target's next-token log-probs from the policy's own logprob pass) and fits
the head with the same training-time-test step as offline initialization
(`specrl.draft.eagle3.ttt_update`) on the head's device (a GPU when the draft-trainer
has one). Gradient isolation is structural: a batch holds detached CPU copies of what the
policy computed, and nothing here references the policy's parameters.

A bad batch never reaches the weights: a width that does not match the draft (aux
layers x hidden size, vocabulary), shapes that disagree, non-finite values, or a step
whose loss or gradient is not finite is refused with DraftInputError and counted, and
the head keeps its last good weights. Every `holdout_every`-th batch is kept for
evaluation instead: per-position top-1 agreement with the target and the acceptance
length that implies.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import NamedTuple

import torch

from specrl.config import DraftTrainingConfig
from specrl.draft.eagle3 import Eagle3Head, NonFiniteUpdate, ttt_loss, ttt_update
from specrl.features import Captured


class DraftInputError(ValueError):
    """A captured batch the draft cannot train on; nothing was changed."""


class TrainBatch(NamedTuple):
    """A checked batch in the layout of `ttt_loss`, on the head's device: position t
    holds the target's prediction of token t+1; the last position, which predicts
    nothing, is masked. A top-k capture stays top-k (`target_ids`), never spread over the
    vocabulary."""

    aux: torch.Tensor  # [B, L, n_aux * H]
    input_ids: torch.Tensor  # [B, L]
    target_logprobs: torch.Tensor  # [B, L, V], or [B, L, k] with target_ids
    loss_mask: torch.Tensor  # [B, L]
    target_ids: torch.Tensor | None  # [B, L, k] or None


@dataclass
class DraftStats:
    """What the draft-trainer has done so far."""

    steps: int = 0
    tokens: int = 0
    refused: int = 0
    last_loss: float = math.nan
    last_error: str = ""
    policy_version: int = -1  # the newest policy version trained against


def acceptance_length(agreement: list[float]) -> float:
    """Expected tokens per verification when drafting len(agreement) tokens: the bonus
    token plus draft position j accepted if every position up to j agrees (TTT scores
    position j given correct earlier tokens, so agreements multiply)."""
    total, run = 1.0, 1.0
    for a in agreement:
        run *= a
        total += run
    return total


def pooled_agreement(parts: list[tuple[float, list[float]]]) -> list[float]:
    """Per-position agreement over several batches, each weighted by its signal tokens:
    (tokens, agreement per position) pairs in, the token-weighted mean out."""
    total = sum(w for w, _ in parts)
    if not parts:
        return []
    return [sum(w * a[j] for w, a in parts) / max(total, 1.0) for j in range(len(parts[0][1]))]


class OnlineDraftTrainer:
    def __init__(self, head: Eagle3Head, cfg: DraftTrainingConfig) -> None:
        self.head = head.train()
        self.cfg = cfg
        params = [p for p in head.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
        self.stats = DraftStats()
        self.holdout: deque[TrainBatch] = deque(maxlen=cfg.holdout_batches)
        self._seen = 0

    def submit(self, batch: Captured) -> bool:
        """Train on `batch`, or hold it out for evaluation (returns False then). Raises
        DraftInputError, with the head unchanged, for a batch it cannot use."""
        try:
            tb = self._tensors(batch)
        except DraftInputError as e:
            self._refuse(e)
            raise
        self._seen += 1
        if self._seen % self.cfg.holdout_every == 0:
            self.holdout.append(tb)
            return False
        c = self.cfg
        try:
            loss, _ = ttt_update(
                self.head, self.opt, tb.aux, tb.input_ids, tb.target_logprobs, tb.loss_mask,
                target_ids=tb.target_ids, ttt_steps=c.ttt_steps, decay=c.loss_decay,
                max_grad_norm=c.max_grad_norm,
            )  # fmt: skip
        except NonFiniteUpdate as e:
            err = DraftInputError(f"batch of policy v{batch.policy_version} refused: {e}")
            self._refuse(err)
            raise err from None
        s = self.stats
        s.steps += 1
        s.tokens += int(tb.loss_mask.sum())
        s.last_loss = loss
        s.policy_version = max(s.policy_version, batch.policy_version)
        return True

    @torch.no_grad()
    def evaluate(self, head: Eagle3Head | None = None) -> list[float]:
        """Top-1 agreement per draft position on the held-out batches, token-weighted
        (empty before the first batch is held out), of the head being trained or of
        another `head` (e.g. the draft published earlier)."""
        if not self.holdout:
            return []
        was_training = (head or self.head).training
        head = (head or self.head).eval()
        parts = []
        for tb in self.holdout:
            logits = head.ttt_forward(tb.aux, tb.input_ids, self.cfg.ttt_steps)
            _, stats = ttt_loss(
                logits, tb.target_logprobs, tb.loss_mask, target_ids=tb.target_ids,
                vocab=head.vocab_map(), decay=self.cfg.loss_decay,
            )  # fmt: skip
            parts.append((float(tb.loss_mask.sum()), stats["top1_agreement"]))
        head.train(was_training)
        return pooled_agreement(parts)

    def _refuse(self, e: DraftInputError) -> None:
        self.stats.refused += 1
        self.stats.last_error = str(e)

    def _tensors(self, b: Captured) -> TrainBatch:
        """The batch on the head's device, after checking it."""
        cfg = self.head.cfg
        dev = self.head.fc.weight.device
        ids, aux, lp = b.input_ids.to(dev), b.aux.to(dev), b.target_logprobs.to(dev)
        if ids.dim() != 2:
            raise DraftInputError(f"input_ids must be [batch, length], got {tuple(ids.shape)}")
        n, length = ids.shape
        if b.aux_layer_ids and tuple(b.aux_layer_ids) != tuple(cfg.aux_layer_ids):
            raise DraftInputError(
                f"features captured at aux layers {list(b.aux_layer_ids)}; this draft reads layers "
                f"{list(cfg.aux_layer_ids)} (trainer.capture.aux_layer_ids must be the draft's)"
            )
        width = len(cfg.aux_layer_ids) * cfg.hidden_size
        if aux.shape != (n, length, width):
            raise DraftInputError(
                f"aux hidden states are {tuple(aux.shape)}; this draft takes [{n}, {length}, {width}] "
                f"({len(cfg.aux_layer_ids)} layers {list(cfg.aux_layer_ids)} x hidden {cfg.hidden_size})"
            )
        if b.loss_mask.shape != (n, length - 1) or lp.shape[:2] != (n, length - 1):
            raise DraftInputError(
                f"loss mask {tuple(b.loss_mask.shape)} / target log-probs {tuple(lp.shape)} do not "
                f"cover the {length - 1} predicted positions of input_ids {tuple(ids.shape)}"
            )
        if bool((ids < 0).any()) or bool((ids >= cfg.vocab_size).any()):
            raise DraftInputError(f"token ids outside the draft's vocabulary of {cfg.vocab_size}")
        if not bool(torch.isfinite(aux).all()):
            raise DraftInputError("aux hidden states hold NaN or inf")
        if bool(torch.isnan(lp).any()) or bool((lp > 1e-4).any()):
            raise DraftInputError("target log-probs hold NaN or positive values")
        top = None
        if b.target_ids is None:
            if lp.shape[-1] != cfg.vocab_size:
                raise DraftInputError(
                    f"target distribution over {lp.shape[-1]} tokens; "
                    f"the draft's vocabulary is {cfg.vocab_size}"
                )
        else:  # top-k: the tokens outside it have probability 0
            top = b.target_ids.to(dev).long()
            if top.shape != lp.shape or bool((top < 0).any()) or bool((top >= cfg.vocab_size).any()):
                raise DraftInputError("top-k target ids do not match their log-probs or the vocabulary")
            top = torch.cat([top, top.new_zeros((n, 1, top.shape[-1]))], dim=1)
        # the last position predicts nothing: probability 0 everywhere, and masked
        target = torch.cat([lp.float(), lp.new_full((n, 1, lp.shape[-1]), -1e30, dtype=torch.float32)], dim=1)
        mask = torch.zeros((n, length), dtype=torch.float32, device=dev)
        mask[:, :-1] = b.loss_mask.to(dev).float() * b.attention_mask.to(dev)[:, 1:].float()
        return TrainBatch(aux.float(), ids.long(), target, mask, top)
