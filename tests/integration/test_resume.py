"""Fault tests of `specrl run` with every service a real process. One asynchronous run
(lag 1, a checkpoint every 2 versions) is hit by three faults in turn: its trainer killed
(while the run is paused at a step boundary through its control API, so the fault
strikes before the next version is saved, whatever the machine's speed), its Redis
(restarted from the append-only file) and `specrl run` itself killed by SIGKILL (which
must take every service it started with it), each followed by `specrl run --resume`. (A
rollout server killed is started again by the run on its address and caught up, the run
going on by itself: tests/integration/test_ray_launcher.py kills one mid-run, the same
System.check_alive with the Ray launcher's services.)

Checked from the run's own step log after every stop: the steps the checkpoint holds
stay as they were, a step lost with the trainer (the run may notice a dead Redis only
after its next checkpoint, then nothing is lost) is trained again on the very groups it
had; and at the end every step appears once, no prompt group is trained on twice and
none is lost (each admitted prompt trained on exactly once, under its own id or the id
it was generated again under)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import yaml

from specrl.trainer import checkpoint

from helpers import SpecrlRun, run_steps, tiny_run_config, wait_for_steps

pytestmark = [pytest.mark.vllm, pytest.mark.zoo, pytest.mark.timeout(1500)]

STEPS, PROMPTS, N = 8, 4, 4


def _config(tmp_path: Path, **orchestrator) -> Path:
    cfg = tiny_run_config(tmp_path, steps=STEPS, checkpoint_every=2, **orchestrator)
    cfg["name"] = "r"
    cfg["data"]["prompts_per_step"] = PROMPTS
    cfg["sampling"]["n"] = N
    cfg["rollout"]["replicas"] = 1
    cfg["orchestrator"]["status_port"] = 0  # the control API: pause before the trainer's fault
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _children(pid: int) -> dict[int, str]:
    """Live direct children of `pid` with their command lines."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text().rsplit(")", 1)[1].split()
            if int(stat[1]) == pid and stat[0] != "Z":
                out[int(d.name)] = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (FileNotFoundError, ProcessLookupError):
            continue
    return out


def _alive(pid: int) -> bool:
    try:
        return (Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]) != "Z"
    except FileNotFoundError:
        return False


def _kill(run: SpecrlRun, victim: str) -> None:
    """SIGKILL `victim` ("run" or the child whose command line names it); the run must
    end: by its own error for a service, with every child for the run itself."""
    children = _children(run.proc.pid)
    if victim == "run":
        run.proc.send_signal(signal.SIGKILL)
        run.wait(timeout=30)
        deadline = time.monotonic() + 40
        while any(_alive(p) for p in children) and time.monotonic() < deadline:
            time.sleep(0.2)
        survivors = {p: c for p, c in children.items() if _alive(p)}
        assert not survivors, f"outlived the killed run: {survivors}"
        return
    (pid,) = [p for p, c in children.items() if victim in c]
    if victim == "serve trainer":
        # between steps: the version the last step made is saved only as the next starts
        # (a checkpoint never holds a step the log lacks), so this fault costs a step
        run.pause()
    os.killpg(pid, signal.SIGKILL)
    code = run.wait(timeout=300)
    out = run.output()
    assert code == 75 and run.says("specrl run --resume"), out  # EX_TEMPFAIL: a retry may succeed


# (steps logged when the fault strikes, what is killed)
FAULTS = [(3, "serve trainer"), (5, "redis-server"), (7, "run")]


def test_a_run_resumes_after_each_process_is_killed_with_nothing_lost_or_trained_twice(
    zoo, servers, tmp_path
):
    servers.close()  # two cores: no other engine while these run
    config = _config(tmp_path, max_lag=1)
    run_dir = tmp_path / "r"
    previous: tuple[list[dict], int] | None = None  # the killed run's log, its checkpoint
    run: SpecrlRun | None = None
    for logged, victim in [*FAULTS, (STEPS, None)]:
        if run is None:
            run = SpecrlRun(config, *(["--resume"] if previous else []))
            if previous:
                run.wait_resumed()
        wait_for_steps(run, run_dir, logged)
        if victim is None:
            assert run.wait(timeout=600) == 0, run.output()
        else:
            _kill(run, victim)
        log = run_steps(run_dir)
        if previous is not None:
            killed, version = previous
            assert run.says(f"resumed at version {version}"), run.output()
            assert log[:version] == killed[:version], "a step the checkpoint holds changed"
            if len(killed) > version:
                assert sorted(log[version]["group_ids"]) == sorted(killed[version]["group_ids"])
        meta = json.loads((checkpoint.find(run_dir / "checkpoint") / "meta.json").read_text())
        previous = (log, meta["step"])
        if victim == "serve trainer":  # killed while paused before a save: its loss is certain
            assert len(log) >= logged and len(log) > meta["step"], "the trainer's fault must cost a step"
        run = None

    final = run_steps(run_dir)
    assert [r["step"] for r in final] == list(range(STEPS)), "every step once"
    groups = [g for r in final for g in r["group_ids"]]
    assert len(groups) == len(set(groups)) == STEPS * PROMPTS, "a group trained on twice"
    admitted = sorted(g.split(".")[0] for g in groups)
    assert admitted == sorted(f"{b}-{i}" for b in range(STEPS) for i in range(PROMPTS)), "a prompt lost"
    assert all(r["duplicate_samples"] == 0 and r["lag"]["max"] <= 1 for r in final)
    assert json.loads((run_dir / "summary.json").read_text())["steps"] == STEPS
