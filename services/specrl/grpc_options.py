"""gRPC settings every specrl server and client shares: messages carry whole batches of
token ids and logprobs (and weight manifests), far beyond gRPC's 4 MiB default."""

from __future__ import annotations

MAX_MESSAGE_BYTES = 256 * 1024 * 1024
OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
]
