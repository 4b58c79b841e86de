"""`specrl bench step` turns four runs' step logs into the comparison table: checked on
synthetic step records (the runs themselves take minutes; a crash here would lose them)."""

from __future__ import annotations

import pytest
import yaml

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


def test_a_report_compares_the_runs_it_has_when_the_named_baseline_is_missing(tmp_path):
    """A comparison run that failed leaves no records: the report still compares the
    runs that ran (against the first) instead of failing, and one run gets no table."""
    from specrl.orchestrator.report import SideBySide, write_report

    def run(gen: float) -> list[dict]:
        records = _records(gen=gen, exposed=gen, train=6.0, reward=0.5)
        return [r | {"step": i, "loss": 0.0, "entropy": 1.0} for i, r in enumerate(records)]

    out = write_report(
        {"main": run(2.0), "async": run(4.0), "ar": []}, tmp_path / "r", side_by_side=SideBySide(3, "ar")
    )
    text = out.read_text()
    assert "## Side by side" in text and "ratios to `main`" in text
    table = text[text.index("## Side by side") :].split("\n\n")[2].splitlines()
    header = [c.strip() for c in table[0].split("|")[1:-1]]
    row = next([c.strip() for c in line.split("|")[1:-1]] for line in table if line.startswith("| async |"))
    assert float(row[header.index("gen_speedup_vs_ar")]) == 0.5  # against main: 2.0 / 4.0
    assert out.with_suffix(".png").stat().st_size > 10_000
    single = write_report({"main": run(2.0)}, tmp_path / "s", side_by_side=SideBySide(3, "ar")).read_text()
    assert "## Side by side" not in single


def test_the_benchmarks_job_runs_ar_async_and_hybrid_beside_eagle3(tmp_path):
    """The demo's job (its prompts come back every 2 steps, what history drafts from)."""
    from specrl.bench.step import EXAMPLE, bench_config

    cfg = bench_config(yaml.safe_load(EXAMPLE.read_text()), 8, tmp_path)
    assert cfg.compare.runs == ("ar", "async", "hybrid") and cfg.compare.steps == 8
    assert cfg.rollout.server.speculation.method == "eagle3" and cfg.orchestrator.max_lag == 0
    assert cfg.data.task_prompts == 2 * cfg.data.prompts_per_step
