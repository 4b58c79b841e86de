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

from specrl.bench.loadgen import LoadEndpoints
from specrl.config import SamplingConfig
from specrl.data.rewards import math_reward
from specrl.orchestrator.generation import Generators
from specrl.queue.redis_server import RedisServer
from specrl.queue.streams import PromptGroup, RunStreams

pytestmark = pytest.mark.timeout(300)
REPLICAS, SLOTS, GROUPS = 64, 512, 3000


def _threads() -> int:
    """OS threads of this process (gRPC's own included, not only Python's)."""
    return len(os.listdir("/proc/self/task"))


def test_threads_and_redis_connections_stay_bounded_at_64_replicas_of_512_slots(tmp_path):
    with RedisServer(tmp_path / "redis") as redis_server, LoadEndpoints(REPLICAS) as fleet:
        streams = RunStreams.connect(redis_server.url, "scale", max_connections=16)
        streams.publish([PromptGroup(f"0-{i}", 0, [1, 2, 3], "", "8", 0) for i in range(GROUPS)])
        before = _threads()
        gens = Generators(
            streams, list(fleet.addresses), concurrency=SLOTS, sampling=SamplingConfig(n=4, max_tokens=8),
            reward_fn=math_reward, seed=0, timeout_s=60,
        ).start()  # fmt: skip
        threads = clients = 0
        deadline = time.monotonic() + 120
        try:
            while streams.r.xlen(streams.rollouts) < GROUPS and time.monotonic() < deadline:
                threads = max(threads, _threads() - before)
                clients = max(clients, len(streams.r.client_list()))
                time.sleep(0.1)
        finally:
            gens.stop()
        entries = streams.r.xrange(streams.rollouts)
    groups = [json.loads(fields["data"]) for _, fields in entries]
    assert len(groups) == GROUPS and len({g["group_id"] for g in groups}) == GROUPS, "lost or doubled"
    assert all(len(g["samples"]) == 4 and not g["error"] for g in groups)
    assert {g["replica"] for g in groups} == set(fleet.addresses), "a replica was never used"
    assert threads < 50, f"{threads} threads for {REPLICAS} x {SLOTS} slots"
    assert clients <= 17, f"{clients} Redis connections (16 in the pool, 1 for client_list)"
