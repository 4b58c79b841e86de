"""Ports handed to children that cannot bind port 0 themselves."""

from __future__ import annotations

import socket

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
