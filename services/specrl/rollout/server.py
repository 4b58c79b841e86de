"""gRPC front of the rollout server. The servicer only converts messages and maps errors
to status codes; the work is in RolloutService."""

from __future__ import annotations

import asyncio
import logging
import signal
import time
import uuid

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from specrl import grpc_options, serving, shutdown
from specrl.config import RolloutServerConfig
from specrl.rollout.engines.base import Sampling
from specrl.rollout.service import NotReady, NotServing, RolloutService, StampedSample
from specrl.rollout.validation import Limits, RequestError, parse_request
from specrl.rollout.weights import WeightUpdateError
from specrl.v1 import rollout_pb2 as pb
from specrl.v1 import rollout_pb2_grpc as pb_grpc
from specrl.weightsync.manifest import ManifestError
from specrl.weightsync.wire import join_info_from_proto, kind_from_proto, manifest_from_proto

log = logging.getLogger("specrl.rollout.server")

SERVICE_NAME = "specrl.v1.RolloutService"
_UPDATE_CODES = {
    "invalid": grpc.StatusCode.INVALID_ARGUMENT,
    "precondition": grpc.StatusCode.FAILED_PRECONDITION,
    "deadline": grpc.StatusCode.DEADLINE_EXCEEDED,
    "failed": grpc.StatusCode.ABORTED,
}
_FINISH = {
    "stop": pb.FINISH_REASON_STOP,
    "length": pb.FINISH_REASON_LENGTH,
    "abort": pb.FINISH_REASON_ABORT,
}


def to_proto(s: StampedSample, return_text: bool) -> pb.Sample:
    g, a = s.sample, s.sample.acceptance
    return pb.Sample(
        prompt_index=s.prompt_index,
        sample_index=g.sample_index,
        token_ids=g.token_ids,
        logprobs=g.logprobs,
        text=g.text if return_text else "",
        finish_reason=_FINISH[g.finish_reason],
        policy_version=s.policy_version,
        draft_version=s.draft_version,
        prompt_tokens=g.prompt_tokens,
        acceptance=pb.AcceptanceStats(
            drafts=a.drafts,
            draft_tokens=a.draft_tokens,
            accepted_tokens=a.accepted_tokens,
            accepted_per_position=a.accepted_per_position,
            acceptance_length=a.acceptance_length,
        ),
    )


class RolloutServicer(pb_grpc.RolloutServiceServicer):
    def __init__(self, service: RolloutService) -> None:
        self.service = service
        self.instance = uuid.uuid4().hex[:16]  # RolloutStatus.instance
        info = service.engine.info
        self.limits = Limits(
            vocab_size=info.vocab_size,
            max_model_len=info.max_model_len,
            max_samples_per_request=service.cfg.max_samples_per_request,
            max_n=info.max_n,
        )

    async def _parse(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> tuple[list[list[int]], Sampling, list[list[list[int]]]]:
        try:
            return parse_request(request, self.service.engine.tokenize, self.limits)
        except RequestError as e:
            self.service.metrics.requests.labels(status="invalid").inc()
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))
            raise  # unreachable: abort raises

    async def _stream(self, request, context):
        prompts, sampling, history = await self._parse(request, context)
        try:
            async for s in self.service.generate(prompts, sampling, request.request_id, history):
                yield s
        except NotServing as e:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        except NotReady as e:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(e))

    async def Generate(self, request, context):
        t0 = time.perf_counter()
        return_text = not request.HasField("return_text") or request.return_text
        samples = [s async for s in self._stream(request, context)]
        samples.sort(key=lambda s: (s.prompt_index, s.sample.sample_index))
        return pb.GenerateResponse(
            samples=[to_proto(s, return_text) for s in samples],
            seconds=time.perf_counter() - t0,
        )

    async def GenerateStream(self, request, context):
        return_text = not request.HasField("return_text") or request.return_text
        async for s in self._stream(request, context):
            yield to_proto(s, return_text)

    async def GetStatus(self, request, context):
        svc, info, st = self.service, self.service.engine.info, self.service.self_test
        return pb.RolloutStatus(
            engine=info.engine,
            engine_version=info.engine_version,
            model=info.model,
            speculation_method=info.method,
            num_speculative_tokens=info.k,
            draft_model=info.draft,
            policy_version=svc.policy_version,
            draft_version=svc.draft_version,
            self_test_passed=st.passed if st else not svc.cfg.speculation.enabled,
            self_test_p_value=st.p_value if st else 0.0,
            self_test_detail=st.detail if st else "not run",
            requests_in_flight=svc.in_flight,
            max_model_len=info.max_model_len,
            vocab_size=info.vocab_size,
            engine_patches=svc.engine_patches,
            weight_sync_workers=info.workers,
            weight_sync=self._weight_state(),
            speculation=await self._speculation_state(),
            tokens_generated=svc.engine.tokens_generated,
            max_num_seqs=svc.cfg.engine.max_num_seqs,
            instance=self.instance,
        )

    async def _speculation_state(self) -> pb.SpeculationState:
        schedule = self.service.k_schedule or ()
        history = await self.service.history_state()
        return pb.SpeculationState(
            k_schedule=[pb.KRange(first=a, last=b, k=k) for a, b, k in schedule],
            adaptive=self.service.adaptive is not None,
            drafter_paused=self.service.drafter_paused,
            history=self.service.cfg.speculation.drafts_from_history,
            history_rows=history.get("history", 0),
            model_rows=history.get("model", 0),
            history_tokens=history.get("tokens", 0),
            first_pass_only_steps=history.get("first_pass_only", 0),
            long_draft_steps=history.get("long_drafts", 0),
            left_out_rows=history.get("left_out", 0),
            padded_steps=history.get("padded", 0),
            extended_rows=history.get("extended", 0),
        )

    async def SetSpeculation(self, request, context):
        schedule = tuple((r.first, r.last, r.k) for r in request.k_schedule)
        try:
            await self.service.set_k_schedule(schedule)
        except NotServing as e:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(e))
        except ValueError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"k_schedule: {e}")
        return await self._speculation_state()

    def _weight_state(self) -> pb.WeightSyncState:
        w = self.service.weights
        return pb.WeightSyncState(
            policy_version=w.versions["policy"],
            draft_version=w.versions["draft"],
            draft_policy_version=w.draft_policy_version,
            ready=w.ready,
            detail=w.detail,
            state=w.state,
            pending_kind=w.pending.kind if w.pending else "",
            policy_epoch=w.epochs.get("policy", 0),
            draft_epoch=w.epochs.get("draft", 0),
            last_seconds=w.last_seconds,
            last_bytes=w.last_bytes,
            last_load_seconds=w.last_load_seconds,
            last_wait_seconds=w.last_wait_seconds,
        )

    async def _weight_call(self, context, call) -> None:
        """Run a weight-sync step, mapping its errors to gRPC status codes."""
        try:
            await call()
        except WeightUpdateError as e:
            await context.abort(_UPDATE_CODES[e.code], str(e))
        except ManifestError as e:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(e))

    async def JoinWeightGroup(self, request, context):
        ranks: list[int] = []

        async def call() -> None:
            ranks.extend(await self.service.weights.join(join_info_from_proto(request)))

        await self._weight_call(context, call)
        return pb.JoinWeightGroupResponse(ranks=ranks)

    async def BeginWeightUpdate(self, request, context):
        async def call() -> None:
            await self.service.weights.begin(
                kind_from_proto(request.kind),
                request.version,
                request.epoch,
                manifest_from_proto(request.manifest),
                request.policy_version,
                rewind=request.rewind,
            )

        await self._weight_call(context, call)
        return self._weight_state()

    async def CommitWeightUpdate(self, request, context):
        async def call() -> None:
            await self.service.weights.commit(kind_from_proto(request.kind), request.version)

        await self._weight_call(context, call)
        return self._weight_state()

    async def AbortWeightUpdate(self, request, context):
        async def call() -> None:
            await self.service.weights.abort(kind_from_proto(request.kind), request.version, request.reason)

        await self._weight_call(context, call)
        return self._weight_state()


async def create_server(
    service: RolloutService, address: str
) -> tuple[grpc.aio.Server, int, health.HealthServicer]:
    """Bind (port 0 picks a free one) and start; returns server, bound port and health."""
    server = grpc.aio.server(options=grpc_options.SERVER_OPTIONS)
    pb_grpc.add_RolloutServiceServicer_to_server(RolloutServicer(service), server)
    health_servicer = health.HealthServicer(experimental_non_blocking=True)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = grpc_options.add_port(server, address)
    await server.start()

    def set_health(serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for name in ("", SERVICE_NAME):
            health_servicer.set(name, status)

    service.watch_serving(set_health)
    return server, port, health_servicer


async def serve(cfg: RolloutServerConfig, *, ready_file: str | None = None) -> int:
    """Run a rollout server until SIGINT/SIGTERM. Returns the process exit code."""
    from specrl import metrics
    from specrl.rollout.engines import create_engine

    rollout_metrics = metrics.RolloutMetrics()
    if cfg.metrics_port is not None:
        port = metrics.serve(cfg.metrics_port)
        log.info("metrics on :%d/metrics", port)
    engine = create_engine(cfg)
    service = RolloutService(cfg, engine, rollout_metrics)
    try:
        await service.start()
        server, port, _ = await create_server(service, f"{cfg.host}:{cfg.port}")
        spec = cfg.speculation
        log.info(
            "rollout server on %s:%d (model %s, speculation %s k=%d%s)%s",
            cfg.host,
            port,
            engine.info.model,
            engine.info.method,
            engine.info.k,
            f", history up to {spec.engine_k}" if spec.engine_k > spec.k else "",
            "" if service.serving else f" NOT SERVING: {service.not_serving_reason}",
        )
        stop = asyncio.Event()  # set before ready: a stop asked at once still stops gracefully
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        serving.report_ready(ready_file, port)
        await stop.wait()
        log.info("shutting down")
        shutdown.exit_after()
        await server.stop(grace=5)
    finally:
        engine.shutdown()
    return 0
