"""Conversions between weight-sync data and the rollout proto (specrl.v1)."""

from __future__ import annotations

from specrl.v1 import rollout_pb2 as pb
from specrl.weightsync.group import JoinInfo
from specrl.weightsync.manifest import Manifest, ManifestError, TensorSpec

JOIN_TIMEOUT_S = 60.0  # a JoinWeightGroupRequest that names no collective timeout

KIND_TO_PROTO = {"policy": pb.WEIGHT_KIND_POLICY, "draft": pb.WEIGHT_KIND_DRAFT}
KIND_FROM_PROTO = {v: k for k, v in KIND_TO_PROTO.items()}


def kind_from_proto(kind: int) -> str:
    try:
        return KIND_FROM_PROTO[kind]
    except KeyError:
        raise ManifestError("weight kind must be WEIGHT_KIND_POLICY or WEIGHT_KIND_DRAFT") from None


def join_info_from_proto(request: pb.JoinWeightGroupRequest) -> JoinInfo:
    """What a receiver needs to join the sender's group, from the sender's request."""
    return JoinInfo(
        kind=kind_from_proto(request.kind),
        host=request.store_host,
        port=request.store_port,
        epoch=request.epoch,
        rank_offset=request.rank_offset,
        world_size=request.world_size,
        backend=request.backend,
        timeout_s=request.timeout_s or JOIN_TIMEOUT_S,
    )


def manifest_to_proto(m: Manifest) -> pb.WeightManifest:
    return pb.WeightManifest(
        tensors=[
            pb.TensorSpec(
                name=t.name, shape=t.shape, dtype=t.dtype, bucket=t.bucket, offset=t.offset, nbytes=t.nbytes
            )
            for t in m.tensors
        ],
        bucket_bytes=m.bucket_bytes,
    )


def manifest_from_proto(m: pb.WeightManifest) -> Manifest:
    return Manifest(
        tensors=tuple(
            TensorSpec(t.name, tuple(t.shape), t.dtype, t.bucket, t.offset, t.nbytes) for t in m.tensors
        ),
        bucket_bytes=tuple(m.bucket_bytes),
    )
