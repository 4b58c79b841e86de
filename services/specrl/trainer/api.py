"""The trainer service's public face, torch-free: the rollout sample it trains on, its
wire codec and a small synchronous client (orchestrator, draft-trainer, tests). Other
services import this module, never the trainer's internals."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from grpc_health.v1 import health_pb2, health_pb2_grpc

from specrl import grpc_options
from specrl.v1 import trainer_pb2 as pb
from specrl.v1 import trainer_pb2_grpc as pb_grpc


@dataclass(frozen=True)
class Rollout:
    prompt_ids: Sequence[int]
    completion_ids: Sequence[int]
    reward: float
    # The rollout engine's logprobs of completion_ids (for truncated IS and mismatch
    # monitoring); empty when unknown.
    rollout_logprobs: Sequence[float] = ()
    # Policy version that generated the sample; None: the trainer's current one.
    policy_version: int | None = None


def to_proto(r: Rollout) -> pb.RolloutSample:
    return pb.RolloutSample(
        prompt_ids=list(r.prompt_ids),
        completion_ids=list(r.completion_ids),
        reward=r.reward,
        rollout_logprobs=list(r.rollout_logprobs),
        policy_version=r.policy_version,
    )


def from_proto(s: pb.RolloutSample) -> Rollout:
    return Rollout(
        list(s.prompt_ids),
        list(s.completion_ids),
        s.reward,
        list(s.rollout_logprobs),
        s.policy_version if s.HasField("policy_version") else None,
    )


class CaptureStream:
    """An iterator over StreamCaptures that another thread may cancel (the draft-trainer
    stopping while it waits for the next batch). It yields the messages as they came:
    decoding the tensors is the consumer's (`specrl.features.Captured.from_message`)."""

    def __init__(self, call) -> None:
        self._call = call

    def __iter__(self) -> Iterator[pb.CapturedBatch]:
        return self

    def __next__(self) -> pb.CapturedBatch:
        return next(self._call)

    def cancel(self) -> None:
        self._call.cancel()


class TrainerClient:
    def __init__(self, address: str, *, timeout: float = 3600.0) -> None:
        self.address = address
        self.timeout = timeout
        self._channel = grpc_options.channel(address)
        self.stub = pb_grpc.TrainerServiceStub(self._channel)
        self._health = health_pb2_grpc.HealthStub(self._channel)

    def train_step(self, rollouts: Sequence[Rollout], group_size: int) -> pb.TrainStepResponse:
        batch = pb.TrainBatch(samples=[to_proto(r) for r in rollouts])
        return self.stub.TrainStep(
            pb.TrainStepRequest(inline=batch, group_size=group_size), timeout=self.timeout
        )

    def compute_logprobs(
        self, rollouts: Sequence[Rollout], *, reference: bool = False
    ) -> pb.ComputeLogprobsResponse:
        req = pb.ComputeLogprobsRequest(samples=[to_proto(r) for r in rollouts], reference=reference)
        return self.stub.ComputeLogprobs(req, timeout=self.timeout)

    def push_weights(self, replicas: Sequence[str], *, rewind: bool = False) -> pb.PushWeightsResponse:
        request = pb.PushWeightsRequest(replicas=list(replicas), rewind=rewind)
        return self.stub.PushWeights(request, timeout=self.timeout)

    def load(self, path: str) -> pb.LoadCheckpointResponse:
        return self.stub.LoadCheckpoint(pb.LoadCheckpointRequest(path=path), timeout=self.timeout)

    def save(self, path: str) -> pb.SaveCheckpointResponse:
        return self.stub.SaveCheckpoint(pb.SaveCheckpointRequest(path=path), timeout=self.timeout)

    def find_checkpoint(self, directory: str) -> pb.CheckpointInfo:
        """The complete checkpoint `directory` holds on the trainer's disk (path "" when none)."""
        return self.stub.FindCheckpoint(pb.FindCheckpointRequest(directory=directory), timeout=60)

    def captures(self, max_batches: int = 0) -> CaptureStream:
        """The trainer's captured batches as its logprob passes produce them (blocks
        between them; 0: until cancelled)."""
        return CaptureStream(self.stub.StreamCaptures(pb.StreamCapturesRequest(max_batches=max_batches)))

    def status(self) -> pb.TrainerStatus:
        return self.stub.GetStatus(pb.GetTrainerStatusRequest(), timeout=30)

    def health(self) -> int:
        return self._health.Check(health_pb2.HealthCheckRequest(), timeout=10).status

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> TrainerClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
