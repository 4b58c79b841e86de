"""Generation: turns admitted prompt groups into rewarded rollout groups, on one asyncio
event loop in one thread, however many replicas and calls in flight there are.

Each replica has one gRPC channel (grpc.aio) and at most its slots of Generate calls in
flight (one prompt group of n samples each): `concurrency` when given, else sized from
the capacity the replica reports (`slots_for`: its engine's max_num_seqs and n). A
dispatcher takes prompts from the queue only for free slots, in batches, and gives each to
the replica with the most free slots, so faster replicas take more work and none holds
more than its slots. Redis and the reward function
run on a small thread pool (`workers`): the orchestrator's threads and Redis connections
stay bounded whatever replicas x concurrency is (48 replicas x 512 slots was 24,576
threads, each polling Redis, when every slot had its own). Replicas can join (`add`,
paused until they hold the current policy) and leave (`remove`: their calls in flight
finish, then the channel closes) while the run goes on.

The watchdog reads every replica's status each pass (concurrently, one small GetStatus
each): its progress, its load (specrl_rollout_replica_tokens_per_second) and its capacity
(slots). Each call's wait in the queue is observed when it starts
(specrl_generation_queue_wait_seconds, by the replica that took it).

Failures never lose a prompt and never spin on it forever:
  - a replica that is down or not ready (UNAVAILABLE, ...) gets the prompt given back to
    the queue, and its slot backs off;
  - a replica the trainer could not update is paused by the orchestrator, and samples
    older than the lag bound allows are given back rather than rewarded;
  - a request the replica refuses for good (INVALID_ARGUMENT: e.g. a prompt longer than
    its context) ends the group as failed, with the reason; the orchestrator replaces it;
  - a group whose call fails otherwise (deadline passed, an internal error) goes back
    with its failures counted; at `max_attempts` it ends as failed too, so a group no
    replica can finish is never retried forever;
  - a reward function that raises scores the sample 0 and is counted and logged;
  - an orchestrator that dies leaves its prompts pending, reclaimed after
    `reclaim_idle_s` by the next;
  - when the run stops, calls in flight are cancelled (the replica aborts them) and
    their prompts given back: a run stopping because a service died does not wait for
    generations nobody will train on.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import grpc
import redis

from specrl.config import SamplingConfig
from specrl.data.rewards import RewardFn
from specrl.metrics import OrchestratorMetrics
from specrl.orchestrator.carry import HistoryCarry
from specrl.queue.streams import Delivery, PromptGroup, RolloutGroup, RunStreams, SampleRecord
from specrl.rollout.api import AsyncRolloutClient
from specrl.v1 import rollout_pb2 as rpb

log = logging.getLogger("specrl.orchestrator.generation")

T = TypeVar("T")
CONSUMER = "generation"  # this orchestrator's name in the prompt stream's consumer group
FETCH_MAX = 256  # prompts taken from the queue per read, at most
DEMAND_EVERY_S = 1.0  # how often the demand gauge (autoscaling's input) is read from Redis
WATCH_EVERY_S = 10.0  # the progress watchdog's period, at most (and the entries' touch)
# A replica's slots while its capacity is unknown (its status not read yet, unanswered, or
# not reporting max_num_seqs), with no orchestrator.concurrency.
FALLBACK_SLOTS = 16
# Slots per replica relative to the groups its engine batches at once (see `slots_for`).
SLOT_MARGIN = 1.25
RATE_MIN_S = 1.0  # the shortest time between two status reads a tokens/s is measured over
CLOCK_EVERY_S = 30.0  # how often the offset of Redis's clock from ours is measured
_FINISH = {
    rpb.FINISH_REASON_STOP: "stop",
    rpb.FINISH_REASON_LENGTH: "length",
    rpb.FINISH_REASON_ABORT: "abort",
}
# Refusals that another try cannot fix: the group fails (the orchestrator replaces it).
_FINAL = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED,
}
# Failures of the call itself, counted against the group (orchestrator.max_attempts).
# Not counted: a replica down or not ready (UNAVAILABLE, FAILED_PRECONDITION), whose group
# another replica takes, and cancellation by stop.
_COUNTED = {
    grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.INTERNAL,
    grpc.StatusCode.UNKNOWN,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
    grpc.StatusCode.DATA_LOSS,
}


def slots_for(max_num_seqs: int, n: int) -> int:
    """Generate calls (groups of `n` samples) to keep in flight on a replica whose engine
    batches `max_num_seqs` sequences at once: ceil(1.25 x max_num_seqs / n), at least 1.
    ceil(max_num_seqs / n) alone fills the batch only at the start: a group holds its slot
    until its last (longest) sample ends while its finished samples leave the batch, and
    a new call takes a round trip and a prefill before it decodes. A quarter more groups
    wait in the engine's own queue and refill the batch as sequences finish; not more, so
    that few groups sit queued inside one replica while another is free (their policy
    version aging). 0 (capacity unknown): FALLBACK_SLOTS."""
    if max_num_seqs <= 0:
        return FALLBACK_SLOTS
    return max(1, math.ceil(SLOT_MARGIN * max_num_seqs / max(1, n)))


def queue_wait_s(entry_id: str, now: float) -> float | None:
    """Seconds from a prompt's admission to the queue until `now` (time.time(), on Redis's
    clock): a stream entry's id is "<ms>-<seq>", <ms> the Redis server's clock in
    milliseconds since the epoch at the XADD that admitted it, so the queue needs no
    timestamp of its own. A group given back after a failed call is added again under a
    new id: its wait counts from the re-queue. None for an id of another form."""
    try:
        ms = int(entry_id.split("-", 1)[0])
    except ValueError:
        return None
    return max(0.0, now - ms / 1000.0)


def prompt_key(group: PromptGroup) -> bytes:
    """A prompt's identity for routing and carried history."""
    return hashlib.blake2b(str(group.prompt_ids).encode(), digest_size=16).digest()


def request_seed(run_seed: int, group_id: str) -> int:
    """Each group's sampling seed: a function of the run seed and the group alone, so a
    group is sampled the same way whichever replica takes it."""
    digest = hashlib.sha256(f"{run_seed}:{group_id}".encode()).digest()
    return int.from_bytes(digest[:7], "big")


class IdleClock:
    """Time with no Generate call in flight, per key (a replica, or ANY for the replicas
    together), counted from when the key is first watched. Thread-safe."""

    ANY = ""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._in_flight: dict[str, int] = {}
        self._since: dict[str, float | None] = {}
        self._total: dict[str, float] = {}

    def watch(self, key: str) -> None:
        with self._lock:
            if key not in self._in_flight:
                self._in_flight[key], self._since[key], self._total[key] = 0, time.perf_counter(), 0.0

    def busy(self, key: str, delta: int) -> None:
        """`delta` calls started (+) or ended (-) on `key`."""
        with self._lock:
            now = time.perf_counter()
            since = self._since[key]
            if self._in_flight[key] == 0 and delta > 0 and since is not None:
                self._total[key] += now - since
                self._since[key] = None
            self._in_flight[key] += delta
            if self._in_flight[key] == 0:
                self._since[key] = now

    def seconds(self, key: str) -> float:
        with self._lock:
            since = self._since.get(key)
            return self._total.get(key, 0.0) + (time.perf_counter() - since if since is not None else 0.0)


class Generators:
    def __init__(
        self,
        streams: RunStreams,
        replicas: list[str],
        *,
        concurrency: int | None,
        sampling: SamplingConfig,
        reward_fn: RewardFn,
        seed: int,
        timeout_s: float | None,
        stall_s: float = 120.0,
        max_attempts: int = 4,
        metrics: OrchestratorMetrics | None = None,
        retry_backoff_s: float = 1.0,
        stop_token_ids: tuple[int, ...] = (),
        workers: int = 8,
        prompt_affinity: bool | None = None,
        history_carry_tokens: int = 0,
    ) -> None:
        self.streams = streams
        self.replicas = replicas
        # slots per replica; None: each replica's from its capacity (`slots_for`)
        self.concurrency = concurrency
        # a prompt's groups to one replica while it has room (`_choose`); None: when some
        # replica reports drafting from history (method history, or hybrid with a draft model)
        self.prompt_affinity = prompt_affinity
        # the last responses per prompt, for replicas without them (carry.py); None: off
        self.carry = HistoryCarry(history_carry_tokens) if history_carry_tokens else None
        self.sampling = sampling
        self.stop_token_ids = stop_token_ids  # the data's (PromptSource.stop_token_ids)
        self.reward_fn = reward_fn
        self.seed = seed
        self.timeout_s = timeout_s
        self.stall_s = stall_s
        self.max_attempts = max_attempts
        self.metrics = metrics
        self.retry_backoff_s = retry_backoff_s
        # Samples generated by an older policy than this are given back (set by the
        # orchestrator to the trainer's version minus the lag bound).
        self.min_version = 0
        # ... and samples by a newer policy than this are too (a replica still serving a
        # policy lost with a crash, before a resumed run's rewind reached it).
        self.max_version = 0
        self.errors: dict[str, str] = {}
        self.reward_errors = 0
        self._paused: set[str] = set()
        # Replicas found serving a policy outside [min_version, max_version] (a rollout
        # server started again on its address comes back on its initial weights).
        self.behind: set[str] = set()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="generation")
        self._idle = IdleClock()
        self._idle.watch(IdleClock.ANY)
        # the event loop's own state, touched only on its thread
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._wake: asyncio.Event | None = None
        self._clients: dict[str, AsyncRolloutClient] = {}
        self._in_flight: dict[str, int] = {}
        self._slots: dict[str, int] = {}  # per replica: the calls it may have in flight
        self._history_replicas: set[str] = set()  # replicas that draft from history
        self._reading: set[str] = set()  # replicas whose capacity is being read at join
        # per replica: tokens_generated at a status read, and when (monotonic): its tokens/s
        self._rate: dict[str, tuple[int, float]] = {}
        self._redis_offset = 0.0  # Redis's clock minus ours (time.time()), seconds
        self._calls: dict[str, dict[asyncio.Task, Delivery]] = {}  # per replica, in flight
        # per replica: its engine's tokens_generated when last seen to change, and when
        # (or when it got work, if later); replicas stalled, and since when
        self._progress: dict[str, tuple[int | None, float]] = {}
        self._stalled: dict[str, float] = {}
        self._leaving: set[str] = set()
        self._tasks: set[asyncio.Task] = set()
        self._failed_start: Exception | None = None

    # -- control, from the orchestrator's thread --------------------------------------

    def start(self) -> Generators:
        ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, args=(ready,), name="generation", daemon=True)
        self._thread.start()
        ready.wait()
        if self._failed_start is not None:
            raise self._failed_start
        return self

    def add(self, replica: str) -> None:
        """A replica that joined the run: paused until the orchestrator has pushed it the
        current policy (then `resume`)."""
        if replica in self.replicas:
            return
        self._paused.add(replica)
        self.replicas.append(replica)
        self._on_loop(self._join, replica)

    def remove(self, replica: str) -> None:
        """A replica that left: its calls in flight finish, then its channel closes."""
        if replica in self.replicas:
            self.replicas.remove(replica)
        self._paused.discard(replica)
        self.behind.discard(replica)
        self._on_loop(self._leave, replica)

    def stop(self, join_s: float = 30.0) -> None:
        """Stop taking prompts and cancel the calls in flight; their prompts go back to
        the queue, or stay pending for the next run if Redis is down too."""
        self._stop.set()
        self._on_loop(self._cancel_all)
        if self._thread is not None:
            self._thread.join(join_s)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def pause(self, replica: str) -> None:
        """Send nothing to `replica` (it missed a weight update) until resumed."""
        if replica not in self._paused:
            log.warning("pausing generation on %s: it did not take the last weight update", replica)
        self._paused.add(replica)

    def resume(self, replica: str) -> None:
        """`replica` serves the current policy again."""
        self._paused.discard(replica)
        self.behind.discard(replica)
        self._on_loop(self._notify)

    def need_update(self) -> bool:
        """Some replica is paused or behind: it needs the current policy pushed to it."""
        return bool(self._paused or self.behind)

    def idle_seconds(self) -> float:
        """Total time so far with no Generate call in flight on any replica."""
        return self._idle.seconds(IdleClock.ANY)

    def slots(self) -> dict[str, int]:
        """Per replica of the generators now: the Generate calls it may have in flight."""
        return dict(self._slots)

    def reading(self) -> set[str]:
        """Replicas joined whose status (capacity, speculation) is still being read: they
        get no work until it is."""
        return set(self._reading)

    def replica_idle_seconds(self) -> dict[str, float]:
        """Per replica of the run now: total time so far with no call in flight on it
        (one idle replica among many is invisible in `idle_seconds`)."""
        return {r: self._idle.seconds(r) for r in list(self.replicas)}

    def _on_loop(self, fn: Callable[..., None], *args: object) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(RuntimeError):  # closed meanwhile: generation is over
                loop.call_soon_threadsafe(fn, *args)

    # -- the event loop ---------------------------------------------------------------

    def _serve(self, ready: threading.Event) -> None:
        loop = self._loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._wake = asyncio.Event()
        try:
            for replica in list(self.replicas):
                self._join(replica)
        except Exception as e:  # e.g. unreadable TLS files: `start` raises it
            self._failed_start = e
            for task in list(self._tasks):  # the status reads of replicas joined before
                task.cancel()
            loop.run_until_complete(asyncio.gather(*self._tasks, return_exceptions=True))
            loop.close()
            return
        finally:
            ready.set()
        try:
            loop.run_until_complete(self._dispatch())
        finally:
            loop.run_until_complete(self._close())
            loop.close()

    def _join(self, replica: str) -> None:
        self._idle.watch(replica)
        self._leaving.discard(replica)
        if replica not in self._clients:
            self._clients[replica] = AsyncRolloutClient(replica, timeout=self.timeout_s)
            self._in_flight[replica] = 0
            self._calls[replica] = {}
            self._slots[replica] = self.concurrency or FALLBACK_SLOTS
            if self.concurrency is None or self.prompt_affinity is None:
                # no work until its capacity and method are read (or found unreadable)
                self._reading.add(replica)
            self._spawn(self._read_status(replica))
        if self.metrics:
            self.metrics.generation_slots.labels(replica=replica).set(self._slots[replica])
            self.metrics.generation_in_flight.labels(replica=replica)  # 0 until a call
            self.metrics.generation_queue_wait.labels(replica=replica)  # empty until a call
        self._notify()

    async def _read_status(self, replica: str) -> None:
        """A joining replica's capacity (its slots) and tokens so far; a replica that does
        not answer yet keeps FALLBACK_SLOTS until a watchdog pass reads it."""
        try:
            status = await self._status(replica)
            if status is not None and replica in self._clients:
                self._observe(replica, status, time.monotonic())
            elif status is None and self.concurrency is None:
                log.info("%s: status unanswered; %d slots until it answers", replica, FALLBACK_SLOTS)
        finally:
            self._reading.discard(replica)
            self._notify()

    def _observe(self, replica: str, status: rpb.RolloutStatus, now: float) -> None:
        """A replica's status read: its slots from its capacity, and its tokens/s since
        the last read at least RATE_MIN_S ago (none over an engine restart: the count
        starts again; an unanswered read keeps the last one, so the next spans the gap)."""
        if status.speculation.history:
            self._history_replicas.add(replica)
            if self.carry:
                self.carry.observe(replica, status.instance)
        if self.concurrency is None:
            slots = slots_for(status.max_num_seqs, self.sampling.n)
            if slots != self._slots.get(replica):
                log.info(
                    "%s: %d slots (engine max_num_seqs %d, n %d)",
                    replica, slots, status.max_num_seqs, self.sampling.n,
                )  # fmt: skip
                self._slots[replica] = slots
                if self.metrics:
                    self.metrics.generation_slots.labels(replica=replica).set(slots)
                self._notify()
        tokens = status.tokens_generated
        last = self._rate.get(replica)
        if last is None or tokens < last[0]:
            self._rate[replica] = (tokens, now)
        elif now - last[1] >= RATE_MIN_S:
            self._rate[replica] = (tokens, now)
            if self.metrics:
                rate = (tokens - last[0]) / (now - last[1])
                self.metrics.replica_tokens_per_second.labels(replica=replica).set(rate)

    def _leave(self, replica: str) -> None:
        if replica in self._clients:
            self._leaving.add(replica)
            self._close_if_done(replica)

    def _close_if_done(self, replica: str) -> None:
        if replica in self._leaving and self._in_flight.get(replica) == 0:
            self._leaving.discard(replica)
            del self._in_flight[replica], self._calls[replica], self._slots[replica]
            self._history_replicas.discard(replica)
            if self.carry:
                self.carry.forget(replica)
            self._reading.discard(replica)
            self._rate.pop(replica, None)
            self._progress.pop(replica, None)
            self._stalled.pop(replica, None)
            if self.metrics:
                self.metrics.generation_slots.remove(replica)
                self.metrics.generation_in_flight.remove(replica)
                self.metrics.generation_queue_wait.remove(replica)
                self.metrics.replica_tokens_per_second.remove(replica)
            client = self._clients.pop(replica)
            self._spawn(client.close())

    def _notify(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def _cancel_all(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        self._notify()

    def _spawn(self, coro) -> asyncio.Task:
        """A task on the generators' loop (which may not run yet: the replicas at start)."""
        assert self._loop is not None
        task = self._loop.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _blocking(self, fn: Callable[..., T], *args: object, **kwargs: object) -> T:
        """`fn` (Redis, the reward function) on the pool, off the event loop."""
        return await asyncio.get_running_loop().run_in_executor(self._pool, lambda: fn(*args, **kwargs))

    def _free(self) -> dict[str, int]:
        """Free slots of the replicas that may take work now."""
        return {
            r: self._slots[r] - n
            for r, n in self._in_flight.items()
            if n < self._slots[r]
            and r not in self._reading
            and r not in self._leaving
            and r not in self._paused
            and r not in self._stalled
        }

    async def _dispatch(self) -> None:
        assert self._wake is not None
        self._spawn(self._publish_demand())
        self._spawn(self._watch())
        while not self._stop.is_set():
            free = self._free()
            if not free:
                self._wake.clear()
                # a slot freed, a replica joined or resumed, stop; or look again
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=0.5)
                continue
            want = min(sum(free.values()), FETCH_MAX)
            try:
                taken = await self._blocking(self.streams.next_prompts, CONSUMER, count=want, block_ms=200)
            except Exception as e:  # redis restarting: keep trying until stopped
                if not self._stop.is_set():
                    log.warning("prompt queue unavailable: %s", e)
                await asyncio.sleep(self.retry_backoff_s)
                continue
            for delivery in taken:
                free = self._free()  # pauses and leaves may have come while reading
                if self._stop.is_set() or not free:
                    self._spawn(self._requeue(delivery))
                    continue
                replica = self._choose(free, delivery.group)
                if self._in_flight[replica] == 0:  # progress is awaited from now on
                    self._progress[replica] = (self._progress.get(replica, (None, 0.0))[0], time.monotonic())
                self._in_flight[replica] += 1
                self._busy(replica, +1)
                self._calls[replica][self._spawn(self._run(replica, delivery))] = delivery

    def _choose(self, free: dict[str, int], group: PromptGroup) -> str:
        """The replica for a group: the one with the most free slots; or, with prompt
        affinity, the prompt's own among those with a free slot by rendezvous hashing, so
        a prompt that comes back (the next epoch) goes where its history and prefix cache
        are while that replica has room, and elsewhere, as stably, when it has none."""
        if not (self.prompt_affinity or (self.prompt_affinity is None and self._history_replicas)):
            return max(free, key=free.__getitem__)
        key = prompt_key(group)
        return max(free, key=lambda r: hashlib.blake2b(key + r.encode(), digest_size=8).digest())

    async def _close(self) -> None:
        """After the dispatcher stopped: let cancelled calls give their prompts back,
        then close the channels."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)
        await asyncio.gather(*(c.close() for c in self._clients.values()), return_exceptions=True)
        self._clients.clear()

    def _busy(self, replica: str, delta: int) -> None:
        self._idle.busy(IdleClock.ANY, delta)
        self._idle.busy(replica, delta)
        if self.metrics:
            self.metrics.generation_in_flight.labels(replica=replica).inc(delta)

    async def _publish_demand(self) -> None:
        """Sequences wanted now: n x the prompt groups in the queue (taken or not: a
        finished group's entry is deleted), for autoscaling on demand vs capacity. Also
        measures Redis's clock against ours now and then (queue waits: `queue_wait_s`)."""
        clock_at = -math.inf
        while not self._stop.is_set():
            if time.monotonic() - clock_at >= CLOCK_EVERY_S:
                try:
                    self._redis_offset = await self._blocking(self._measure_redis_offset)
                    clock_at = time.monotonic()
                except Exception:  # Redis away: the offset measured last stays
                    pass
            try:
                groups = (await self._blocking(self.streams.depths))["prompts"]
                if self.metrics:
                    self.metrics.generation_demand.set(groups * self.sampling.n)
            except Exception:  # Redis away: the dispatcher says so
                pass
            await asyncio.sleep(DEMAND_EVERY_S)

    def _measure_redis_offset(self) -> float:
        """Redis's clock (TIME) minus ours, from the fastest of three reads (to within half
        its round trip); 0 when within that (the clocks agree as far as can be told, as
        the same host's always do: a loaded machine's slow round trips add no error)."""
        rtt, offset = math.inf, 0.0
        for _ in range(3):
            t0 = time.time()
            seconds, micros = self.streams.r.time()
            t1 = time.time()
            if t1 - t0 < rtt:
                rtt, offset = t1 - t0, seconds + micros / 1e6 - (t0 + t1) / 2
        return 0.0 if abs(offset) <= rtt / 2 + 1e-6 else offset  # 1e-6: TIME's resolution

    async def _run(self, replica: str, delivery: Delivery) -> None:
        """One prompt group on one replica's slot; the slot is freed after any back-off."""
        try:
            await self._generate(replica, delivery)
        except asyncio.CancelledError:
            pass  # stop, after the call: what it was doing on the pool completes
        except Exception as e:
            self._failed(replica, delivery, e)
            await self._give_back(delivery)
        finally:
            self._busy(replica, -1)
            self._in_flight[replica] -= 1
            self._calls[replica].pop(asyncio.current_task(), None)  # type: ignore[arg-type]
            self._close_if_done(replica)
            self._notify()

    async def _watch(self) -> None:
        """The no-progress watchdog, in place of a fixed deadline: a replica with calls
        in flight whose engine generated no token for `stall_s` (its tokens_generated
        unchanged, or its status unanswered) is stalled: its calls are cancelled (the
        groups go back uncounted, to other replicas) and it gets no work until its engine
        progresses again, or `stall_s` later. Also marks the prompt entries of the calls
        in flight alive, so that no live call is reclaimed as abandoned. Reads every
        replica's status, idle or not, at once: its load and capacity too (`_observe`)."""
        every = min(WATCH_EVERY_S, self.stall_s / 4)
        while not self._stop.is_set():
            await asyncio.sleep(every)
            entries = [d.entry_id for calls in self._calls.values() for d in calls.values()]
            try:
                await self._blocking(self.streams.touch, CONSUMER, entries)
            except Exception as e:
                log.warning("could not mark %d generations in flight alive: %s", len(entries), e)
            polled = list(self._clients)
            # a channel closed meanwhile (its replica left) cancels its read: not this pass
            seen = await asyncio.gather(*(self._status(r) for r in polled), return_exceptions=True)
            now = time.monotonic()
            for replica, status in zip(polled, seen):
                if replica not in self._clients:  # left meanwhile: its labels are gone
                    continue
                tokens = None
                if isinstance(status, rpb.RolloutStatus):
                    self._observe(replica, status, now)
                    tokens = status.tokens_generated
                if not (self._in_flight[replica] or replica in self._stalled):
                    if tokens is not None:  # idle: progress is awaited from its next call
                        self._progress[replica] = (tokens, now)
                    continue
                last, since = self._progress.get(replica, (None, now))
                if tokens is not None and tokens != last:
                    self._progress[replica] = (tokens, now)
                    if self._stalled.pop(replica, None) is not None:
                        log.info("%s makes progress again: it gets work", replica)
                        self._notify()
                elif replica in self._stalled:
                    if now - self._stalled[replica] > self.stall_s:
                        del self._stalled[replica]  # try it again
                        self._notify()
                elif self._in_flight[replica] and now - since > self.stall_s:
                    self._stall(replica, now - since)

    async def _status(self, replica: str) -> rpb.RolloutStatus | None:
        """The replica's status (its engine's tokens_generated, capacity); None when it
        does not answer."""
        client = self._clients.get(replica)
        try:
            return await client.status(timeout=min(10.0, self.stall_s)) if client else None
        except grpc.aio.AioRpcError:
            return None

    def _stall(self, replica: str, seconds: float) -> None:
        calls = self._calls.get(replica, {})
        reason = f"no token generated for {seconds:.0f}s with {len(calls)} calls in flight (generate_stall_s)"
        log.error("%s is stalled: %s; its groups go to other replicas", replica, reason)
        self.errors[replica] = reason
        self._stalled[replica] = time.monotonic()
        if self.metrics:
            self.metrics.generation_stalled.inc()
        for task in list(calls):
            task.cancel()  # the call's group is re-queued, not counted against it

    def _failed(self, replica: str, delivery: Delivery, e: Exception) -> None:
        """A group that failed outside the Generate call's own errors: Redis failing
        while it was handed on (one line: the run reports Redis itself), or a bug (with
        its traceback)."""
        if self._stop.is_set():
            return
        self.errors[replica] = f"{type(e).__name__}: {e}"
        group_id = delivery.group.group_id
        if isinstance(e, redis.exceptions.ConnectionError):
            log.warning("group %s: Redis unavailable (%s)", group_id, e)
        else:
            log.exception("group %s failed", group_id, exc_info=e)

    async def _requeue(self, delivery: Delivery) -> None:
        """Put a prompt back at the end of the queue (if Redis is down too, it stays
        pending and is reclaimed later)."""
        try:
            await self._blocking(self.streams.retry, delivery.entry_id, delivery.group)
        except Exception as e:
            log.warning("could not re-queue %s (%s): it will be reclaimed", delivery.group.group_id, e)

    async def _give_back(self, delivery: Delivery) -> None:
        """A failed call's prompt, re-queued and counted; then its slot backs off."""
        if self.metrics:
            self.metrics.generation_retries.inc()
        await self._requeue(delivery)
        if not self._stop.is_set():
            await asyncio.sleep(self.retry_backoff_s)

    async def _generate(self, replica: str, delivery: Delivery) -> None:
        group = delivery.group
        assert isinstance(group, PromptGroup)
        s = self.sampling
        started = time.time()
        t0 = time.perf_counter()
        wait = queue_wait_s(delivery.entry_id, started + self._redis_offset)
        if self.metrics and wait is not None:
            self.metrics.generation_queue_wait.labels(replica=replica).observe(wait)
        carry = self.carry if replica in self._history_replicas else None
        key = prompt_key(group) if carry else b""
        history = carry.to_send(replica, key) if carry else []
        if history and self.metrics:
            self.metrics.history_carried_tokens.inc(sum(map(len, history)))
        try:
            resp = await self._clients[replica].generate(
                [group.prompt_ids],
                n=s.n,
                temperature=s.temperature,
                top_p=s.top_p,
                top_k=s.top_k,
                max_tokens=s.max_tokens,
                stop=s.stop,
                stop_token_ids=self.stop_token_ids,
                seed=request_seed(self.seed, group.group_id),
                history=[history],
            )
        except asyncio.CancelledError:  # stop or a stall cancelled the call (the replica aborts it)
            await self._requeue(delivery)
            return
        except grpc.aio.AioRpcError as e:
            reason = f"{e.code().name}: {e.details()}"
            self.errors[replica] = reason
            if e.code() in _FINAL:
                log.error("%s refused group %s for good: %s", replica, group.group_id, reason)
                await self._hand_on(
                    delivery, replica, started=started, gen_seconds=time.perf_counter() - t0, error=reason
                )
                return
            if e.code() in _COUNTED:
                group = dataclasses.replace(group, attempts=group.attempts + 1)
                if group.attempts >= self.max_attempts:
                    reason = (
                        f"{group.attempts} failed Generate calls (orchestrator.max_attempts); last: {reason}"
                    )
                    log.error("group %s dropped: %s", group.group_id, reason)
                    if self.metrics:
                        self.metrics.generation_dropped.inc()
                    await self._hand_on(
                        delivery, replica, started=started, gen_seconds=time.perf_counter() - t0, error=reason
                    )
                    return
            log.warning(
                "generate on %s failed (%s): %s goes back (%d of %d failures)",
                replica, e.code().name, group.group_id, group.attempts, self.max_attempts,
            )  # fmt: skip
            await self._give_back(dataclasses.replace(delivery, group=group))
            return
        versions = [x.policy_version for x in resp.samples]
        lowest, highest = min(versions), max(versions)
        if lowest < self.min_version or highest > self.max_version:
            log.warning(
                "%s sampled with policy v%d..v%d, outside v%d..v%d: %s goes back",
                replica, lowest, highest, self.min_version, self.max_version, group.group_id,
            )  # fmt: skip
            self.behind.add(replica)
            await self._give_back(delivery)
            return
        if carry:
            carry.generated(replica, key, [x.token_ids for x in resp.samples])
        t1 = time.perf_counter()
        samples = await self._blocking(lambda: [self._sample(x, group.answer) for x in resp.samples])
        reward_seconds = time.perf_counter() - t1
        await self._hand_on(
            delivery,
            replica,
            started=started,
            gen_seconds=t1 - t0,
            samples=samples,
            reward_seconds=reward_seconds,
        )

    def _sample(self, x: rpb.Sample, answer: str) -> SampleRecord:
        try:
            reward = float(self.reward_fn(x.text, answer))
        except Exception as e:
            self.reward_errors += 1
            if self.reward_errors == 1 or self.reward_errors % 100 == 0:
                log.error("reward function raised (%d so far, each scored 0): %r", self.reward_errors, e)
            reward = 0.0
        acc = x.acceptance
        return SampleRecord(
            completion_ids=list(x.token_ids),
            logprobs=list(x.logprobs),
            text=x.text,
            reward=reward,
            finish_reason=_FINISH.get(x.finish_reason, "unspecified"),
            policy_version=x.policy_version,
            draft_version=x.draft_version,
            drafts=acc.drafts,
            draft_tokens=acc.draft_tokens,
            accepted_tokens=acc.accepted_tokens,
        )

    async def _hand_on(
        self,
        delivery: Delivery,
        replica: str,
        *,
        started: float,
        gen_seconds: float,
        samples: list[SampleRecord] | None = None,
        reward_seconds: float = 0.0,
        error: str = "",
    ) -> None:
        """The finished group (or, with `error`, the failed one: no samples) to the
        trainer's stream; its prompt acknowledged in the same transaction."""
        group = delivery.group
        assert isinstance(group, PromptGroup)
        await self._blocking(
            self.streams.finish,
            delivery.entry_id,
            RolloutGroup(
                group_id=group.group_id,
                batch=group.batch,
                prompt_ids=group.prompt_ids,
                prompt=group.prompt,
                answer=group.answer,
                samples=samples or [],
                replica=replica,
                gen_seconds=gen_seconds,
                reward_seconds=reward_seconds,
                admitted_version=group.admitted_version,
                started_at=started,
                finished_at=time.time(),
                error=error,
            ),
        )
