"""gRPC front of the trainer (rank 0). The servicer converts messages and maps errors to
status codes; commands run one at a time (they are collectives across all ranks)."""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import NoReturn

import grpc

from specrl import serving, shutdown
from specrl.config import TrainerServerConfig, resolve_model_path
from specrl.trainer import checkpoint
from specrl.trainer.api import from_proto
from specrl.trainer.batch import BatchError
from specrl.trainer.logprobs import Mismatch
from specrl.trainer.service import TrainerCore, init_distributed, load_batch_file
from specrl.v1 import trainer_pb2 as pb
from specrl.v1 import trainer_pb2_grpc as pb_grpc
from specrl.weightsync.sender import WeightSyncError

log = logging.getLogger("specrl.trainer.server")
SERVICE_NAME = "specrl.v1.TrainerService"


def _mismatch(m: Mismatch | None) -> pb.Mismatch | None:
    return None if m is None else pb.Mismatch(kl=m.kl, max_abs=m.max_abs, tokens=m.tokens)


class TrainerServicer(pb_grpc.TrainerServiceServicer):
    def __init__(self, core: TrainerCore) -> None:
        self.core = core
        self._lock = threading.Lock()  # commands are collectives: one at a time, in order

    def _guarded(self, context, fn):
        with self._lock:
            try:
                return fn()
            except BatchError as e:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))

    def ComputeLogprobs(self, request, context):
        t0 = time.perf_counter()
        lps, mm = self._guarded(
            context,
            lambda: self.core.compute_logprobs(
                [from_proto(s) for s in request.samples], reference=request.reference
            ),
        )
        return pb.ComputeLogprobsResponse(
            completions=[pb.CompletionLogprobs(logprobs=x) for x in lps],
            mismatch=_mismatch(mm),
            seconds=time.perf_counter() - t0,
        )

    def TrainStep(self, request, context):
        def run():
            if request.HasField("batch_ref"):
                rollouts = load_batch_file(request.batch_ref)
            elif request.HasField("inline"):
                rollouts = [from_proto(s) for s in request.inline.samples]
            else:
                raise BatchError("TrainStep needs a batch: inline or batch_ref")
            return self.core.train_step(rollouts, request.group_size)

        m = self._guarded(context, run)
        fields = {k: getattr(m, k) for k in pb.StepMetrics.DESCRIPTOR.fields_by_name if k != "mismatch"}
        return pb.TrainStepResponse(
            metrics=pb.StepMetrics(**fields, mismatch=_mismatch(m.mismatch)), step=self.core.state.step_count
        )

    def SaveCheckpoint(self, request, context):
        if not request.path:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "SaveCheckpoint needs a path")
        path = self._guarded(context, lambda: self.core.save(request.path))
        return pb.SaveCheckpointResponse(path=path, step=self.core.state.step_count, hf_path=f"{path}/hf")

    def LoadCheckpoint(self, request, context):
        if not request.path:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "LoadCheckpoint needs a path")
        with self._lock:
            try:
                step = self.core.load(request.path)
            except FileNotFoundError as e:
                context.abort(grpc.StatusCode.NOT_FOUND, str(e))
        log.info("restored %s: policy v%d", request.path, step)
        return pb.LoadCheckpointResponse(step=step)

    def FindCheckpoint(self, request, context):
        if not request.directory:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "FindCheckpoint needs a directory")
        found = checkpoint.find(request.directory)
        if found is None:
            return pb.CheckpointInfo()
        return pb.CheckpointInfo(path=str(found), step=checkpoint.read_meta(found)["step"])

    def PushWeights(self, request, context):
        replicas = list(request.replicas)
        if len(set(replicas)) != len(replicas) or not all(replicas):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"replicas: empty or repeated in {replicas}")
        with self._lock:
            try:
                out = self.core.push_weights(replicas, rewind=request.rewind)
            except WeightSyncError as e:
                context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        fields = ("version", "updated", "dropped", "bytes", "seconds", "phases")
        return pb.PushWeightsResponse(**{f: getattr(out, f) for f in fields})

    def StreamCaptures(self, request, context):
        """Not a command (no lock): it only drains the capture queue the logprob passes
        fill. A batch taken off the queue as the client goes away is lost, as a batch
        dropped from a full queue is: draft training tolerates gaps, the policy never
        waits."""
        capturer = self.core.state.capturer
        if capturer is None:
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "capture is off (trainer.capture.enabled)")
        sent = 0
        while context.is_active() and (request.max_batches <= 0 or sent < request.max_batches):
            try:
                c = capturer.queue.get(timeout=0.5)
            except queue.Empty:
                continue
            yield c.to_message()
            sent += 1

    def GetStatus(self, request, context):
        p, cfg = self.core.state, self.core.cfg
        q = p.capturer.queue if p.capturer else None
        return pb.TrainerStatus(
            model=resolve_model_path(cfg.model),
            tp=cfg.tp,
            dp=cfg.dp,
            step=p.step_count,
            capture_enabled=q is not None,
            capture_queue=q.qsize() if q else 0,
            capture_dropped=q.dropped if q else 0,
        )


def serve(cfg: TrainerServerConfig, *, ready_file: str | None = None) -> NoReturn:
    """Run one trainer rank until SIGINT/SIGTERM (rank 0) or rank 0's stop (others),
    then end the process (shutdown.exit_now says why not by returning)."""
    from specrl import metrics

    init_distributed()
    import torch.distributed as dist

    rank = dist.get_rank() if dist.is_initialized() else 0
    trainer_metrics = metrics.TrainerMetrics() if rank == 0 else None
    sender_metrics = metrics.WeightSenderMetrics() if rank == 0 else None
    core = TrainerCore(
        cfg.trainer, trainer_metrics, weight_sync=cfg.weight_sync, sender_metrics=sender_metrics
    )
    if rank != 0:
        core.follow()
        shutdown.exit_now(0)
    if cfg.metrics_port is not None:
        log.info("metrics on :%d/metrics", metrics.serve(cfg.metrics_port))
    server, port = serving.start(
        lambda s: pb_grpc.add_TrainerServiceServicer_to_server(TrainerServicer(core), s),
        SERVICE_NAME,
        cfg.host,
        cfg.port,
    )
    log.info(
        "trainer on %s:%d (model %s, tp=%d dp=%d)",
        cfg.host,
        port,
        cfg.trainer.model,
        cfg.trainer.tp,
        cfg.trainer.dp,
    )
    asked = serving.stop_signals()
    serving.report_ready(ready_file, port)
    serving.wait_for_stop(server, asked)
    log.info("stopped serving")
    core.stop()
    shutdown.exit_now(0)
