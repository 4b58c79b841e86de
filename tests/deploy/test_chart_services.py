"""The chart's CPU deployment, run for real without a cluster: the config files its
ConfigMap renders (values-cpu.yaml, made small) start a rollout server, a trainer and a
draft-trainer as real processes, and `specrl run` with the rendered run.yaml trains
against them and a password-protected Redis, the password passed the way the chart's
Secret passes it. Only what a cluster provides is replaced: the Services' DNS names by
loopback, the volume by a temporary directory."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
import redis
import yaml
from test_helm_chart import CHART, VALUES, configs, containers, helm, render

from specrl.config import DraftTrainerServerConfig, RolloutServerConfig, TrainerServerConfig, load_config
from specrl.launcher import ServiceProcess, free_port
from specrl.queue.redis_server import RedisServer

pytestmark = [pytest.mark.vllm, pytest.mark.zoo, pytest.mark.timeout(900)]
STEPS = 3


def _small(tmp_path) -> list[str]:
    ports = {
        "rollout.port": free_port(),
        "rollout.metricsPort": free_port(),
        "trainer.port": free_port(),
        "trainer.metricsPort": free_port(),
        "trainer.weightSyncPort": free_port(),
        "draftTrainer.port": free_port(),
        "draftTrainer.metricsPort": free_port(),
        "draftTrainer.weightSyncPort": free_port(),
        "orchestrator.metricsPort": free_port(),
    }
    small = {
        **ports,
        "runs.mountPath": str(tmp_path / "runs"),
        "rollout.replicas": 1,
        "rollout.config.engine.max_model_len": 128,
        "rollout.config.engine.kv_cache_gib": 0.25,
        "rollout.config.self_test.enabled": False,
        "trainer.procsPerNode": 1,
        "trainer.config.trainer.dp": 1,
        "trainer.config.trainer.micro_batch_size": 16,
        "trainer.config.trainer.optim.lr": 3e-5,
        "draftTrainer.config.training.lr": 1e-3,  # as the draft-trainer test: visible in 3 steps
        "draftTrainer.config.training.holdout_every": 5,
        "orchestrator.config.data.prompts_per_step": 16,
        "orchestrator.config.sampling.n": 8,
        "orchestrator.config.sampling.max_tokens": 32,
        "orchestrator.config.orchestrator.steps": STEPS,
        "orchestrator.config.orchestrator.concurrency": 8,
    }
    tree: dict = {}
    for dotted, value in small.items():
        *parents, leaf = dotted.split(".")
        node = tree
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    # a values file (--set would turn 0.25 into a string), as JSON: its quoted keys keep
    # `n` a key where Helm's YAML 1.1 would read false
    path = tmp_path / "small.json"
    path.write_text(json.dumps(tree))
    return [*VALUES["cpu"], "-f", str(path)]


def _on_loopback(text: str, redis_port: int) -> str:
    """What the cluster's DNS would do: every Service name is this machine."""
    text = re.sub(r"[a-z0-9-]+(\.[a-z0-9-]+)*\.svc", "127.0.0.1", text)
    return text.replace("127.0.0.1:6379", f"127.0.0.1:{redis_port}")


def test_the_rendered_cpu_deployment_trains_with_speculative_rollouts(zoo, tmp_path):
    docs = render(*_small(tmp_path))
    with RedisServer(tmp_path / "redis") as server:
        password = "chart-secret"
        redis.Redis.from_url(server.url).config_set("requirepass", password)
        files = {}
        for name, data in configs(docs).items():
            path = tmp_path / name
            path.write_text(_on_loopback(yaml.safe_dump(data), server.port))
            files[name] = path
        started: list[ServiceProcess] = []
        try:
            for name, cls, service in [
                ("rollout.yaml", RolloutServerConfig, "rollout"),
                ("trainer.yaml", TrainerServerConfig, "trainer"),
                ("draft-trainer.yaml", DraftTrainerServerConfig, "draft-trainer"),
            ]:
                started.append(ServiceProcess(load_config(files[name], cls), service=service).start())
            # `helm test`: the chart's health pod asks every gRPC service
            args = containers(docs)["health"]["args"]
            health = subprocess.run(
                [sys.executable, "-m", "specrl.cli", *(_on_loopback(a, server.port) for a in args)],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert health.returncode == 0, health.stderr
            # the orchestrator Job: the password comes from the environment (the Secret)
            env = {**os.environ, "SPECRL_REDIS_PASSWORD": password}
            run = subprocess.run(
                [sys.executable, "-m", "specrl.cli", "run", "--config", str(files["run.yaml"])],
                capture_output=True,
                text=True,
                timeout=800,
                env=env,
            )
            assert run.returncode == 0, run.stdout + run.stderr
        finally:
            for p in reversed(started):
                p.stop()
        redis.Redis.from_url(server.url, password=password).config_set("requirepass", "")
    run_dir = tmp_path / "runs" / yaml.safe_load(files["run.yaml"].read_text())["name"]
    steps = [yaml.safe_load(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    assert [s["step"] for s in steps] == list(range(STEPS))
    assert all(s["acceptance_length"] > 1.0 for s in steps), steps  # EAGLE-3 rollouts
    assert all(s["push"]["updated"] for s in steps[1:]), steps  # policy broadcast reached it
    # the draft-trainer adapted the generic draft on the trainer's features and published
    # it to the replica: acceptance rises (1.4 -> 2.3 in the draft-trainer's own test)
    assert steps[-1]["draft"]["version"] >= 1 and steps[-1]["draft"]["updated"], steps[-1]["draft"]
    assert steps[-1]["acceptance_length"] > steps[0]["acceptance_length"] + 0.3, steps
    assert password not in (run_dir / "config.json").read_text()


def test_the_chart_lints(tmp_path):
    """The small values above are valid chart values too."""
    out = helm("lint", "--strict", str(CHART), *_small(tmp_path))
    assert out.returncode == 0, out.stdout + out.stderr
