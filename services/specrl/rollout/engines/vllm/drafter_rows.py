"""The hybrid's draft model run over some of the batch's rows only: the requests history
drafts for alone, for long, are left out of its passes (`DrafterRows`).

vLLM's EAGLE proposer runs over every row of the batch every step, if only its first pass
(which writes the draft model's KV cache for the tokens just verified, from the target's
hidden states). For a request that history has drafted alone for many steps that pass
buys only the option of the draft model drafting for it again, and it is the hybrid's
fixed price over history alone: on the CPU testbed 7-9 ms of a ~60 ms step at 41-64
requests (docs/benchmarks.md). Left out, a request's rows are cut from the pass's inputs
(its tokens, positions, hidden states, KV slots, block table and sequence length), so the
pass and the draft model's positions run over the other rows only; the rows left out get
an empty draft back (the hybrid fills them from history). A request that comes back
(history stops drafting well for it) finds its draft model's KV cache stale over the
steps it was left out: its drafts are worse there, never wrong (they are still a
deterministic function of what the engine holds, verified by rejection sampling), and the
hybrid's scores see it.

Only the EAGLE pathway (the proposer shifts the target's tokens by one and reads their
hidden states: EAGLE, EAGLE-3) and its unpadded batch, which the hybrid asks for; a draft
model of its own (`draft_model`, extra input slots) or M-RoPE positions run over every row.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

# CommonAttentionMetadata's optional fields of one entry per row (as its `unpadded` slices)
PER_ROW = (
    "causal",
    "encoder_seq_lens",
    "encoder_seq_lens_cpu",
    "dcp_local_seq_lens",
    "dcp_local_seq_lens_cpu_upper_bound",
    "seq_lens_cpu_upper_bound",
    "is_prefilling",
    "req_idx",
    "rswa_prefix_lens",
    "replayssm_decode_base_cpu",
)


class DrafterRows:
    """Wraps the runner's drafter's `propose`: the rows of requests in `left_out` (set by
    the hybrid each step) are cut from its inputs, and their drafts come back empty (zeros,
    to be replaced) in the batch's order (module docstring)."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner
        self._propose = runner.drafter.propose
        self.left_out: set[str] = set()
        runner.drafter.propose = self.propose

    @staticmethod
    def supported(drafter: Any) -> bool:
        extra_slots = getattr(drafter, "needs_extra_input_slots", True)
        return not extra_slots and not getattr(drafter, "uses_mrope", True)

    def propose(
        self,
        num_speculative_tokens: int,
        target_token_ids: torch.Tensor,
        target_positions: torch.Tensor,
        target_hidden_states: torch.Tensor,
        next_token_ids: torch.Tensor,
        token_indices_to_sample: torch.Tensor | None,
        common_attn_metadata: Any,
        *args: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        cad = common_attn_metadata

        def run(tokens, positions, hidden, next_ids, attn) -> torch.Tensor:
            return self._propose(
                num_speculative_tokens, tokens, positions, hidden, next_ids,
                token_indices_to_sample, attn, *args, **kwargs,
            )  # fmt: skip

        # the padded batch, or per-request ranges this does not cut, run as they come
        padded = token_indices_to_sample is not None or kwargs.get("num_rejected_tokens_gpu") is not None
        padded |= cad.mm_req_doc_ranges is not None
        if padded or not self.left_out:
            return run(target_token_ids, target_positions, target_hidden_states, next_token_ids, cad)
        req_ids = self.runner.input_batch.req_ids[: cad.num_reqs]
        kept_rows = torch.tensor([req not in self.left_out for req in req_ids], dtype=torch.bool)
        if bool(kept_rows.all()):
            return run(target_token_ids, target_positions, target_hidden_states, next_token_ids, cad)
        device = next_token_ids.device
        drafts = torch.zeros((cad.num_reqs, num_speculative_tokens), dtype=torch.int64, device=device)
        if not kept_rows.any():
            return drafts
        bounds = cad.query_start_loc_cpu.to(torch.long)
        keep = kept_rows.nonzero().squeeze(1)  # rows, and their tokens in the pass
        tokens = torch.repeat_interleave(kept_rows, bounds[1:] - bounds[:-1]).nonzero().squeeze(1)
        lengths = (bounds[1:] - bounds[:-1])[keep]
        starts = torch.zeros(len(keep) + 1, dtype=cad.query_start_loc_cpu.dtype)
        starts[1:] = lengths.cumsum(0)
        per_row = {name: _rows(getattr(cad, name), keep) for name in PER_ROW}
        kept = cad.replace(
            query_start_loc=starts.to(cad.query_start_loc.device),
            query_start_loc_cpu=starts,
            seq_lens=_rows(cad.seq_lens, keep),
            num_reqs=len(keep),
            num_actual_tokens=len(tokens),
            max_query_len=int(lengths.max()),
            block_table_tensor=_rows(cad.block_table_tensor, keep),
            slot_mapping=_rows(cad.slot_mapping, tokens),
            positions=_rows(cad.positions, tokens),
            _num_computed_tokens_cache=None,
            _token_to_req_indices_cache=None,
            **per_row,
        )
        inputs = (_rows(x, tokens) for x in (target_token_ids, target_positions, target_hidden_states))
        drafts[keep.to(device)] = run(*inputs, _rows(next_token_ids, keep), kept)
        return drafts


def _rows(x: Any, keep: torch.Tensor) -> Any:
    """Entries `keep` (indices into the first dimension, on the CPU) of a tensor on any
    device or an array; None or a plain flag (such as `causal`) as it is."""
    if isinstance(x, torch.Tensor):
        return x[keep.to(x.device)]
    return x[keep.numpy()] if isinstance(x, np.ndarray) else x
