"""In-cluster resume, run for real without a cluster: the chart's CPU deployment (its
rendered configs, as in test_chart_services) with the services as processes that keep
running, as pods do, and the orchestrator Job's pod failing and being retried with the
Job's own args (`specrl run --config ... --continue`), the way Kubernetes retries it.

Two faults in one asynchronous run (lag 1, a checkpoint every 2 versions):
- the orchestrator SIGKILLed: the trainer holds later steps than the last checkpoint and
  the replica serves a newer policy; the retry brings both back to the checkpoint (the
  trainer loads it, the replica is rewound) and trains the lost steps again;
- the trainer SIGKILLed: the attempt stops with exit 75 (a retry may succeed); the
  trainer starts again on its initial weights, as its StatefulSet would, while the next
  attempt already runs: it waits for the trainer to serve and restores it from the
  checkpoint.
Checked from the run's step log at the end: every step once, every admitted prompt
trained on exactly once, and no sample trained on that a lost policy generated (lag
never negative) or that breaks the lag bound."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis
import yaml
from test_chart_services import on_loopback, small_values
from test_helm_chart import configs, containers, render

from specrl.config import DraftTrainerServerConfig, RolloutServerConfig, TrainerServerConfig, load_config
from specrl.launcher import ServiceProcess
from specrl.queue.redis_server import RedisServer
from specrl.rollout.api import RolloutClient

from helpers import wait_for

pytestmark = [pytest.mark.vllm, pytest.mark.zoo, pytest.mark.timeout(900)]
STEPS, PROMPTS, N = 8, 8, 4
PASSWORD = "chart-secret"


def _steps(run_dir: Path) -> list[dict]:
    path = run_dir / "steps.jsonl"
    return [yaml.safe_load(line) for line in path.read_text().splitlines()] if path.exists() else []


class Attempt:
    """One attempt of the orchestrator Job: its container's args, the run.yaml the
    ConfigMap mounts at /etc/specrl, the password from the Secret."""

    def __init__(self, args: list[str], files: dict[str, Path], out: Path) -> None:
        args = [str(files[Path(a).name]) if a.startswith("/etc/specrl/") else a for a in args]
        self.out = out
        env = {**os.environ, "SPECRL_REDIS_PASSWORD": PASSWORD}
        with open(out, "w") as f:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "specrl.cli", *args], stdout=f, stderr=subprocess.STDOUT, env=env
            )

    def says(self, pattern: str) -> re.Match | None:
        return re.search(pattern, " ".join(self.out.read_text().split()))

    def wait_for_steps(self, run_dir: Path, n: int, timeout: float = 400) -> None:
        deadline = time.monotonic() + timeout
        while len(_steps(run_dir)) < n:
            assert self.proc.poll() is None, self.out.read_text()
            assert time.monotonic() < deadline, f"{n} steps not logged in {timeout}s"
            time.sleep(0.3)

    def wait(self, timeout: float = 600) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self.proc.kill()


def test_a_failed_orchestrator_job_is_retried_and_resumes_the_run(zoo, tmp_path):
    extra = {
        "orchestrator.config.orchestrator.steps": STEPS,
        "orchestrator.config.orchestrator.max_lag": 1,
        "orchestrator.config.orchestrator.checkpoint_every": 2,
        "orchestrator.config.orchestrator.concurrency": 4,
        "orchestrator.config.data.prompts_per_step": PROMPTS,
        "orchestrator.config.sampling.n": N,
    }
    args, _ = small_values(tmp_path, extra)
    docs = render(*args)
    job = containers(docs)["orchestrator"]
    assert job["args"][-1] == "--continue"
    with RedisServer(tmp_path / "redis") as server:
        redis.Redis.from_url(server.url).config_set("requirepass", PASSWORD)
        files = {}
        for name, data in configs(docs).items():
            files[name] = tmp_path / name
            files[name].write_text(on_loopback(yaml.safe_dump(data), server.port))
        run_dir = tmp_path / "runs" / yaml.safe_load(files["run.yaml"].read_text())["name"]
        services = {
            name: ServiceProcess(load_config(files[f"{name}.yaml"], cls), service=name)
            for name, cls in [
                ("rollout", RolloutServerConfig),
                ("trainer", TrainerServerConfig),
                ("draft-trainer", DraftTrainerServerConfig),
            ]
        }
        try:
            for s in services.values():
                s.start()
            # attempt 1 dies with its pod once the replica serves v3 (checkpoint: v2)
            first = Attempt(job["args"], files, tmp_path / "attempt-1.out")
            first.wait_for_steps(run_dir, 3)
            with RolloutClient(services["rollout"].address) as replica:
                wait_for(lambda: replica.status().weight_sync.policy_version >= 3, 120, "the push of v3")
            first.proc.send_signal(signal.SIGKILL)
            assert first.wait() == -signal.SIGKILL
            assert first.says("--continue: starting a run in")
            lost = _steps(run_dir)
            assert len(lost) == 3, "the step after the kill point must not have ended"
            # attempt 2: the trainer kept running past the checkpoint
            second = Attempt(job["args"], files, tmp_path / "attempt-2.out")
            second.wait_for_steps(run_dir, 6)
            assert second.says("--continue: resuming the run in")
            held = second.says(r"trainer restored to the run's checkpoint \(v2; it held v(\d+)\)")
            assert held and int(held.group(1)) >= 3, second.out.read_text()
            assert second.says("resumed at version 2")
            rewound = services["rollout"].log_tail(400)
            assert re.search(r"policy v\d+ replaced by v2 \(the trainer resumed", rewound), rewound
            # the trainer's pod fails; the attempt with it
            services["trainer"].kill()
            assert second.wait() == 75, second.out.read_text()  # EX_TEMPFAIL: a retry may succeed
            assert second.says("specrl run --resume")
            # the pod starts again on its initial weights while attempt 3 already runs: it
            # waits for the trainer, restores it from the last checkpoint and finishes
            services["trainer"].start(wait=False)
            third = Attempt(job["args"], files, tmp_path / "attempt-3.out")
            assert third.wait() == 0, third.out.read_text()
            restored = third.says(r"trainer restored to the run's checkpoint \(v(\d+); it held v0\)")
            assert restored and int(restored.group(1)) >= 4, third.out.read_text()
        finally:
            for s in reversed(services.values()):
                s.stop()

    final = _steps(run_dir)
    assert [r["step"] for r in final] == list(range(STEPS)), "every step once"
    assert final[:2] == lost[:2], "a step the first checkpoint holds changed"
    groups = [g for r in final for g in r["group_ids"]]
    assert len(groups) == len(set(groups)) == STEPS * PROMPTS, "a group trained on twice"
    admitted = sorted(g.split(".")[0] for g in groups)
    assert admitted == sorted(f"{b}-{i}" for b in range(STEPS) for i in range(PROMPTS)), "a prompt lost"
    assert all(r["lag"]["min"] >= 0 and r["lag"]["max"] <= 1 for r in final), [r["lag"] for r in final]
    assert all(r["duplicate_samples"] == 0 for r in final)
