"""Where the rollout replicas are, looked up again while the run goes on
(`rollout.discover`), so generation scales out and in under a running loop: a Kubernetes
autoscaler adds or removes rollout pods, the headless Service's DNS name follows, and so
does the orchestrator.

  dns:NAME:PORT   every address NAME resolves to, each with PORT
  file:PATH       one host:port a line (# comments), for schedulers without DNS
"""

from __future__ import annotations

import socket
from pathlib import Path


class DiscoveryError(RuntimeError):
    """The lookup failed (the set of replicas is unknown, not empty)."""


def discover(spec: str) -> list[str]:
    """The replicas' host:port addresses, sorted."""
    kind, _, rest = spec.partition(":")
    if kind == "dns":
        name, _, port = rest.rpartition(":")
        try:
            infos = socket.getaddrinfo(name, int(port), type=socket.SOCK_STREAM)
        except (socket.gaierror, UnicodeError) as e:
            raise DiscoveryError(f"{name} does not resolve: {e}") from None
        hosts = {info[4][0] for info in infos}
        return sorted(f"[{h}]:{port}" if ":" in h else f"{h}:{port}" for h in hosts)
    if kind == "file":
        try:
            lines = Path(rest).read_text().splitlines()
        except OSError as e:
            raise DiscoveryError(f"cannot read {rest}: {e}") from None
        found = {line.split("#", 1)[0].strip() for line in lines}
        return sorted(a for a in found if a)
    raise DiscoveryError(f"unknown discovery {spec!r}: dns:NAME:PORT or file:PATH")
