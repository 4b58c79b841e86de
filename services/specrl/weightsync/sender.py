"""The publishing side of weight sync, used by the trainer (policy) and the draft-trainer
(draft): group membership with epochs, catch-up of new replicas, and bucketed pushes
that survive members dying.

A push: Begin on every member (each validates the manifest against its checkpoint and
drains its in-flight requests), broadcast the buckets, Commit on every member. A member
that fails (unreachable, broadcast error) is dropped, the survivors abort, the group is
re-formed under a new epoch and the push is repeated, so no update is lost and nobody
waits longer than the collective timeout. A member that refuses the update (bad
manifest, version going backwards) is a caller error: the push stops there and every
server keeps serving its last good version.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc
import torch

from specrl import grpc_options
from specrl.config import WeightSenderConfig
from specrl.metrics import WeightSenderMetrics
from specrl.v1 import rollout_pb2 as pb
from specrl.v1 import rollout_pb2_grpc as pb_grpc
from specrl.weightsync.buffers import BucketBuffers
from specrl.weightsync.group import WeightGroup, host_store, pick_backend
from specrl.weightsync.manifest import DTYPES, Manifest, pack, plan
from specrl.weightsync.names import to_checkpoint_name
from specrl.weightsync.wire import KIND_TO_PROTO, manifest_to_proto

log = logging.getLogger("specrl.weightsync.sender")

WeightSource = Callable[[], Iterable[tuple[str, torch.Tensor]]]
"""Yields (name, tensor) in a stable order each time it is called (e.g.
`model.named_parameters`); called once for the manifest and once for the data."""

_REFUSED = (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION)


class WeightSyncError(RuntimeError):
    """A push that did not reach every member."""


class _MembersFailed(Exception):
    def __init__(self, failed: dict[str, str]) -> None:
        super().__init__("; ".join(f"{a}: {e}" for a, e in failed.items()))
        self.failed = failed


@dataclass
class PushResult:
    version: int
    members: list[str]
    bytes: int
    seconds: float
    epoch: int
    dropped: dict[str, str] = field(default_factory=dict)
    # where the time went: group check / formation + Begin (validate, drain), the
    # broadcast, and Commit (receivers finish loading, reset caches, switch versions)
    phases: dict[str, float] = field(default_factory=dict)

    @property
    def bandwidth(self) -> float:
        """Bytes per second per receiver, end to end (Begin to Commit)."""
        return self.bytes / self.seconds if self.seconds > 0 else 0.0


class _Member:
    def __init__(self, address: str) -> None:
        self.address = address
        self.channel = grpc_options.channel(address)
        self.stub = pb_grpc.RolloutServiceStub(self.channel)

    def close(self) -> None:
        self.channel.close()


def _describe(e: Exception) -> str:
    if isinstance(e, grpc.RpcError):
        return f"{e.code().name}: {e.details()}"
    return f"{type(e).__name__}: {e}"


def _failed_joins(futures: dict[str, Future]) -> dict[str, str]:
    """The members whose JoinWeightGroup call failed, with why (waits for every call)."""
    failed = {}
    for address, f in futures.items():
        try:
            f.result()
        except grpc.RpcError as e:
            failed[address] = f"could not join: {_describe(e)}"
    return failed


class WeightSender:
    def __init__(
        self,
        cfg: WeightSenderConfig,
        *,
        eagle3_draft: bool = False,
        metrics: WeightSenderMetrics | None = None,
        device: torch.device | None = None,
    ) -> None:
        self.cfg = cfg
        self.kind = cfg.kind
        self.eagle3_draft = eagle3_draft
        # Set by `restart`: this publisher's versions replace whatever the replicas serve,
        # newer or equal (a policy lost with a crash).
        self.rewind = False
        self.metrics = metrics
        self.device = device or torch.device("cpu")
        self.backend = pick_backend(cfg.backend, self.device)
        self.store = host_store(cfg.host, cfg.port, cfg.timeout_s)
        self.port = self.store.port
        # Epochs start from the clock so a restarted sender never reuses one.
        self.epoch = int(time.time() * 1000)
        self.members: dict[str, _Member] = {}
        self.version: int | None = None
        self._source: WeightSource | None = None
        self._policy_version = 0
        self._group: WeightGroup | None = None
        self._group_members: tuple[str, ...] = ()
        self._pool = ThreadPoolExecutor(max_workers=16, thread_name_prefix=f"specrl-{self.kind}-sender")

    # -- membership ---------------------------------------------------------------

    def add_replica(self, address: str) -> bool:
        """Add a rollout server; if a version was pushed already, bring it to that version
        first (it refuses Generate until then when configured to await this kind).
        Returns whether weights were sent to it."""
        if address in self.members:
            return False
        member = _Member(address)
        sent = False
        if self.version is not None and self._source is not None:
            try:
                sent = self._catch_up(member)
            except Exception:
                member.close()
                raise
        self.members[address] = member
        self._set_member_metrics()
        log.info("%s sender: %s joined (%d members)", self.kind, address, len(self.members))
        return sent

    def set_current(self, version: int, source: WeightSource, *, policy_version: int = 0) -> None:
        """Declare `version` (what `source` yields) current without broadcasting it to the
        members: the initial weights every replica loaded, or a restarted publisher whose
        replicas may already serve it. Replicas added later are caught up to it only if
        they are behind."""
        if self.version is not None and version < self.version:
            raise ValueError(f"{self.kind} version must not go back: at v{self.version}, got v{version}")
        self.version, self._source, self._policy_version = version, source, policy_version

    def served(self, addresses: Iterable[str] | None = None) -> dict[str, int]:
        """The version of this kind that each reachable address (default: member) serves."""
        out = {}
        for address in self.members if addresses is None else addresses:
            member = self.members.get(address) or _Member(address)
            try:
                ws = member.stub.GetStatus(pb.GetStatusRequest(), timeout=self.cfg.rpc_timeout_s).weight_sync
            except grpc.RpcError as e:
                log.warning("%s sender: %s unreachable (%s)", self.kind, address, e.code().name)
                continue
            finally:
                if address not in self.members:
                    member.close()
            out[address] = ws.policy_version if self.kind == "policy" else ws.draft_version
        return out

    def follow(self, replicas: Sequence[str]) -> list[str]:
        """Membership follows `replicas`, in two halves around the caller's push: members
        not listed leave now, and so do members that no longer serve the current version
        (a rollout server started again on its address comes back on its initial
        weights); returns the replicas to `join` after the push, which catches them up.
        Unreachable members stay (a push drops them)."""
        for gone in set(self.members) - set(replicas):
            self.remove_replica(gone)
        if self.version is not None:
            for address, served in self.served().items():
                if served != self.version:
                    log.info("%s sender: %s serves v%d, not v%d: catching it up", self.kind, address, served,
                             self.version)  # fmt: skip
                    self.remove_replica(address)
        return [a for a in replicas if a not in self.members]

    def join(self, addresses: Sequence[str]) -> tuple[list[str], dict[str, str]]:
        """`add_replica` each address; returns those weights were sent to, and those that
        could not be added, with why."""
        sent, failed = [], {}
        for address in addresses:
            try:
                if self.add_replica(address):
                    sent.append(address)
            except (WeightSyncError, grpc.RpcError) as e:
                failed[address] = str(e)
        return sent, failed

    def remove_replica(self, address: str) -> None:
        member = self.members.pop(address, None)
        if member is not None:
            member.close()
        self._set_member_metrics()

    def _set_member_metrics(self) -> None:
        if self.metrics:
            self.metrics.members.labels(kind=self.kind).set(len(self.members))

    def _catch_up(self, member: _Member) -> bool:
        status = member.stub.GetStatus(pb.GetStatusRequest(), timeout=self.cfg.rpc_timeout_s)
        ws = status.weight_sync
        served = ws.policy_version if self.kind == "policy" else ws.draft_version
        if served == self.version and ws.ready:
            return False
        assert self.version is not None and self._source is not None
        log.info("%s sender: catching %s up from v%d to v%d", self.kind, member.address, served, self.version)
        try:
            self._attempt(
                [member], self.version, self.manifest_for(self._source), self._source, self._policy_version
            )
        except _MembersFailed as e:
            raise WeightSyncError(
                f"catching {member.address} up to {self.kind} v{self.version} failed: {e}"
            ) from None
        return True

    # -- pushing ------------------------------------------------------------------

    def _tensors(self, source: WeightSource) -> Iterator[tuple[str, torch.Tensor]]:
        """The source's tensors under the engine's names, ready to send."""
        cast = DTYPES[self.cfg.send_dtype] if self.cfg.send_dtype else None
        for name, t in source():
            engine_name = to_checkpoint_name(self.kind, name, eagle3=self.eagle3_draft)
            if engine_name is None:
                continue
            if hasattr(t, "full_tensor"):  # a DTensor shard (tensor / data parallel trainer)
                t = t.full_tensor()
            t = t.detach()
            if cast is not None and t.is_floating_point():
                t = t.to(cast)
            yield engine_name, t

    def manifest_for(self, source: WeightSource) -> Manifest:
        """The manifest a push of `source` sends (names translated, bucket layout)."""
        cast = DTYPES[self.cfg.send_dtype] if self.cfg.send_dtype else None
        specs = []
        for name, t in source():
            engine_name = to_checkpoint_name(self.kind, name, eagle3=self.eagle3_draft)
            if engine_name is not None:
                dtype = cast if cast is not None and t.is_floating_point() else t.dtype
                specs.append((engine_name, tuple(t.shape), dtype))
        return plan(specs, int(self.cfg.bucket_mb * 2**20))

    def push(self, version: int, source: WeightSource, *, policy_version: int = 0) -> PushResult:
        """Publish `version` to every member. Draft pushes name the policy version the
        draft was trained against (`policy_version`). Raises WeightSyncError if a member
        refused it or members kept failing after `retries` re-forms."""
        if self.version is not None and version <= self.version:
            raise ValueError(f"{self.kind} version must increase: pushed v{self.version}, got v{version}")
        manifest = self.manifest_for(source)
        dropped: dict[str, str] = {}
        for attempt in range(self.cfg.retries + 1):
            members = [self.members[a] for a in sorted(self.members)]
            try:
                result = self._attempt(members, version, manifest, source, policy_version)
            except _MembersFailed as e:
                if self.metrics:
                    self.metrics.failures.labels(kind=self.kind).inc()
                for address, reason in e.failed.items():
                    log.error("%s sender: dropping %s: %s", self.kind, address, reason)
                    dropped[address] = reason
                    self.remove_replica(address)
                if attempt == self.cfg.retries:
                    raise WeightSyncError(f"{self.kind} v{version} failed: {e}") from None
                continue
            result.dropped = dropped
            self.version, self._source, self._policy_version = version, source, policy_version
            if self.metrics:
                m = self.metrics
                m.seconds.labels(kind=self.kind).observe(result.seconds)
                m.bytes.labels(kind=self.kind).inc(result.bytes)
                m.bandwidth.labels(kind=self.kind).set(result.bandwidth)
                m.version.labels(kind=self.kind).set(version)
            return result
        raise AssertionError("unreachable")

    def _attempt(
        self,
        members: list[_Member],
        version: int,
        manifest: Manifest,
        source: WeightSource,
        policy_version: int,
    ) -> PushResult:
        t0 = time.perf_counter()
        if not members:
            return PushResult(version, [], 0, 0.0, self.epoch)
        group = self._ensure_group(members)
        t_group = time.perf_counter()
        kind = KIND_TO_PROTO[self.kind]
        begin = pb.BeginWeightUpdateRequest(
            kind=kind,
            version=version,
            epoch=group.epoch,
            manifest=manifest_to_proto(manifest),
            policy_version=policy_version,
            rewind=self.rewind,
        )
        self._call_all(
            members, version, lambda m: m.stub.BeginWeightUpdate(begin, timeout=self._long_timeout())
        )
        t_begin = time.perf_counter()
        try:
            self._broadcast(group, manifest, source)
        except WeightSyncError:
            self._drop_group()
            self._abort_all(members, version, "sender error")
            raise
        except Exception as e:
            self._drop_group()
            failed = self._unreachable(members) or {m.address: f"broadcast failed: {e}" for m in members}
            self._abort_all(members, version, f"broadcast failed: {e}")
            raise _MembersFailed(failed) from None
        t_sent = time.perf_counter()
        commit = pb.CommitWeightUpdateRequest(kind=kind, version=version)
        self._call_all(
            members, version, lambda m: m.stub.CommitWeightUpdate(commit, timeout=self._long_timeout())
        )
        t_end = time.perf_counter()
        phases = {"group": t_group - t0, "begin": t_begin - t_group, "broadcast": t_sent - t_begin}
        phases["commit"] = t_end - t_sent
        addresses = [m.address for m in members]
        return PushResult(version, addresses, manifest.total_bytes, t_end - t0, group.epoch, phases=phases)

    def _long_timeout(self) -> float:
        # Begin drains in-flight requests and Commit waits for the load: both may take long.
        return self.cfg.rpc_timeout_s + 2 * self.cfg.timeout_s

    def _call_all(self, members: list[_Member], version: int, call: Callable[[_Member], object]) -> list:
        """Run `call` on every member concurrently. A refusal aborts the update on every
        member and raises WeightSyncError; unreachable members raise _MembersFailed."""
        futures = {m.address: self._pool.submit(call, m) for m in members}
        results, refused, failed = [], {}, {}
        for address, f in futures.items():
            try:
                results.append(f.result())
            except grpc.RpcError as e:
                (refused if e.code() in _REFUSED else failed)[address] = _describe(e)
        if refused or failed:
            self._abort_all(members, version, "; ".join(f"{a}: {r}" for a, r in (refused | failed).items()))
        if refused:
            raise WeightSyncError(
                f"{self.kind} update refused: " + "; ".join(f"{a}: {r}" for a, r in refused.items())
            )
        if failed:
            self._drop_group()
            raise _MembersFailed(failed)
        return results

    def _abort_all(self, members: list[_Member], version: int, reason: str) -> None:
        """Best effort: tell every member to abandon the pending update (members without
        one ignore it; unreachable ones are dealt with by the caller)."""
        req = pb.AbortWeightUpdateRequest(kind=KIND_TO_PROTO[self.kind], version=version, reason=reason)
        futures = [
            self._pool.submit(m.stub.AbortWeightUpdate, req, timeout=self.cfg.rpc_timeout_s) for m in members
        ]
        for f in futures:
            with contextlib.suppress(grpc.RpcError):
                f.result()

    def _broadcast(self, group: WeightGroup, manifest: Manifest, source: WeightSource) -> None:
        """Pack bucket i+1 while bucket i is on the wire (two buckets in memory at most)."""
        tensors = self._tensors(source)
        in_flight = None
        buffers: BucketBuffers | None = None  # on the source's device, reused once sent
        for index, size in enumerate(manifest.bucket_bytes):
            specs = manifest.bucket(index)
            batch = []
            for spec in specs:
                name, t = next(tensors)
                if name != spec.name:
                    raise WeightSyncError(f"source order changed during the push: {name} != {spec.name}")
                batch.append(t)
            buffers = buffers or BucketBuffers(batch[0].device if batch else torch.device("cpu"))
            flat = pack(specs, batch, size, buffers.take(size)).to(group.device)
            if in_flight is not None:
                in_flight.wait()
            in_flight = group.start_broadcast(flat)
            del flat  # the pending broadcast holds it until it is waited on and replaced
        if in_flight is not None:
            in_flight.wait()

    def _unreachable(self, members: list[_Member]) -> dict[str, str]:
        """Members that do not answer a status call (dead or partitioned)."""
        out = {}
        for m in members:
            try:
                m.stub.GetStatus(pb.GetStatusRequest(), timeout=min(5.0, self.cfg.rpc_timeout_s))
            except grpc.RpcError as e:
                out[m.address] = f"unreachable after a failed broadcast ({_describe(e)})"
        return out

    # -- the group ----------------------------------------------------------------

    def _statuses(self, members: list[_Member]) -> dict[str, pb.RolloutStatus]:
        statuses, unreachable = {}, {}
        for m in members:
            try:
                statuses[m.address] = m.stub.GetStatus(pb.GetStatusRequest(), timeout=self.cfg.rpc_timeout_s)
            except grpc.RpcError as e:
                unreachable[m.address] = f"unreachable: {_describe(e)}"
        if unreachable:
            raise _MembersFailed(unreachable)
        return statuses

    def _epoch_of(self, status: pb.RolloutStatus) -> int:
        ws = status.weight_sync
        return ws.policy_epoch if self.kind == "policy" else ws.draft_epoch

    def _ensure_group(self, members: list[_Member]) -> WeightGroup:
        """The current group if every member is still in it, else a new epoch. Members
        leave a group when an update fails on their side, so this also heals a group
        broken by an aborted update."""
        addresses = tuple(m.address for m in members)
        statuses = self._statuses(members)
        if (
            self._group is not None
            and self._group_members == addresses
            and all(self._epoch_of(st) == self._group.epoch for st in statuses.values())
        ):
            return self._group
        self._drop_group()
        self._wait_idle(members)
        workers = {a: st.weight_sync_workers or 1 for a, st in statuses.items()}
        world = 1 + sum(workers.values())
        self.epoch += 1
        epoch, offset = self.epoch, 1
        requests = {}
        for m in members:
            requests[m.address] = pb.JoinWeightGroupRequest(
                kind=KIND_TO_PROTO[self.kind],
                epoch=epoch,
                store_host=self.cfg.host,
                store_port=self.port,
                rank_offset=offset,
                world_size=world,
                backend=self.backend,
                timeout_s=self.cfg.timeout_s,
            )
            offset += workers[m.address]
        futures = {
            m.address: self._pool.submit(
                m.stub.JoinWeightGroup,
                requests[m.address],
                timeout=self.cfg.rpc_timeout_s + self.cfg.timeout_s,
            )
            for m in members
        }
        try:
            group = WeightGroup(
                self.store,
                kind=self.kind,
                epoch=epoch,
                rank=0,
                world_size=world,
                backend=self.backend,
                timeout_s=self.cfg.timeout_s,
            )
        except Exception as e:
            failed = _failed_joins(futures)
            raise _MembersFailed(failed or {a: f"group formation failed: {e}" for a in futures}) from None
        if failed := _failed_joins(futures):
            # formed, but a member went away before its join returned (a replica killed
            # as the group formed): the group is broken for every later collective
            group.close()
            raise _MembersFailed(failed)
        self._group, self._group_members = group, addresses
        if self.metrics:
            self.metrics.epoch.labels(kind=self.kind).set(epoch)
        log.info("%s weight group epoch %d formed: %s (world %d)", self.kind, epoch, list(addresses), world)
        return group

    def _wait_idle(self, members: list[_Member]) -> None:
        """Wait (bounded) until no member is still inside an aborted update: its engine
        leaves the old group only when that group's collective timeout expires. An update
        of this kind received in full is not waited for: joining abandons it (its sender
        is gone: this sender commits its own before forming a group)."""
        deadline = time.monotonic() + 2 * self.cfg.timeout_s + self.cfg.rpc_timeout_s
        for m in members:
            while time.monotonic() < deadline:
                try:
                    ws = m.stub.GetStatus(pb.GetStatusRequest(), timeout=self.cfg.rpc_timeout_s).weight_sync
                except grpc.RpcError:
                    break  # formation will report it
                if ws.state == "idle" or (ws.state == "received" and ws.pending_kind == self.kind):
                    break
                time.sleep(0.2)

    def restart(self) -> None:
        """Forget the members, the group and the version published: a trainer restored
        from a checkpoint publishes again from there, in a new group, and from now on
        replaces newer or same-numbered versions the replicas serve (`rewind`)."""
        for address in list(self.members):
            self.remove_replica(address)
        self._drop_group()
        self.version, self._source, self._policy_version = None, None, 0
        self.rewind = True

    def _drop_group(self) -> None:
        if self._group is not None:
            self._group.close()
        self._group, self._group_members = None, ()

    def close(self) -> None:
        self._drop_group()
        for m in self.members.values():
            m.close()
        self.members.clear()
        self._pool.shutdown(wait=False)
