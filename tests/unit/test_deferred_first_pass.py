"""The hybrid's deferred first pass (rollout/engines/vllm/first_pass.py): what the draft
model's next pass is given after passes were deferred, on a stand-in for vLLM's model
runner and drafter (named as such: it records what `propose` is called with; the real
one runs in tests/integration/test_lossless.py's hybrid cells and deferral check). The
attention metadata is vLLM's own class. A token's id is 100 + its position, its hidden
state the position, its KV slot 1000 + the position, so every piece can be traced."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from vllm.v1.attention.backend import CommonAttentionMetadata

from specrl.rollout.engines.vllm.first_pass import DeferredFirstPass


class _Drafter:
    """Stand-in for vLLM's EAGLE proposer: records each pass's inputs."""

    needs_extra_input_slots = False
    uses_mrope = False

    def __init__(self, max_num_tokens: int) -> None:
        self.max_num_tokens = max_num_tokens
        self.passes: list[dict] = []

    def propose(self, k, tokens, positions, hidden, next_ids, to_sample, cad, *args, **kwargs):
        self.passes.append({"k": k, "tokens": tokens, "positions": positions, "hidden": hidden, "cad": cad})
        return torch.zeros((cad.num_reqs, k), dtype=torch.int64)


def _runner(capacity: int = 256) -> SimpleNamespace:
    return SimpleNamespace(drafter=_Drafter(capacity), input_batch=None, requests={})


def _pass(runner, rows: dict[str, range], k: int, live: set[str] | None = None) -> None:
    """One call of the drafter's `propose` for `rows` (request -> positions this pass),
    as the runner makes it; `live`: the runner's requests (default: the rows)."""
    runner.input_batch = SimpleNamespace(req_ids=list(rows))
    runner.requests = dict.fromkeys(live if live is not None else rows)
    positions = torch.tensor([p for r in rows.values() for p in r], dtype=torch.long)
    lengths = torch.tensor([len(r) for r in rows.values()])
    starts = torch.zeros(len(rows) + 1, dtype=torch.int32)
    starts[1:] = lengths.cumsum(0)
    cad = CommonAttentionMetadata(
        query_start_loc=starts,
        query_start_loc_cpu=starts.clone(),
        seq_lens=torch.tensor([r.stop for r in rows.values()], dtype=torch.int32),
        num_reqs=len(rows),
        num_actual_tokens=len(positions),
        max_query_len=int(lengths.max()),
        max_seq_len=max(r.stop for r in rows.values()),
        block_table_tensor=torch.zeros((len(rows), 4), dtype=torch.int32),
        slot_mapping=1000 + positions,
    )
    runner.drafter.propose(
        num_speculative_tokens=k,
        target_token_ids=100 + positions,
        target_positions=positions,
        target_hidden_states=positions[:, None].float().repeat(1, 2),
        next_token_ids=torch.zeros(len(rows), dtype=torch.int32),
        token_indices_to_sample=None,
        common_attn_metadata=cad,
        sampling_metadata=None,
        num_rejected_tokens_gpu=None,
    )


def _install(runner) -> tuple[DeferredFirstPass, _Drafter, dict]:
    drafter = runner.drafter
    counts = {"deferred_first_passes": 0, "deferred_tokens_dropped": 0}
    return DeferredFirstPass(runner, counts), drafter, counts


def test_deferred_passes_run_with_the_next_one_each_request_as_one_query():
    runner = _runner()
    deferred, drafter, counts = _install(runner)
    deferred.defer = True
    _pass(runner, {"a": range(10, 13), "b": range(20, 22)}, k=0)
    _pass(runner, {"b": range(22, 24), "a": range(13, 15)}, k=0)  # another order
    assert drafter.passes == [] and counts["deferred_first_passes"] == 2
    deferred.defer = False
    _pass(runner, {"a": range(15, 16), "b": range(24, 26), "c": range(0, 5)}, k=3)  # "c" new
    (ran,) = drafter.passes
    cad = ran["cad"]
    assert ran["positions"].tolist() == [*range(10, 16), *range(20, 26), *range(5)]
    assert ran["tokens"].tolist() == [100 + p for p in ran["positions"].tolist()]
    assert ran["hidden"][:, 0].tolist() == ran["positions"].float().tolist()
    assert cad.slot_mapping.tolist() == [1000 + p for p in ran["positions"].tolist()]
    assert cad.query_start_loc_cpu.tolist() == cad.query_start_loc.tolist() == [0, 6, 12, 17]
    assert (cad.num_actual_tokens, cad.max_query_len, cad.num_reqs) == (17, 6, 3)
    assert cad.seq_lens.tolist() == [16, 26, 5]  # the requests' lengths: unchanged
    assert deferred.caught_up == pytest.approx(9 / 17) and deferred.pending_tokens == 0
    _pass(runner, {"a": range(16, 18)}, k=3)  # nothing deferred: the pass as it came
    assert drafter.passes[-1]["positions"].tolist() == [16, 17] and deferred.caught_up == 0


def test_a_request_whose_deferred_tokens_do_not_lead_up_to_the_pass_drops_them():
    """Recomputed from its prompt (preempted): its cache was rewritten, nothing to catch up."""
    runner = _runner()
    deferred, drafter, counts = _install(runner)
    deferred.defer = True
    _pass(runner, {"a": range(10, 13), "b": range(20, 22)}, k=0)
    deferred.defer = False
    _pass(runner, {"a": range(0, 14), "b": range(22, 23)}, k=3)
    assert drafter.passes[-1]["positions"].tolist() == [*range(14), 20, 21, 22]
    assert counts["deferred_tokens_dropped"] == 3


def test_a_request_out_of_a_pass_keeps_its_tokens_and_an_ended_one_forgets_them():
    runner = _runner()
    deferred, drafter, counts = _install(runner)
    deferred.defer = True
    _pass(runner, {"a": range(10, 13), "b": range(20, 22)}, k=0)
    deferred.defer = False
    _pass(runner, {"b": range(22, 23)}, k=3, live={"a", "b"})  # "a" not scheduled
    assert drafter.passes[-1]["positions"].tolist() == [20, 21, 22]
    _pass(runner, {"a": range(13, 14)}, k=3)
    assert drafter.passes[-1]["positions"].tolist() == [10, 11, 12, 13]
    deferred.defer = True
    _pass(runner, {"a": range(14, 16)}, k=0)
    _pass(runner, {"c": range(0, 4)}, k=0)  # "a" ended
    assert deferred.pending.keys() == {"c"} and deferred.pending_tokens == 4
    assert counts["deferred_tokens_dropped"] == 0  # nothing a live request needed


def test_deferral_stops_at_half_the_buffers_and_a_pass_that_would_outgrow_them_drops():
    runner = _runner(capacity=16)
    deferred, drafter, counts = _install(runner)
    deferred.defer = True
    _pass(runner, {"a": range(10, 14)}, k=0)  # 4 kept
    _pass(runner, {"a": range(14, 18)}, k=0)  # 8 kept: half the buffers
    _pass(runner, {"a": range(18, 20)}, k=0)  # 10: over half, so this one runs, caught up
    assert counts["deferred_first_passes"] == 2
    assert drafter.passes[-1]["positions"].tolist() == list(range(10, 20))
    _pass(runner, {"a": range(20, 24)}, k=0)
    deferred.defer = False
    _pass(runner, {"a": range(24, 25), "b": range(0, 14)}, k=3)  # 4 + 1 + 14 > 16
    assert drafter.passes[-1]["positions"].tolist() == [24, *range(14)]
    assert counts["deferred_tokens_dropped"] == 4


def test_only_the_eagle_pathway_defers():
    eagle = _Drafter(16)
    assert DeferredFirstPass.supported(eagle)
    own_model = _Drafter(16)
    own_model.needs_extra_input_slots = True  # a draft model of its own (draft_model)
    mrope = _Drafter(16)
    mrope.uses_mrope = True
    assert not DeferredFirstPass.supported(own_model) and not DeferredFirstPass.supported(mrope)
    assert not DeferredFirstPass.supported(None)
