"""The weight-sync process group: one sender (rank 0) and every rollout engine worker.

It is a standalone torch.distributed group (not the default one) so it lives beside
whatever groups the trainer and the engine already use. Rendezvous is a TCPStore hosted
by the sender; every re-formation (membership change, failure) uses a fresh key prefix,
the epoch, so members of an old group can never meet members of a new one. NCCL on GPU,
gloo on CPU, same code.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
from dataclasses import dataclass

import torch
import torch.distributed as dist

log = logging.getLogger("specrl.weightsync")


@dataclass(frozen=True)
class JoinInfo:
    """What a rollout server needs to join one epoch of a sender's group."""

    kind: str
    host: str  # the sender's rendezvous store
    port: int
    epoch: int
    rank_offset: int  # the server's workers take rank_offset + local rank
    world_size: int
    backend: str
    timeout_s: float


def pick_backend(backend: str, device: torch.device) -> str:
    if backend != "auto":
        return backend
    return "nccl" if device.type == "cuda" else "gloo"


class WeightGroup:
    """One epoch of the group, from the point of view of one member."""

    def __init__(
        self,
        store: dist.Store,
        *,
        kind: str,
        epoch: int,
        rank: int,
        world_size: int,
        backend: str,
        timeout_s: float,
    ) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} outside a group of {world_size}")
        self.kind, self.epoch, self.rank, self.world_size = kind, epoch, rank, world_size
        self.backend = backend
        prefixed = dist.PrefixStore(f"specrl/weightsync/{kind}/{epoch}", store)
        timeout = datetime.timedelta(seconds=timeout_s)
        if backend == "gloo":
            self._pg = dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)
        elif backend == "nccl":
            opts = dist.ProcessGroupNCCL.Options()
            opts._timeout = timeout
            self._pg = dist.ProcessGroupNCCL(prefixed, rank, world_size, opts)
        else:
            raise ValueError(f"unknown backend {backend!r} (gloo | nccl)")
        # A first collective completes the rendezvous: every member is connected when the
        # constructor returns, so a missing member fails here, not in the first update.
        self.broadcast(torch.zeros(1, dtype=torch.uint8, device=self.device))
        log.info("%s weight group epoch %d: rank %d of %d (%s)", kind, epoch, rank, world_size, backend)

    @property
    def device(self) -> torch.device:
        """Where this group's buffers live (NCCL: the current CUDA device)."""
        return (
            torch.device("cuda", torch.cuda.current_device())
            if self.backend == "nccl"
            else torch.device("cpu")
        )

    @classmethod
    def join(cls, info: JoinInfo, local_rank: int) -> WeightGroup:
        """Join as a receiver: connect to the sender's store and form the group."""
        store = dist.TCPStore(
            info.host,
            info.port,
            is_master=False,
            timeout=datetime.timedelta(seconds=info.timeout_s),
        )
        group = cls(
            store,
            kind=info.kind,
            epoch=info.epoch,
            rank=info.rank_offset + local_rank,
            world_size=info.world_size,
            backend=info.backend,
            timeout_s=info.timeout_s,
        )
        group._store = store  # keep the client connection alive with the group
        return group

    def broadcast(self, tensor: torch.Tensor) -> None:
        """Broadcast from the sender (rank 0) into `tensor` on every member, in place."""
        self.start_broadcast(tensor).wait()

    def start_broadcast(self, tensor: torch.Tensor) -> dist.Work:
        """Post a broadcast and return at once; `.wait()` on the result completes it. Lets
        both sides overlap the next bucket's transfer with packing / loading this one."""
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        return self._pg.broadcast([tensor], opts)

    def close(self) -> None:
        """Drop this epoch's group (members re-form under a new epoch)."""
        pg, self._pg = self._pg, None
        if pg is not None and hasattr(pg, "shutdown"):
            with contextlib.suppress(Exception):  # already broken: nothing left to release
                pg.shutdown()


def host_store(host: str, port: int, timeout_s: float) -> dist.TCPStore:
    """The sender's rendezvous store (port 0 picks a free one; see `.port`)."""
    return dist.TCPStore(
        host,
        port,
        is_master=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=timeout_s),
    )
