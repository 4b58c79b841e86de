"""The sender's membership when a replica dies at the one moment a real server cannot be
made to die on purpose: after the weight group has formed (its rank connected) and before
its JoinWeightGroup call returned. A Ray actor killed as the trainer pushed did exactly
that in CI, and the raw gRPC error stopped the run instead of dropping the replica.

The replica is a STAND-IN rollout server (real gRPC over loopback, a real gloo group
joined with the sender's store; no engine): a real vLLM server cannot be killed between
those two points deterministically. Everything on the sender's side is the real code."""

from __future__ import annotations

from concurrent import futures

import grpc
import pytest
import torch

from specrl.config import WeightSenderConfig
from specrl.v1 import rollout_pb2 as pb
from specrl.v1 import rollout_pb2_grpc as pb_grpc
from specrl.weightsync.group import WeightGroup
from specrl.weightsync.sender import WeightSender, WeightSyncError
from specrl.weightsync.wire import join_info_from_proto


class DiesAsItJoins(pb_grpc.RolloutServiceServicer):
    """Stand-in replica: idle at version 0; joins the group, then fails its join call as a
    process killed at that moment does."""

    def __init__(self) -> None:
        self.groups: list[WeightGroup] = []

    def GetStatus(self, request, context):
        idle = pb.WeightSyncState(state="idle", ready=True)
        return pb.RolloutStatus(weight_sync_workers=1, weight_sync=idle)

    def JoinWeightGroup(self, request, context):
        self.groups.append(WeightGroup.join(join_info_from_proto(request), local_rank=0))
        context.abort(grpc.StatusCode.UNAVAILABLE, "stand-in: the replica went away as it joined")


@pytest.fixture
def replica():
    servicer = DiesAsItJoins()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    pb_grpc.add_RolloutServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield f"127.0.0.1:{port}", servicer
    server.stop(grace=None)
    for g in servicer.groups:
        g.close()


def _sender(retries: int) -> WeightSender:
    return WeightSender(WeightSenderConfig(kind="policy", timeout_s=20, rpc_timeout_s=20, retries=retries))


def _weights():
    return [("model.embed_tokens.weight", torch.ones(4, 2))]


def test_a_replica_lost_after_the_group_formed_is_dropped_and_the_push_goes_on(replica):
    address, servicer = replica
    sender = _sender(retries=1)
    try:
        sender.add_replica(address)
        result = sender.push(1, _weights)
        assert len(servicer.groups) == 1, "the stand-in did not join: the case is not exercised"
        assert list(result.dropped) == [address] and "could not join" in result.dropped[address]
        assert result.members == [] and address not in sender.members and sender.version == 1
        assert sender._group is None, "a group with a member gone was kept for the next push"
    finally:
        sender.close()


def test_out_of_retries_it_is_a_weight_sync_error_naming_the_replica(replica):
    address, _ = replica
    sender = _sender(retries=0)
    try:
        sender.add_replica(address)
        with pytest.raises(WeightSyncError, match=f"{address}: could not join: UNAVAILABLE"):
            sender.push(1, _weights)
    finally:
        sender.close()
