"""`specrl bench rollout`'s grid and outputs (the benchmark itself runs real servers and
is run by hand; its results are in docs/benchmarks.md)."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from specrl.bench.rollout import _write, variants
from specrl.cli import app


def test_each_speculator_runs_at_every_k_then_adaptive_between_two_ar_runs():
    vs = variants([1, 3], only=["eagle3-domain", "ngram"])
    assert [v.label for v in vs] == [
        "ar",
        "eagle3:eagle3-domain:k1",
        "eagle3:eagle3-domain:k3",
        "eagle3:eagle3-domain:adaptive<=3",
        "ngram:-:k1",
        "ngram:-:k3",
        "ngram:-:adaptive<=3",
        "ar",
    ]
    adaptive = vs[3].config().speculation
    assert adaptive.adaptive.enabled and adaptive.num_speculative_tokens == 3
    assert not vs[2].config().speculation.adaptive.enabled
    assert len(variants([3], adaptive=False)) == 2 + 4


def test_a_paused_variant_starts_at_k0_for_every_batch_size():
    from specrl.bench.rollout import Variant

    v = Variant("eagle3", "eagle3-generic", 3, paused=True)
    spec = v.config().speculation
    assert v.label == "eagle3:eagle3-generic:paused"
    assert spec.k_schedule == ((1, v.config().engine.max_num_seqs, 0),) and not spec.adaptive.enabled


def test_outputs_hold_fixed_and_adaptive_rows(tmp_path):
    def row(method, k, tps, adaptive="", k_at_c=None):
        chosen = k if k_at_c is None else k_at_c
        return {"method": method, "draft": "", "k": k, "adaptive": adaptive, "k_at_c": chosen,
                "concurrency": 1, "tokens_per_s": tps, "acceptance_length": 1.0}  # fmt: skip

    rows = [row("ar", 0, 100.0), row("ngram", 3, 90.0), row("ngram", 3, 99.0, "learning", 0),
            row("ngram", 3, 101.0, "learned", 0)]  # fmt: skip
    out = tmp_path / "rollout.json"
    _write(out, rows, [1], {})
    saved = json.loads(out.read_text())["rows"]
    assert [r["speedup_vs_ar"] for r in saved] == [1.0, 0.9, 0.99, 1.01]
    assert out.with_suffix(".png").stat().st_size > 0
    assert "learned" in out.with_suffix(".md").read_text()


def test_unknown_speculator_is_refused():
    result = CliRunner().invoke(app, ["bench", "rollout", "--only", "eagle3-domain,medusa"])
    assert result.exit_code == 2 and "medusa" in result.output


def test_draft_table_puts_the_adaptive_controller_beside_the_fixed_ks():
    from specrl.bench.draft import paper_table

    def row(draft, k, speedup, adaptive="", k_at_c=None, task="rl-zero"):
        return {"task": task, "init": "eagle3-domain", "draft": draft, "method": "eagle3", "k": k,
                "adaptive": adaptive, "k_at_c": k if k_at_c is None else k_at_c, "concurrency": 1,
                "speedup_vs_ar": speedup, "acceptance_length": 3.0}  # fmt: skip

    rows = [row("frozen", 3, 1.8), row("frozen", 7, 2.2), row("frozen", 7, 2.0, "learning", 7),
            row("frozen", 7, 2.25, "learned", 6), row("frozen", 3, 1.1, task="rl-think")]  # fmt: skip
    table = paper_table(rows, "rl-zero", [3, 7], 1).splitlines()
    assert table[0] == "| draft | k=3 | k=7 | adaptive (k<=7) |"
    assert table[2] == "| domain init, frozen | 1.80x (AL 3.00) | 2.20x (AL 3.00) | 2.25x (AL 3.00, k=6) |"
    think = paper_table(rows, "rl-think", [3, 7], 1).splitlines()
    assert think[2] == "| domain init, frozen | 1.10x (AL 3.00) |  |  |"


def test_unknown_draft_bench_task_is_refused():
    result = CliRunner().invoke(app, ["bench", "draft", "--tasks", "rl-zero,rl-hard"])
    assert result.exit_code == 2 and "rl-hard" in result.output


def test_adaptive_bench_measures_every_server_after_every_other_equally_often():
    from collections import Counter
    from itertools import pairwise

    from specrl.bench.adaptive import balanced_orders

    for n in range(1, 8):
        orders = balanced_orders(n)
        assert len(orders) == (n if n % 2 == 0 else 2 * n)
        assert all(sorted(order) == list(range(n)) for order in orders)
        follows = Counter(pair for order in orders for pair in pairwise(order))
        assert len(follows) == n * (n - 1) and len(set(follows.values())) <= 1, (n, follows)
    result = CliRunner().invoke(app, ["bench", "adaptive", "--only", "medusa"])
    assert result.exit_code == 2 and "medusa" in result.output


def test_adaptive_bench_pairs_each_round_with_ar_and_the_best_fixed_k():
    import math

    from specrl.bench.adaptive import paired_ratio, table_rows
    from specrl.bench.rollout import Variant

    # two rounds with ratios 1 and 2: geometric mean sqrt(2), t(0.975, 1) = 12.706 on the
    # log ratios' standard error ln2 / 2
    ratio, lo, hi = paired_ratio([1.0, 4.0], [1.0, 2.0])
    half = 12.7062 * math.log(2) / 2
    assert ratio == pytest.approx(math.sqrt(2))
    want = (math.sqrt(2) * math.exp(-half), math.sqrt(2) * math.exp(half))
    assert (lo, hi) == pytest.approx(want, rel=1e-4)
    with pytest.raises(ValueError, match="paired"):
        paired_ratio([1.0, 2.0], [1.0])

    variants = [
        Variant("none", "", 0),
        Variant("eagle3", "d", 1),
        Variant("eagle3", "d", 3),
        Variant("eagle3", "d", 3, adaptive=True),
    ]
    # the machine drifts 2x between rounds: medians alone would see AR vary 100-200
    rates = {
        (0, 4): [100.0, 200.0, 100.0],
        (1, 4): [110.0, 220.0, 110.0],
        (2, 4): [150.0, 300.0, 150.0],
        (3, 4): [100.0, 210.0, 95.0],
    }
    rows = table_rows(variants, rates, [4], "d", {(3, 4): 2})
    by = {r["variant"]: r for r in rows}
    assert "paired_vs_ar" not in by["ar"]
    assert by["k=3"]["paired_vs_ar"] == pytest.approx(1.5) and by["k=3"]["vs_ar"].startswith("faster")
    adaptive = by["adaptive"]
    assert adaptive["k_at_c"] == 2 and adaptive["best_k"] == 3
    assert adaptive["vs_ar"].startswith("not resolved")  # rounds at 1.0, 1.05, 0.95x AR
    assert adaptive["vs_best_k"].startswith("slower")  # 0.63-0.70x k=3 in every round
    geo = (100 * 210 * 95 / (150 * 300 * 150)) ** (1 / 3)
    assert adaptive["paired_vs_best_k"] == pytest.approx(geo, rel=1e-3)


def test_measurements_wait_for_the_cpu_to_go_quiet():
    import subprocess
    import sys
    import time

    from specrl.bench.rollout import wait_for_quiet_cpu

    busy = "import time\nt = time.time()\nwhile time.time() - t < 1.5: pass"
    procs = [subprocess.Popen([sys.executable, "-c", busy]) for _ in range(2)]
    try:
        time.sleep(0.3)  # the loops are spinning
        waited = wait_for_quiet_cpu(timeout=3.0)
    finally:
        for p in procs:
            p.wait()
    # at least until the loops ended (~1.2 s more), at most the timeout (a machine busy
    # with something else besides keeps it waiting that long)
    assert 0.8 <= waited < 3.6, waited
    assert wait_for_quiet_cpu(busy_percent=100.1, timeout=5.0) < 0.5  # nothing counts as busy
