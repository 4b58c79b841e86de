"""`specrl bench history` and `bench staleness` turn each version's measurements into
rows (bench/epochs.py): checked on synthetic closed-loop results (the benchmarks take an
hour; a crash here would lose them)."""

from __future__ import annotations

import json
import statistics

import pytest
from rich.console import Console

from specrl.bench import epochs, history, staleness
from specrl.bench.epochs import (
    HYBRID_COUNTS,
    block_rounds,
    paired_rows,
    pool_size,
    prompt_sets,
    requests_per_level,
)
from specrl.bench.tasks import TASKS


def _result(tokens_per_s: float, accepted: int = 0, drafts: int = 0) -> dict:
    return {
        "tokens": int(tokens_per_s * 10),
        "seconds": 10.0,
        "drafts": drafts,
        "accepted": accepted,
        "busy_start": False,
    }


def test_each_cell_is_paired_with_ar_and_history_with_eagle3_and_the_hybrid_with_both():
    # two rounds; AR 100 then 200 tok/s (a drifting machine), every other cell 1.5x, 2x
    # and 3x AR in the same rounds: the paired ratios are exact despite the drift
    cells = history.cells(TASKS["rl-zero"])
    factor = {"ar": 1.0, "eagle3": 1.5, "history": 2.0, "hybrid": 3.0}
    done = {
        (i, 4): [_result(base * factor[c.name], accepted=6, drafts=4) for base in (100.0, 200.0)]
        for i, c in enumerate(cells)
    }
    hybrid = [i for i, c in enumerate(cells) if c.hybrid]
    assert [cells[i].name for i in hybrid] == ["hybrid"]
    for n, r in enumerate(done[hybrid[0], 4]):  # the server's counters over each round
        r["hybrid"] = dict(zip(HYBRID_COUNTS, (10 * n + 30, 10, 5 + n, 2, 20 + n, 3 * n, n + 2)))
    rows = {r["name"]: r for r in paired_rows(cells, done, [4], versus=("eagle3", "history"))}
    summed = {
        "history_rows": 70,
        "model_rows": 20,
        "first_pass_only_steps": 11,
        "long_draft_steps": 4,
        "left_out_rows": 41,
        "padded_steps": 3,
        "extended_rows": 5,
    }
    assert {f: rows["hybrid"][f] for f in HYBRID_COUNTS} == summed
    assert "history_rows" not in rows["history"]
    assert rows["hybrid"]["speedup_vs_ar"] == pytest.approx(3.0)
    assert rows["hybrid"]["speedup_vs_eagle3"] == pytest.approx(2.0)
    assert rows["hybrid"]["speedup_vs_history"] == pytest.approx(1.5)
    assert rows["history"]["speedup_vs_eagle3"] == pytest.approx(4 / 3, abs=1e-3)
    assert "speedup_vs_history" not in rows["history"]  # not paired with itself
    assert "speedup_vs_eagle3" not in rows["eagle3"] and rows["ar"]["vs_ar"] == ""
    assert rows["hybrid"]["ci_low"] == pytest.approx(3.0) == rows["hybrid"]["ci_high"]  # no spread
    assert rows["eagle3"]["acceptance_length"] == 2.5 and rows["eagle3"]["rounds"] == 2


def test_every_round_and_level_has_prompts_of_its_own_and_the_staleness_cells_their_carry():
    levels = [1, 4, 16, 64]
    assert [requests_per_level(c) for c in levels] == [4, 4, 8, 32]  # 1 group of 1 or 4 per thread
    pool = [f"p{i}" for i in range(pool_size(levels, rounds=2))]
    sets = prompt_sets(pool, levels, rounds=2)
    assert sorted(p for ps in sets.values() for p in ps) == sorted(pool)  # each once
    carry = {c.name: c.carry for c in staleness.cells("zoo:eagle3-domain", "/adapted")}
    assert carry == {
        "ar": "",
        "eagle3-frozen": "",
        "eagle3-adapted": "",
        "history-frozen": "first",
        "history-renewed": "last",
    }


def test_the_eagle3_and_hybrid_cells_use_the_head_asked_for():
    for head in ("domain", "generic"):
        drafts = {c.name: c.draft for c in history.cells(TASKS["rl-think"], head)}
        assert drafts["eagle3"] == drafts["hybrid"] == f"zoo:think/eagle3-{head}"


def test_history_drafts_past_the_heads_k_alone_and_in_the_hybrid():
    from specrl.bench.draft import bench_server

    cells = {c.name: c for c in history.cells(TASKS["rl-zero"], history_draft=8)}
    assert cells["history"].k == 8 and cells["eagle3"].k is None and cells["hybrid"].k is None
    hybrid = cells["hybrid"]
    spec = bench_server("zoo:target", hybrid.method, hybrid.draft, 3, False, hybrid.history).speculation
    assert spec.k == 3 and spec.engine_k == 8  # the head drafts 3, history up to 8


def test_history_tree_settings_reach_history_alone_and_the_hybrid_and_are_checked():
    import typer

    from specrl.bench.draft import bench_server
    from specrl.cli import _history_tree

    tree = _history_tree("max_depth=32,max_spec_factor=2")
    assert tree == {"max_depth": 32, "max_spec_factor": 2.0}
    cells = {c.name: c for c in history.cells(TASKS["rl-zero"], history_draft=16, tree=tree)}
    for name in ("history", "hybrid"):
        cell = cells[name]
        spec = bench_server("zoo:target", cell.method, cell.draft, 3, False, cell.history).speculation
        assert (spec.history.max_depth, spec.history.max_spec_factor) == (32, 2.0), name
    assert cells["hybrid"].history["hybrid"] and cells["hybrid"].history["hybrid_max_draft"] == 16
    refused = {
        "depth=3": "depth not an index setting",
        "hybrid=true": "hybrid not an index setting",
        "max_depth=x": "valid integer",
        "min_match=20": "min_match must be < max_depth",
    }
    for bad, says in refused.items():
        with pytest.raises(typer.BadParameter, match=says):
            _history_tree(bad)


def test_a_continued_rl_run_draws_training_batches_of_its_own(tmp_path):
    from specrl.bench.draft import rl_run_config

    seeds = {
        rl_run_config(TASKS["rl-zero"], "eagle3-domain", 4, tmp_path, data_seed=s).data.seed
        for s in (0, 1, 2)
    }
    assert seeds == {0, 1, 2}


def test_policy_drift_is_the_relative_distance_of_the_weights(tmp_path):
    import torch
    from safetensors.torch import save_file

    for name, scale in (("a", 1.0), ("b", 1.1)):
        (tmp_path / name).mkdir()
        weights = {"w": torch.full((4,), 3.0 * scale), "v": torch.full((2,), 4.0 * scale)}
        save_file(weights, str(tmp_path / name / "model.safetensors"))
    assert staleness.policy_drift(str(tmp_path / "a"), str(tmp_path / "b")) == pytest.approx(0.1)
    assert staleness.policy_drift(str(tmp_path / "a"), str(tmp_path / "a")) == 0.0
    (tmp_path / "c").mkdir()
    save_file({"other": torch.ones(2)}, str(tmp_path / "c" / "model.safetensors"))
    with pytest.raises(ValueError, match="share no weight names"):
        staleness.policy_drift(str(tmp_path / "a"), str(tmp_path / "c"))


def test_a_servers_offset_shared_by_its_blocks_rounds_is_not_averaged_out():
    """Three blocks of servers, each keeping its own offset over its rounds: per round the
    ratio looks resolved, over the blocks it is not; the estimate is the blocks' mean."""
    import math

    from specrl.bench.adaptive import paired_ratio

    got = [1.20, 1.21, 1.19, 1.01, 1.02, 1.00, 1.10, 1.11, 1.09]
    base = [1.0] * len(got)
    blocks = [0, 0, 0, 1, 1, 1, 2, 2, 2]
    _, lo_rounds, _ = paired_ratio(got, base)
    assert lo_rounds > 1  # read per round: faster
    ratio, lo, hi = paired_ratio(got, base, blocks)
    means = [statistics.fmean(math.log(x) for x in got[b * 3 : b * 3 + 3]) for b in range(3)]
    assert ratio == pytest.approx(math.exp(statistics.fmean(means)))
    assert lo < 1 < hi  # over the blocks: not resolved
    assert paired_ratio(got, base, [0] * len(got)) == paired_ratio(got, base)  # one block: per round
    with pytest.raises(ValueError, match="paired"):
        paired_ratio(got, base, blocks[:-1])


def test_rounds_split_into_blocks_of_consecutive_rounds():
    assert block_rounds(15, 4) == [[1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert block_rounds(3, 1) == [[1, 2, 3]]
    for bad in (0, 4):
        with pytest.raises(ValueError, match="--blocks"):
            block_rounds(3, bad)


class StandIns:
    """Stand-ins for the rollout servers, the closed-loop client and the weight sender (the
    benchmark's real ones take minutes per start; pushes into real servers, a hybrid's
    among them, are tests/integration/test_weightsync.py's): what was started, measured
    and pushed, in order."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.started: list[StandIns.Server] = []
        self.calls: list[tuple[str, tuple[str, ...], object]] = []  # address, prompts, carried
        self.events: list[tuple] = []  # ("round", address, prompts) and ("push", version, policy, members)
        stand_ins = self

        class Server:
            def __init__(self, cfg) -> None:
                self.address = f"server-{len(stand_ins.started)}"
                stand_ins.started.append(self)
                self.stopped = False

            def stop(self) -> None:
                self.stopped = True

        class Sender:
            def __init__(self, cfg) -> None:
                self.members: list[str] = []

            def add_replica(self, address: str) -> bool:
                self.members.append(address)
                return False

            def close(self) -> None:
                self.members = []

        def closed_loop(address, prompts, threads, max_tokens, n, history=None):
            stand_ins.calls.append((address, tuple(prompts), history))
            stand_ins.events.append(("round", address, tuple(prompts)))
            return _result(100.0 + len(stand_ins.calls)) | {"responses": {p: [[1]] for p in prompts}}

        def push_policy(sender, version, policy):
            stand_ins.events.append(("push", version, policy, tuple(sender.members)))
            return 0.1

        self.Server = Server
        monkeypatch.setattr(epochs, "ServiceProcess", Server)
        monkeypatch.setattr(epochs, "start_all", lambda procs: None)
        monkeypatch.setattr(epochs, "closed_loop", closed_loop)
        monkeypatch.setattr(epochs, "bench_server", lambda *args: object())
        monkeypatch.setattr(epochs, "WeightSender", Sender)
        monkeypatch.setattr(epochs, "push_policy", push_policy)
        monkeypatch.setattr(epochs, "_hybrid_counts", lambda address: dict.fromkeys(HYBRID_COUNTS, 0))


def test_each_block_measures_on_servers_started_afresh_after_a_warm_up_round(monkeypatch):
    """Every round of a block runs on that block's servers, each block starts its own
    after a warm-up round, and the rows' intervals are the blocks' (stand-in servers)."""
    stand_ins = StandIns(monkeypatch)
    started, calls = stand_ins.started, stand_ins.calls
    cells = [epochs.Cell("ar", "none"), epochs.Cell("eagle3", "eagle3", "zoo:eagle3-domain")]
    prompts = prompt_sets([f"p{i}" for i in range(pool_size([4], 4))], [4], rounds=4)
    done, written = epochs.measure("zoo:target", 3, cells, prompts, [4], 4, {}, 8, Console(), blocks=2)
    assert len(started) == 4 and all(s.stopped for s in started)  # 2 cells x 2 blocks
    # per block: the warm-up round (round 0's prompts) then its counted rounds, on its servers
    round_of = {tuple(ps): r for (r, _), ps in prompts.items()}
    for block, servers in enumerate((started[:2], started[2:])):
        for s in servers:
            rounds = [round_of[p] for a, p, _ in calls if a == s.address]
            assert rounds == [0, 1 + 2 * block, 2 + 2 * block]
    assert [r["block"] for r in done[(1, 4)]] == [0, 0, 1, 1]
    assert set(written) == {p for (r, _), ps in prompts.items() for p in ps}
    rows = paired_rows(cells, done, [4])
    assert rows[1]["blocks"] == 2 and rows[1]["rounds"] == 4


def test_kept_servers_start_once_per_block_and_take_each_versions_weights_before_its_rounds(monkeypatch):
    """`--servers kept`: a block's servers are started on the first version's policy and
    measure every version, each later version's weights pushed into all of them before
    that version's warm-up round; no responses are carried (the servers hold them); the
    results come per version (stand-in servers, client and sender)."""
    stand_ins = StandIns(monkeypatch)
    cells = [
        epochs.Cell("ar", "none"),
        epochs.Cell("hybrid", "eagle3", "zoo:eagle3-domain", history={"hybrid": True}, carry="last"),
    ]
    prompts = prompt_sets([f"p{i}" for i in range(pool_size([4], 2))], [4], rounds=2)
    policies = ["zoo:target", "/ckpt/e1", "/ckpt/e2"]
    done = epochs.measure_kept(policies, 3, cells, prompts, [4], 2, 8, Console(), blocks=2)
    assert len(stand_ins.started) == 4 and all(s.stopped for s in stand_ins.started)  # 2 cells x 2 blocks
    round_of = {tuple(ps): r for (r, _), ps in prompts.items()}
    for block, servers in enumerate((stand_ins.started[:2], stand_ins.started[2:])):
        addresses = tuple(s.address for s in servers)
        # this block's events: per version a push (after the first), then warm-up and its round
        seen = [e for e in stand_ins.events if (e[0] == "push" and e[3] == addresses) or e[1] in addresses]
        expected = []
        for version, policy in enumerate(policies):
            if version:
                expected.append(("push", version, policy))
            expected += [("round", 0), ("round", 0), ("round", 1 + block), ("round", 1 + block)]
        assert [e[:3] if e[0] == "push" else ("round", round_of[e[2]]) for e in seen] == expected
    assert all(carried is None for _, _, carried in stand_ins.calls)
    assert len(done) == 3
    for results in done:  # each version: both cells, one counted round per block
        assert [r["block"] for r in results[(1, 4)]] == [0, 1]
    assert paired_rows(cells, done[2], [4])[1]["rounds"] == 2


def test_kept_servers_write_every_versions_rows_after_each_block(monkeypatch, tmp_path):
    """A run on kept servers writes every version's rows after each block of servers (the
    meta saying how many were measured), so one that fails later keeps them; the finished
    run's file has every block's rounds and no `partial` (stand-in servers)."""
    stand_ins = StandIns(monkeypatch)
    out = tmp_path / "kept.json"
    files: list[dict | None] = []  # the file as each block's servers start
    monkeypatch.setattr(epochs, "start_all", lambda procs: files.append(_read(out)))
    monkeypatch.setattr(
        epochs, "task_prompts", lambda tasks, n, console, distinct: [f"p{i}" for i in range(n)]
    )
    cells = [epochs.Cell("ar", "none"), epochs.Cell("eagle3", "eagle3", "zoo:eagle3-domain")]
    epochs.run_over_versions(
        out, lambda task, index, tmp: (index, f"policy-{index}", cells), versions=2,
        keys=("method", "epoch"), columns=("method", "epoch"), meta={}, k=3, concurrency=[4],
        tasks=["rl-zero"], rounds=4, console=Console(), blocks=2, servers="kept",
    )  # fmt: skip
    assert len(stand_ins.started) == 4 and files[0] is None
    partial = files[1]
    assert partial["meta"]["partial"] == "rl-zero: 1 of 2 blocks measured"
    assert [(r["epoch"], r["method"], r["rounds"]) for r in partial["rows"]] == [
        (0, "ar", 2), (0, "eagle3", 2), (1, "ar", 2), (1, "eagle3", 2),
    ]  # fmt: skip
    final = _read(out)
    assert "partial" not in final["meta"] and [r["rounds"] for r in final["rows"]] == [4] * 4


def _read(path) -> dict | None:
    return json.loads(path.read_text()) if path.exists() else None


def test_servers_are_fresh_or_kept(tmp_path):
    with pytest.raises(ValueError, match="fresh, kept"):
        epochs.run_over_versions(
            tmp_path / "x.json", None, versions=1, keys=("method", "epoch"), columns=(), meta={}, k=3,
            concurrency=[4], tasks=["rl-zero"], rounds=1, console=Console(), servers="shared",
        )  # fmt: skip
