"""What the trainer captures for the draft-trainer, defined once for both: the EAGLE-3
auxiliary layer ids (capture, draft config and engine) and the captured batch with its
wire codec. Neither service imports the other; both import this.

An aux layer id `i` names the residual stream after `i` decoder layers of the target
(0 is the embedding output). That is what vLLM's Qwen2/Qwen3/Llama models collect
(`_maybe_add_hidden_state(..., idx + 1, ...)`) and what transformers returns as
`output_hidden_states[i]` for `i < num_layers`. Getting this off by one is a known
silent failure in the field (acceptance near zero), so every producer and consumer of
aux hidden states in specrl goes through this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from specrl.v1 import trainer_pb2 as pb


def default_aux_layer_ids(num_layers: int) -> tuple[int, int, int]:
    """Low, middle and high layers, as EAGLE-3 and vLLM choose them: (2, N//2, N-3).

    Explicit, distinct ids are always written into the draft config: vLLM's implicit
    default collapses to duplicates on shallow targets.
    """
    if num_layers < 7:  # below 7 the three ids are not distinct
        raise ValueError(f"EAGLE-3 needs a target with at least 7 layers, got {num_layers}")
    return (2, num_layers // 2, num_layers - 3)


def validate_aux_layer_ids(ids: Sequence[int], num_layers: int) -> tuple[int, ...]:
    """Reject ids vLLM would silently mis-handle: duplicates or out of [0, num_layers)."""
    ids = tuple(int(i) for i in ids)
    if len(set(ids)) != len(ids):
        raise ValueError(f"aux layer ids must be distinct, got {ids}")
    bad = [i for i in ids if not 0 <= i < num_layers]
    if bad:
        raise ValueError(f"aux layer ids {bad} outside [0, {num_layers}) for this target")
    return ids


def gather_aux_hidden_states(hidden_states: Sequence[torch.Tensor], ids: Sequence[int]) -> torch.Tensor:
    """Concatenate transformers' `output_hidden_states` at the aux ids: [..., len(ids) * H].

    `hidden_states` is the tuple a HF causal LM returns with output_hidden_states=True
    (embeddings first); the result is detached, since the draft never trains the policy.
    """
    return torch.cat([hidden_states[i] for i in ids], dim=-1).detach()


@dataclass
class Captured:
    """One micro-batch of the verifier's features, all detached, on CPU."""

    policy_version: int
    input_ids: torch.Tensor  # [B, L]
    attention_mask: torch.Tensor  # [B, L]
    loss_mask: torch.Tensor  # [B, L-1] completion positions kept as signal
    aux: torch.Tensor  # [B, L, n_aux * H]
    target_logprobs: torch.Tensor  # [B, L-1, V] or top-k values [B, L-1, k]
    target_ids: torch.Tensor | None  # [B, L-1, k] with top-k, else None
    aux_layer_ids: tuple[int, ...] = ()  # the target layers `aux` was taken at

    _TENSORS = ("input_ids", "attention_mask", "loss_mask", "aux", "target_logprobs", "target_ids")

    def encode(self) -> bytes:
        """The tensors as safetensors bytes (CapturedBatch.tensors)."""
        from safetensors.torch import save

        return save({k: getattr(self, k).contiguous() for k in self._TENSORS if getattr(self, k) is not None})

    @classmethod
    def decode(cls, data: bytes, *, policy_version: int, aux_layer_ids: tuple[int, ...]) -> Captured:
        from safetensors.torch import load

        t = load(data)
        missing = [k for k in cls._TENSORS[:-1] if k not in t]
        if missing:
            raise ValueError(f"captured batch lacks {missing}")
        return cls(policy_version, *(t[k] for k in cls._TENSORS[:-1]), t.get("target_ids"), aux_layer_ids)

    def to_message(self) -> pb.CapturedBatch:
        return pb.CapturedBatch(
            policy_version=self.policy_version, aux_layer_ids=self.aux_layer_ids, tensors=self.encode()
        )

    @classmethod
    def from_message(cls, m: pb.CapturedBatch) -> Captured:
        """Raises ValueError when the tensors do not decode."""
        return cls.decode(m.tensors, policy_version=m.policy_version, aux_layer_ids=tuple(m.aux_layer_ids))
