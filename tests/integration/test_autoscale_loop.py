"""The orchestrator scales generation itself (`rollout.autoscale`): the real RL loop, a real
Redis and the scale benchmark's load-generator endpoints (specrl.bench.loadgen: the
RolloutService and TrainerService gRPC APIs answering after set latencies, no engine
behind them), with the Kubernetes API played by FakeKubeApi (tests/kube_api_fake.py: no
API server runs here), which authorizes every call against the Role the Helm chart renders
for the orchestrator and stands in for the StatefulSet controller (a scale change
publishes that many endpoints in the Service's EndpointSlice). Starting from one replica
whose generation the trainer waits for most of each step, the loop must scale out until
the exposed share meets its target, and not past what pays; nothing lost or trained twice.
"""

from __future__ import annotations

import pytest
from chart_rbac import orchestrator_role
from kube_api_fake import FakeKubeApi, endpoint_slice
from prometheus_client import CollectorRegistry

from specrl.bench.loadgen import LoadEndpoints
from specrl.bench.scale import MadeUpPrompts
from specrl.config import AutoscaleConfig, OrchestratorConfig, SamplingConfig
from specrl.data.rewards import math_reward
from specrl.metrics import OrchestratorMetrics
from specrl.orchestrator.autoscale import Autoscaler
from specrl.orchestrator.discovery import DiscoveryError, open_discovery
from specrl.orchestrator.kube import WorkloadScale
from specrl.orchestrator.loop import Orchestrator
from specrl.queue.redis_server import RedisServer
from specrl.queue.streams import RunStreams
from specrl.trainer.api import TrainerClient

from helpers import wait_for

pytestmark = pytest.mark.timeout(300)
NAMESPACE = "train"
WORKLOAD = "rl-specrl-rollout"
SERVICE = "rl-specrl-rollout-headless"
MAX = 8
STEPS = 24
PROMPTS = 24  # a step's groups: 12 rounds of 2 slots on one replica, 0.1 s each


@pytest.mark.timed
def test_the_loop_scales_rollout_out_to_its_exposed_generation_target(tmp_path, monkeypatch):
    # the chart's Role for the orchestrator (release rl in namespace train)
    api = FakeKubeApi(
        role=orchestrator_role("--set", f"rollout.orchestratorScaling.maxReplicas={MAX}")
    ).start()
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(api.kubeconfig(tmp_path / "kubeconfig", NAMESPACE)))
    cfg = AutoscaleConfig(
        enabled=True, workload=f"statefulsets/{WORKLOAD}", namespace=NAMESPACE, min_replicas=1,
        max_replicas=MAX, target_exposed_share=0.2, tolerance=0.05, window_steps=2,
    )  # fmt: skip
    with (
        RedisServer(tmp_path / "redis") as redis_server,
        LoadEndpoints(MAX, median_s=0.1, sigma=0.0, trainer_step_s=0.2, hosts=True) as fleet,
        TrainerClient(fleet.trainer) as trainer,
    ):
        hosts = [a.rsplit(":", 1)[0] for a in fleet.addresses]
        port = int(fleet.addresses[0].rsplit(":", 1)[1])

        def controller(resource: str, name: str, replicas: int) -> None:
            """The StatefulSet controller's part: `replicas` pods, their endpoints published."""
            api.put_slice(NAMESPACE, endpoint_slice("rollout-abcde", SERVICE, hosts[:replicas]))

        api.scales[(NAMESPACE, "statefulsets", WORKLOAD)] = 1
        api.on_scale = controller
        controller("statefulsets", WORKLOAD, 1)
        watch = open_discovery(f"k8s:{NAMESPACE}/{SERVICE}:{port}", every_s=10.0)
        replicas = wait_for(lambda: _found(watch), 10, "the first list")
        registry = CollectorRegistry()
        metrics = OrchestratorMetrics(registry)
        loop = Orchestrator(
            OrchestratorConfig(steps=STEPS, max_lag=1, concurrency=2, checkpoint_every=0),
            sampling=SamplingConfig(n=2, max_tokens=8),
            seed=0,
            prompts_per_step=PROMPTS,
            streams=RunStreams.connect(redis_server.url, "autoscale"),
            trainer=trainer,
            replicas=list(replicas),
            source=MadeUpPrompts(),  # type: ignore[arg-type]
            reward_fn=math_reward,
            metrics=metrics,
            discover=watch,
            discover_every_s=watch.every_s,
            autoscaler=Autoscaler(cfg, WorkloadScale(cfg.workload, cfg.namespace), metrics),
        )
        try:
            records = loop.run()
        finally:
            watch.close()
            api.stop()
    asked = [r["autoscale"]["asked"] for r in records]
    shares = [r["time"]["exposed_generation"] / r["time"]["step"] for r in records]
    summary = [(a, round(s, 2), r["autoscale"].get("reason", "")) for a, s, r in zip(asked, shares, records)]
    # every step's line in full on failure (pytest shortens a list given as the message)
    steps = "\n".join(f"step {i}: asked {a}, exposed {s}, {why}" for i, (a, s, why) in enumerate(summary))
    assert asked[0] == 1 and max(asked) >= 3, steps
    # a scale-in only when a scale-out did not pay (the law's no-gain check) or well hidden
    for before, (a, _, reason) in zip(asked, summary[1:]):
        assert a >= before or "predicted: back to" in reason or "under the target" in reason, steps
    settled = [s for a, s, r in zip(asked, shares, records) if r["autoscale"]["replicas"] == asked[-1]]
    assert sum(settled[-2:]) / 2 <= cfg.target_exposed_share + cfg.tolerance, steps
    assert sum(shares[:2]) / 2 > 0.4, f"one replica should have been too slow:\n{steps}"
    # every call the orchestrator made was one the chart's Role allows, and only these
    assert not api.denied, api.denied
    assert {(v, g, r) for v, g, r, _ in api.requests} <= {
        ("list", "discovery.k8s.io", "endpointslices"),
        ("watch", "discovery.k8s.io", "endpointslices"),
        ("get", "apps", "statefulsets/scale"),
        ("patch", "apps", "statefulsets/scale"),
    }
    assert api.scales[(NAMESPACE, "statefulsets", WORKLOAD)] == asked[-1]
    assert registry.get_sample_value("specrl_rollout_target_replicas") == asked[-1]
    assert sum(r["samples"] for r in records) == STEPS * PROMPTS * 2, "lost samples"
    assert sum(r["duplicate_samples"] for r in records) == 0


def _found(watch) -> list[str]:
    try:
        return watch()
    except DiscoveryError:
        return []
