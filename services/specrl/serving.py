"""The life of a synchronous gRPC service process (trainer rank 0, draft-trainer): bind
and start with gRPC health serving, report the bound port to whoever started it, wait for
SIGINT/SIGTERM, then stop under the shutdown deadline. `health_of` asks any specrl service
(rollout server included) whether it serves."""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from specrl import grpc_options, shutdown

STOP_POLL_S = 0.2  # how soon a service notices SIGINT/SIGTERM


def start(
    add_servicer: Callable[[grpc.Server], None],
    service_name: str,
    host: str,
    port: int,
    *,
    workers: int = 8,
) -> tuple[grpc.Server, int]:
    """Bind (port 0 picks a free one), start, mark SERVING; returns server and bound port."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers), options=grpc_options.SERVER_OPTIONS)
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


def stop_signals() -> list[int]:
    """From now on SIGINT/SIGTERM are recorded in the returned list instead of ending the
    process: a service calls this before it reports ready, so a stop asked the moment it
    is up still takes the graceful path (`wait_for_stop`)."""
    # The handler takes no lock: one that does (Event.set) deadlocks when a second signal
    # interrupts the first handler inside it, holding that lock (a trainer hung that way
    # for good after its run was killed: SIGTERM twice in a row).
    asked: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, _: asked.append(signum))
    return asked


def wait_for_stop(server: grpc.Server, asked: list[int]) -> None:
    """Block until a stop signal is recorded in `asked` (`stop_signals`), then stop
    `server` (the process exits within the shutdown deadline whatever the caller's
    cleanup does)."""
    while not asked:
        time.sleep(STOP_POLL_S)
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
