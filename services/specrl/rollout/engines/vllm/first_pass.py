"""The EAGLE draft model's first pass, deferred through the hybrid's steps of history's
drafts alone (`speculation.history.hybrid_defer_first_pass`).

In a step where history drafts every request alone, the draft model drafts nothing, yet
vLLM's EAGLE proposer still runs its first pass over the tokens the step verified: that
writes the draft model's KV cache for them (from the target's hidden states), which its
later drafts attend to. That pass is the hybrid's fixed price over history alone: on the
CPU testbed ~2-3 ms of a ~14 ms step at one request, 7-12 ms of ~25 ms at 16. Deferred,
the step keeps what the pass would have read (the tokens, their positions, the target's
hidden states, the KV slots) and the next pass that runs (a step where the draft model
drafts, at most REMEASURE_EVERY steps later, or a first pass that would outgrow the
proposer's buffers) covers them first: per request, the deferred tokens and the step's as
one query, causal, as a chunked prefill is. The KV cache the draft model reads is then
the one it would have had, written later and in fewer, longer forwards; a request that
ends while history drafts for it never pays for it at all.

Lossless either way: the draft model still drafts deterministically from the request's
own earlier tokens. A request whose deferred tokens do not lead up to the step's (it was
preempted and recomputed, which rewrote the cache from its prompt) or that would not fit
the buffers drops them: its draft model then reads stale cache slots there, which costs
acceptance, never correctness; the engine log counts such drops.

Only the EAGLE pathway (the proposer shifts the target's tokens by one and reads their
hidden states: EAGLE, EAGLE-3); a draft model of its own (`draft_model`, extra input
slots) or M-RoPE positions run their first pass every step as before.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any, NamedTuple

import torch

log = logging.getLogger(__name__)


class Deferred(NamedTuple):
    """One step's first-pass inputs of one request: positions start .. start + len."""

    start: int
    tokens: torch.Tensor
    positions: torch.Tensor
    hidden: torch.Tensor
    slots: torch.Tensor


class DeferredFirstPass:
    """Wraps the runner's drafter's `propose`: while `defer` is set (by the hybrid, for a
    step of history's drafts alone) a call with no draft positions keeps its inputs per
    request instead of running; any other call runs over each request's kept inputs and
    its own (module docstring)."""

    def __init__(self, runner: Any, counts: dict[str, int]) -> None:
        self.runner = runner
        self._propose = runner.drafter.propose
        self.capacity = int(runner.drafter.max_num_tokens)
        self.defer = False
        self.pending: dict[str, list[Deferred]] = {}
        self.pending_tokens = 0
        self.caught_up = 0.0  # share of the last pass's tokens that were deferred ones
        # passes deferred, deferred tokens dropped (module docstring): the hybrid's counts
        self.counts = counts
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
        step = (target_token_ids, target_positions, target_hidden_states, cad.slot_mapping)

        def run(tokens: torch.Tensor, positions: torch.Tensor, hidden: torch.Tensor, attn: Any) -> Any:
            return self._propose(
                num_speculative_tokens, tokens, positions, hidden, next_token_ids,
                token_indices_to_sample, attn, *args, **kwargs,
            )  # fmt: skip

        self.caught_up = 0.0
        self._forget(self.pending.keys() - self.runner.requests.keys())
        if token_indices_to_sample is not None or kwargs.get("num_rejected_tokens_gpu") is not None:
            self._forget(set(self.pending))  # a padded batch: the pass as vLLM runs it
            return run(*step[:3], cad)
        req_ids = list(self.runner.input_batch.req_ids[: cad.num_reqs])
        bounds = cad.query_start_loc_cpu.tolist()
        starts = self._starts(target_positions, bounds)
        step_tokens = bounds[-1]
        fits = 2 * (self.pending_tokens + step_tokens) <= self.capacity  # half the buffers
        if self.defer and num_speculative_tokens == 0 and fits:
            for r, req in enumerate(req_ids):
                a, b = bounds[r], bounds[r + 1]
                if a < b:
                    kept = Deferred(starts[r], *(x[a:b].clone() for x in step))
                    self.pending.setdefault(req, []).append(kept)
                    self.pending_tokens += b - a
            self.counts["deferred_first_passes"] += 1
            return torch.empty((len(req_ids), 0), dtype=torch.int64, device=target_token_ids.device)
        rows = []  # per request: its deferred inputs, then its own
        for r, req in enumerate(req_ids):
            a, b = bounds[r], bounds[r + 1]
            rows.append([*self._leading_to(req, starts[r] if a < b else None), tuple(x[a:b] for x in step)])
        lengths = [sum(len(piece[0]) for piece in row) for row in rows]
        total = sum(lengths)
        if total == step_tokens:  # nothing deferred for these requests
            return run(*step[:3], cad)
        if total > self.capacity:  # more than the proposer's buffers hold
            self._drop(total - step_tokens, "they outgrew the draft model's buffers")
            return run(*step[:3], cad)
        pieces = [piece for row in rows for piece in row]
        tokens, positions, hidden, slots = (torch.cat([piece[i] for piece in pieces]) for i in range(4))
        query_start = torch.zeros(len(lengths) + 1, dtype=cad.query_start_loc_cpu.dtype)
        query_start[1:] = torch.tensor(lengths).cumsum(0)
        merged = cad.replace(
            query_start_loc=query_start.to(cad.query_start_loc.device),
            query_start_loc_cpu=query_start,
            num_actual_tokens=total,
            max_query_len=max(lengths),
            slot_mapping=slots,
            positions=None if cad.positions is None else positions,
            _num_computed_tokens_cache=None,
            _token_to_req_indices_cache=None,
        )
        self.caught_up = 1.0 - step_tokens / total
        return run(tokens, positions, hidden, merged)

    def _leading_to(self, req: str, start: int | None) -> list[tuple[torch.Tensor, ...]]:
        """`req`'s deferred inputs, taken, where they lead up to position `start` without a
        gap (None: the request has no tokens in this pass; they stay)."""
        if start is None or req not in self.pending:
            return []
        kept = self.pending.pop(req)
        n = sum(len(d.tokens) for d in kept)
        self.pending_tokens -= n
        ends = [d.start + len(d.tokens) for d in kept]
        if [d.start for d in kept[1:]] + [start] != ends:
            self._drop(n, f"request {req}'s do not lead up to position {start} (recomputed?)")
            return []
        return [(d.tokens, d.positions, d.hidden, d.slots) for d in kept]

    def _forget(self, reqs: set[str]) -> None:
        for req in reqs:
            self.pending_tokens -= sum(len(d.tokens) for d in self.pending.pop(req))

    def _drop(self, n: int, why: str) -> None:
        self.counts["deferred_tokens_dropped"] += n
        log.warning(
            "hybrid: %d deferred first-pass tokens dropped: %s (%d so far)",
            n, why, self.counts["deferred_tokens_dropped"],
        )  # fmt: skip

    @staticmethod
    def _starts(positions: torch.Tensor, bounds: list[int]) -> list[int]:
        """Each request's first position in this pass (0 where it has none)."""
        firsts = torch.tensor([a if a < b else 0 for a, b in itertools.pairwise(bounds)], dtype=torch.long)
        return positions[firsts.to(positions.device)].tolist() if bounds[-1] else [0] * (len(bounds) - 1)
