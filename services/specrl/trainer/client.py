"""A small synchronous client of the trainer service (orchestrator, tests)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from specrl import grpc_options
from specrl.trainer.batch import Rollout
from specrl.trainer.capture import Captured
from specrl.v1 import trainer_pb2 as pb
from specrl.v1 import trainer_pb2_grpc as pb_grpc


def to_proto(r: Rollout) -> pb.RolloutSample:
    return pb.RolloutSample(
        prompt_ids=list(r.prompt_ids),
        completion_ids=list(r.completion_ids),
        reward=r.reward,
        rollout_logprobs=list(r.rollout_logprobs),
        policy_version=r.policy_version,
    )


class TrainerClient:
    def __init__(self, address: str, *, timeout: float = 3600.0) -> None:
        self.address = address
        self.timeout = timeout
        self._channel = grpc.insecure_channel(address, options=grpc_options.OPTIONS)
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

    def push_weights(self, replicas: Sequence[str]) -> pb.PushWeightsResponse:
        return self.stub.PushWeights(pb.PushWeightsRequest(replicas=list(replicas)), timeout=self.timeout)

    def save(self, path: str) -> pb.SaveCheckpointResponse:
        return self.stub.SaveCheckpoint(pb.SaveCheckpointRequest(path=path), timeout=self.timeout)

    def captures(self, max_batches: int = 0) -> Iterator[Captured]:
        """The trainer's captured batches as its logprob passes produce them (blocks
        between them; 0: until the caller stops iterating)."""
        stream = self.stub.StreamCaptures(pb.StreamCapturesRequest(max_batches=max_batches))
        try:
            for m in stream:
                ids = tuple(m.aux_layer_ids)
                yield Captured.decode(m.tensors, policy_version=m.policy_version, aux_layer_ids=ids)
        finally:
            stream.cancel()

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
