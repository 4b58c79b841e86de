"""The chart's CPU deployment, run for real without a cluster: the config files its
ConfigMap renders (values-cpu.yaml, made small) start a rollout server, a trainer and a
draft-trainer as real processes, and `specrl run` with the rendered run.yaml trains
against them and a password-protected Redis, the password passed the way the chart's
Secret passes it, every gRPC connection under mutual TLS with the chart's settings (certificates
made here). A real Prometheus scrapes every service's metrics port meanwhile, and
every query of every dashboard panel and every alert rule is run against it. Only what
a cluster provides is replaced: the Services' DNS names by loopback, the volume by a
temporary directory."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
import redis
import yaml
from test_helm_chart import CHART, VALUES, configs, containers, helm, render

from deploygen import dashboards
from specrl import grpc_options, serving
from specrl.config import DraftTrainerServerConfig, RolloutServerConfig, TrainerServerConfig, load_config
from specrl.launcher import ServiceProcess, free_port
from specrl.queue.redis_server import RedisServer

from helpers import ARTIFACTS, browser, http_json, make_certificates, tool, wait_for

pytestmark = [pytest.mark.vllm, pytest.mark.zoo, pytest.mark.timeout(900)]
STEPS = 3
TOKEN = "control-token"


class Prometheus:
    """A real Prometheus server (the Debian package) scraping `targets` every second."""

    def __init__(self, root: Path, targets: list[str]) -> None:
        binary = tool("prometheus", installs="`make setup`: apt-get prometheus")
        self.port = free_port()
        config = root / "prometheus.yml"
        scrape = {"job_name": "specrl", "scrape_interval": "1s", "static_configs": [{"targets": targets}]}
        config.write_text(yaml.safe_dump({"global": {"scrape_interval": "1s"}, "scrape_configs": [scrape]}))
        cmd = [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={root / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--log.level=warn",
        ]
        with open(root / "prometheus.log", "w") as log:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log)
        deadline = time.monotonic() + 60
        while not self._ready():
            assert self.proc.poll() is None and time.monotonic() < deadline, (
                root / "prometheus.log"
            ).read_text()
            time.sleep(0.2)

    def _ready(self) -> bool:
        try:
            return urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2).status == 200
        except OSError:
            return False

    def query(self, expr: str, at: float) -> dict:
        url = f"http://127.0.0.1:{self.port}/api/v1/query?" + urllib.parse.urlencode(
            {"query": expr, "time": at}
        )
        try:
            return json.load(urllib.request.urlopen(url, timeout=30))
        except urllib.error.HTTPError as e:  # 400: the query does not parse
            return json.load(e)

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


def small_values(tmp_path, extra: dict | None = None) -> tuple[list[str], dict[str, int]]:
    """Helm args for values-cpu.yaml made small (and `extra`, dotted keys), with free
    ports for every service; (args, those ports)."""
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
        "orchestrator.statusPort": free_port(),
    }
    small = {
        **ports,
        "runs.mountPath": str(tmp_path / "runs"),
        "tls.enabled": True,  # every gRPC connection below is mutual TLS
        "tls.existingSecret": "specrl-tls",
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
        # no Kubernetes API here to watch EndpointSlices through: the headless Service's
        # DNS name, which on_loopback turns into this machine
        "orchestrator.discovery": "dns",
        **(extra or {}),
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
    return [*VALUES["cpu"], "-f", str(path)], ports


def on_loopback(text: str, redis_port: int) -> str:
    """What the cluster's DNS would do: every Service name is this machine."""
    text = re.sub(r"[a-z0-9-]+(\.[a-z0-9-]+)*\.svc", "127.0.0.1", text)
    return text.replace("127.0.0.1:6379", f"127.0.0.1:{redis_port}")


@pytest.mark.timed
def test_the_rendered_cpu_deployment_trains_with_speculative_rollouts(zoo, tmp_path, monkeypatch):
    args, ports = small_values(tmp_path)
    docs = render(*args)
    # the TLS Secret the pods mount at /etc/specrl/tls, made here by a CA of the test's
    # own; every process started below (and what they start) gets the chart's TLS env
    pki = make_certificates(tmp_path / "pki")
    for e in containers(docs)["rollout"]["env"]:
        if e["name"].startswith("SPECRL_TLS_"):
            monkeypatch.setenv(e["name"], e["value"].replace("/etc/specrl/tls", str(pki["ca"].parent)))
    metrics = [f"127.0.0.1:{port}" for key, port in ports.items() if key.endswith("metricsPort")]
    prometheus = Prometheus(tmp_path, metrics)
    with RedisServer(tmp_path / "redis") as server:
        password = "chart-secret"
        redis.Redis.from_url(server.url).config_set("requirepass", password)
        files = {}
        for name, data in configs(docs).items():
            path = tmp_path / name
            path.write_text(on_loopback(yaml.safe_dump(data), server.port))
            files[name] = path
        started: list[ServiceProcess] = []
        try:
            for name, cls, service in [
                ("rollout.yaml", RolloutServerConfig, "rollout"),
                ("trainer.yaml", TrainerServerConfig, "trainer"),
                ("draft-trainer.yaml", DraftTrainerServerConfig, "draft-trainer"),
            ]:
                started.append(ServiceProcess(load_config(files[name], cls), service=service).start())
            with monkeypatch.context() as plaintext:  # without the certificates: nothing
                for name in grpc_options.TLS_ENV:
                    plaintext.delenv(name)
                assert all(serving.health_of(p.address, timeout=5) == "UNAVAILABLE" for p in started)
            # `helm test`: the chart's health pod asks every gRPC service
            args = containers(docs)["health"]["args"]
            health = subprocess.run(
                [sys.executable, "-m", "specrl.cli", *(on_loopback(a, server.port) for a in args)],
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert health.returncode == 0, health.stderr
            # the orchestrator Job: the password comes from the environment (the Secret)
            env = {**os.environ, "SPECRL_REDIS_PASSWORD": password, "SPECRL_CONTROL_TOKEN": TOKEN}
            with open(tmp_path / "run.out", "w") as out:
                run = subprocess.Popen(
                    [sys.executable, "-m", "specrl.cli", "run", "--config", str(files["run.yaml"])],
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=env,
                )
            try:
                paused_at = _steer_through_the_status_page(run, ports["orchestrator.statusPort"], tmp_path)
                code = run.wait(timeout=800)
            finally:
                run.kill()
            assert code == 0, (tmp_path / "run.out").read_text()
            during = time.time() - 3  # the orchestrator's series end when it exits
            _every_query_answers(prometheus, during)
        finally:
            for p in reversed(started):
                p.stop()
            prometheus.stop()
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
    # "checkpoint now", asked while paused before step k, saved as step k starts (the
    # other only after the last step, in no step's record): the time it took shows in
    # that step's record
    saved = [s["step"] for s in steps if s["time"]["checkpoint"] > 0.01]
    assert saved == [paused_at], [s["time"]["checkpoint"] for s in steps]


def _steer_through_the_status_page(run: subprocess.Popen, port: int, tmp_path: Path) -> int:
    """Pause the live run through the control API, check it holds still, ask for a
    checkpoint, watch the page in a real browser, resume; the step it paused before."""
    from selenium.webdriver.common.by import By

    def status() -> dict | None:
        assert run.poll() is None, (tmp_path / "run.out").read_text()
        try:
            return http_json(port, "/api/status")[1]
        except OSError:
            return None  # not serving yet

    wait_for(lambda: (s := status()) and s["state"] == "running", 300, "the status page")
    assert http_json(port, "/api/pause", method="POST")[0] == 401  # no token, no control
    assert http_json(port, "/api/pause", method="POST", token=TOKEN)[0] == 200
    paused = wait_for(lambda: (s := status()) and s["state"] == "paused" and s, 300, "the pause")
    k = paused["step"]
    assert k < STEPS - 1, "the run was nearly done before it could be paused"
    time.sleep(3)
    assert status()["step"] == k  # held still at the step boundary
    assert http_json(port, "/api/checkpoint", method="POST", token=TOKEN)[0] == 200
    b = browser()
    try:
        b.get(f"http://127.0.0.1:{port}/")
        wait_for(lambda: b.find_element(By.ID, "step").text == f"{k} / {STEPS}")
        wait_for(lambda: "paused" in b.find_element(By.ID, "state").text)
        assert "SERVING" in b.find_element(By.ID, "replicas").text
        if k:  # the stage chart of the steps done
            wait_for(lambda: b.find_elements(By.CSS_SELECTOR, "#stages rect"))
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        b.save_screenshot(str(ARTIFACTS / "status-page-live.png"))
    finally:
        b.quit()
    assert http_json(port, "/api/resume", method="POST", token=TOKEN)[0] == 200
    return k


def _every_query_answers(prometheus: Prometheus, at: float) -> None:
    """Every panel query returns data from the services' own metrics; every alert rule
    evaluates (it returns nothing while nothing is wrong)."""
    empty = []
    for uid, title, expr in dashboards.queries():
        reply = prometheus.query(expr.replace(dashboards.RATE, "1m"), at)
        assert reply["status"] == "success", (uid, title, expr, reply)
        # the adaptive k controller's and history's panels have data only on replicas
        # that run them (speculation.adaptive and speculation.history, off in
        # values-cpu.yaml; their metrics are tested in tests/integration/
        # test_rollout_server.py and test_lossless.py): their queries must still evaluate
        if not reply["data"]["result"] and not re.search(r"specrl_rollout_(adaptive|history)_", expr):
            empty.append(f"{uid} / {title}: {expr}")
    assert not empty, "panels without data:\n" + "\n".join(empty)
    for rule in dashboards.rules()["groups"][0]["rules"]:
        reply = prometheus.query(rule["expr"], at)
        assert reply["status"] == "success", (rule["alert"], reply)
        assert not reply["data"]["result"], f"{rule['alert']} fires on a healthy run: {reply}"


def test_the_chart_lints(tmp_path):
    """The small values above are valid chart values too."""
    out = helm("lint", "--strict", str(CHART), *small_values(tmp_path)[0])
    assert out.returncode == 0, out.stdout + out.stderr
