"""One rollout replica across two machines (a LeaderWorkerSet's leader and worker pods),
run for real on one: `specrl serve rollout` as node 0 and `specrl serve rollout-worker
--node-rank 1` as node 1 of one vLLM engine, tensor parallel 2 split over them
(`engine.nnodes: 2`), talking over loopback as pods talk over the network.

Each node computes half of every layer, so the replica's logprobs match the reference
model only if both nodes hold their shard; and after a policy push through specrl's
weight sync (one weight group, a rank per worker) they match the new policy only if the
push reached the workers of both nodes. Node 1 ends by itself once node 0 is gone."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml
from test_weightsync import Reference, max_logprob_gap

from specrl.config import RolloutServerConfig, WeightSenderConfig, resolve_model_path
from specrl.launcher import ServiceProcess, free_port
from specrl.rollout.api import RolloutClient
from specrl.weightsync.sender import WeightSender

pytestmark = [pytest.mark.vllm, pytest.mark.zoo, pytest.mark.timeout(900)]
GAP = 2e-3  # float32 engine vs float32 reference (the single-node weight-sync tests' bound)


def test_a_replica_spanning_two_nodes_serves_the_policy_and_takes_weight_updates(servers, tmp_path):
    from transformers import AutoTokenizer

    servers.close()  # two cores: no other engine while these run
    cfg = RolloutServerConfig.model_validate(
        {
            "port": free_port(),  # node 1 watches node 0's gRPC health at this port
            "engine": {
                "model": "zoo:target",
                "dtype": "float32",
                "max_model_len": 256,
                "kv_cache_gib": 0.25,
                "tensor_parallel_size": 2,
                "nnodes": 2,
                "master_port": free_port(),
                "cpu_threads_bind": "nobind",  # two "machines" on one: let the OS place them
                "leader_grace_s": 5.0,
            },
            "speculation": {"method": "eagle3", "num_speculative_tokens": 3, "draft": "zoo:eagle3-domain"},
            "self_test": {"enabled": False},  # test_lossless covers the sampler
        }
    )
    path = tmp_path / "rollout.yaml"
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json")))
    leader = ServiceProcess(cfg, service="rollout", ready_timeout=600).start(wait=False)
    with open(tmp_path / "worker.log", "w") as log:
        node1 = ["serve", "rollout-worker", "--config", str(path), "--node-rank", "1"]
        worker = subprocess.Popen(
            [sys.executable, "-m", "specrl.cli", *node1],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    sender_cfg = WeightSenderConfig(kind="policy", timeout_s=60.0, rpc_timeout_s=60.0, bucket_mb=1.0)
    sender = WeightSender(sender_cfg)
    try:
        leader.wait()
        ref = Reference()
        tok = AutoTokenizer.from_pretrained(resolve_model_path("zoo:target"))
        with RolloutClient(leader.address, timeout=300) as client:
            status = client.status()
            assert status.weight_sync_workers == 2, status
            gap, _ = max_logprob_gap(client, ref, tok)
            assert gap < GAP, f"the two-node replica's logprobs are off the policy's by {gap}"

            ref.perturb(seed=5)
            sender.add_replica(leader.address)
            pushed = sender.push(1, ref.model.named_parameters)
            assert pushed.members == [leader.address]
            gap, samples = max_logprob_gap(client, ref, tok)
            assert {s.policy_version for s in samples} == {1}
            assert gap < GAP, f"after the push, logprobs are off the new policy by {gap}: a node missed it"
            ref.restore()
            assert max_logprob_gap(client, ref, tok)[0] > 10 * GAP, "the push changed nothing"
        leader.stop()
        # node 1 ends by itself once node 0 is gone (engine.leader_grace_s, then vLLM's
        # shutdown of its workers, which are stuck in collectives with node 0's: ~10 s)
        assert worker.wait(timeout=90) == 0
        assert "node 0 (" in (tmp_path / "worker.log").read_text()
    finally:
        sender.close()
        leader.stop()
        worker.kill()
