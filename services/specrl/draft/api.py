"""A small synchronous client of the draft-trainer (orchestrator, tests)."""

from __future__ import annotations

from collections.abc import Sequence

from specrl import grpc_options
from specrl.v1 import draft_pb2 as pb
from specrl.v1 import draft_pb2_grpc as pb_grpc


class DraftTrainerClient:
    def __init__(self, address: str, *, timeout: float = 600.0) -> None:
        self.address = address
        self.timeout = timeout
        self._channel = grpc_options.channel(address)
        self.stub = pb_grpc.DraftTrainerServiceStub(self._channel)

    def push_draft(self, replicas: Sequence[str]) -> pb.PushDraftResponse:
        return self.stub.PushDraft(pb.PushDraftRequest(replicas=list(replicas)), timeout=self.timeout)

    def status(self) -> pb.DraftStatus:
        return self.stub.GetStatus(pb.GetDraftStatusRequest(), timeout=30)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> DraftTrainerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
