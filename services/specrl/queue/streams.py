"""The run's work queues on Redis streams, with at-least-once delivery and no duplicates.

Two streams per run, each with one consumer group:
  prompts   (group "generators"): prompt groups admitted for generation, each stamped
            with the trainer step it is meant for and the policy version at admission;
  rollouts  (group "trainer"): finished groups (n samples with rewards, logprobs and the
            policy / draft versions that produced them).

An entry is acknowledged only when its consumer is done with it, in the same MULTI/EXEC
transaction that hands the result on (a finished rollout group is added and its prompt
acknowledged together; a trained group is acknowledged and recorded as trained
together), so a crash at any point leaves every group either pending (and reclaimed by
the next consumer after `reclaim_idle_s`) or handed on, never lost. Trained group ids
are kept in a set, so a group delivered twice (a slow consumer whose entry was
reclaimed) is trained on once.

Resume: a trained group stays replayable until a trainer checkpoint holds its update.
`complete` keeps a copy of each step's groups under that step ("unflushed"); `flush`
forgets the steps a checkpoint covers; `resume` rolls the queues back to the version the
restarted trainer has (see `resume`).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import redis

GENERATORS = "generators"
TRAINER = "trainer"


@dataclass(frozen=True)
class PromptGroup:
    """One prompt to be sampled n times (a GRPO group)."""

    group_id: str
    batch: int  # trainer step the group is meant for
    prompt_ids: list[int]
    prompt: str
    answer: str
    admitted_version: int  # policy version when generation was admitted
    attempts: int = 0  # Generate calls that failed on it so far (orchestrator.max_attempts)


@dataclass
class SampleRecord:
    completion_ids: list[int]
    logprobs: list[float]
    text: str
    reward: float
    finish_reason: str
    policy_version: int
    draft_version: int
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0


@dataclass
class RolloutGroup:
    group_id: str
    batch: int
    prompt_ids: list[int]
    prompt: str
    answer: str
    samples: list[SampleRecord]
    replica: str
    gen_seconds: float
    reward_seconds: float
    admitted_version: int
    started_at: float = 0.0  # wall clock (time.time()) when its Generate call started
    finished_at: float = 0.0  # and when the group was handed on
    error: str = ""  # set when the group failed for good (no samples): it is replaced

    @property
    def min_policy_version(self) -> int:
        return min(s.policy_version for s in self.samples)

    @staticmethod
    def from_json(data: str) -> RolloutGroup:
        d = json.loads(data)
        d["samples"] = [SampleRecord(**s) for s in d["samples"]]
        return RolloutGroup(**d)


def _newest(g: RolloutGroup) -> int:
    """The newest policy version among a group's samples (-1 for none)."""
    return max((s.policy_version for s in g.samples), default=-1)


@dataclass
class Delivery:
    entry_id: str
    group: PromptGroup | RolloutGroup
    redelivered: bool = False


class RunStreams:
    def __init__(self, client: redis.Redis, run: str, *, reclaim_idle_s: float = 300.0) -> None:
        self.r = client
        self.prefix = f"specrl:{run}:"
        self.prompts = self.prefix + "prompts"
        self.rollouts = self.prefix + "rollouts"
        # groups trained on, or retired (dropped as stale and replaced): a late copy of
        # one of them is never trained on
        self.trained = self.prefix + "trained"
        self.state = self.prefix + "state"
        self.unflushed = self.prefix + "unflushed"  # step -> its groups, until a checkpoint
        self.reclaim_idle_ms = int(reclaim_idle_s * 1000)

    @classmethod
    def connect(
        cls, url: str, run: str, *, password: str | None = None, max_connections: int = 16, **kw: float
    ) -> RunStreams:
        """`max_connections` bounds the connections of every thread using these streams
        together: one more caller waits for a free connection (up to 30 s)."""
        # RESP2 replies (redis-py's default), spelled out: the parsing below relies on it
        pool = redis.BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=30,
            password=password,
            decode_responses=True,
            socket_timeout=30,
            health_check_interval=10,
            protocol=2,
        )
        client = redis.Redis(connection_pool=pool)
        try:
            version = client.info("server")["redis_version"]
        except redis.exceptions.ConnectionError as e:
            raise ConnectionError(f"redis at {url} is not reachable: {e}") from None
        if int(version.split(".")[0]) < 7:
            raise ConnectionError(f"redis at {url} is {version}: specrl needs Redis >= 7 (XAUTOCLAIM)")
        streams = cls(client, run, **kw)
        streams.setup()
        return streams

    def setup(self) -> None:
        for stream, group in ((self.prompts, GENERATORS), (self.rollouts, TRAINER)):
            try:
                self.r.xgroup_create(stream, group, id="0", mkstream=True)
            except redis.exceptions.ResponseError as e:
                if "BUSYGROUP" not in str(e):
                    raise

    # -- generation side ------------------------------------------------------------

    def publish(self, groups: list[PromptGroup], state: dict[str, str | int] | None = None) -> None:
        """Admit groups for generation and save the run state (e.g. how far the data
        was read), atomically."""
        pipe = self.r.pipeline(transaction=True)
        self._add_prompts(pipe, groups)
        if state:
            pipe.hset(self.state, mapping={k: str(v) for k, v in state.items()})
        pipe.execute()

    def next_prompt(self, consumer: str, *, block_ms: int = 200) -> Delivery | None:
        """A prompt group to generate: one abandoned by a dead generator first, else a
        new one (waits up to `block_ms`)."""
        got = self.next_prompts(consumer, count=1, block_ms=block_ms)
        return got[0] if got else None

    def next_prompts(self, consumer: str, *, count: int, block_ms: int = 200) -> list[Delivery]:
        """Up to `count` prompt groups to generate: those abandoned by a dead generator
        first, else new ones (waits up to `block_ms` for the first)."""
        got = self._reclaim(self.prompts, GENERATORS, consumer, count=count)
        redelivered = bool(got)
        if not got:
            resp = self.r.xreadgroup(GENERATORS, consumer, {self.prompts: ">"}, count=count, block=block_ms)
            got = resp[0][1] if resp else []
        return [Delivery(e, PromptGroup(**json.loads(f["data"])), redelivered) for e, f in got]

    def touch(self, consumer: str, entries: list[str]) -> None:
        """Mark prompt entries still being generated as alive (their idle time reset), so
        that a long call is never reclaimed as abandoned."""
        if entries:
            self.r.xclaim(self.prompts, GENERATORS, consumer, 0, entries, justid=True)

    def finish(self, prompt_entry: str, group: RolloutGroup) -> None:
        """Hand a finished group to the trainer and acknowledge its prompt, atomically."""
        pipe = self.r.pipeline(transaction=True)
        pipe.xadd(self.rollouts, {"data": json.dumps(asdict(group))})
        self._done(pipe, self.prompts, GENERATORS, [prompt_entry])
        pipe.execute()

    def retry(self, prompt_entry: str, group: PromptGroup) -> None:
        """Give a prompt back (generation failed): re-queued at the end, atomically."""
        pipe = self.r.pipeline(transaction=True)
        self._add_prompts(pipe, [group])
        self._done(pipe, self.prompts, GENERATORS, [prompt_entry])
        pipe.execute()

    # -- training side --------------------------------------------------------------

    def recover(self, consumer: str) -> list[Delivery]:
        """Rollouts delivered to `consumer` and never acknowledged: what a restarted
        orchestrator had taken but not trained on."""
        own = self.r.xreadgroup(TRAINER, consumer, {self.rollouts: "0"})
        entries = [(e, f) for e, f in (own[0][1] if own else []) if f]
        return [Delivery(e, RolloutGroup.from_json(f["data"]), True) for e, f in entries]

    def take_rollouts(self, consumer: str, *, count: int, block_ms: int = 200) -> list[Delivery]:
        """Finished groups for the trainer: any left too long by a consumer (dead, or
        this one: callers skip entries they hold already), else new ones (waits up to
        `block_ms`)."""
        entries = [(e, f, True) for e, f in self._reclaim(self.rollouts, TRAINER, consumer, count=count)]
        if not entries:
            resp = self.r.xreadgroup(TRAINER, consumer, {self.rollouts: ">"}, count=count, block=block_ms)
            entries = [(e, f, False) for e, f in (resp[0][1] if resp else [])]
        return [Delivery(e, RolloutGroup.from_json(f["data"]), again) for e, f, again in entries]

    def trained_already(self, group_ids: list[str]) -> list[bool]:
        return [bool(x) for x in self.r.smismember(self.trained, group_ids)] if group_ids else []

    def complete(
        self,
        entries: list[str],
        groups: list[RolloutGroup],
        state: dict[str, str | int],
        *,
        replay_step: int | None = None,
    ) -> None:
        """Acknowledge consumed rollout entries, record their groups as trained and save
        the run state (e.g. the policy version), atomically. With `replay_step`, the
        groups are also kept under that step until `flush` (a restarted trainer that
        lost the step trains on them again)."""
        pipe = self.r.pipeline(transaction=True)
        self._done(pipe, self.rollouts, TRAINER, entries)
        if groups:
            pipe.sadd(self.trained, *(g.group_id for g in groups))
        if replay_step is not None:
            pipe.hset(self.unflushed, str(replay_step), json.dumps([asdict(g) for g in groups]))
        if state:
            pipe.hset(self.state, mapping={k: str(v) for k, v in state.items()})
        pipe.execute()

    def flush(self, version: int) -> None:
        """A checkpoint holds policy `version`: the steps before it need no replay."""
        done = [s for s in self.r.hkeys(self.unflushed) if int(s) < version]
        if done:
            self.r.hdel(self.unflushed, *done)

    def resume(self, version: int) -> dict[str, int]:
        """Roll the run back to policy `version` (what the restarted trainer loaded),
        atomically, before any generator starts:
          - the groups of steps >= `version` go back to the rollout stream, no longer
            recorded as trained (that training was lost with the trainer);
          - groups generated by a policy newer than `version` (a lineage that no longer
            exists), queued or in a lost step, are retired and their prompts admitted
            again;
          - prompts taken by generators of the previous orchestrator (all dead) are
            queued again.
        Returns counts of what was replayed, retired and requeued."""
        counts = {"replayed": 0, "retired": 0, "requeued": 0}
        pipe = self.r.pipeline(transaction=True)
        lost: list[RolloutGroup] = []
        lost_steps = [s for s in self.r.hkeys(self.unflushed) if int(s) >= version]
        # steps before `version` are held by the checkpoint (their flush was cut short)
        for data in self.r.hmget(self.unflushed, lost_steps) if lost_steps else []:
            for g in (RolloutGroup.from_json(json.dumps(x)) for x in json.loads(data)):
                if _newest(g) > version:
                    lost.append(g)
                    continue
                pipe.srem(self.trained, g.group_id)
                pipe.xadd(self.rollouts, {"data": json.dumps(asdict(g))})
                counts["replayed"] += 1
        for entry, fields in self.r.xrange(self.rollouts):
            g = RolloutGroup.from_json(fields["data"])
            if _newest(g) > version:
                self._done(pipe, self.rollouts, TRAINER, [entry])
                lost.append(g)
        for g in lost:
            again = PromptGroup(
                f"{g.group_id}.v{version}",
                g.batch,
                g.prompt_ids,
                g.prompt,
                g.answer,
                admitted_version=version,
            )
            pipe.sadd(self.trained, g.group_id)  # a late copy is never trained on
            self._add_prompts(pipe, [again])
            counts["retired"] += 1
        n_taken = self.r.xpending(self.prompts, GENERATORS)["pending"]
        taken = (
            {p["message_id"] for p in self.r.xpending_range(self.prompts, GENERATORS, "-", "+", n_taken)}
            if n_taken
            else set()
        )
        for entry, fields in self.r.xrange(self.prompts):
            if entry in taken:
                pipe.xadd(self.prompts, fields)
                self._done(pipe, self.prompts, GENERATORS, [entry])
                counts["requeued"] += 1
        if lost_steps:
            pipe.hdel(self.unflushed, *lost_steps)
        pipe.hset(self.state, mapping={"version": str(version)})
        pipe.execute()
        return counts

    def discard(self, entries: list[str]) -> None:
        """Acknowledge entries that will never be trained on (duplicates)."""
        pipe = self.r.pipeline(transaction=True)
        self._done(pipe, self.rollouts, TRAINER, entries)
        pipe.execute()

    def replace(self, entry: str, retired: str, again: PromptGroup) -> None:
        """Retire a rollout group that will never be trained on (stale) and admit its
        prompt again as `again`, atomically: a late copy of the retired group is
        recognized as one, and the prompt is never lost in between."""
        pipe = self.r.pipeline(transaction=True)
        self._done(pipe, self.rollouts, TRAINER, [entry])
        pipe.sadd(self.trained, retired)
        self._add_prompts(pipe, [again])
        pipe.execute()

    # -- state ----------------------------------------------------------------------

    def get_state(self) -> dict[str, str]:
        return self.r.hgetall(self.state)

    def exists(self) -> bool:
        """Whether this run has state in Redis (a previous run under the same name)."""
        return bool(self.r.exists(self.state, self.trained)) or any(self.depths().values())

    def depths(self) -> dict[str, int]:
        """Groups waiting or in progress: prompts not yet generated, rollouts not yet
        trained on (acknowledged entries are deleted, so the stream length is the depth)."""
        return {"prompts": self.r.xlen(self.prompts), "rollouts": self.r.xlen(self.rollouts)}

    def clear(self) -> None:
        """Forget the run (a fresh start under the same name)."""
        self.r.delete(self.prompts, self.rollouts, self.trained, self.state, self.unflushed)
        self.setup()

    def _add_prompts(self, pipe, groups: list[PromptGroup]) -> None:
        for g in groups:
            pipe.xadd(self.prompts, {"data": json.dumps(asdict(g))})

    @staticmethod
    def _done(pipe, stream: str, group: str, entries: list[str]) -> None:
        """Acknowledge entries and delete them (the stream length stays the depth)."""
        if entries:
            pipe.xack(stream, group, *entries)
            pipe.xdel(stream, *entries)

    def _reclaim(self, stream: str, group: str, consumer: str, *, count: int) -> list:
        resp = self.r.xautoclaim(stream, group, consumer, self.reclaim_idle_ms, "0-0", count=count)
        return [(e, f) for e, f in resp[1] if f]
