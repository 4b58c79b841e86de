"""The run's Redis streams against a real redis-server: every group is handed on exactly
once through generator deaths, orchestrator restarts, duplicates and a Redis restart."""

from __future__ import annotations

import time

import pytest

from specrl.queue.redis_server import RedisServer
from specrl.queue.streams import PromptGroup, RolloutGroup, RunStreams, SampleRecord

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def redis_server(tmp_path):
    with RedisServer(tmp_path / "redis") as server:
        yield server


def _prompt(i: int, batch: int = 0) -> PromptGroup:
    return PromptGroup(f"{batch}-{i}", batch, [1, 2, i], f"Q{i}", str(i), admitted_version=0)


def _rollout(p: PromptGroup, version: int = 0) -> RolloutGroup:
    sample = SampleRecord([5, 6], [-0.1, -0.2], "x", 1.0, "stop", version, 0)
    return RolloutGroup(
        p.group_id, p.batch, p.prompt_ids, p.prompt, p.answer, [sample], "r:1", 0.1, 0.0, p.admitted_version
    )


def _generate_all(streams: RunStreams, consumer: str = "gen-0") -> int:
    n = 0
    while (d := streams.next_prompt(consumer, block_ms=50)) is not None:
        streams.finish(d.entry_id, _rollout(d.group))
        n += 1
    return n


def test_groups_flow_from_prompts_to_trained_exactly_once(redis_server):
    streams = RunStreams.connect(redis_server.url, "t1")
    streams.publish([_prompt(i) for i in range(5)])
    assert streams.depths() == {"prompts": 5, "rollouts": 0}
    assert _generate_all(streams) == 5
    assert streams.depths() == {"prompts": 0, "rollouts": 5}
    got = streams.take_rollouts("orch", count=10, block_ms=50)
    assert sorted(d.group.group_id for d in got) == [f"0-{i}" for i in range(5)]
    assert all(isinstance(d.group, RolloutGroup) and not d.redelivered for d in got)
    streams.complete([d.entry_id for d in got], [d.group for d in got], {"version": 1})
    assert streams.depths() == {"prompts": 0, "rollouts": 0}
    assert streams.trained_already(["0-0", "0-4", "9-9"]) == [True, True, False]
    assert streams.get_state() == {"version": "1"}
    assert streams.take_rollouts("orch", count=10, block_ms=50) == []


@pytest.mark.timed
def test_a_dead_generators_prompt_is_reclaimed_and_a_failed_one_requeued(redis_server):
    streams = RunStreams.connect(redis_server.url, "t2", reclaim_idle_s=0.3)
    streams.publish([_prompt(0), _prompt(1)])
    dead = streams.next_prompt("gen-dead")  # taken, never finished
    assert dead is not None and dead.group.group_id == "0-0"
    failed = streams.next_prompt("gen-1")
    assert failed is not None
    streams.retry(failed.entry_id, failed.group)
    again = streams.next_prompt("gen-1", block_ms=50)
    assert again is not None and again.group == failed.group and not again.redelivered
    streams.finish(again.entry_id, _rollout(again.group))
    assert streams.next_prompt("gen-1", block_ms=50) is None, "0-0 is not idle long enough yet"
    time.sleep(0.4)
    reclaimed = streams.next_prompt("gen-1", block_ms=50)
    assert reclaimed is not None and reclaimed.redelivered and reclaimed.group.group_id == "0-0"
    streams.finish(reclaimed.entry_id, _rollout(reclaimed.group))
    assert streams.depths() == {"prompts": 0, "rollouts": 2}


def test_a_restarted_orchestrator_recovers_what_it_took_and_duplicates_are_detected(redis_server):
    streams = RunStreams.connect(redis_server.url, "t3")
    streams.publish([_prompt(i) for i in range(3)])
    _generate_all(streams)
    taken = streams.take_rollouts("orch", count=2, block_ms=50)
    assert len(taken) == 2
    # the orchestrator dies before training on them: a new one under the same name
    restarted = RunStreams.connect(redis_server.url, "t3")
    recovered = restarted.recover("orch")
    assert {d.entry_id for d in recovered} == {d.entry_id for d in taken}
    assert all(d.redelivered for d in recovered)
    restarted.complete([d.entry_id for d in recovered], [d.group for d in recovered], {})
    # a slow generator finishes 0-0 a second time: the group is known as trained
    restarted.finish("0-0", _rollout(_prompt(0)))
    rest = restarted.take_rollouts("orch", count=10, block_ms=50)
    ids = [d.group.group_id for d in rest]
    assert sorted(ids) == ["0-0", "0-2"]
    assert restarted.trained_already(ids) == [gid == "0-0" for gid in ids]


def test_queues_survive_a_redis_restart_with_the_append_only_file(tmp_path):
    data = tmp_path / "redis"
    server = RedisServer(data).start()
    streams = RunStreams.connect(server.url, "t4")
    streams.publish([_prompt(i) for i in range(4)])
    d = streams.next_prompt("gen-0")
    assert d is not None
    streams.finish(d.entry_id, _rollout(d.group))
    streams.complete([], [_rollout(_prompt(9, batch=2))], {"version": 3})
    server.stop()
    with RedisServer(data, port=server.port) as again:
        streams = RunStreams.connect(again.url, "t4")
        assert streams.depths() == {"prompts": 3, "rollouts": 1}
        assert streams.get_state() == {"version": "3"}
        assert streams.trained_already(["2-9"]) == [True]
        assert _generate_all(streams) == 3


def _train(streams: RunStreams, step: int, count: int) -> list[str]:
    """Take `count` rollout groups and record them as trained at `step`, kept for replay."""
    got = streams.take_rollouts("orch", count=count, block_ms=50)
    assert len(got) == count
    streams.complete(
        [d.entry_id for d in got], [d.group for d in got], {"version": step + 1}, replay_step=step
    )
    return sorted(d.group.group_id for d in got)


def test_resume_replays_the_steps_after_the_checkpoint_and_regenerates_a_lost_policys_groups(redis_server):
    """Two steps trained, a checkpoint at version 1, one group of the lost version 2
    queued and one prompt held by a dead generator: resuming at version 1 trains step 1's
    groups again, generates the version-2 group again and requeues the held prompt."""
    streams = RunStreams.connect(redis_server.url, "t7")
    streams.publish([_prompt(i, batch=0) for i in range(2)])
    _generate_all(streams)
    step0 = _train(streams, 0, 2)
    streams.flush(1)  # a checkpoint holds version 1
    streams.publish([_prompt(i, batch=1) for i in range(2)] + [_prompt(0, batch=2), _prompt(1, batch=2)])
    for _ in range(2):
        d = streams.next_prompt("gen-0")
        streams.finish(d.entry_id, _rollout(d.group, version=1))
    step1 = _train(streams, 1, 2)
    d = streams.next_prompt("gen-0")  # batch 2, generated by version 2 (lost with the trainer)
    streams.finish(d.entry_id, _rollout(d.group, version=2))
    held = streams.next_prompt("gen-dead")  # the generator dies with the orchestrator
    assert held is not None and held.group.group_id == "2-1"

    restarted = RunStreams.connect(redis_server.url, "t7")
    assert restarted.resume(1) == {"replayed": 2, "retired": 1, "requeued": 1}
    assert restarted.get_state()["version"] == "1"
    assert restarted.trained_already(step0 + step1 + ["2-0"]) == [True, True, False, False, True]
    again = restarted.take_rollouts("orch", count=10, block_ms=50)
    assert sorted(d.group.group_id for d in again) == step1
    prompts = [restarted.next_prompt("gen-1", block_ms=50) for _ in range(2)]
    assert sorted(p.group.group_id for p in prompts) == ["2-0.v1", "2-1"]
    assert restarted.next_prompt("gen-1", block_ms=50) is None
    assert restarted.resume(1) == {"replayed": 0, "retired": 0, "requeued": 2}, "resume again: nothing lost"


def test_resume_before_any_checkpoint_replays_from_the_start(redis_server):
    streams = RunStreams.connect(redis_server.url, "t8")
    streams.publish([_prompt(0, batch=0), _prompt(0, batch=1)])
    d = streams.next_prompt("gen-0")
    streams.finish(d.entry_id, _rollout(d.group, version=0))
    _train(streams, 0, 1)
    d = streams.next_prompt("gen-0")
    streams.finish(d.entry_id, _rollout(d.group, version=1))
    _train(streams, 1, 1)
    assert streams.resume(0) == {"replayed": 1, "retired": 1, "requeued": 0}
    assert [d.group.group_id for d in streams.take_rollouts("orch", count=10, block_ms=50)] == ["0-0"]
    assert streams.next_prompt("gen-0", block_ms=50).group.group_id == "1-0.v0"


def test_an_unreachable_redis_is_a_clear_error():
    with pytest.raises(ConnectionError, match="not reachable"):
        RunStreams.connect("redis://127.0.0.1:1/0", "t5")


def test_a_stale_group_is_retired_and_its_prompt_admitted_again_atomically(redis_server):
    streams = RunStreams.connect(redis_server.url, "t6")
    streams.publish([_prompt(0)])
    _generate_all(streams)
    (stale,) = streams.take_rollouts("orch", count=10, block_ms=50)
    again = PromptGroup("0-0.r1", 1, stale.group.prompt_ids, "Q0", "0", admitted_version=1)
    streams.replace(stale.entry_id, "0-0", again)
    assert streams.depths() == {"prompts": 1, "rollouts": 0}
    assert streams.trained_already(["0-0", "0-0.r1"]) == [True, False]
    taken = streams.next_prompt("gen-0", block_ms=50)
    assert taken is not None and taken.group == again


def test_a_redis_server_dies_with_the_process_that_started_it(tmp_path):
    """`specrl run` killed by SIGKILL must not leave its Redis (or engines, trainers:
    same `die_with_parent` hook) running."""
    import os
    import signal
    import subprocess
    import sys

    code = (
        "import sys, time\n"
        "from specrl.queue.redis_server import RedisServer\n"
        f"s = RedisServer({str(tmp_path / 'r')!r}).start()\n"
        "print(s.proc.pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    redis_pid = int(parent.stdout.readline())
    assert _alive(redis_pid)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if not _alive(redis_pid):
            return
        time.sleep(0.1)
    os.kill(redis_pid, signal.SIGKILL)
    pytest.fail("redis-server outlived the process that started it")


def _alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper has exited)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_redis_with_a_password_is_reached_with_it_and_refused_without(redis_server):
    import redis

    admin = redis.Redis.from_url(redis_server.url)
    admin.config_set("requirepass", "s3cret")  # what the chart's Redis runs with
    try:
        with pytest.raises((ConnectionError, redis.exceptions.RedisError)):
            RunStreams.connect(redis_server.url, "r")
        streams = RunStreams.connect(redis_server.url, "r", password="s3cret")
        streams.publish([_prompt(0)])
        assert streams.next_prompt("gen-0", block_ms=50).group.group_id == "0-0"
    finally:
        redis.Redis.from_url(redis_server.url, password="s3cret").config_set("requirepass", "")
