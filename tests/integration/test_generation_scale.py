"""The orchestrator's generation at cluster scale: 64 replicas x 512 slots each (the GB200
values' concurrency) against load-generator endpoints (specrl.bench.loadgen: the real
RolloutService gRPC API answering after a long-tailed latency, no engine behind it; a
fleet of 64 engines cannot run here) and a real Redis. A thread and a Redis connection per
slot was 32,768 of each; threads and connections must not grow with replicas x slots.

Without orchestrator.concurrency each replica's slots come from the capacity it reports
(GetStatus max_num_seqs) and the group size n; the orchestrator measures each replica's
load (tokens/s, from the statuses its watchdog reads) and each group's wait in the queue."""

from __future__ import annotations

import json
import os
import socket
import time

import pytest
from prometheus_client import CollectorRegistry

from specrl.bench.loadgen import LoadEndpoints
from specrl.config import SamplingConfig
from specrl.data.rewards import math_reward
from specrl.metrics import OrchestratorMetrics
from specrl.orchestrator.generation import FALLBACK_SLOTS, Generators, slots_for
from specrl.queue.redis_server import RedisServer
from specrl.queue.streams import PromptGroup, RunStreams
from specrl.rollout.api import RolloutClient

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
    streams: RunStreams, replicas: list[str], groups: int, metrics: OrchestratorMetrics, *, n: int = 2, **kw
) -> list[dict]:
    """Generate `groups` prompt groups of `n` samples on `replicas` with no fixed deadline;
    the groups handed on (every one, or a timeout). Slots: from each replica's capacity
    unless `concurrency` is given."""
    streams.publish([PromptGroup(f"0-{i}", 0, [1, 2, 3], "", "8", 0) for i in range(groups)])
    kw.setdefault("concurrency", None)
    gens = Generators(
        streams, replicas, sampling=SamplingConfig(n=n, max_tokens=8), reward_fn=math_reward, seed=0,
        timeout_s=None, metrics=metrics, **kw,
    ).start()  # fmt: skip
    try:
        wait_for(lambda: streams.r.xlen(streams.rollouts) >= groups, 60, "every group")
        time.sleep(1.0)  # a duplicate would land now
    finally:
        gens.stop()
    return [json.loads(fields["data"]) for _, fields in streams.r.xrange(streams.rollouts)]


@pytest.mark.timed
def test_a_generation_far_longer_than_the_stall_limit_finishes_once_while_its_replica_progresses(tmp_path):
    """What a 30k-token group is to a GB200 replica: calls of 4 s, 4x the stall limit and
    4x the time after which Redis would reclaim an idle entry. The replica's engine makes
    progress, so nothing is cancelled, retried or generated twice (the entries in flight
    are marked alive)."""
    registry = CollectorRegistry()
    metrics = OrchestratorMetrics(registry)
    with (
        RedisServer(tmp_path / "redis") as server,
        LoadEndpoints(2, median_s=4.0, sigma=0.0, max_num_seqs=6) as fleet,  # 4 slots at n=2
    ):
        streams = RunStreams.connect(server.url, "long", reclaim_idle_s=1.0)
        groups = _run(streams, list(fleet.addresses), 6, metrics, stall_s=1.0)
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
        LoadEndpoints(4, hang=True, max_num_seqs=6) as stopped,  # 4 slots at n=2
        LoadEndpoints(4, median_s=0.1, max_num_seqs=6) as healthy,
    ):
        streams = RunStreams.connect(server.url, "hung")
        replicas = stopped.addresses + healthy.addresses
        groups = _run(streams, replicas, 40, metrics, stall_s=1.0)
    assert sorted(g["group_id"] for g in groups) == sorted(f"0-{i}" for i in range(40))
    assert {g["replica"] for g in groups} <= set(healthy.addresses)
    assert registry.get_sample_value("specrl_generation_stalled_total") >= 4
    assert registry.get_sample_value("specrl_generation_retries_total") == 0


def _gauge(registry: CollectorRegistry, name: str, replica: str) -> float | None:
    return registry.get_sample_value(name, {"replica": replica})


def test_each_replicas_slots_come_from_the_capacity_it_reports_and_the_group_size(tmp_path):
    """Two replicas whose engines batch 8 and 20 sequences, groups of n=4: 3 and 7 slots
    (ceil(1.25 x max_num_seqs / n)), each kept full by a backlog and never exceeded, as
    the replicas themselves count the calls in flight on them. Each group's wait in the
    queue is observed once, by the replica that took it."""
    registry = CollectorRegistry()
    metrics = OrchestratorMetrics(registry)
    with (
        RedisServer(tmp_path / "redis") as server,
        LoadEndpoints(1, median_s=0.2, sigma=0.3, max_num_seqs=8) as small,
        LoadEndpoints(1, median_s=0.2, sigma=0.3, max_num_seqs=20) as large,
    ):
        streams = RunStreams.connect(server.url, "slots")
        groups = _run(streams, small.addresses + large.addresses, 80, metrics, n=4)
    (a,), (b,) = small.addresses, large.addresses
    assert (slots_for(8, 4), slots_for(20, 4)) == (3, 7)
    assert (
        _gauge(registry, "specrl_generation_slots", a),
        _gauge(registry, "specrl_generation_slots", b),
    ) == (3, 7)
    assert (small.peak_in_flight, large.peak_in_flight) == (3, 7), "slots not filled, or exceeded"
    assert len(groups) == 80 and small.calls + large.calls == 80
    for replica in (a, b):
        took = sum(g["replica"] == replica for g in groups)
        assert (
            registry.get_sample_value("specrl_generation_queue_wait_seconds_count", {"replica": replica})
            == took
        )


def test_concurrency_when_given_overrides_the_replicas_capacity(tmp_path):
    registry = CollectorRegistry()
    metrics = OrchestratorMetrics(registry)
    with RedisServer(tmp_path / "redis") as server, LoadEndpoints(1, median_s=0.1, max_num_seqs=64) as fleet:
        streams = RunStreams.connect(server.url, "fixed")
        groups = _run(streams, fleet.addresses, 20, metrics, n=4, concurrency=2)
    assert len(groups) == 20
    assert _gauge(registry, "specrl_generation_slots", fleet.addresses[0]) == 2  # not 20
    assert fleet.peak_in_flight == 2


def test_a_replica_whose_status_is_unanswered_at_join_gets_the_fallback_until_read(tmp_path):
    """Nothing listens on the replica's port when the generators start: it gets
    FALLBACK_SLOTS. Once it serves (capacity 8, n=4), a watchdog pass reads 3 slots."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    replica = f"127.0.0.1:{port}"
    registry = CollectorRegistry()
    with RedisServer(tmp_path / "redis") as server:
        streams = RunStreams.connect(server.url, "late")
        gens = Generators(
            streams, [replica], concurrency=None, sampling=SamplingConfig(n=4, max_tokens=8),
            reward_fn=math_reward, seed=0, timeout_s=None, stall_s=1.0, metrics=OrchestratorMetrics(registry),
        ).start()  # fmt: skip
        try:
            wait_for(lambda: gens.slots() == {replica: FALLBACK_SLOTS}, 10, "the fallback")
            assert _gauge(registry, "specrl_generation_slots", replica) == FALLBACK_SLOTS
            with LoadEndpoints(1, max_num_seqs=8, ports=[port]):
                wait_for(lambda: _gauge(registry, "specrl_generation_slots", replica) == 3, 15, "3 slots")
        finally:
            gens.stop()


def test_each_replicas_tokens_per_second_is_measured_and_forgotten_when_it_leaves(tmp_path):
    """Every replica's status is read on each watchdog pass, idle or not: its engine's
    tokens/s shows for the two generating and for a third that joined and got no work
    (paused: it awaits the current policy). A replica removed loses all its series once
    its calls finish; the others keep theirs."""
    registry = CollectorRegistry()
    metrics = OrchestratorMetrics(registry)
    rate = "specrl_rollout_replica_tokens_per_second"
    with RedisServer(tmp_path / "redis") as server, LoadEndpoints(3, median_s=0.5, sigma=0.2) as fleet:
        a, b, idle = fleet.addresses
        streams = RunStreams.connect(server.url, "load")
        streams.publish([PromptGroup(f"0-{i}", 0, [1, 2, 3], "", "8", 0) for i in range(2000)])
        gens = Generators(
            streams, [a, b], concurrency=None, sampling=SamplingConfig(n=4, max_tokens=8),
            reward_fn=math_reward, seed=0, timeout_s=None, stall_s=1.0, metrics=metrics,
        ).start()  # fmt: skip
        try:
            gens.add(idle)
            wait_for(lambda: all((_gauge(registry, rate, r) or 0) > 0 for r in (a, b, idle)), 10, "tokens/s")
            assert _gauge(registry, "specrl_generation_in_flight", a) > 0
            assert _gauge(registry, "specrl_generation_in_flight", idle) == 0
            assert streams.r.xlen(streams.rollouts) < 2000, "still generating"
            gens.remove(b)
            wait_for(lambda: _gauge(registry, rate, b) is None, 10, "b's tokens/s removed")
            for name in (
                "specrl_generation_slots",
                "specrl_generation_in_flight",
                "specrl_generation_queue_wait_seconds_count",
            ):
                assert _gauge(registry, name, b) is None, name
            assert _gauge(registry, rate, a) > 0 and _gauge(registry, rate, idle) > 0
        finally:
            gens.stop()


def test_the_queue_wait_of_each_group_is_from_its_admission_to_its_call(tmp_path):
    """Twelve groups admitted at once to one replica of 3 slots, calls of 0.1 s: they wait
    for a slot in turn (0, 0.1, 0.2, 0.3 s, three each, and more). Each group's wait is its
    call's start (RolloutGroup.started_at) less its admission (its stream entry's id, ms on
    Redis's clock, here this host's)."""
    registry = CollectorRegistry()
    metrics = OrchestratorMetrics(registry)
    with RedisServer(tmp_path / "redis") as server, LoadEndpoints(1, median_s=0.1, sigma=0.0) as fleet:
        streams = RunStreams.connect(server.url, "wait")
        before = time.time()
        streams.publish([PromptGroup(f"0-{i}", 0, [1, 2, 3], "", "8", 0) for i in range(12)])
        admitted = time.time()
        gens = Generators(
            streams, fleet.addresses, concurrency=3, sampling=SamplingConfig(n=4, max_tokens=8),
            reward_fn=math_reward, seed=0, timeout_s=None, metrics=metrics,
        ).start()  # fmt: skip
        try:
            wait_for(lambda: streams.r.xlen(streams.rollouts) >= 12, 30, "every group")
        finally:
            gens.stop()
        groups = [json.loads(fields["data"]) for _, fields in streams.r.xrange(streams.rollouts)]
    labels = {"replica": fleet.addresses[0]}
    assert registry.get_sample_value("specrl_generation_queue_wait_seconds_count", labels) == 12
    total = registry.get_sample_value("specrl_generation_queue_wait_seconds_sum", labels)
    started = sum(g["started_at"] for g in groups)
    # admitted between `before` (less the id's ms rounding) and `admitted`
    assert started - 12 * admitted - 0.01 <= total <= started - 12 * (before - 0.001) + 0.01
    assert total >= 3 * (0.1 + 0.2 + 0.3) * 0.9, "the later groups waited their turn"


@pytest.mark.parametrize(("affinity", "method"), [(True, ""), (None, "history")], ids=["set", "by-method"])
def test_with_prompt_affinity_a_prompt_that_comes_back_goes_to_the_same_replica(tmp_path, affinity, method):
    """orchestrator.prompt_affinity (on by itself with history-drafting replicas): 21
    prompts, each admitted in 3 batches (epochs), over 4 replicas with room to spare:
    every group of a prompt lands on one replica, and the prompts spread over them. (Without
    affinity the replica with the most free slots takes each group: here group i goes to
    replica i mod 4, and a prompt's groups 21 apart to different replicas.) The ports, and
    so the hashing, differ per run: 21 prompts fall on at most 2 of 4 replicas with
    probability ~3e-6 (10 did in ~0.6% of runs)."""
    metrics = OrchestratorMetrics(CollectorRegistry())
    with RedisServer(tmp_path / "redis") as server, LoadEndpoints(4, median_s=0.05, method=method) as fleet:
        streams = RunStreams.connect(server.url, "affinity")
        groups = [PromptGroup(f"{b}-{p}", b, [1, 2, 3, p], "", "8", 0) for b in range(3) for p in range(21)]
        gens = Generators(
            streams, list(fleet.addresses), concurrency=64, sampling=SamplingConfig(n=2, max_tokens=8),
            reward_fn=math_reward, seed=0, timeout_s=None, metrics=metrics, prompt_affinity=affinity,
        ).start()  # fmt: skip
        try:
            # published once every replica's status is read: before that, the first one read
            # would take every group (64 slots), as at a run's start (carried history covers
            # the prompts that then move: test below)
            wait_for(lambda: not gens.reading(), 10, "every replica read")
            streams.publish(groups)
            wait_for(lambda: streams.r.xlen(streams.rollouts) >= len(groups), 60, "every group")
        finally:
            gens.stop()
        done = [json.loads(fields["data"]) for _, fields in streams.r.xrange(streams.rollouts)]
    by_prompt: dict[int, set[str]] = {}
    for g in done:
        by_prompt.setdefault(g["prompt_ids"][-1], set()).add(g["replica"])
    assert len(done) == 63 and all(len(r) == 1 for r in by_prompt.values()), by_prompt
    assert len(set().union(*by_prompt.values())) >= 3, "21 prompts hashed onto fewer than 3 of 4 replicas"


def test_replicas_that_restarted_get_each_prompts_last_responses_with_its_next_group(tmp_path):
    """History carried (orchestrator.history_carry_tokens): 6 prompts over 2
    history-drafting replicas; the replicas restart (new instances) between the first and
    second epoch. Every second-epoch group carries its prompt's first-epoch responses (n=2)
    to its replica, once: the first and third epochs carry none (the replica generated the
    prompt itself, or had it carried since it started)."""
    with socket.socket() as a, socket.socket() as b:
        a.bind(("127.0.0.1", 0))
        b.bind(("127.0.0.1", 0))
        ports = [a.getsockname()[1], b.getsockname()[1]]
    addresses = [f"127.0.0.1:{p}" for p in ports]
    metrics = OrchestratorMetrics(registry := CollectorRegistry())

    def epoch(streams: RunStreams, b: int) -> None:
        streams.publish([PromptGroup(f"{b}-{p}", b, [1, 2, 3, p], "", "8", 0) for p in range(6)])
        wait_for(lambda: streams.r.xlen(streams.rollouts) >= 6 * (b + 1), 30, f"epoch {b}")

    with RedisServer(tmp_path / "redis") as server:
        streams = RunStreams.connect(server.url, "carry")
        fleet = dict(median_s=0.02, sigma=0.1, tokens=5, method="history", ports=ports)
        with LoadEndpoints(2, **fleet):
            gens = Generators(
                streams, addresses, concurrency=4, sampling=SamplingConfig(n=2, max_tokens=5),
                reward_fn=math_reward, seed=0, timeout_s=None, stall_s=2.0, metrics=metrics,
                history_carry_tokens=1000,
            ).start()  # fmt: skip
            try:
                epoch(streams, 0)
            except BaseException:
                gens.stop()
                raise
        try:
            with LoadEndpoints(2, **fleet):
                new = RolloutClient(addresses[0]).status().instance
                assert gens.carry is not None
                wait_for(lambda: all(gens.carry.instance(r) == new for r in addresses), 10, "the restart")
                epoch(streams, 1)
                epoch(streams, 2)
        finally:
            gens.stop()
        done = [json.loads(fields["data"]) for _, fields in streams.r.xrange(streams.rollouts)]
    carried = {(g["batch"], s["text"]) for g in done for s in g["samples"]}
    assert carried == {(0, "history=0"), (1, "history=2"), (2, "history=0")}, carried
    assert registry.get_sample_value("specrl_generation_history_carried_tokens_total") == 6 * 2 * 5
