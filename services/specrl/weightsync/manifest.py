"""The manifest of one weight update: every tensor's name, shape and dtype, and where its
bytes sit in the flattened buckets that are broadcast one after another.

Buckets are flat uint8 buffers holding several tensors back to back (each start aligned),
so a model streams in a few large collectives while neither side ever holds two full
copies: the sender packs one bucket at a time, the receiver loads one bucket at a time.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch

ALIGN = 16  # bytes; any tensor view of a bucket starts at a multiple of its itemsize

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


class ManifestError(ValueError):
    """A manifest that does not describe a well-formed bucket layout."""


def dtype_name(dtype: torch.dtype) -> str:
    try:
        return DTYPE_NAMES[dtype]
    except KeyError:
        raise ManifestError(f"dtype {dtype} cannot be sent") from None


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str
    bucket: int
    offset: int  # bytes from the start of the bucket
    nbytes: int

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class Manifest:
    tensors: tuple[TensorSpec, ...]
    bucket_bytes: tuple[int, ...]

    @property
    def total_bytes(self) -> int:
        return sum(self.bucket_bytes)

    def bucket(self, index: int) -> list[TensorSpec]:
        return [t for t in self.tensors if t.bucket == index]

    def validate(self) -> Manifest:
        """Check the layout is self-consistent; raises ManifestError naming the problem."""
        seen: set[str] = set()
        ends: dict[int, list[tuple[int, int, str]]] = {}
        for t in self.tensors:
            if t.name in seen:
                raise ManifestError(f"tensor {t.name!r} appears twice")
            seen.add(t.name)
            if t.dtype not in DTYPES:
                raise ManifestError(f"{t.name}: unknown dtype {t.dtype!r}")
            if any(d < 0 for d in t.shape):
                raise ManifestError(f"{t.name}: negative dimension in shape {list(t.shape)}")
            itemsize = DTYPES[t.dtype].itemsize
            if t.nbytes != t.numel * itemsize:
                raise ManifestError(f"{t.name}: nbytes {t.nbytes} != {t.numel} elements x {itemsize} bytes")
            if not 0 <= t.bucket < len(self.bucket_bytes):
                raise ManifestError(f"{t.name}: bucket {t.bucket} out of range")
            if t.offset < 0 or t.offset % ALIGN or t.offset + t.nbytes > self.bucket_bytes[t.bucket]:
                raise ManifestError(f"{t.name}: bytes [{t.offset}, +{t.nbytes}) outside its bucket")
            ends.setdefault(t.bucket, []).append((t.offset, t.offset + t.nbytes, t.name))
        for spans in ends.values():
            spans.sort()
            for (_, end, a), (start, _, b) in itertools.pairwise(spans):
                if start < end:
                    raise ManifestError(f"tensors {a!r} and {b!r} overlap in their bucket")
        return self

    def to_dict(self) -> dict:
        """Plain data (crosses process boundaries by pickle, e.g. vLLM collective_rpc)."""
        return {
            "tensors": [[t.name, list(t.shape), t.dtype, t.bucket, t.offset, t.nbytes] for t in self.tensors],
            "bucket_bytes": list(self.bucket_bytes),
        }

    @classmethod
    def from_dict(cls, d: dict) -> Manifest:
        return cls(
            tensors=tuple(
                TensorSpec(name, tuple(shape), dtype, bucket, offset, nbytes)
                for name, shape, dtype, bucket, offset, nbytes in d["tensors"]
            ),
            bucket_bytes=tuple(d["bucket_bytes"]),
        )


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def plan(specs: Iterable[tuple[str, Sequence[int], torch.dtype]], bucket_bytes: int) -> Manifest:
    """Lay tensors out in order into buckets of at most `bucket_bytes` (a tensor larger
    than that gets a bucket of its own). Order is kept: senders list a model's tensors
    layer by layer, so a receiver completes each layer after few buckets."""
    if bucket_bytes <= 0:
        raise ManifestError("bucket size must be positive")
    tensors: list[TensorSpec] = []
    sizes: list[int] = []
    for name, shape, dtype in specs:
        shape = tuple(int(d) for d in shape)
        numel = 1
        for d in shape:
            numel *= d
        nbytes = numel * dtype.itemsize
        if not sizes or (sizes[-1] > 0 and _aligned(sizes[-1]) + nbytes > bucket_bytes):
            sizes.append(0)
        offset = _aligned(sizes[-1])
        tensors.append(TensorSpec(name, shape, dtype_name(dtype), len(sizes) - 1, offset, nbytes))
        sizes[-1] = offset + nbytes
    return Manifest(tuple(tensors), tuple(sizes)).validate()


def pack(
    specs: Sequence[TensorSpec], tensors: Sequence[torch.Tensor], size: int, out: torch.Tensor | None = None
) -> torch.Tensor:
    """One bucket: the tensors' bytes at their offsets, in `out` (a uint8 buffer of `size`
    bytes) or in a new buffer on the tensors' device."""
    if out is None:
        device = tensors[0].device if tensors else torch.device("cpu")
        out = torch.empty(size, dtype=torch.uint8, device=device)
    elif out.numel() != size or out.dtype != torch.uint8:
        raise ValueError(f"pack needs a uint8 buffer of {size} bytes, got {out.numel()} x {out.dtype}")
    flat = out  # alignment gaps are never read
    for spec, t in zip(specs, tensors, strict=True):
        if tuple(t.shape) != spec.shape or dtype_name(t.dtype) != spec.dtype:
            raise ManifestError(
                f"{spec.name}: tensor is {list(t.shape)} {t.dtype}, manifest says "
                f"{list(spec.shape)} {spec.dtype} (did the model change during the push?)"
            )
        flat[spec.offset : spec.offset + spec.nbytes] = t.contiguous().reshape(-1).view(torch.uint8)
    return flat


def unpack(flat: torch.Tensor, specs: Sequence[TensorSpec]) -> list[tuple[str, torch.Tensor]]:
    """Views of a received bucket as named tensors (no copies)."""
    return [(s.name, flat[s.offset : s.offset + s.nbytes].view(DTYPES[s.dtype]).view(s.shape)) for s in specs]
