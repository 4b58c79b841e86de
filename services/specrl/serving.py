"""The life of a synchronous gRPC service process (trainer rank 0, draft-trainer): bind
and start with gRPC health serving, report the bound port to whoever started it, wait for
SIGINT/SIGTERM, then stop under the shutdown deadline. `health_of` asks any specrl service
(rollout server included) whether it serves."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from specrl import grpc_options, shutdown


def start(
    add_servicer: Callable[[grpc.Server], None],
    service_name: str,
    host: str,
    port: int,
    *,
    workers: int = 8,
) -> tuple[grpc.Server, int]:
    """Bind (port 0 picks a free one), start, mark SERVING; returns server and bound port."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers), options=grpc_options.OPTIONS)
    add_servicer(server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    bound = grpc_options.add_port(server, f"{host}:{port}")
    server.start()
    for name in ("", service_name):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return server, bound


def report_ready(ready_file: str | None, port: int) -> None:
    """Tell the launcher (specrl.launcher.ServiceProcess) the bound port."""
    if ready_file:
        with open(ready_file, "w") as f:
            f.write(str(port))


def wait_for_stop(server: grpc.Server) -> None:
    """Block until SIGINT/SIGTERM, then stop `server` (the process exits within the
    shutdown deadline whatever the caller's cleanup does)."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    shutdown.exit_after()
    server.stop(grace=5).wait()


def health_of(address: str, timeout: float = 10.0) -> str:
    """The gRPC health of the service at `address` ("SERVING", "NOT_SERVING"), or the
    name of the gRPC error that kept it from answering ("UNAVAILABLE", ...)."""
    with grpc_options.channel(address) as channel:
        try:
            stub = health_pb2_grpc.HealthStub(channel)
            reply = stub.Check(health_pb2.HealthCheckRequest(), timeout=timeout)
        except grpc.RpcError as e:
            return e.code().name
    return health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
