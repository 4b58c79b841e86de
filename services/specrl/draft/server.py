"""gRPC front of the draft-trainer: status and PushDraft over DraftTrainerCore."""

from __future__ import annotations

import logging

import grpc

from specrl import serving
from specrl.config import DraftTrainerServerConfig
from specrl.draft.service import DraftTrainerCore
from specrl.v1 import draft_pb2 as pb
from specrl.v1 import draft_pb2_grpc as pb_grpc

log = logging.getLogger("specrl.draft.server")
SERVICE_NAME = "specrl.v1.DraftTrainerService"


class DraftTrainerServicer(pb_grpc.DraftTrainerServiceServicer):
    def __init__(self, core: DraftTrainerCore) -> None:
        self.core = core

    def GetStatus(self, request, context):
        return pb.DraftStatus(**self.core.status())

    def PushDraft(self, request, context):
        replicas = list(request.replicas)
        if len(set(replicas)) != len(replicas) or not all(replicas):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"replicas: empty or repeated in {replicas}")
        out = self.core.push(replicas)
        return pb.PushDraftResponse(**vars(out))


def serve(cfg: DraftTrainerServerConfig, *, ready_file: str | None = None) -> int:
    """Run the draft-trainer until SIGINT/SIGTERM."""
    from specrl import metrics

    core = DraftTrainerCore(
        cfg, metrics=metrics.DraftMetrics(), sender_metrics=metrics.WeightSenderMetrics()
    ).start()
    if cfg.metrics_port is not None:
        log.info("metrics on :%d/metrics", metrics.serve(cfg.metrics_port))
    server, port = serving.start(
        lambda s: pb_grpc.add_DraftTrainerServiceServicer_to_server(DraftTrainerServicer(core), s),
        SERVICE_NAME,
        cfg.host,
        cfg.port,
        workers=4,
    )
    log.info("draft-trainer on %s:%d", cfg.host, port)
    asked = serving.stop_signals()
    serving.report_ready(ready_file, port)
    serving.wait_for_stop(server, asked)
    log.info("stopped serving")
    core.stop()
    return 0
