"""Trainer state: hidden-state capture is a pure side effect, and checkpoint -> fresh
process state -> resume reproduces the next step exactly."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from specrl.config import TrainerConfig
from specrl.trainer import checkpoint
from specrl.trainer.batch import collate
from specrl.trainer.state import TrainState
from specrl.trainer.step import train_step

from helpers import tiny_qwen3, tiny_rollouts


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "model"
    tiny_qwen3(path)
    return path


def _config(model_dir, **kw) -> TrainerConfig:
    base = {"model": str(model_dir), "micro_batch_size": 3, "grpo": {"kl_coef": 0.05}, "optim": {"lr": 1e-3}}
    return TrainerConfig.model_validate({**base, **kw})


def test_capture_leaves_gradients_bit_identical_and_captures_the_right_layers(model_dir):
    from transformers import AutoModelForCausalLM

    batch = collate(tiny_rollouts(), 64)
    plain = TrainState.build(_config(model_dir))
    capture_cfg = {"enabled": True, "aux_layer_ids": [0, 1], "token_fraction": 0.5, "topk": 4}
    captured = TrainState.build(_config(model_dir, capture=capture_cfg))
    m_plain = train_step(plain, batch, group_size=4)
    m_cap = train_step(captured, batch, group_size=4)
    timings = {"logprob_seconds": 0.0, "train_seconds": 0.0}
    assert dataclasses.replace(m_plain, **timings) == dataclasses.replace(m_cap, **timings)
    for (name, a), (_, b) in zip(plain.model.named_parameters(), captured.model.named_parameters()):
        assert torch.equal(a, b), f"{name} differs with capture on"

    q = captured.capturer.queue
    assert q.qsize() == 3  # 8 samples in micro-batches of 3
    items = [q.get(timeout=1) for _ in range(3)]
    reference = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    kept, total = 0, 0
    for i, item in enumerate(items):
        rows = batch.rows(slice(3 * i, 3 * i + 3))
        assert item.policy_version == 0
        assert not item.aux.requires_grad and item.aux.grad_fn is None
        with torch.no_grad():
            hs = reference(
                input_ids=rows.input_ids, attention_mask=rows.attention_mask, output_hidden_states=True
            )
        torch.testing.assert_close(item.aux, torch.cat([hs.hidden_states[0], hs.hidden_states[1]], -1))
        assert item.target_logprobs.shape[-1] == 4 and item.target_ids.shape == item.target_logprobs.shape
        assert (item.target_logprobs[..., :-1] >= item.target_logprobs[..., 1:]).all()
        assert ((item.loss_mask == 1) <= (rows.mask == 1)).all()  # only completion tokens
        kept += item.loss_mask.sum().item()
        total += rows.mask.sum().item()
    assert 0.2 < kept / total < 0.8, f"token_fraction 0.5 kept {kept}/{total}"


def test_checkpoint_resume_reproduces_the_next_step_exactly(model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    first = collate(tiny_rollouts(seed=1), 64)
    second = collate(tiny_rollouts(seed=2), 64)
    a = TrainState.build(_config(model_dir))
    train_step(a, first, group_size=4)
    saved = a.full_state()
    checkpoint.save(a, tmp_path / "ckpt")
    torch.rand(7)  # RNG drift after saving must not matter
    want = train_step(a, second, group_size=4)

    b = TrainState.build(_config(model_dir))  # a fresh trainer, as after a restart
    meta = checkpoint.load(b, tmp_path / "ckpt")
    assert meta["step"] == 1 and b.step_count == 1
    got = train_step(b, second, group_size=4)
    assert got.stats == want.stats
    for (name, x), (_, y) in zip(a.model.named_parameters(), b.model.named_parameters()):
        assert torch.equal(x, y), name

    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path / "ckpt" / "hf"), dtype=torch.float32)
    for name, p in hf.named_parameters():
        assert torch.equal(p, saved[name]), f"HF export of {name} is not the saved weights"


def test_load_refuses_a_directory_that_is_not_a_checkpoint(model_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match="not a specrl trainer checkpoint"):
        checkpoint.load(TrainState.build(_config(model_dir)), tmp_path)


def test_a_save_killed_midway_leaves_the_previous_checkpoint_loadable(model_dir, tmp_path):
    a = TrainState.build(_config(model_dir))
    train_step(a, collate(tiny_rollouts(seed=1), 64), group_size=4)
    ckpt = tmp_path / "ckpt"
    checkpoint.save(a, ckpt)
    train_step(a, collate(tiny_rollouts(seed=2), 64), group_size=4)
    checkpoint.save(a, ckpt)  # replaces the first: step 2
    assert not ckpt.with_name("ckpt.partial").exists() and not ckpt.with_name("ckpt.old").exists()

    # killed while writing: a partial directory without meta.json is ignored
    (ckpt.with_name("ckpt.partial") / "state").mkdir(parents=True)
    assert checkpoint.load(TrainState.build(_config(model_dir)), ckpt)["step"] == 2
    # killed between the two renames: the previous checkpoint is found beside
    ckpt.rename(ckpt.with_name("ckpt.old"))
    assert checkpoint.load(TrainState.build(_config(model_dir)), ckpt)["step"] == 2
    # and the next save cleans both up
    checkpoint.save(a, ckpt)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
