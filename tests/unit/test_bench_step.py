"""`specrl bench step` turns three runs' step logs into the comparison table: checked on
synthetic step records (the runs themselves take minutes; a crash here would lose them)."""

from __future__ import annotations

import pytest

from specrl.bench.step import TABLE_COLUMNS, compare
from specrl.orchestrator.report import BREAKDOWN


def _records(gen: float, exposed: float, train: float, reward: float, steps: int = 4) -> list[dict]:
    t = dict.fromkeys(BREAKDOWN, 0.0) | {"exposed_generation": exposed, "train": train, "other": 0.01}
    t |= {"gen": gen, "step": sum(t[k] for k in BREAKDOWN)}
    return [
        {
            "time": t,
            "mismatch_max_abs": 1e-5,
            "reward_mean": reward,
            "samples": 100,
            "acceptance_length": 3.0,
            "lag": {"max": 0},
        }
        for _ in range(steps)
    ]


def test_compare_gives_ratios_to_ar_and_async_exposure():
    rows = compare(
        {
            "ar": _records(gen=4.0, exposed=4.0, train=6.0, reward=0.5),
            "eagle3": _records(gen=2.0, exposed=2.0, train=6.0, reward=0.5),
            "eagle3-async": _records(gen=2.0, exposed=0.1, train=6.0, reward=0.9),
        }
    )
    by = {r["config"]: r for r in rows}
    assert by["eagle3"]["gen_speedup_vs_ar"] == pytest.approx(2.0)
    assert by["eagle3"]["step_speedup_vs_ar"] == pytest.approx(10.01 / 8.01, abs=1e-3)
    assert by["eagle3-async"]["exposed_gen_vs_sync_gen"] == pytest.approx(0.05)
    assert by["eagle3"]["reward_p_vs_ar"] == 1.0 and by["eagle3-async"]["reward_p_vs_ar"] < 1e-6
    for r in rows:
        assert set(TABLE_COLUMNS) <= set(r), set(TABLE_COLUMNS) - set(r)
