"""The generators' idle clock (orchestrator/generation.py): time with no Generate call in
flight, per replica and for the replicas together, so one idle replica among many shows
(issue 31). Driven by a stepped clock, not by sleeping."""

from __future__ import annotations

import pytest

from specrl.orchestrator import generation
from specrl.orchestrator.generation import IdleClock


@pytest.fixture
def clock(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(generation.time, "perf_counter", lambda: now[0])
    return now


def test_each_replica_and_the_whole_fleet_count_their_own_idle_time(clock):
    idle = IdleClock()
    for key in (IdleClock.ANY, "a", "b"):
        idle.watch(key)

    def call(replica: str, delta: int) -> None:
        idle.busy(IdleClock.ANY, delta)
        idle.busy(replica, delta)

    clock[0] += 2  # all idle for 2 s
    call("a", +1)
    clock[0] += 3  # a busy, b idle
    call("a", +1)  # a second call on a
    call("a", -1)
    clock[0] += 1
    call("a", -1)  # a idle again at 106
    clock[0] += 4
    assert idle.seconds("a") == pytest.approx(2 + 4)
    assert idle.seconds("b") == pytest.approx(10)
    assert idle.seconds(IdleClock.ANY) == pytest.approx(2 + 4)  # "any call in flight" hides b


def test_a_replica_that_joins_late_counts_from_when_it_joined(clock):
    idle = IdleClock()
    idle.watch("a")
    clock[0] += 5
    idle.watch("late")
    idle.watch("a")  # watching again changes nothing
    clock[0] += 1
    assert idle.seconds("late") == pytest.approx(1) and idle.seconds("a") == pytest.approx(6)
    assert idle.seconds("never-watched") == 0.0
