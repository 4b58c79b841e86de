"""`specrl bench rollout`'s grid and outputs (the benchmark itself runs real servers and
is run by hand; its results are in docs/benchmarks.md)."""

from __future__ import annotations

import json
from pathlib import Path

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

    def row(draft, k, speedup, adaptive=False, k_at_c=None, task="rl-zero", c=1):
        return {"task": task, "init": "eagle3-domain", "draft": draft, "method": "eagle3", "k": k,
                "adaptive": adaptive, "k_at_c": k if k_at_c is None else k_at_c, "concurrency": c,
                "speedup_vs_ar": speedup, "acceptance_length": 3.0}  # fmt: skip

    rows = [row("frozen", 3, 1.8), row("frozen", 7, 2.2), row("frozen", 7, 2.0, c=4),
            row("frozen", 7, 2.25, True, 6), row("frozen", 3, 1.1, task="rl-think")]  # fmt: skip
    table = paper_table(rows, "rl-zero", [3, 7], 1).splitlines()
    assert table[0] == "| draft | k=3 | k=7 | adaptive (k<=7) |"
    assert table[2] == "| domain init, frozen | 1.80x (AL 3.00) | 2.20x (AL 3.00) | 2.25x (AL 3.00, k=6) |"
    think = paper_table(rows, "rl-think", [3, 7], 1).splitlines()
    assert think[2] == "| domain init, frozen | 1.10x (AL 3.00) |  |  |"


def test_draft_bench_pairs_each_draft_with_the_shared_ar_and_its_own_best_k():
    from specrl.bench.draft import _cells, cell_rows, controller_lines
    from specrl.bench.tasks import TASKS

    cells = _cells(TASKS["rl-zero"], "eagle3-generic", [3, 7], Path("/run/draft"))
    assert [(c[0], c[1], c[3], c[4]) for c in cells] == [
        ("ar", "none", 0, False),
        ("frozen", "eagle3", 3, False), ("frozen", "eagle3", 7, False), ("frozen", "eagle3", 7, True),
        ("adapted", "eagle3", 3, False), ("adapted", "eagle3", 7, False), ("adapted", "eagle3", 7, True),
        ("-", "ngram", 3, False), ("-", "history", 7, False),
    ]  # fmt: skip
    assert cells[1][2] == "zoo:eagle3-generic" and cells[4][2] == "/run/draft"
    assert len(_cells(TASKS["rl-think"], "eagle3-domain", [3], None)) == 3  # held back: no adapted

    def rounds(*rates, al=2.0):  # closed_loop results of 100 tokens, one per counted round
        return [
            {
                "tokens": 100,
                "seconds": 100 / x,
                "drafts": 50,
                "accepted": round(50 * (al - 1)),
                "busy_start": False,
            }
            for x in rates
        ]

    # two rounds, the machine 2x slower in the second; the frozen draft's best is k=3
    # (2x AR), its controller 1.5x AR; the adapted draft's best k=7, its controller at it
    done = {
        (0, 1): rounds(100, 50), (1, 1): rounds(200, 100), (2, 1): rounds(150, 75), (3, 1): rounds(150, 75),
        (4, 1): rounds(110, 55), (5, 1): rounds(300, 150), (6, 1): rounds(300, 150),
        (7, 1): rounds(90, 45, al=1.5), (8, 1): rounds(250, 125, al=4.0),
    }  # fmt: skip
    rows = cell_rows(TASKS["rl-zero"], "eagle3-generic", cells, done, {(3, 1): 3, (6, 1): 7}, [1])
    assert [(r["draft"], r["k"], r["adaptive"]) for r in rows] == [
        ("ar", 0, False),
        ("frozen", 3, False),
        ("frozen", 7, False),
        ("frozen", 7, True),
        ("adapted", 3, False),
        ("adapted", 7, False),
        ("adapted", 7, True),
        ("-", 3, False),
        ("-", 7, False),
    ]
    # AR once, although three groups pair with it
    by = {(r["draft"], r["k"], r["adaptive"]): r for r in rows}
    frozen, adapted = by[("frozen", 7, True)], by[("adapted", 7, True)]
    assert frozen["k_at_c"] == 3 and frozen["best_k"] == 3
    assert frozen["paired_vs_ar"] == pytest.approx(1.5) and frozen["paired_vs_best_k"] == pytest.approx(0.75)
    assert adapted["best_k"] == 7 and adapted["paired_vs_best_k"] == pytest.approx(1.0)
    assert by[("-", 3, False)]["method"] == "ngram" and by[("-", 3, False)]["acceptance_length"] == 1.5
    assert by[("ar", 0, False)]["tokens"] == 200 and by[("ar", 0, False)]["speedup_vs_ar"] == 1.0
    lines = controller_lines(rows, "rl-zero")
    assert len(lines) == 2 and lines[0].startswith("- generic frozen, c=1: adaptive (k=3) 1.50x AR")
    assert "0.75x the best fixed k=3" in lines[0]


def test_unknown_bench_task_is_refused():
    result = CliRunner().invoke(app, ["bench", "draft", "--tasks", "rl-zero,rl-hard"])
    assert result.exit_code == 2 and "rl-hard" in result.output
    result = CliRunner().invoke(app, ["bench", "adaptive", "--task", "rl-hard"])
    assert result.exit_code == 2 and "rl-hard" in result.output


@pytest.mark.parametrize("replicas", ["16,x", "0", ""])
def test_bench_scale_refuses_a_replica_list_it_cannot_run(replicas):
    result = CliRunner().invoke(app, ["bench", "scale", "--replicas", replicas])
    assert result.exit_code == 2 and "--replicas" in result.output


def test_a_task_serves_its_own_target_and_drafts():
    from specrl.bench.rollout import Variant
    from specrl.bench.tasks import TASKS

    think = TASKS["rl-think"]
    v = Variant("eagle3", "eagle3-domain", 7, adaptive=True, zoo=think.zoo)
    cfg = v.config()
    assert cfg.engine.model == "zoo:think/target" and cfg.speculation.draft == "zoo:think/eagle3-domain"
    assert v.label == "eagle3:think/eagle3-domain:adaptive<=7"
    assert Variant("none", "", 0, zoo=think.zoo).config().engine.model == "zoo:think/target"
    assert Variant("eagle3", "eagle3-domain", 3).config().engine.model == "zoo:target"
    assert (TASKS["rl-zero"].prompts(32), think.prompts(32), think.prompts(10)) == (32, 16, 8)


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


@pytest.mark.timed
def test_measurements_wait_for_the_cpu_to_go_quiet():
    import subprocess
    import sys
    import time

    from specrl.bench.rollout import wait_for_quiet_cpu

    busy = "import time\nt = time.time()\nwhile time.time() - t < 1.5: pass"
    procs = [subprocess.Popen([sys.executable, "-c", busy]) for _ in range(2)]
    try:
        time.sleep(0.3)  # the loops are spinning
        waited, quiet = wait_for_quiet_cpu(timeout=3.0)
    finally:
        for p in procs:
            p.wait()
    # at least until the loops ended (~1.2 s more), at most the timeout (a machine busy
    # with something else besides keeps it waiting that long, and says so)
    assert 0.8 <= waited < 3.6, waited
    assert quiet or waited >= 3.0
    waited, quiet = wait_for_quiet_cpu(busy_percent=100.1, timeout=5.0)  # nothing counts as busy
    assert quiet and waited < 0.5
    waited, quiet = wait_for_quiet_cpu(busy_percent=0.0, timeout=0.5)  # never quiet: gives up, says so
    assert not quiet and 0.5 <= waited < 1.0
