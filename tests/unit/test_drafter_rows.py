"""The hybrid's draft model over some rows only (rollout/engines/vllm/drafter_rows.py):
what vLLM's EAGLE proposer is given when requests are left out, on a stand-in for the
model runner and its drafter (named as such: it records what `propose` is called with;
the real one runs in tests/integration/test_lossless.py's hybrid cells). The attention
metadata is vLLM's own class. A token's id is 100 + its position, its hidden state the
position, its KV slot 1000 + the position, a request's block table row and sequence
length its own, so every piece can be traced."""

from __future__ import annotations

from types import SimpleNamespace

import torch
from vllm.v1.attention.backend import CommonAttentionMetadata

from specrl.rollout.engines.vllm.drafter_rows import DrafterRows


class _Drafter:
    """Stand-in for vLLM's EAGLE proposer: records each pass's inputs and drafts
    10 * (the row's next token) + the position, per row."""

    needs_extra_input_slots = False
    uses_mrope = False

    def __init__(self) -> None:
        self.passes: list[dict] = []

    def propose(self, k, tokens, positions, hidden, next_ids, to_sample, cad, *args, **kwargs):
        self.passes.append(
            {"tokens": tokens, "positions": positions, "hidden": hidden, "next": next_ids, "cad": cad}
        )
        return (10 * next_ids[:, None] + torch.arange(k)).to(torch.int64)


def _pass(runner, rows: dict[str, range], k: int) -> torch.Tensor:
    """One call of the drafter's `propose` for `rows` (request -> positions this pass),
    as the runner makes it: request r's next token is r's index + 1."""
    runner.input_batch = SimpleNamespace(req_ids=list(rows))
    positions = torch.tensor([p for r in rows.values() for p in r], dtype=torch.long)
    lengths = torch.tensor([len(r) for r in rows.values()])
    starts = torch.zeros(len(rows) + 1, dtype=torch.int32)
    starts[1:] = lengths.cumsum(0)
    n = len(rows)
    cad = CommonAttentionMetadata(
        query_start_loc=starts,
        query_start_loc_cpu=starts.clone(),
        seq_lens=torch.tensor([r.stop for r in rows.values()], dtype=torch.int32),
        num_reqs=n,
        num_actual_tokens=len(positions),
        max_query_len=int(lengths.max()),
        max_seq_len=max(r.stop for r in rows.values()),
        block_table_tensor=torch.arange(n, dtype=torch.int32)[:, None].repeat(1, 4),
        slot_mapping=1000 + positions,
        is_prefilling=torch.tensor([r.start == 0 for r in rows.values()]),
    )
    return runner.drafter.propose(
        num_speculative_tokens=k,
        target_token_ids=100 + positions,
        target_positions=positions,
        target_hidden_states=positions[:, None].float().repeat(1, 2),
        next_token_ids=torch.arange(1, n + 1, dtype=torch.int32),
        token_indices_to_sample=None,
        common_attn_metadata=cad,
        sampling_metadata=None,
        num_rejected_tokens_gpu=None,
    )


def _install() -> tuple[SimpleNamespace, DrafterRows, _Drafter]:
    runner = SimpleNamespace(drafter=_Drafter(), input_batch=None)
    drafter = runner.drafter
    return runner, DrafterRows(runner), drafter


def test_rows_left_out_are_cut_from_the_pass_and_come_back_empty_in_the_batchs_order():
    runner, rows, drafter = _install()
    rows.left_out = {"b", "zzz"}  # "zzz" not in the batch
    drafts = _pass(runner, {"a": range(10, 13), "b": range(20, 22), "c": range(0, 2)}, k=3)
    (ran,) = drafter.passes
    cad = ran["cad"]
    assert ran["positions"].tolist() == [10, 11, 12, 0, 1]
    assert ran["tokens"].tolist() == [100 + p for p in ran["positions"].tolist()]
    assert ran["hidden"][:, 0].tolist() == ran["positions"].float().tolist()
    assert cad.slot_mapping.tolist() == [1000 + p for p in ran["positions"].tolist()]
    assert cad.query_start_loc_cpu.tolist() == cad.query_start_loc.tolist() == [0, 3, 5]
    assert (cad.num_reqs, cad.num_actual_tokens, cad.max_query_len) == (2, 5, 3)
    assert cad.seq_lens.tolist() == [13, 2] and cad.block_table_tensor[:, 0].tolist() == [0, 2]
    assert cad.is_prefilling.tolist() == [False, True] and ran["next"].tolist() == [1, 3]
    assert drafts.tolist() == [[10, 11, 12], [0, 0, 0], [30, 31, 32]]


def test_no_row_left_out_runs_the_pass_as_it_came_and_every_row_left_out_runs_none():
    runner, rows, drafter = _install()
    drafts = _pass(runner, {"a": range(10, 12), "b": range(20, 21)}, k=2)
    assert drafter.passes[-1]["cad"].num_reqs == 2 and drafts.tolist() == [[10, 11], [20, 21]]
    rows.left_out = {"a", "b"}
    drafts = _pass(runner, {"a": range(12, 13), "b": range(21, 22)}, k=2)
    assert len(drafter.passes) == 1 and drafts.tolist() == [[0, 0], [0, 0]]
    rows.left_out = {"a"}
    assert _pass(runner, {"a": range(13, 14), "b": range(22, 23)}, k=0).shape == (2, 0)  # a first pass
    assert drafter.passes[-1]["positions"].tolist() == [22]


def test_only_the_eagle_pathway_leaves_rows_out():
    own_model = _Drafter()
    own_model.needs_extra_input_slots = True  # a draft model of its own (draft_model)
    mrope = _Drafter()
    mrope.uses_mrope = True
    assert DrafterRows.supported(_Drafter())
    assert not DrafterRows.supported(own_model) and not DrafterRows.supported(mrope)
    assert not DrafterRows.supported(None)
