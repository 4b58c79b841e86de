"""Weight-sync pieces below the engine: bucket layout, names, manifest checks, and a real
gloo group across processes."""

from __future__ import annotations

import multiprocessing as mp

import pytest
import torch

from specrl.weightsync.buffers import BucketBuffers
from specrl.weightsync.group import JoinInfo, WeightGroup, host_store
from specrl.weightsync.manifest import ALIGN, Manifest, ManifestError, TensorSpec, pack, plan, unpack
from specrl.weightsync.names import Expected, to_checkpoint_name
from specrl.weightsync.receiver import check_manifest, receive


def _named() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [
        ("a", torch.randn(3, 5, generator=g)),
        ("b", torch.randn(7, generator=g).to(torch.bfloat16)),
        ("c", torch.arange(11, dtype=torch.int64)),
        ("big", torch.randn(300, generator=g)),
        ("flag", torch.tensor([True, False, True])),
    ]


def test_plan_pack_unpack_roundtrip_across_buckets():
    named = _named()
    m = plan([(n, t.shape, t.dtype) for n, t in named], bucket_bytes=256)
    # "big" (1200 bytes) exceeds the bucket size: it gets a bucket of its own
    big = next(t for t in m.tensors if t.name == "big")
    assert [t.name for t in m.bucket(big.bucket)] == ["big"]
    assert len(m.bucket_bytes) >= 3
    assert all(t.offset % ALIGN == 0 for t in m.tensors)
    tensors = dict(named)
    got = {}
    for i, size in enumerate(m.bucket_bytes):
        specs = m.bucket(i)
        flat = pack(specs, [tensors[s.name] for s in specs], size)
        assert flat.numel() == size
        got.update(unpack(flat, specs))
    for name, t in named:
        assert got[name].dtype == t.dtype and torch.equal(got[name], t), name
    assert Manifest.from_dict(m.to_dict()) == m


def test_pack_rejects_tensor_that_changed_shape():
    m = plan([("a", (2, 2), torch.float32)], 1024)
    with pytest.raises(ManifestError, match="manifest says"):
        pack(m.bucket(0), [torch.zeros(3)], m.bucket_bytes[0])


@pytest.mark.parametrize(
    ("tensors", "buckets", "match"),
    [
        (
            (TensorSpec("a", (2,), "float32", 0, 0, 8), TensorSpec("a", (2,), "float32", 0, 16, 8)),
            (32,),
            "twice",
        ),
        ((TensorSpec("a", (2,), "float32", 0, 0, 4),), (16,), "nbytes"),
        ((TensorSpec("a", (2,), "complex", 0, 0, 8),), (16,), "dtype"),
        ((TensorSpec("a", (4,), "float32", 0, 0, 16),), (8,), "outside"),
        ((TensorSpec("a", (2,), "float32", 1, 0, 8),), (16,), "out of range"),
        ((TensorSpec("a", (2,), "float32", 0, 4, 8),), (16,), "outside"),
        (
            (TensorSpec("a", (8,), "float32", 0, 0, 32), TensorSpec("b", (2,), "float32", 0, 16, 8)),
            (48,),
            "overlap",
        ),
    ],
)
def test_manifest_validation_names_the_problem(tensors, buckets, match):
    with pytest.raises(ManifestError, match=match):
        Manifest(tensors, buckets).validate()


def test_names_translate_trainer_and_draft_trainer_names():
    assert to_checkpoint_name("policy", "_orig_mod.model.layers.0.mlp.up_proj.weight") == (
        "model.layers.0.mlp.up_proj.weight"
    )
    assert to_checkpoint_name("policy", "module.lm_head.weight") == "lm_head.weight"
    # speculators-style and specrl-head EAGLE-3 names -> vLLM's checkpoint names
    assert to_checkpoint_name("draft", "layers.0.self_attn.q_proj.weight", eagle3=True) == (
        "midlayer.self_attn.q_proj.weight"
    )
    assert to_checkpoint_name("draft", "model.layers.0.mlp.down_proj.weight", eagle3=True) == (
        "midlayer.mlp.down_proj.weight"
    )
    assert (
        to_checkpoint_name("draft", "midlayer.hidden_norm.weight", eagle3=True)
        == "midlayer.hidden_norm.weight"
    )
    assert to_checkpoint_name("draft", "fc.weight", eagle3=True) == "fc.weight"
    assert to_checkpoint_name("draft", "d2t", eagle3=True) == "d2t"
    for not_sent in ("embed.weight", "embed_tokens.weight", "model.embed_tokens.weight", "t2d"):
        assert to_checkpoint_name("draft", not_sent, eagle3=True) is None
    # a draft *model* (draft_model method) is a full LM: names unchanged
    assert (
        to_checkpoint_name("draft", "model.layers.0.mlp.up_proj.weight")
        == "model.layers.0.mlp.up_proj.weight"
    )


def test_check_manifest_against_checkpoint():
    expected = {"w": Expected((4, 2), "BF16"), "d2t": Expected((3,), "I64")}
    ok = plan([("w", (4, 2), torch.float32), ("d2t", (3,), torch.int64)], 1024)
    check_manifest(ok, expected)  # float32 into a bf16 checkpoint: the loader casts
    cases = {
        "unknown parameter names: x": [
            ("w", (4, 2), torch.float32),
            ("d2t", (3,), torch.int64),
            ("x", (1,), torch.float32),
        ],
        "missing parameters: d2t": [("w", (4, 2), torch.float32)],
        r"w: shape \[2, 4\]": [("w", (2, 4), torch.float32), ("d2t", (3,), torch.int64)],
        "d2t: dtype float32": [("w", (4, 2), torch.float32), ("d2t", (3,), torch.float32)],
    }
    for match, specs in cases.items():
        with pytest.raises(ManifestError, match=match):
            check_manifest(plan(specs, 1024), expected)


def _receiver(port: int, rank: int, manifest: dict, out: mp.Queue) -> None:
    info = JoinInfo(
        "policy", "127.0.0.1", port, epoch=7, rank_offset=1, world_size=3, backend="gloo", timeout_s=120
    )
    group = WeightGroup.join(info, local_rank=rank - 1)
    got: dict[str, torch.Tensor] = {}
    result = receive(
        group, Manifest.from_dict(manifest), lambda batch: got.update(batch), torch.device("cpu")
    )
    out.put((rank, result, {k: v.clone() for k, v in got.items()}))


def test_real_gloo_group_broadcasts_buckets_to_every_receiver():
    named = _named()
    m = plan([(n, t.shape, t.dtype) for n, t in named], bucket_bytes=256)
    store = host_store("127.0.0.1", 0, 120)  # generous: spawning two torch processes on a busy 2-core box
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_receiver, args=(store.port, r, m.to_dict(), out)) for r in (1, 2)]
    for p in procs:
        p.start()
    group = WeightGroup(store, kind="policy", epoch=7, rank=0, world_size=3, backend="gloo", timeout_s=120)
    tensors = dict(named)
    for i, size in enumerate(m.bucket_bytes):
        specs = m.bucket(i)
        group.broadcast(pack(specs, [tensors[s.name] for s in specs], size))
    results = [out.get(timeout=180) for _ in procs]
    for p in procs:
        p.join(timeout=30)
    group.close()
    assert sorted(r for r, _, _ in results) == [1, 2]
    for _, result, got in results:
        assert result["ok"] and result["buckets"] == len(m.bucket_bytes) and result["bytes"] == m.total_bytes
        for name, t in named:
            assert torch.equal(got[name], t), name


def test_bucket_buffers_are_reused_only_once_no_view_survives():
    pool = BucketBuffers(torch.device("cpu"), keep=2)
    first = pool.take(64)
    first.fill_(1)
    del first
    again = pool.take(32)  # the same memory: nothing holds the first buffer any more
    assert pool.allocated == 1 and again.numel() == 32
    kept = again[8:16].view(torch.int16)  # what a loader keeps until its layer is complete
    del again
    other = pool.take(64)
    assert pool.allocated == 2  # the viewed buffer was not handed out again
    other.fill_(7)
    assert torch.equal(kept, torch.full((4,), 0x0101, dtype=torch.int16))  # untouched
    del other, kept
    held = [pool.take(64), pool.take(64)]  # both free again
    assert pool.allocated == 2
    held.append(pool.take(64))  # a third at once: allocated, not pooled (keep=2)
    assert pool.allocated == 3 and len(pool._pool) == 2
    meta = BucketBuffers(torch.device("meta"))  # off CPU: never pooled
    first = meta.take(8)
    assert first.device.type == "meta"
    del first
    meta.take(8)
    assert meta.allocated == 2


def test_receive_reuses_bucket_buffers_unless_the_loader_keeps_views(monkeypatch):
    import specrl.weightsync.receiver as receiver

    named = [(f"w{i}", torch.full((16,), float(i))) for i in range(12)]
    m = plan([(n, t.shape, t.dtype) for n, t in named], bucket_bytes=64)  # 12 buckets of 64 bytes
    group = WeightGroup(host_store("127.0.0.1", 0, 30), kind="policy", epoch=1, rank=0,
                        world_size=1, backend="gloo", timeout_s=30)  # fmt: skip
    pools: list[BucketBuffers] = []

    class Counting(BucketBuffers):  # the real pool, counted
        def __init__(self, device: torch.device) -> None:
            super().__init__(device)
            pools.append(self)

    monkeypatch.setattr(receiver, "BucketBuffers", Counting)
    copied: dict[str, torch.Tensor] = {}
    result = receive(group, m, lambda b: copied.update((n, t.clone()) for n, t in b), torch.device("cpu"))
    assert result["ok"] and len(m.bucket_bytes) == 12
    assert pools[-1].allocated <= 3  # one on the wire, one loading, one the collective lets go late
    held: dict[str, torch.Tensor] = {}
    receive(group, m, held.update, torch.device("cpu"))  # keeps views of every bucket
    assert pools[-1].allocated == 12
    group.close()
