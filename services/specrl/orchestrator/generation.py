"""Generators: threads of the orchestrator that turn admitted prompt groups into rewarded
rollout groups. Each rollout replica gets `concurrency` of them, each with one Generate
call in flight, so faster replicas pull more work (load balancing by pull). A failed call
gives the prompt back to the queue; a generator that dies leaves its prompt pending, to
be reclaimed by another after `reclaim_idle_s`.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time

import grpc

from specrl.config import SamplingConfig
from specrl.metrics import OrchestratorMetrics
from specrl.orchestrator.rewards import RewardFn
from specrl.queue.streams import Delivery, PromptGroup, RolloutGroup, RunStreams, SampleRecord
from specrl.rollout.client import RolloutClient
from specrl.v1 import rollout_pb2 as rpb

log = logging.getLogger("specrl.orchestrator.generation")

_FINISH = {
    rpb.FINISH_REASON_STOP: "stop",
    rpb.FINISH_REASON_LENGTH: "length",
    rpb.FINISH_REASON_ABORT: "abort",
}


def request_seed(run_seed: int, group_id: str) -> int:
    """Each group's sampling seed: a function of the run seed and the group alone, so a
    group is sampled the same way whichever replica or generator takes it."""
    digest = hashlib.sha256(f"{run_seed}:{group_id}".encode()).digest()
    return int.from_bytes(digest[:7], "big")


class Generators:
    def __init__(
        self,
        streams: RunStreams,
        replicas: list[str],
        *,
        concurrency: int,
        sampling: SamplingConfig,
        reward_fn: RewardFn,
        seed: int,
        metrics: OrchestratorMetrics | None = None,
        retry_backoff_s: float = 1.0,
    ) -> None:
        self.streams = streams
        self.replicas = replicas
        self.concurrency = concurrency
        self.sampling = sampling
        self.reward_fn = reward_fn
        self.seed = seed
        self.metrics = metrics
        self.retry_backoff_s = retry_backoff_s
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._in_flight = 0
        self._idle_since: float | None = time.perf_counter()
        self._idle_total = 0.0
        self.errors: dict[str, str] = {}

    def start(self) -> Generators:
        for replica in self.replicas:
            for i in range(self.concurrency):
                t = threading.Thread(
                    target=self._work, args=(replica, f"gen-{replica}-{i}"), daemon=True, name=f"gen-{i}"
                )
                t.start()
                self._threads.append(t)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self._stop.set()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def idle_seconds(self) -> float:
        """Total time so far with no Generate call in flight on any replica."""
        with self._lock:
            extra = time.perf_counter() - self._idle_since if self._idle_since is not None else 0.0
            return self._idle_total + extra

    def _busy(self, delta: int) -> None:
        with self._lock:
            now = time.perf_counter()
            if self._in_flight == 0 and delta > 0 and self._idle_since is not None:
                self._idle_total += now - self._idle_since
                self._idle_since = None
            self._in_flight += delta
            if self._in_flight == 0:
                self._idle_since = now

    def _work(self, replica: str, consumer: str) -> None:
        with RolloutClient(replica) as client:
            while not self._stop.is_set():
                try:
                    delivery = self.streams.next_prompt(consumer, block_ms=200)
                except Exception as e:  # redis restarting: keep trying until stopped
                    log.warning("%s: queue unavailable: %s", consumer, e)
                    self._stop.wait(self.retry_backoff_s)
                    continue
                if delivery is None:
                    continue
                self._busy(+1)
                try:
                    self._generate(client, replica, delivery)
                except Exception as e:  # a reward function or Redis failing: keep the prompt
                    log.exception("%s: group %s failed", consumer, delivery.group.group_id)
                    self.errors[replica] = f"{type(e).__name__}: {e}"
                    self._give_back(delivery)
                finally:
                    self._busy(-1)

    def _give_back(self, delivery: Delivery) -> None:
        """Re-queue a prompt whose generation failed (if Redis is down too, it stays
        pending and is reclaimed later), then back off."""
        if self.metrics:
            self.metrics.generation_retries.inc()
        try:
            self.streams.retry(delivery.entry_id, delivery.group)  # type: ignore[arg-type]
        except Exception as e:
            log.warning("could not re-queue %s (%s): it will be reclaimed", delivery.group.group_id, e)
        self._stop.wait(self.retry_backoff_s)

    def _generate(self, client: RolloutClient, replica: str, delivery: Delivery) -> None:
        group = delivery.group
        assert isinstance(group, PromptGroup)
        s = self.sampling
        t0 = time.perf_counter()
        try:
            resp = client.generate(
                [group.prompt_ids],
                n=s.n,
                temperature=s.temperature,
                top_p=s.top_p,
                top_k=s.top_k,
                max_tokens=s.max_tokens,
                stop=s.stop,
                seed=request_seed(self.seed, group.group_id),
            )
        except grpc.RpcError as e:
            self.errors[replica] = f"{e.code().name}: {e.details()}"
            log.warning("generate on %s failed (%s): %s goes back", replica, e.code().name, group.group_id)
            self._give_back(delivery)
            return
        t1 = time.perf_counter()
        samples = []
        for sample in resp.samples:
            acc = sample.acceptance
            samples.append(
                SampleRecord(
                    completion_ids=list(sample.token_ids),
                    logprobs=list(sample.logprobs),
                    text=sample.text,
                    reward=float(self.reward_fn(sample.text, group.answer)),
                    finish_reason=_FINISH.get(sample.finish_reason, "unspecified"),
                    policy_version=sample.policy_version,
                    draft_version=sample.draft_version,
                    drafts=acc.drafts,
                    draft_tokens=acc.draft_tokens,
                    accepted_tokens=acc.accepted_tokens,
                )
            )
        t2 = time.perf_counter()
        self.streams.finish(
            delivery.entry_id,
            RolloutGroup(
                group_id=group.group_id,
                batch=group.batch,
                prompt_ids=group.prompt_ids,
                prompt=group.prompt,
                answer=group.answer,
                samples=samples,
                replica=replica,
                gen_seconds=t1 - t0,
                reward_seconds=t2 - t1,
                admitted_version=group.admitted_version,
                finished_at=time.time(),
            ),
        )
