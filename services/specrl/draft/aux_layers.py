"""The one definition of EAGLE-3 auxiliary layer ids: capture, draft config and engine.

An aux layer id `i` names the residual stream after `i` decoder layers of the target
(0 is the embedding output). That is what vLLM's Qwen2/Qwen3/Llama models collect
(`_maybe_add_hidden_state(..., idx + 1, ...)`) and what transformers returns as
`output_hidden_states[i]` for `i < num_layers`. Getting this off by one is a known
silent failure in the field (acceptance near zero), so every producer and consumer of
aux hidden states in specrl goes through this module.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


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
