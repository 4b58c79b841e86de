"""`specrl bench history` turns an epoch's measurements into rows: checked on synthetic
closed-loop results (the benchmark itself takes an hour; a crash here would lose it)."""

from __future__ import annotations

import pytest

from specrl.bench.history import METHODS, epoch_rows, group, requests_per_level, threads


def _result(tokens_per_s: float, accepted: int = 0, drafts: int = 0) -> dict:
    return {
        "tokens": int(tokens_per_s * 10),
        "seconds": 10.0,
        "drafts": drafts,
        "accepted": accepted,
        "busy_start": False,
    }


def test_each_method_is_paired_with_ar_and_history_with_eagle3_alone():
    # two rounds; AR 100 then 200 tok/s (a drifting machine), every other method 1.5x,
    # 2x and 3x AR in the same rounds: the paired ratios are exact despite the drift
    factor = {"ar": 1.0, "eagle3": 1.5, "history": 2.0, "hybrid": 3.0}
    done = {
        (i, 4): [_result(base * factor[m], accepted=6, drafts=4) for base in (100.0, 200.0)]
        for i, m in enumerate(METHODS)
    }
    rows = {r["method"]: r for r in epoch_rows("rl-zero", 1, done, [4])}
    assert rows["hybrid"]["speedup_vs_ar"] == pytest.approx(3.0)
    assert rows["hybrid"]["speedup_vs_eagle3"] == pytest.approx(2.0)
    assert rows["history"]["speedup_vs_eagle3"] == pytest.approx(4 / 3, abs=1e-3)
    assert "speedup_vs_eagle3" not in rows["eagle3"] and rows["ar"]["vs_ar"] == ""
    assert rows["hybrid"]["ci_low"] == pytest.approx(3.0) == rows["hybrid"]["ci_high"]  # no spread
    assert rows["eagle3"]["acceptance_length"] == 2.5 and rows["eagle3"]["rounds"] == 2
    assert {r["epoch"] for r in rows.values()} == {1}


def test_concurrency_counts_sequences_of_groups():
    assert [(group(c), threads(c), requests_per_level(c)) for c in (1, 4, 16, 64)] == [
        (1, 1, 4),
        (4, 1, 4),
        (4, 4, 8),
        (4, 16, 32),
    ]
