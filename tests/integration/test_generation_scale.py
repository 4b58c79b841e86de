"""The orchestrator's generation at cluster scale: 64 replicas x 512 slots each (the GB200
values' concurrency) against load-generator endpoints (specrl.bench.loadgen: the real
RolloutService gRPC API answering after a long-tailed latency, no engine behind it; a
fleet of 64 engines cannot run here) and a real Redis. A thread and a Redis connection per
slot was 32,768 of each; threads and connections must not grow with replicas x slots."""

from __future__ import annotations

import json
import os
import time

import pytest
from prometheus_client import CollectorRegistry

from specrl.bench.loadgen import LoadEndpoints
from specrl.config import SamplingConfig
from specrl.data.rewards import math_reward
from specrl.metrics import OrchestratorMetrics
from specrl.orchestrator.generation import Generators
from specrl.queue.redis_server import RedisServer
from specrl.queue.streams import PromptGroup, RunStreams

from helpers import wait_for

pytestmark = pytest.mark.timeout(300)
REPLICAS, SLOTS, GROUPS = 64, 512, 3000


def _threads() -> int:
    """OS threads of this process (gRPC's own included, not only Python's)."""
    return len(os.listdir("/proc/self/task"))


def test_threads_and_redis_connections_stay_bounded_at_64_replicas_of_512_slots(tmp_path):
    with RedisServer(tmp_path / "redis") as redis_server, LoadEndpoints(REPLICAS) as fleet:
        streams = RunStreams.connect(redis_server.url, "scale", max_connections=16)
        streams.publish([PromptGroup(f"0-{i}", 0, [1, 2, 3], "", "8", 0) for i in range(GROUPS)])
        registry = CollectorRegistry()
        metrics = OrchestratorMetrics(registry)
        before = _threads()
        gens = Generators(
            streams, list(fleet.addresses), concurrency=SLOTS, sampling=SamplingConfig(n=4, max_tokens=8),
            reward_fn=math_reward, seed=0, timeout_s=60, metrics=metrics,
        ).start()  # fmt: skip
        threads = clients = demand = 0
        deadline = time.monotonic() + 120
        try:
            while streams.r.xlen(streams.rollouts) < GROUPS and time.monotonic() < deadline:
                threads = max(threads, _threads() - before)
                clients = max(clients, len(streams.r.client_list()))
                demand = max(demand, registry.get_sample_value("specrl_generation_demand_sequences"))
                time.sleep(0.1)
            wait_for(
                lambda: registry.get_sample_value("specrl_generation_demand_sequences") == 0, 10, "demand 0"
            )
            in_flight = [
                registry.get_sample_value("specrl_generation_in_flight", {"replica": r})
                for r in fleet.addresses
            ]
        finally:
            gens.stop()
        entries = streams.r.xrange(streams.rollouts)
    groups = [json.loads(fields["data"]) for _, fields in entries]
    assert len(groups) == GROUPS and len({g["group_id"] for g in groups}) == GROUPS, "lost or doubled"
    assert all(len(g["samples"]) == 4 and not g["error"] for g in groups)
    assert {g["replica"] for g in groups} == set(fleet.addresses), "a replica was never used"
    assert threads < 50, f"{threads} threads for {REPLICAS} x {SLOTS} slots"
    assert clients <= 17, f"{clients} Redis connections (16 in the pool, 1 for client_list)"
    # autoscaling's input: n x the groups admitted and not generated, live (0 once done)
    assert GROUPS * 4 / 2 <= demand <= GROUPS * 4, demand
    assert in_flight == [0.0] * REPLICAS


def _run(
    streams: RunStreams, replicas: list[str], groups: int, metrics: OrchestratorMetrics, **kw
) -> list[dict]:
    """Generate `groups` prompt groups on `replicas` with no fixed deadline; the groups
    handed on (every one, or a timeout)."""
    streams.publish([PromptGroup(f"0-{i}", 0, [1, 2, 3], "", "8", 0) for i in range(groups)])
    gens = Generators(
        streams, replicas, sampling=SamplingConfig(n=2, max_tokens=8), reward_fn=math_reward, seed=0,
        timeout_s=None, metrics=metrics, **kw,
    ).start()  # fmt: skip
    try:
        wait_for(lambda: streams.r.xlen(streams.rollouts) >= groups, 60, "every group")
        time.sleep(1.0)  # a duplicate would land now
    finally:
        gens.stop()
    return [json.loads(fields["data"]) for _, fields in streams.r.xrange(streams.rollouts)]


def test_a_generation_far_longer_than_the_stall_limit_finishes_once_while_its_replica_progresses(tmp_path):
    """What a 30k-token group is to a GB200 replica: calls of 4 s, 4x the stall limit and
    4x the time after which Redis would reclaim an idle entry. The replica's engine makes
    progress, so nothing is cancelled, retried or generated twice (the entries in flight
    are marked alive)."""
    registry = CollectorRegistry()
    metrics = OrchestratorMetrics(registry)
    with RedisServer(tmp_path / "redis") as server, LoadEndpoints(2, median_s=4.0, sigma=0.0) as fleet:
        streams = RunStreams.connect(server.url, "long", reclaim_idle_s=1.0)
        groups = _run(streams, list(fleet.addresses), 6, metrics, concurrency=4, stall_s=1.0)
    assert sorted(g["group_id"] for g in groups) == [f"0-{i}" for i in range(6)]
    assert all(g["gen_seconds"] >= 3.9 and not g["error"] for g in groups)
    for counter in ("specrl_generation_retries_total", "specrl_generation_stalled_total"):
        assert registry.get_sample_value(counter) == 0, counter


def test_a_replica_that_stops_generating_is_found_stalled_and_its_groups_go_elsewhere(tmp_path):
    """Four replicas whose engine stopped (Generate never answers, no token generated)
    listed first, so they take the first groups; four healthy ones. The watchdog finds
    the stopped ones after stall_s, cancels their calls and every group finishes on the
    healthy replicas, once, none counted as a failure of its own."""
    registry = CollectorRegistry()
    metrics = OrchestratorMetrics(registry)
    with (
        RedisServer(tmp_path / "redis") as server,
        LoadEndpoints(4, hang=True) as stopped,
        LoadEndpoints(4, median_s=0.1) as healthy,
    ):
        streams = RunStreams.connect(server.url, "hung")
        replicas = stopped.addresses + healthy.addresses
        groups = _run(streams, replicas, 40, metrics, concurrency=4, stall_s=1.0)
    assert sorted(g["group_id"] for g in groups) == sorted(f"0-{i}" for i in range(40))
    assert {g["replica"] for g in groups} <= set(healthy.addresses)
    assert registry.get_sample_value("specrl_generation_stalled_total") >= 4
    assert registry.get_sample_value("specrl_generation_retries_total") == 0
