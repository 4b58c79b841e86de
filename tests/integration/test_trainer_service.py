"""The trainer as a service: two ranks (dp=2, real gloo group) behind real gRPC. Rank 0
serves and broadcasts commands; rank 1 follows and exits when rank 0 stops."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import urllib.request

import grpc
import pytest
import torch

from specrl.config import TrainerConfig, TrainerServerConfig
from specrl.launcher import ServiceProcess
from specrl.trainer.batch import collate
from specrl.trainer.logprobs import logprobs
from specrl.trainer.state import TrainState
from specrl.v1 import trainer_pb2 as pb
from specrl.v1 import trainer_pb2_grpc as pb_grpc

from helpers import tiny_qwen3, tiny_rollouts

pytestmark = pytest.mark.timeout(600)


def _sample(r) -> pb.RolloutSample:
    return pb.RolloutSample(
        prompt_ids=r.prompt_ids,
        completion_ids=r.completion_ids,
        reward=r.reward,
        rollout_logprobs=r.rollout_logprobs,
    )


@pytest.fixture(scope="module")
def trainer(tmp_path_factory):
    model = tmp_path_factory.mktemp("tiny") / "model"
    tiny_qwen3(model)
    cfg = TrainerServerConfig.model_validate(
        {
            "port": 0,
            "metrics_port": 0,
            "trainer": {
                "model": str(model),
                "dp": 2,
                "micro_batch_size": 3,
                "capture": {"enabled": True, "aux_layer_ids": [0, 1]},
            },
        }
    )
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        master = str(s.getsockname()[1])
    env = {"WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": master}
    ranks = [
        ServiceProcess(cfg, service="trainer", env={**env, "RANK": str(r)}, wait_ready=False).start()
        for r in (0, 1)
    ]
    ranks[0].wait()
    channel = grpc.insecure_channel(ranks[0].address)
    yield ranks, pb_grpc.TrainerServiceStub(channel), model
    channel.close()
    for p in ranks:
        p.stop()


def test_logprobs_match_a_single_process_policy_and_report_mismatch(trainer):
    _, stub, model = trainer
    rollouts = tiny_rollouts()
    resp = stub.ComputeLogprobs(
        pb.ComputeLogprobsRequest(samples=[_sample(r) for r in rollouts]), timeout=120
    )
    local = TrainState.build(TrainerConfig.model_validate({"model": str(model)}))
    batch = collate(rollouts, local.vocab_size)
    want = logprobs(local, batch)
    for i, (r, got) in enumerate(zip(rollouts, resp.completions)):
        assert len(got.logprobs) == len(r.completion_ids)
        torch.testing.assert_close(
            torch.tensor(list(got.logprobs)), want[i][batch.mask[i].bool()], rtol=0, atol=1e-5
        )
    n = sum(len(r.completion_ids) for r in rollouts)
    diff = torch.tensor([x for r in rollouts for x in r.rollout_logprobs]) - torch.cat(
        [want[i][batch.mask[i].bool()] for i in range(len(rollouts))]
    )
    assert resp.mismatch.tokens == n
    assert resp.mismatch.kl == pytest.approx(diff.mean().item(), abs=1e-5)
    assert resp.mismatch.max_abs == pytest.approx(diff.abs().max().item(), abs=1e-5)


def test_train_steps_inline_and_by_reference(trainer, tmp_path):
    ranks, stub, _ = trainer
    rollouts = tiny_rollouts(seed=3)
    resp = stub.TrainStep(
        pb.TrainStepRequest(inline=pb.TrainBatch(samples=[_sample(r) for r in rollouts]), group_size=4),
        timeout=120,
    )
    assert resp.step == 1 and resp.metrics.tokens == sum(len(r.completion_ids) for r in rollouts)
    assert resp.metrics.stats["grad_norm"] > 0 and resp.metrics.mismatch.tokens == resp.metrics.tokens
    ref = tmp_path / "batch.jsonl"
    ref.write_text(
        "\n".join(
            json.dumps(
                {
                    "prompt_ids": list(r.prompt_ids),
                    "completion_ids": list(r.completion_ids),
                    "reward": r.reward,
                }
            )
            for r in tiny_rollouts(seed=4)
        )
    )
    resp = stub.TrainStep(pb.TrainStepRequest(batch_ref=str(ref), group_size=2), timeout=120)
    assert resp.step == 2 and not resp.metrics.HasField("mismatch")
    body = (
        urllib.request.urlopen(f"http://127.0.0.1:{ranks[0].metrics_port}/metrics", timeout=10)
        .read()
        .decode()
    )
    assert re.search(r"^specrl_trainer_steps_total 2\.0$", body, re.M)
    assert re.search(r'^specrl_trainer_stage_seconds_count\{stage="train"\} 2\.0$', body, re.M)


def test_captured_features_stream_out_as_the_policy_computed_them(trainer):
    """The first TrainStep's logprob pass captured both DP ranks' shares of the batch
    (two micro-batches of policy v0 each, gathered on rank 0); StreamCaptures hands all
    of them out, every rollout once, and they are what an independent forward of the
    initial model gives."""
    from transformers import AutoModelForCausalLM

    from specrl.features import Captured, gather_aux_hidden_states
    from specrl.trainer.api import TrainerClient

    ranks, _, model = trainer
    with TrainerClient(ranks[0].address) as client:
        batches = [Captured.from_message(m) for m in client.captures(max_batches=4)]
    rows = [
        c.input_ids[i][c.attention_mask[i].bool()].tolist() for c in batches for i in range(len(c.input_ids))
    ]
    assert sorted(rows) == sorted(r.prompt_ids + r.completion_ids for r in tiny_rollouts(seed=3))
    policy = AutoModelForCausalLM.from_pretrained(str(model), dtype=torch.float32).eval()
    for c in batches:
        assert c.policy_version == 0 and c.aux_layer_ids == (0, 1) and c.target_ids is None
        with torch.no_grad():
            out = policy(input_ids=c.input_ids, attention_mask=c.attention_mask, output_hidden_states=True)
        real = c.attention_mask.bool()
        aux = gather_aux_hidden_states(out.hidden_states, (0, 1))
        assert torch.allclose(c.aux[real], aux[real], atol=1e-4)
        lp = torch.log_softmax(out.logits[:, :-1], -1)
        assert torch.allclose(c.target_logprobs[real[:, 1:]], lp[real[:, 1:]], atol=1e-4)
        assert c.loss_mask.sum() > 0 and bool((c.loss_mask <= c.attention_mask[:, 1:]).all())


def test_bad_batches_are_refused_and_nothing_is_trained(trainer):
    _, stub, _ = trainer
    rollouts = tiny_rollouts(seed=5)
    probe = pb.ComputeLogprobsRequest(samples=[_sample(r) for r in rollouts])
    before = stub.ComputeLogprobs(probe, timeout=120)
    step = stub.GetStatus(pb.GetTrainerStatusRequest(), timeout=30).step
    bad = [_sample(r) for r in rollouts]
    bad[3].completion_ids.append(99)
    bad[3].rollout_logprobs.append(-1.0)
    cases = [
        (
            pb.TrainStepRequest(inline=pb.TrainBatch(samples=bad), group_size=4),
            "sample 3: completion token ids outside",
        ),
        (
            pb.TrainStepRequest(inline=pb.TrainBatch(samples=[_sample(r) for r in rollouts]), group_size=3),
            "groups of 3",
        ),
        (pb.TrainStepRequest(batch_ref="/no/such/file.jsonl", group_size=4), "no such file"),
        (pb.TrainStepRequest(group_size=4), "needs a batch"),
    ]
    for request, match in cases:
        with pytest.raises(grpc.RpcError) as err:
            stub.TrainStep(request, timeout=120)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT and match in err.value.details()
    assert stub.GetStatus(pb.GetTrainerStatusRequest(), timeout=30).step == step
    after = stub.ComputeLogprobs(probe, timeout=120)
    assert [list(c.logprobs) for c in after.completions] == [list(c.logprobs) for c in before.completions]


def test_specrl_health_reports_each_service_and_fails_unless_all_serve(trainer):
    ranks, _, _ = trainer

    def health(*addresses: str) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "specrl.cli", "health", "--timeout", "5", *addresses]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60)

    ok = health(ranks[0].address)
    assert ok.returncode == 0 and f"{ranks[0].address}: SERVING" in ok.stderr, ok.stderr
    with socket.socket() as s:  # a port nobody serves
        s.bind(("127.0.0.1", 0))
        nobody = f"127.0.0.1:{s.getsockname()[1]}"
    bad = health(ranks[0].address, nobody)
    assert bad.returncode == 1 and f"{nobody}: UNAVAILABLE" in bad.stderr, bad.stderr


def test_save_checkpoint_and_stop_every_rank(trainer, tmp_path):
    ranks, stub, _ = trainer
    resp = stub.SaveCheckpoint(pb.SaveCheckpointRequest(path=str(tmp_path / "ckpt")), timeout=120)
    assert (tmp_path / "ckpt" / "meta.json").exists() and (
        tmp_path / "ckpt" / "hf" / "model.safetensors"
    ).exists()
    assert resp.step == stub.GetStatus(pb.GetTrainerStatusRequest(), timeout=30).step
    status = stub.GetStatus(pb.GetTrainerStatusRequest(), timeout=30)
    assert (status.tp, status.dp) == (1, 2)
    ranks[0].stop()
    assert ranks[0].proc.returncode == 0, ranks[0].log_tail()  # SIGTERM is a clean stop
    assert ranks[1].proc.wait(timeout=60) == 0, "rank 1 did not follow rank 0's stop"
