"""GPU checks of the trainer and weight-sync code paths on one CUDA device, run from the
repository root: `PYTHONPATH=services:tests python scripts/gpu_check.py`.

Prints: a GRPO step (2 clipped epochs, warmup) on CUDA vs CPU (loss, grad norm,
weights), hidden-state capture on CUDA, checkpoint -> fresh policy -> resume on CUDA
(exact), and an NCCL weight-sync group (world of one: a single GPU cannot host two NCCL
ranks) packing, broadcasting and unpacking the model's buckets. Results are recorded in docs/trainer.md.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch


def trainer_checks(work: Path) -> torch.nn.Module:
    from specrl.config import TrainerConfig
    from specrl.trainer import checkpoint
    from specrl.trainer.batch import collate
    from specrl.trainer.state import TrainState
    from specrl.trainer.step import train_step

    from helpers import tiny_qwen3, tiny_rollouts

    tiny_qwen3(work / "model", layers=4)
    cfg = TrainerConfig.model_validate(
        {
            "model": str(work / "model"),
            "micro_batch_size": 3,
            "grpo": {"kl_coef": 0.05, "is_cap": 2.0, "epochs": 2},
            "optim": {"lr": 1e-3, "warmup_steps": 2},
            "capture": {"enabled": True, "aux_layer_ids": [0, 1, 3], "topk": 4},
        }
    )
    first, second = collate(tiny_rollouts(seed=1), 64), collate(tiny_rollouts(seed=2), 64)
    cuda = torch.device("cuda")
    cpu, gpu = TrainState.build(cfg), TrainState.build(cfg, device=cuda)
    mc, mg = train_step(cpu, first, 4).stats, train_step(gpu, first, 4).stats
    print(f"loss cpu {mc['loss']:.9f} gpu {mg['loss']:.9f}; ", end="")
    print(f"grad norm cpu {mc['grad_norm']:.7f} gpu {mg['grad_norm']:.7f}")
    sc, sg = cpu.full_state(), gpu.full_state()
    print("max |weight cpu - gpu| after the step:", max((sc[k] - sg[k]).abs().max().item() for k in sc))
    item = gpu.capturer.queue.get()
    print("capture on cuda:", tuple(item.aux.shape), item.aux.device, "detached:", item.aux.grad_fn is None)
    checkpoint.save(gpu, work / "ckpt")
    want = train_step(gpu, second, 4).stats["loss"]
    resumed = TrainState.build(cfg, device=cuda)
    checkpoint.load(resumed, work / "ckpt")
    got = train_step(resumed, second, 4).stats["loss"]
    print("resume reproduces the next step on cuda:", got == want, got, want)
    return gpu.model


def nccl_group_check(model: torch.nn.Module) -> None:
    from specrl.weightsync.group import WeightGroup, host_store
    from specrl.weightsync.manifest import pack, plan, unpack

    store = host_store("127.0.0.1", 0, 30)
    group = WeightGroup(store, kind="policy", epoch=1, rank=0, world_size=1, backend="nccl", timeout_s=30)
    named = {n: p.detach() for n, p in model.named_parameters()}
    manifest = plan([(n, t.shape, t.dtype) for n, t in named.items()], 1 << 20)
    t0 = time.perf_counter()
    for i, size in enumerate(manifest.bucket_bytes):
        specs = manifest.bucket(i)
        flat = pack(specs, [named[s.name] for s in specs], size).to(group.device)
        group.start_broadcast(flat).wait()
        for name, t in unpack(flat, specs):
            assert torch.equal(t, named[name]), name
    torch.cuda.synchronize()
    took = time.perf_counter() - t0
    print(f"nccl group on {group.device}: {len(manifest.bucket_bytes)} buckets in {took:.4f}s")
    group.close()


def main() -> None:
    work = Path(tempfile.mkdtemp(prefix="specrl-gpu-"))
    nccl_group_check(trainer_checks(work))


if __name__ == "__main__":
    main()
