"""The trainer's core, no gRPC: every rank holds its shard of the `TrainState`; rank 0
receives commands and broadcasts them so all ranks run the same collective operations in
the same order.

Requests are validated on rank 0 before anything is broadcast: a bad batch is refused
with the offending sample named, and no rank trains on it.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.distributed as dist

from specrl.config import TrainerConfig, WeightSenderConfig
from specrl.devices import local_device
from specrl.metrics import TrainerMetrics, WeightSenderMetrics
from specrl.trainer import checkpoint
from specrl.trainer.api import Rollout
from specrl.trainer.batch import BatchError, collate, validate
from specrl.trainer.logprobs import Mismatch, logprobs, mismatch
from specrl.trainer.state import TrainState
from specrl.trainer.step import StepMetrics, train_step
from specrl.weightsync.sender import WeightSender

log = logging.getLogger("specrl.trainer")


def load_batch_file(path: str) -> list[Rollout]:
    """A JSONL batch reference: one {"prompt_ids", "completion_ids", "reward",
    "rollout_logprobs"?, "policy_version"?} object per line."""
    p = Path(path.removeprefix("file://"))
    if not p.is_file():
        raise BatchError(f"batch reference {path!r}: no such file")
    out = []
    for n, line in enumerate(p.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
            out.append(
                Rollout(
                    d["prompt_ids"],
                    d["completion_ids"],
                    float(d["reward"]),
                    d.get("rollout_logprobs") or (),
                    d.get("policy_version"),
                )
            )
        except (ValueError, KeyError, TypeError) as e:
            raise BatchError(f"batch reference {path!r} line {n}: {type(e).__name__}: {e}") from None
    return out


@dataclass
class PushOutcome:
    version: int
    updated: list[str] = field(default_factory=list)
    dropped: dict[str, str] = field(default_factory=dict)
    bytes: int = 0
    seconds: float = 0.0
    phases: dict[str, float] = field(default_factory=dict)


class TrainerCore:
    def __init__(
        self,
        cfg: TrainerConfig,
        metrics: TrainerMetrics | None = None,
        *,
        weight_sync: WeightSenderConfig | None = None,
        sender_metrics: WeightSenderMetrics | None = None,
    ) -> None:
        self.cfg = cfg
        self.state = TrainState.build(cfg, device=local_device())
        self.metrics = metrics
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.weight_sync = weight_sync or WeightSenderConfig()
        self.sender_metrics = sender_metrics
        self._sender: WeightSender | None = None

    # -- rank 0 -------------------------------------------------------------------

    def compute_logprobs(
        self, rollouts: Sequence[Rollout], *, reference: bool = False
    ) -> tuple[list[list[float]], Mismatch | None]:
        validate(rollouts, self.state.vocab_size)
        if reference and self.state.reference is None:
            raise BatchError(f"no reference policy: trainer.loss {self.cfg.loss!r} reads none")
        return self._run("logprobs", (list(rollouts), reference))

    def train_step(self, rollouts: Sequence[Rollout], group_size: int) -> StepMetrics:
        validate(rollouts, self.state.vocab_size)
        if group_size < 1 or len(rollouts) % group_size:
            raise BatchError(f"{len(rollouts)} samples do not split into groups of {group_size}")
        if len(rollouts) % self.cfg.dp:
            raise BatchError(f"{len(rollouts)} samples do not split across dp={self.cfg.dp} ranks")
        m = self._run("train", (list(rollouts), group_size))
        self._observe(m)
        return m

    def save(self, path: str) -> str:
        return self._run("save", path)

    def load(self, path: str) -> int:
        """Restore checkpoint `path` in place (every rank); the policy version it holds."""
        meta = self._run("load", path)
        return int(meta["step"])

    def push_weights(self, replicas: Sequence[str], *, rewind: bool = False) -> PushOutcome:
        """Make every replica in `replicas` serve the current policy (version = steps
        taken); replicas not listed leave the weight group. Sharded weights are gathered
        on rank 0 first (a collective every rank joins), then rank 0 broadcasts them.
        `rewind` (a resumed run): a new weight group sends the policy to every replica,
        whatever version it serves, and later pushes replace newer versions too."""
        t0 = time.perf_counter()
        version = self.state.step_count
        sender = self._weight_sender()
        out = PushOutcome(version)
        if rewind:
            sender.restart()
            for address in replicas:
                sender.add_replica(address)  # no version yet: nothing to catch up
            joining, newer = [], True
        else:
            joining = sender.follow(replicas)
            newer = bool(sender.members) and sender.version is not None and version > sender.version
            if not newer and not joining and sender.version == version:
                return out  # every replica is current: nothing to gather or send
        source = self._source()
        if newer:
            result = sender.push(version, source)
            out.updated, out.dropped, out.bytes = list(result.members), dict(result.dropped), result.bytes
            out.phases = dict(result.phases)
        else:
            # nothing new for the members (or none yet; or a restarted trainer, whose
            # replicas may hold this version already): catch-ups below send what is due
            sender.set_current(version, source)
        sent, failed = sender.join(joining)
        out.updated += sent
        out.dropped |= failed
        out.seconds = time.perf_counter() - t0
        return out

    def _source(self):
        """The full policy weights on rank 0: gathered from every rank's shard (a
        collective) when sharded."""
        if dist.is_initialized() and dist.get_world_size() > 1:
            return self._run("gather", None).items
        return self.state.model.named_parameters

    def _weight_sender(self) -> WeightSender:
        if self._sender is None:
            self._sender = WeightSender(
                self.weight_sync, metrics=self.sender_metrics, device=self.state.device
            )
        return self._sender

    def stop(self) -> None:
        if self._sender is not None:
            self._sender.close()
        if dist.is_initialized() and self.rank == 0:
            dist.broadcast_object_list(["stop", None], src=0)

    def _run(self, op: str, payload: object):
        if dist.is_initialized():
            dist.broadcast_object_list([op, payload], src=0)
        return self._execute(op, payload)

    # -- every rank -----------------------------------------------------------------

    def follow(self) -> None:
        """Ranks > 0: execute rank 0's commands until it stops."""
        while True:
            cmd: list = [None, None]
            dist.broadcast_object_list(cmd, src=0)
            op, payload = cmd
            if op == "stop":
                return
            try:
                self._execute(op, payload)
            except Exception:
                log.exception("rank %d: %s failed", self.rank, op)

    def _execute(self, op: str, payload):
        state = self.state
        if op == "logprobs":
            rollouts, reference = payload
            batch = collate(rollouts, state.vocab_size)
            lp = logprobs(state, batch, reference=reference).cpu()
            out = [lp[i][batch.mask[i].bool()].tolist() for i in range(batch.size)]
            return out, mismatch(lp, batch.rollout_logprobs, batch.mask_of_version(state.step_count))
        if op == "train":
            rollouts, group_size = payload
            return train_step(state, collate(rollouts, state.vocab_size), group_size)
        if op == "save":
            checkpoint.save(state, payload)
            return payload
        if op == "load":
            return checkpoint.load(state, payload)
        if op == "gather":
            return state.full_state(keep=self.rank == 0)
        raise ValueError(f"unknown trainer command {op!r}")

    def _observe(self, m: StepMetrics) -> None:
        if self.metrics is None:
            return
        r = self.metrics
        r.stage_seconds.labels(stage="logprob").observe(m.logprob_seconds)
        r.stage_seconds.labels(stage="train").observe(m.train_seconds)
        r.steps.inc()
        r.tokens.inc(m.tokens)
        seconds = m.logprob_seconds + m.train_seconds
        r.tokens_per_second.set(m.tokens / seconds if seconds > 0 else 0)
        for stat, value in m.stats.items():
            r.step_value.labels(stat=stat).set(value)
        if m.mismatch is not None:
            r.mismatch_kl.set(m.mismatch.kl)
            r.mismatch_max_abs.set(m.mismatch.max_abs)
        if self.state.capturer is not None:
            r.capture_queue.set(self.state.capturer.queue.qsize())
            r.capture_dropped.set(self.state.capturer.queue.dropped)


def init_distributed() -> None:
    """torchrun-compatible: WORLD_SIZE > 1 starts the default group (NCCL with CUDA,
    else gloo) from RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
        log.info("rank %d of %d joined the trainer group", dist.get_rank(), dist.get_world_size())
