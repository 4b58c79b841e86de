"""Ports: handed to children that cannot bind port 0 themselves, and a port held by
another server refused rather than shared."""

from __future__ import annotations

import asyncio
import socket
from concurrent import futures

import grpc
import pytest

from specrl import grpc_options, serving
from specrl.launcher import _ephemeral_range, free_port


def test_free_ports_are_distinct_bindable_and_below_the_ephemeral_range():
    """Between free_port() and a child's bind, other processes bind port 0 and connect
    (a vLLM engine opens a dozen ZMQ sockets): below the kernel's ephemeral range none of
    them can take the port. Bound here to show each is free."""
    low = _ephemeral_range()[0]
    ports = [free_port() for _ in range(64)]
    assert len(set(ports)) == 64 and all(1024 <= p < low for p in ports)
    for p in ports[:8]:
        with socket.socket() as s:
            s.bind(("127.0.0.1", p))


def test_a_port_another_server_holds_is_refused_not_shared():
    """gRPC's default on Linux (SO_REUSEPORT) lets a second server bind a port in use and
    splits connections between the two; specrl's servers (real gRPC, sync and asyncio)
    refuse it with an error that says why."""
    default = [grpc.server(futures.ThreadPoolExecutor(1), options=grpc_options.OPTIONS) for _ in "ab"]
    taken = default[0].add_insecure_port("127.0.0.1:0")
    assert default[1].add_insecure_port(f"127.0.0.1:{taken}") == taken  # both would listen
    first, port = serving.start(lambda s: None, "specrl.test", "127.0.0.1", 0)
    try:
        with pytest.raises(OSError, match="the port is taken"):
            serving.start(lambda s: None, "specrl.test", "127.0.0.1", port)

        async def bind_asyncio() -> None:
            server = grpc.aio.server(options=grpc_options.SERVER_OPTIONS)
            grpc_options.add_port(server, f"127.0.0.1:{port}")

        with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port}"):
            asyncio.run(bind_asyncio())
    finally:
        first.stop(grace=None)
