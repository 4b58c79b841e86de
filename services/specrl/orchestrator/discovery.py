"""Where the rollout replicas are, followed while the run goes on (`rollout.discover`), so
generation scales out and in under a running loop: an autoscaler adds or removes rollout
pods, and the orchestrator follows.

  k8s:NAMESPACE/SERVICE:PORT  the Service's EndpointSlices, watched through the Kubernetes
                              API (kube.EndpointSliceWatch): changes arrive as they happen
  dns:NAME:PORT               every address NAME resolves to, each with PORT, looked up
                              again every `discover_every_s`
  file:PATH                   one host:port a line (# comments), for schedulers without DNS
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Protocol


class DiscoveryError(RuntimeError):
    """The lookup failed (the set of replicas is unknown, not empty)."""


class Discovery(Protocol):
    """The replicas now (`__call__`, raising DiscoveryError when unknown), worth asking
    again after `every_s`; `close` ends any watch behind it."""

    spec: str
    every_s: float

    def __call__(self) -> list[str]: ...

    def close(self) -> None: ...


class Lookup:
    """A DNS or file lookup, done anew on every call."""

    def __init__(self, spec: str, every_s: float) -> None:
        self.spec, self.every_s = spec, every_s

    def __call__(self) -> list[str]:
        return discover(self.spec)

    def close(self) -> None:
        pass


def open_discovery(spec: str, every_s: float) -> Discovery:
    """The discovery `spec` names, started (a Kubernetes watch lists before it returns
    nothing: until then it raises DiscoveryError, as an unknown set)."""
    if spec.startswith("k8s:"):
        from specrl.orchestrator.kube import EndpointSliceWatch

        return EndpointSliceWatch(spec).start()
    return Lookup(spec, every_s)


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
    kinds = "k8s:NAMESPACE/SERVICE:PORT, dns:NAME:PORT or file:PATH"
    raise DiscoveryError(f"unknown discovery {spec!r}: {kinds}")
