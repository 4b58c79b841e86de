"""The rollout server's side of weight sync: group membership, the Begin / Commit / Abort
state machine, versions, and readiness.

Invariants it keeps:
  - a manifest is checked against the checkpoint the engine serves before anything
    changes, so bad input leaves the server serving its last good version;
  - one update at a time (of either kind);
  - a version is switched only by Commit, after every bucket was loaded, together with a
    prefix-cache reset (cached KV was computed by the old weights);
  - weights touched by an update that did not commit (sender died, abort after loading)
    make the server not ready: Generate is refused until a complete update lands.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from specrl.config import WeightReceiverConfig, resolve_model_path
from specrl.metrics import RolloutMetrics
from specrl.rollout.admission import AdmissionGate, DrainTimeout
from specrl.rollout.engines.base import Engine
from specrl.speculation import Method, has_draft_model
from specrl.weightsync.group import JoinInfo
from specrl.weightsync.manifest import Manifest, ManifestError
from specrl.weightsync.names import Expected, checkpoint_tensors
from specrl.weightsync.receiver import check_manifest

log = logging.getLogger("specrl.rollout.weights")

ErrorCode = Literal["invalid", "precondition", "deadline", "failed"]
KINDS = ("policy", "draft")
# Tensors in a checkpoint that the engine loader ignores (never required in an update).
_IGNORED = (r"(^|\.)t2d$",)


class WeightUpdateError(Exception):
    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class _Pending:
    kind: str
    version: int
    epoch: int
    policy_basis: int
    nbytes: int
    task: asyncio.Task
    t0: float
    aborted: str = ""
    finished: bool = False


@dataclass(frozen=True)
class Served:
    """What the engine serves, as weight sync needs to know it: the checkpoints whose
    tensors an update must match, the speculation method (whether there is a draft model
    to update), and the versions the server started with."""

    policy_model: str
    draft_model: str | None
    method: Method
    policy_version: int = 0
    draft_version: int = 0

    @property
    def has_draft_model(self) -> bool:
        return has_draft_model(self.method)


def _outcome(task: asyncio.Task) -> dict:
    if task.cancelled():
        return {"ok": False, "buckets": -1, "error": "receive cancelled (server shutting down)"}
    return task.result()


class WeightUpdater:
    def __init__(
        self,
        sync: WeightReceiverConfig,
        served: Served,
        engine: Engine,
        metrics: RolloutMetrics,
        gate: AdmissionGate,
        on_change: Callable[[], None] = lambda: None,
    ) -> None:
        self.sync, self.served = sync, served
        self.engine, self.metrics, self.gate = engine, metrics, gate
        self.on_change = on_change
        self.versions = {"policy": served.policy_version, "draft": served.draft_version}
        self.draft_policy_version = served.policy_version
        self.epochs: dict[str, int] = {}
        self.synced: set[str] = set()
        self.dirty: dict[str, str] = {}
        self.pending: _Pending | None = None
        self.last_seconds = 0.0
        self.last_bytes = 0
        self.last_load_seconds = 0.0  # of last_seconds: in the engine's loader
        self.last_wait_seconds = 0.0  # of last_seconds: waiting for buckets on the wire
        self._expected: dict[str, dict[str, Expected]] = {}
        self._publish()

    # -- state --------------------------------------------------------------------

    @property
    def ready(self) -> bool:
        return not self.dirty and all(k in self.synced for k in self.sync.await_kinds)

    @property
    def detail(self) -> str:
        if self.dirty:
            return "; ".join(self.dirty.values())
        waiting = [k for k in self.sync.await_kinds if k not in self.synced]
        if waiting:
            return f"awaiting a first {' and '.join(waiting)} weight sync"
        if self.pending:
            return f"receiving {self.pending.kind} v{self.pending.version}"
        return "ok"

    @property
    def state(self) -> str:
        if self.pending is None:
            return "idle"
        return "received" if self.pending.task.done() else "receiving"

    @property
    def draft_lag(self) -> int:
        return self.versions["policy"] - self.draft_policy_version if self.served.has_draft_model else 0

    def _publish(self) -> None:
        m = self.metrics
        m.policy_version.set(self.versions["policy"])
        m.draft_version.set(self.versions["draft"])
        m.draft_policy_version.set(self.draft_policy_version)
        m.draft_lag.set(self.draft_lag)
        m.stale_draft.set(1 if self.draft_lag > self.sync.max_draft_lag else 0)
        m.weights_ready.set(1 if self.ready else 0)
        self.on_change()

    def _expected_tensors(self, kind: str) -> dict[str, Expected]:
        """The checkpoint's tensors: what the engine's loader accepts, in its names."""
        if kind not in self._expected:
            ref = self.served.policy_model if kind == "policy" else self.served.draft_model or ""
            self._expected[kind] = checkpoint_tensors(resolve_model_path(ref), skip=_IGNORED)
        return self._expected[kind]

    def _check_kind(self, kind: str) -> None:
        if kind not in KINDS:
            raise WeightUpdateError("invalid", f"weight kind must be policy or draft, got {kind!r}")
        if kind == "draft" and not self.served.has_draft_model:
            raise WeightUpdateError(
                "precondition", f"speculation method {self.served.method!r} has no draft weights"
            )

    def _check_idle(self) -> None:
        if self.pending is not None:
            p = self.pending
            raise WeightUpdateError(
                "precondition", f"another weight update ({p.kind} v{p.version}) is in progress"
            )

    # -- protocol -----------------------------------------------------------------

    async def join(self, info: JoinInfo) -> list[int]:
        """Join the sender's new group. An update of the same kind that was received in
        full under an older epoch is abandoned first: a sender forms a new group only
        between its updates, so that update's sender is gone (killed between broadcast
        and Commit) and its Commit will never come."""
        self._check_kind(info.kind)
        p = self.pending
        if p is not None and p.kind == info.kind and p.epoch != info.epoch and p.task.done():
            await self.abort(
                p.kind, p.version, f"its sender was replaced ({info.kind} group epoch {info.epoch})"
            )
        self._check_idle()
        if info.backend not in ("gloo", "nccl"):
            raise WeightUpdateError("invalid", f"backend must be gloo or nccl, got {info.backend!r}")
        workers = self.engine.info.workers
        if info.rank_offset < 1 or info.rank_offset + workers > info.world_size:
            raise WeightUpdateError(
                "invalid",
                f"ranks {info.rank_offset}..{info.rank_offset + workers - 1} do not fit a "
                f"group of {info.world_size} whose rank 0 is the sender",
            )
        self.epochs.pop(info.kind, None)
        try:
            ranks = await self.engine.join_weight_group(info)
        except Exception as e:
            raise WeightUpdateError(
                "failed", f"joining {info.kind} weight group epoch {info.epoch}: {e}"
            ) from e
        self.epochs[info.kind] = info.epoch
        log.info(
            "joined %s weight group epoch %d as ranks %s of %d", info.kind, info.epoch, ranks, info.world_size
        )
        return ranks

    async def begin(
        self,
        kind: str,
        version: int,
        epoch: int,
        manifest: Manifest,
        policy_basis: int,
        *,
        rewind: bool = False,
    ) -> None:
        """Start receiving `kind` v`version`. Versions only increase, but for `rewind`: a
        resumed run's trainer, restored from its checkpoint, replacing a newer policy that
        was lost with the crash (or the same version number from the lost run)."""
        self._check_kind(kind)
        self._check_idle()
        if self.epochs.get(kind) != epoch:
            have = self.epochs.get(kind)
            raise WeightUpdateError(
                "precondition",
                f"not a member of {kind} weight group epoch {epoch} "
                f"({'no group joined' if have is None else f'member of epoch {have}'})",
            )
        current = self.versions[kind]
        if not rewind and (version < current or (version == current and kind in self.synced)):
            raise WeightUpdateError(
                "precondition", f"{kind} version must increase: serving v{current}, got v{version}"
            )
        if rewind and version <= current and kind in self.synced:
            log.warning(
                "%s v%d replaced by v%d (the trainer resumed from a checkpoint)", kind, current, version
            )
        try:
            check_manifest(manifest, self._expected_tensors(kind))
        except ManifestError as e:
            self.metrics.weight_updates.labels(kind=kind, outcome="rejected").inc()
            raise WeightUpdateError("invalid", f"{kind} v{version} manifest: {e}") from None
        t0 = time.perf_counter()
        try:
            await self.gate.close_and_drain(self.sync.drain_timeout_s)
        except DrainTimeout as e:
            raise WeightUpdateError("deadline", str(e)) from None
        task = asyncio.create_task(self.engine.receive_weights(kind, epoch, manifest.to_dict()))
        self.pending = p = _Pending(kind, version, epoch, policy_basis, manifest.total_bytes, task, t0)
        task.add_done_callback(lambda _: asyncio.ensure_future(self._settle(p)))
        log.info(
            "receiving %s v%d: %d tensors, %d bytes",
            kind,
            version,
            len(manifest.tensors),
            manifest.total_bytes,
        )
        self._publish()

    async def commit(self, kind: str, version: int) -> None:
        p = self._pending_for(kind, version)
        try:
            result = await asyncio.wait_for(asyncio.shield(p.task), self.sync.receive_timeout_s)
        except TimeoutError:
            raise WeightUpdateError(
                "deadline",
                f"{kind} v{version} not received after {self.sync.receive_timeout_s:g}s "
                "(weight_sync.receive_timeout_s); abort it",
            ) from None
        await self._finish(p, result)
        if not result["ok"]:
            raise WeightUpdateError("failed", f"{kind} v{version} receive failed: {result['error']}")

    async def abort(self, kind: str, version: int, reason: str) -> None:
        """Abandon the pending update (idempotent). The engine may still be inside the
        broadcast; it leaves when the group times out, and only then is the gate opened."""
        p = self.pending
        if p is None or (p.kind, p.version) != (kind, version) or p.aborted:
            return
        p.aborted = reason or "aborted by the sender"
        log.warning("%s v%d aborted: %s", kind, version, p.aborted)
        if p.task.done():
            await self._finish(p, _outcome(p.task))
        else:
            p.task.add_done_callback(lambda t: asyncio.ensure_future(self._finish(p, _outcome(t))))

    async def _settle(self, p: _Pending) -> None:
        """The receive ended without the sender having settled it yet. A sender that died
        mid-update (a trainer pod killed) never sends Commit or Abort: a failed receive
        (its group timed out or broke) is finished here, and a complete one that no
        Commit follows within receive_timeout_s is abandoned, so the server never stays
        "in progress" for good and the next sender's update is taken."""
        if p.finished:
            return
        result, wait_s = _outcome(p.task), self.sync.receive_timeout_s
        if result["ok"]:
            await asyncio.sleep(wait_s)
            if p.finished:
                return
            p.aborted = p.aborted or f"no Commit within {wait_s:g}s of the broadcast"
        log.warning("%s v%d ended without its sender: %s", p.kind, p.version, p.aborted or result["error"])
        await self._finish(p, result)

    def _pending_for(self, kind: str, version: int) -> _Pending:
        p = self.pending
        if p is None or (p.kind, p.version) != (kind, version):
            now = f"{p.kind} v{p.version}" if p else "none"
            raise WeightUpdateError("precondition", f"no pending {kind} v{version} update (pending: {now})")
        if p.aborted:
            raise WeightUpdateError("precondition", f"{kind} v{version} was aborted: {p.aborted}")
        return p

    async def _finish(self, p: _Pending, result: dict) -> None:
        if p.finished:
            return
        p.finished = True
        kind, touched = p.kind, result.get("buckets", 0) != 0
        try:
            if touched and not await self.engine.reset_prefix_cache():
                log.error("prefix cache reset refused after %s v%d", kind, p.version)
            if result["ok"] and not p.aborted:
                self._switch(p, result)
                outcome = "committed"
            else:
                outcome = "aborted" if p.aborted else "failed"
                # the group's collective state is unknown now: leave it, so the sender
                # re-forms before the next update
                self.epochs.pop(kind, None)
                if touched:
                    self.dirty[kind] = (
                        f"{kind} v{p.version} {outcome} after loading part of it "
                        f"({result.get('error') or p.aborted}); awaiting a complete {kind} update"
                    )
            self.metrics.weight_updates.labels(kind=kind, outcome=outcome).inc()
        finally:
            self.pending = None
            self.gate.open()
            self._publish()

    def _switch(self, p: _Pending, received: dict) -> None:
        seconds = time.perf_counter() - p.t0
        self.versions[p.kind] = p.version
        if p.kind == "draft":
            self.draft_policy_version = p.policy_basis or self.versions["policy"]
        self.synced.add(p.kind)
        self.dirty.pop(p.kind, None)
        self.last_seconds, self.last_bytes = seconds, p.nbytes
        self.last_load_seconds = received.get("load_seconds", 0.0)
        self.last_wait_seconds = received.get("wait_seconds", 0.0)
        m = self.metrics
        m.weight_sync_seconds.labels(kind=p.kind).observe(seconds)
        m.weight_sync_bytes.labels(kind=p.kind).inc(p.nbytes)
        m.weight_sync_bandwidth.labels(kind=p.kind).set(p.nbytes / seconds if seconds > 0 else 0)
        log.info(
            "%s v%d committed (%d bytes in %.3fs: loading %.3fs, waiting on the wire %.3fs)",
            p.kind,
            p.version,
            p.nbytes,
            seconds,
            self.last_load_seconds,
            self.last_wait_seconds,
        )
