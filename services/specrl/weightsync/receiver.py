"""Receiving side of an update, engine-agnostic: check a manifest against the checkpoint
an engine serves, then take the buckets off the group one at a time (into reused
buffers, buffers.py) and hand each to the engine's loader."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping

import torch

from specrl.weightsync.buffers import BucketBuffers
from specrl.weightsync.group import WeightGroup
from specrl.weightsync.manifest import Manifest, ManifestError, unpack
from specrl.weightsync.names import Expected, dtype_compatible

log = logging.getLogger("specrl.weightsync")

NamedTensors = list[tuple[str, torch.Tensor]]


def _few(names: list[str]) -> str:
    shown = ", ".join(sorted(names)[:5])
    return shown + (f" (+{len(names) - 5} more)" if len(names) > 5 else "")


def check_manifest(manifest: Manifest, expected: Mapping[str, Expected]) -> None:
    """An update must name exactly the checkpoint's tensors, each with its shape and a
    compatible dtype: a partial update would silently leave old weights in place."""
    manifest.validate()
    sent = {t.name: t for t in manifest.tensors}
    unknown = [n for n in sent if n not in expected]
    if unknown:
        raise ManifestError(f"unknown parameter names: {_few(unknown)}")
    missing = [n for n in expected if n not in sent]
    if missing:
        raise ManifestError(f"update is missing parameters: {_few(missing)}")
    for name, spec in sent.items():
        want = expected[name]
        if spec.shape != want.shape:
            raise ManifestError(f"{name}: shape {list(spec.shape)} != checkpoint's {list(want.shape)}")
        if not dtype_compatible(want.dtype, spec.dtype):
            raise ManifestError(f"{name}: dtype {spec.dtype} cannot load into checkpoint dtype {want.dtype}")


def receive(
    group: WeightGroup,
    manifest: Manifest,
    load: Callable[[NamedTensors], None],
    device: torch.device,
) -> dict:
    """Receive every bucket and load it. Never raises: returns what happened, including
    how many buckets had already been loaded when it failed (0 means the engine's
    weights are untouched), and where the time went: `load_seconds` in the engine's
    loader, `wait_seconds` waiting for a bucket still on the wire."""
    t0 = time.perf_counter()
    done = 0
    spent = {"load_seconds": 0.0, "wait_seconds": 0.0}
    sizes = manifest.bucket_bytes
    buffers = BucketBuffers(device)  # a bucket's buffer is reused once nothing views it

    def post(index: int):
        flat = buffers.take(sizes[index])
        return flat, group.start_broadcast(flat)

    try:
        # receive bucket i+1 while loading bucket i (two buckets in memory at most)
        nxt = post(0) if sizes else None
        for index in range(len(sizes)):
            flat, work = nxt
            t = time.perf_counter()
            work.wait()
            spent["wait_seconds"] += time.perf_counter() - t
            nxt = post(index + 1) if index + 1 < len(sizes) else None
            t = time.perf_counter()
            load(unpack(flat, manifest.bucket(index)))
            spent["load_seconds"] += time.perf_counter() - t
            del flat  # the loader's views, if it kept any, hold the buffer, not this name
            done += 1
        return {
            "ok": True,
            "buckets": done,
            "bytes": manifest.total_bytes,
            "seconds": time.perf_counter() - t0,
            **spent,
        }
    except Exception as e:
        log.error("weight receive failed after %d of %d buckets: %s", done, len(manifest.bucket_bytes), e)
        return {
            "ok": False,
            "buckets": done,
            "error": f"{type(e).__name__}: {e}",
            "seconds": time.perf_counter() - t0,
            **spent,
        }
