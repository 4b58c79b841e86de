"""A replica's generation slots from the capacity it reports, and a group's wait in the
queue from its stream entry's id (orchestrator/generation.py)."""

from __future__ import annotations

import pytest

from specrl.config import OrchestratorConfig
from specrl.orchestrator.generation import FALLBACK_SLOTS, queue_wait_s, slots_for


@pytest.mark.parametrize(
    ("max_num_seqs", "n", "slots"),
    [
        (128, 8, 20),  # 16 groups fill the batch; a quarter more wait in the engine's queue
        (64, 4, 20),
        (8, 4, 3),  # ceil(2.5)
        (256, 16, 20),
        (256, 1, 320),
        (4, 16, 1),  # a group larger than the batch: one at a time
        (1, 1, 2),
    ],
)
def test_slots_are_a_quarter_more_groups_than_the_engine_batches(max_num_seqs, n, slots):
    assert slots_for(max_num_seqs, n) == slots


def test_a_capacity_not_reported_gets_the_fallback():
    assert slots_for(0, 4) == FALLBACK_SLOTS == 16


def test_concurrency_is_derived_unless_set():
    assert OrchestratorConfig().concurrency is None
    assert OrchestratorConfig(concurrency=8).concurrency == 8
    with pytest.raises(ValueError):
        OrchestratorConfig(concurrency=0)


def test_the_wait_counts_from_the_ms_in_the_entry_id():
    assert queue_wait_s("1700000000123-0", 1700000002.623) == pytest.approx(2.5)
    assert queue_wait_s("1700000000123-7", 1700000000.0) == 0.0  # clocks apart: never negative
    assert queue_wait_s("not-an-id", 1.0) is None
