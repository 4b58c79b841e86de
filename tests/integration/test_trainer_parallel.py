"""Tensor and data parallelism change nothing but speed: one GRPO step with TP=2 and with
DP=2 (two processes, real gloo groups) gives the same loss, metrics and updated weights
as one process on the same batch.

Tolerance: float32, only the order of reductions differs (sharded matmuls, all-reduce,
reduce-scatter), so 1e-5 relative on loss, metrics and gradient norm, and 1e-4 (lr / 10)
absolute on every weight after one AdamW step with lr 1e-3: Adam's first step is
lr * g / (|g| + eps), which turns float rounding in gradients near eps into differences
of up to a few 1e-5 (measured max 5.4e-6 on one machine; 2.2e-5 on another, one element
of a q_proj with TP=2 and one KV head, transformers 5.19), while a wrong split, a missed
gradient reduction or a mis-scaled loss moves weights by ~1e-3."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from specrl.config import TrainerConfig
from specrl.launcher import free_port

from helpers import tiny_qwen3, tiny_rollouts

pytestmark = pytest.mark.timeout(600)


def _config(model: Path, tp: int, dp: int) -> TrainerConfig:
    return TrainerConfig.model_validate(
        {
            "model": str(model),
            "tp": tp,
            "dp": dp,
            "micro_batch_size": 2,
            "grpo": {"kl_coef": 0.05, "is_cap": 2.0},
            "optim": {"lr": 1e-3, "grad_clip": 1.0},
        }
    )


def _step(cfg: TrainerConfig):
    from specrl.trainer.batch import collate
    from specrl.trainer.state import TrainState
    from specrl.trainer.step import train_step

    state = TrainState.build(cfg)
    metrics = train_step(state, collate(tiny_rollouts(), state.vocab_size), group_size=4)
    return metrics, state.full_state()


def _rank(rank: int, world: int, port: int, model: str, tp: int, dp: int, out: str) -> None:
    import torch.distributed as dist

    from specrl.shutdown import exit_now

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    metrics, state = _step(_config(Path(model), tp, dp))
    if rank == 0:
        torch.save({"metrics": metrics, "state": state}, out)
    exit_now(0)  # a plain return can abort in gloo's threads at teardown


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """The single-process step per KV-head count, computed once."""
    cache: dict[int, tuple] = {}

    def get(kv_heads: int):
        if kv_heads not in cache:
            path = tmp_path_factory.mktemp(f"tiny-kv{kv_heads}") / "model"
            tiny_qwen3(path, kv_heads=kv_heads)
            cache[kv_heads] = (path, *_step(_config(path, 1, 1)))
        return cache[kv_heads]

    return get


# kv_heads=1 < tp: k/v projections replicated, each rank using the KV head of its queries
@pytest.mark.parametrize(("tp", "dp", "kv_heads"), [(2, 1, 2), (1, 2, 2), (2, 1, 1)])
def test_parallel_step_equals_single_process(single, tmp_path, tp, dp, kv_heads):
    path, want, want_state = single(kv_heads)
    out = tmp_path / "result.pt"
    mp.start_processes(
        _rank, args=(2, free_port(), str(path), tp, dp, str(out)), nprocs=2, start_method="spawn"
    )
    got = torch.load(out, weights_only=False)
    m = got["metrics"]
    assert m.tokens == want.tokens
    assert m.stats.keys() == want.stats.keys()
    for stat in ("loss", "pg_loss", "kl", "entropy", "is_weight"):
        assert m.stats[stat] == pytest.approx(want.stats[stat], rel=1e-5, abs=1e-7), stat
    assert m.stats["clip_fraction"] == pytest.approx(want.stats["clip_fraction"], abs=1e-9)
    assert m.stats["grad_norm"] == pytest.approx(want.stats["grad_norm"], rel=1e-5)
    moved = 0.0
    for name, w in want_state.items():
        torch.testing.assert_close(got["state"][name], w, rtol=0, atol=1e-4, msg=name)
        moved = max(moved, (w - _initial(path)[name]).abs().max().item())
    assert moved > 1e-4, "the step did not move the weights; the comparison would be vacuous"


_INITIAL: dict = {}


def _initial(path: Path) -> dict[str, torch.Tensor]:
    if path not in _INITIAL:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
        _INITIAL[path] = {n: p.detach() for n, p in model.named_parameters()}
    return _INITIAL[path]
