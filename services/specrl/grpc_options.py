"""gRPC settings every specrl server and client shares, in one place: message sizes
(messages carry whole batches of token ids and logprobs, and weight manifests, far beyond
gRPC's 4 MiB default), and mutual TLS.

Mutual TLS is on when SPECRL_TLS_CERT, SPECRL_TLS_KEY and SPECRL_TLS_CA name PEM files
(the Helm chart mounts a cert-manager or user Secret there): every server then requires a
client certificate signed by that CA, and every client presents its own and checks the
server's. Peers are reached by changing pod IPs, so certificates are checked against one
name every specrl certificate carries, SPECRL_TLS_SERVER_NAME (default "specrl"), rather
than against the address.
"""

from __future__ import annotations

import os
from pathlib import Path

import grpc

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]
# Servers only: a port another server holds is an error, not a second listener. gRPC's
# default on Linux (SO_REUSEPORT) lets a second server bind it, and the kernel then splits
# connections between the two: two replicas started on one port would take each other's
# requests and weight updates, a second run's trainer calls could reach the first's.
SERVER_OPTIONS = [*OPTIONS, ("grpc.so_reuseport", 0)]
TLS_ENV = ("SPECRL_TLS_CERT", "SPECRL_TLS_KEY", "SPECRL_TLS_CA")
SERVER_NAME_ENV = "SPECRL_TLS_SERVER_NAME"


class TLSConfigError(RuntimeError):
    """The SPECRL_TLS_* variables are incomplete or name files that cannot be read."""


def tls_files() -> tuple[bytes, bytes, bytes] | None:
    """(certificate chain, private key, CA) when mutual TLS is on, else None."""
    paths = {name: os.environ.get(name, "") for name in TLS_ENV}
    if not any(paths.values()):
        return None
    if missing := [name for name, path in paths.items() if not path]:
        raise TLSConfigError(f"mutual TLS needs {', '.join(TLS_ENV)}: {', '.join(missing)} not set")
    try:
        cert, key, ca = (Path(paths[name]).read_bytes() for name in TLS_ENV)
    except OSError as e:
        raise TLSConfigError(f"mutual TLS: cannot read {e.filename}: {e.strerror}") from None
    return cert, key, ca


def _secure(files: tuple[bytes, bytes, bytes]) -> tuple[grpc.ChannelCredentials, list[tuple[str, object]]]:
    cert, key, ca = files
    credentials = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
    name = os.environ.get(SERVER_NAME_ENV) or "specrl"
    return credentials, [*OPTIONS, ("grpc.ssl_target_name_override", name)]


def channel(address: str) -> grpc.Channel:
    """A channel to a specrl service: mutual TLS when configured, plaintext otherwise."""
    files = tls_files()
    if files is None:
        return grpc.insecure_channel(address, options=OPTIONS)
    return grpc.secure_channel(address, *_secure(files))


def aio_channel(address: str) -> grpc.aio.Channel:
    """`channel`'s asyncio twin (grpc.aio), with the same settings."""
    files = tls_files()
    if files is None:
        return grpc.aio.insecure_channel(address, options=OPTIONS)
    return grpc.aio.secure_channel(address, *_secure(files))


def add_port(server: grpc.Server | grpc.aio.Server, address: str) -> int:
    """Bind `server` (sync or asyncio, made with SERVER_OPTIONS) to `address`, requiring
    client certificates when mutual TLS is configured; the bound port. OSError when the
    address cannot be bound (gRPC says only that it failed)."""
    files = tls_files()
    try:
        if files is None:
            port = server.add_insecure_port(address)
        else:
            cert, key, ca = files
            credentials = grpc.ssl_server_credentials(
                [(key, cert)], root_certificates=ca, require_client_auth=True
            )
            port = server.add_secure_port(address, credentials)
    except RuntimeError:
        port = 0
    if not port:
        raise OSError(
            f"cannot listen on {address}: the port is taken (another server on this machine?) "
            "or the host is not an address of this machine"
        )
    return port
