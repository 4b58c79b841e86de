"""Losses are one module each, chosen by `trainer.loss`: a loss written outside specrl
(REINFORCE, in a package made here) is selected by config alone and trained with, and
the step statistics a TrainStep returns and the trainer exports are exactly the names
the loss gives them plus the step's own."""

from __future__ import annotations

import textwrap

import pytest
import torch
from prometheus_client import CollectorRegistry

from specrl import serving
from specrl.config import GRPOConfig, TrainerConfig
from specrl.metrics import TrainerMetrics
from specrl.trainer.api import TrainerClient
from specrl.trainer.batch import collate
from specrl.trainer.losses import build_loss
from specrl.trainer.server import SERVICE_NAME, TrainerServicer
from specrl.trainer.service import TrainerCore
from specrl.trainer.state import TrainState
from specrl.trainer.step import STEP_STATS, train_step
from specrl.v1 import trainer_pb2_grpc as pb_grpc

from helpers import tiny_qwen3, tiny_rollouts

REINFORCE = '''
"""REINFORCE with group-mean baselines: the whole loss, in one module."""
import torch

from specrl.trainer.losses import LossOutput


class Reinforce:
    uses_reference = False

    def __init__(self, cfg):
        self.cfg = cfg

    def advantages(self, rewards, group_size):
        g = rewards.view(-1, group_size)
        return (g - g.mean(1, keepdim=True)).reshape(-1)

    def __call__(self, logprobs, old_logprobs, advantages, mask, *, ref_logprobs, rollout_logprobs):
        mask = mask.to(logprobs.dtype)
        per_token = -advantages[:, None] * logprobs * mask
        ratio = torch.exp(logprobs - old_logprobs) * mask
        return LossOutput(
            per_token.sum(), {"reinforce": per_token.sum().item(), "ratio": ratio.sum().item()}
        )


def build(cfg):
    return Reinforce(cfg)
'''


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("tiny") / "model"
    tiny_qwen3(path)
    return path


@pytest.fixture
def extra_losses(tmp_path, monkeypatch) -> str:
    """A package outside specrl holding one loss module; its dotted name."""
    package = tmp_path / "extra_losses"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "reinforce.py").write_text(textwrap.dedent(REINFORCE))
    monkeypatch.syspath_prepend(str(tmp_path))
    return "extra_losses.reinforce"


def _config(model, loss: str) -> TrainerConfig:
    # kl_coef > 0: GRPO builds a reference; a loss that reads none must not get one
    return TrainerConfig.model_validate(
        {"model": str(model), "loss": loss, "micro_batch_size": 3, "grpo": {"kl_coef": 0.05}}
    )


def test_a_loss_in_its_own_module_is_selected_by_config(model, extra_losses):
    state = TrainState.build(_config(model, extra_losses))
    assert type(state.loss).__name__ == "Reinforce" and state.reference is None
    before = {n: p.detach().clone() for n, p in state.model.named_parameters()}
    m = train_step(state, collate(tiny_rollouts(), state.vocab_size), group_size=4)
    assert m.stats.keys() == {*STEP_STATS, "reinforce", "ratio"}
    assert m.stats["reinforce"] == pytest.approx(m.stats["loss"])
    assert m.stats["ratio"] == pytest.approx(1.0, abs=1e-5)  # one epoch: still the old policy
    assert any(not torch.equal(p, before[n]) for n, p in state.model.named_parameters())


def test_config_refuses_a_loss_that_does_not_exist(extra_losses):
    for name in ("dapo", "extra_losses.missing", "no_such_package.loss"):
        with pytest.raises(ValueError, match=rf"no loss '{name}': built-in losses are \['grpo'\]"):
            TrainerConfig(loss=name)


def _grpo_stat_names() -> set[str]:
    """The names GRPO's module gives its statistics, from the loss itself."""
    t = torch.zeros(1, 2)
    out = build_loss("grpo", GRPOConfig())(
        t, t, torch.zeros(1), torch.ones(1, 2), ref_logprobs=None, rollout_logprobs=None
    )
    return set(out.stats)


@pytest.mark.parametrize("which", ["grpo", "extra"])
def test_step_statistics_on_the_wire_and_in_metrics_are_the_losses_names(model, extra_losses, which):
    loss, names = ("grpo", _grpo_stat_names()) if which == "grpo" else (extra_losses, {"reinforce", "ratio"})
    registry = CollectorRegistry()
    core = TrainerCore(_config(model, loss), TrainerMetrics(registry))
    server, port = serving.start(
        lambda s: pb_grpc.add_TrainerServiceServicer_to_server(TrainerServicer(core), s),
        SERVICE_NAME,
        "127.0.0.1",
        0,
    )
    try:
        with TrainerClient(f"127.0.0.1:{port}") as client:
            stats = dict(client.train_step(tiny_rollouts(), group_size=4).metrics.stats)
    finally:
        server.stop(None)
    assert stats.keys() == {*STEP_STATS, *names}
    for name, value in stats.items():
        assert registry.get_sample_value("specrl_trainer_step_value", {"stat": name}) == value, name
