"""Conversions between weight-sync data and the rollout proto (specrl.v1)."""

from __future__ import annotations

from specrl.v1 import rollout_pb2 as pb
from specrl.weightsync.manifest import Manifest, ManifestError, TensorSpec

KIND_TO_PROTO = {"policy": pb.WEIGHT_KIND_POLICY, "draft": pb.WEIGHT_KIND_DRAFT}
KIND_FROM_PROTO = {v: k for k, v in KIND_TO_PROTO.items()}


def kind_from_proto(kind: int) -> str:
    try:
        return KIND_FROM_PROTO[kind]
    except KeyError:
        raise ManifestError("weight kind must be WEIGHT_KIND_POLICY or WEIGHT_KIND_DRAFT") from None


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
