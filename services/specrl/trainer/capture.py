"""Verifier hidden states for the draft-trainer, captured during the trainer's logprob
pass (the target forward the trainer runs anyway): aux hidden states at the EAGLE-3 layer
ids and the target's next-token distribution, detached, with a subsample of completion
tokens marked as training signal. The policy never waits for the draft: the queue is
bounded and drops its oldest batch when full."""

from __future__ import annotations

import queue
import threading

import torch

from specrl.config import CaptureConfig
from specrl.features import Captured, default_aux_layer_ids, gather_aux_hidden_states, validate_aux_layer_ids


class CaptureQueue:
    def __init__(self, size: int) -> None:
        self._q: queue.Queue[Captured] = queue.Queue(maxsize=size)
        self._lock = threading.Lock()
        self.dropped = 0

    def put(self, item: Captured) -> None:
        with self._lock:
            while True:
                try:
                    self._q.put_nowait(item)
                    return
                except queue.Full:
                    self._q.get_nowait()
                    self.dropped += 1

    def get(self, timeout: float | None = None) -> Captured:
        return self._q.get(timeout=timeout)

    def qsize(self) -> int:
        return self._q.qsize()


class Capturer:
    def __init__(self, cfg: CaptureConfig, num_layers: int, seed: int) -> None:
        self.cfg = cfg
        ids = cfg.aux_layer_ids or default_aux_layer_ids(num_layers)
        self.aux_layer_ids = validate_aux_layer_ids(ids, num_layers)
        self.queue = CaptureQueue(cfg.queue_size)
        self._gen = torch.Generator().manual_seed(seed)

    def generator_state(self) -> torch.Tensor:
        return self._gen.get_state()

    def set_generator_state(self, state: torch.Tensor) -> None:
        self._gen.set_state(state)

    def capture(
        self,
        hidden_states: tuple[torch.Tensor, ...],
        logprobs: torch.Tensor,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        mask: torch.Tensor,
        policy_version: int,
    ) -> None:
        """This micro-batch's features (for `queue`, after the DP ranks' are gathered);
        `logprobs` are the full next-token log-softmax [B, L-1, V] of the pass."""
        keep = mask.cpu().clone()
        if self.cfg.token_fraction < 1:
            keep *= (torch.rand(keep.shape, generator=self._gen) < self.cfg.token_fraction).to(keep.dtype)
        lp = logprobs.detach()
        ids = None
        if self.cfg.topk is not None:
            lp, ids = lp.topk(self.cfg.topk, dim=-1)
            ids = ids.cpu()
        return Captured(
            policy_version=policy_version,
            input_ids=input_ids.cpu(),
            attention_mask=attention_mask.cpu(),
            loss_mask=keep,
            aux=gather_aux_hidden_states(hidden_states, self.aux_layer_ids).cpu(),
            target_logprobs=lp.cpu(),
            target_ids=ids,
            aux_layer_ids=self.aux_layer_ids,
        )
