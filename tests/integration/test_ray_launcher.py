"""`launcher: ray` on a real Ray cluster: a Ray head started on loopback (`ray start
--head`, the `ray` package from PyPI) for this module and stopped after it. The CPU tiny
run goes end to end through the launcher, every service a Ray actor in its placement
group; mid-run its rollout replica's actor is killed (started again in its bundle, the
run goes on, its engine processes gone with it) and then its trainer's actor (the run
stops with its state kept), and `specrl run --resume` finishes it with every step once
and no group trained twice. A rollout replica spanning two nodes (engine.nnodes: two
actors, `specrl serve rollout` and `rollout-worker` as a LeaderWorkerSet's pods run them)
serves the policy and takes weight updates on both, starts again whole when a node dies,
and its other node ends by itself when node 0 goes. Bad input (no cluster, too few
resources, a Ray release the launcher does not support) is an error before anything
starts. A cluster with token authentication is joined with its token, and refused
without it, saying what to set."""

from __future__ import annotations

import itertools
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import yaml
from test_weightsync import Reference, max_logprob_gap

from specrl import serving
from specrl.config import (
    RayLauncherConfig,
    RunConfig,
    TrainerServerConfig,
    WeightSenderConfig,
    resolve_model_path,
)
from specrl.launcher import free_port
from specrl.orchestrator import ray_launcher
from specrl.orchestrator.system import StartupError, System
from specrl.rollout.api import RolloutClient
from specrl.serving import health_of
from specrl.weightsync.sender import WeightSender

from helpers import SpecrlRun, run_steps, tiny_run_config, wait_for, wait_for_steps

pytestmark = [pytest.mark.vllm, pytest.mark.zoo, pytest.mark.timeout(900)]
STEPS, PROMPTS, N = 4, 4, 4


@contextmanager
def ray_head_started(env: dict[str, str]) -> Iterator[str]:
    """A one-node Ray cluster on loopback (`ray start --head`, the `ray` package from
    PyPI; `env`: its authentication settings) with 8 logical CPUs (placement needs, not
    this machine's cores) and a small object store (nothing large moves through it; a CI
    container's /dev/shm may be small); its address, stopped after. A short temp dir:
    Ray's sockets live there."""
    ray = str(Path(sys.executable).with_name("ray"))
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    port = next(p for p in iter(free_port, None) if p >= 20000)  # Ray's workers take 10002-19999
    started = subprocess.run(
        [ray, "start", "--head", "--node-ip-address", "127.0.0.1", "--port", str(port), "--num-cpus", "8",
         "--num-gpus", "0", "--object-store-memory", str(200 * 2**20), "--include-dashboard", "false",
         "--disable-usage-stats", "--temp-dir", temp],
        capture_output=True, text=True, timeout=120, env={**os.environ, **env},
    )  # fmt: skip
    if started.returncode:  # e.g. a Ray instance already running on this machine
        pytest.fail(f"ray start --head failed ({started.returncode}):\n{started.stdout}\n{started.stderr}")
    try:
        yield f"127.0.0.1:{port}"
    finally:
        subprocess.run([ray, "stop", "--force"], capture_output=True, timeout=120)
        shutil.rmtree(temp, ignore_errors=True)


# A driver of its own process (a process fixes its authentication mode as it imports ray).
DRIVER = """
import sys
from specrl.config import RayLauncherConfig
from specrl.orchestrator import ray_launcher
try:
    ray = ray_launcher.connect(RayLauncherConfig(address=sys.argv[1]))
except ray_launcher.RayUnavailable as e:
    print("refused:", e)
    sys.exit(3)
print("cpus:", ray.get(ray.remote(lambda: ray.cluster_resources()["CPU"]).remote()))
"""


def _driver(address: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    return subprocess.run(
        [sys.executable, "-c", DRIVER, address],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_cluster_with_token_authentication_is_joined_with_its_token_and_refused_without():
    """Token authentication (what Ray turns on for a head that finds a token, and KubeRay's
    `authOptions: {mode: token}`): a driver with RAY_AUTH_MODE=token and the cluster's
    token joins and runs work there; one without them is refused, told what to set. First
    in this module, before its own cluster starts: two Ray heads on one machine share
    Ray's fixed ports, and `ray stop --force` stops both."""
    token = secrets.token_hex(32)
    with ray_head_started({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}) as address:
        joined = _driver(address, {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token})
        assert joined.returncode == 0, joined.stdout + joined.stderr[-3000:]
        assert "cpus: 8.0" in joined.stdout
        refused = _driver(address, {})
        assert refused.returncode == 3, refused.stdout + refused.stderr[-3000:]
        assert f"could not join the Ray cluster at {address}" in refused.stdout
        assert "needs RAY_AUTH_MODE=token and its token in RAY_AUTH_TOKEN" in refused.stdout


@pytest.fixture(scope="module")
def ray_head() -> Iterator[str]:
    """A one-node Ray cluster on loopback for this module (ray_head_started), without
    token authentication, said explicitly: Ray turns it on for a head that finds
    ~/.ray/auth_token (any local `ray.init()` writes one), and this process, the driver,
    fixed its own mode when it imported ray (vLLM imports it) with no RAY_AUTH_MODE set.
    Token authentication: the first test."""
    with ray_head_started({"RAY_AUTH_MODE": "disabled"}) as address:
        yield address


@pytest.fixture
def driver(ray_head) -> Iterator:
    """This process joined to the cluster (the run's namespace), left afterwards."""
    ray = ray_launcher.connect(RayLauncherConfig(address=ray_head))
    yield ray
    ray.shutdown()


def _config(tmp_path: Path, address: str, **ray: object) -> dict:
    """The tiny run on Ray, its trainer two tensor-parallel ranks in one bundle (their
    rendezvous on rank 0's node, as the actors report it)."""
    cfg = tiny_run_config(tmp_path, steps=STEPS, checkpoint_every=2, max_lag=0)
    cfg["data"]["prompts_per_step"], cfg["sampling"]["n"] = PROMPTS, N
    cfg["trainer"]["server"]["trainer"]["tp"] = 2
    # the autoscaler drives the run's rollout actors and the loop finds them through it
    # (RayFleet); held at one replica here (the window's share always within tolerance)
    cfg["rollout"]["autoscale"] = {
        "enabled": True, "min_replicas": 1, "max_replicas": 2,
        "target_exposed_share": 0.5, "tolerance": 0.49, "window_steps": 1,
    }  # fmt: skip
    cfg["launcher"] = "ray"
    cfg["ray"] = {"address": address, "gpus": False, "trainer_procs_per_node": 2, **ray}
    return cfg


def _orphaned_engines() -> list[int]:
    """vLLM engine processes whose parent is gone (reparented to init): a leak."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            name, rest = (d / "stat").read_text().rsplit(")", 1)
        except (FileNotFoundError, ProcessLookupError):
            continue
        state, ppid = rest.split()[:2]
        if name.split("(", 1)[1].startswith("VLLM::") and ppid == "1" and state != "Z":
            out.append(int(d.name))
    return out


def _actor(ray, suffix: str) -> str:
    """The name of the run's live actor ending in `suffix` (-rollout-0, -trainer-0)."""
    names = [a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].endswith(suffix)]
    assert len(names) == 1, names
    return names[0]


@pytest.fixture
def specrl_runs() -> Iterator[list[SpecrlRun]]:
    """`specrl run`s started by a test, killed if the test fails while they run."""
    runs: list[SpecrlRun] = []
    yield runs
    for run in runs:
        if run.proc.poll() is None:
            run.proc.kill()


def test_a_run_on_ray_survives_a_killed_replica_and_resumes_after_a_killed_trainer(
    zoo, servers, ray_head, driver, specrl_runs, tmp_path
):
    servers.close()  # two cores: no other engine while these run
    config = tmp_path / "run.yaml"
    config.write_text(yaml.safe_dump(_config(tmp_path, ray_head)))
    run_dir = tmp_path / "t"
    run = SpecrlRun(config)
    specrl_runs.append(run)
    wait_for_steps(run, run_dir, 1)
    # the services are actors on the cluster, each in its own placement group's bundle
    groups = {g["name"]: g for g in driver.util.placement_group_table().values()}
    live = {n.split("-", 3)[-1] for n, g in groups.items() if g["state"] == "CREATED"}
    assert live == {"rollout-0", "trainer"}, groups
    replica = _actor(driver, "-rollout-0")
    driver.kill(driver.get_actor(replica, namespace="specrl"))
    deadline = time.monotonic() + 300  # started again in its bundle and caught up
    while not (run.says("starting it again (restart 1 of 3)") and run.says("catch-up push")):
        assert run.proc.poll() is None and time.monotonic() < deadline, run.output()
        time.sleep(0.5)
    # the killed replica's vLLM engine processes died with its server (Ray kills an
    # actor's children, not theirs: they die by their own parent-death signal)
    assert not _orphaned_engines(), "engine processes outlived their killed server"
    wait_for_steps(run, run_dir, 3)  # past the checkpoint of step 2
    driver.kill(driver.get_actor(_actor(driver, "-trainer-0"), namespace="specrl"))
    assert run.wait(timeout=300) == 75 and run.says("specrl run --resume"), run.output()
    assert not [g for g in driver.util.placement_group_table().values() if g["state"] == "CREATED"]

    resumed = SpecrlRun(config, "--resume")
    specrl_runs.append(resumed)
    assert resumed.wait(timeout=600) == 0, resumed.output()
    final = run_steps(run_dir)
    assert [r["step"] for r in final] == list(range(STEPS)), "every step once"
    assert all(r["autoscale"]["replicas"] == 1 for r in final), [r["autoscale"] for r in final]
    groups_trained = [g for r in final for g in r["group_ids"]]
    assert len(groups_trained) == len(set(groups_trained)) == STEPS * PROMPTS, "a group trained on twice"
    assert not [g for g in driver.util.placement_group_table().values() if g["state"] == "CREATED"]


GAP = 2e-3  # float32 engine vs float32 reference (the single-node weight-sync tests' bound)
LEADER_GRACE_S = 5.0


def test_a_replica_spanning_two_nodes_serves_takes_updates_and_restarts_whole(
    zoo, servers, ray_head, driver, tmp_path
):
    """Tensor parallel 2 split over two nodes (actors here, on one machine): each node
    computes half of every layer, so logprobs match the reference only if both hold their
    shard, and after a push only if it reached both nodes' workers. The trainer is a
    stand-in (named as such: a gRPC health endpoint only, which is all the run asks of a
    trainer it did not start until the loop runs); this test pushes the weights itself."""
    from transformers import AutoTokenizer

    servers.close()  # two cores: no other engine while these run
    cfg = _config(tmp_path, ray_head)
    cfg["rollout"]["server"]["engine"] |= {
        "tensor_parallel_size": 2, "nnodes": 2, "cpu_threads_bind": "nobind",
        "leader_grace_s": LEADER_GRACE_S,
    }  # fmt: skip
    cfg["rollout"]["server"]["speculation"] = {"method": "none"}
    del cfg["rollout"]["autoscale"]
    sender_cfg = WeightSenderConfig(kind="policy", timeout_s=60.0, rpc_timeout_s=60.0, bucket_mb=1.0)
    sender = WeightSender(sender_cfg)
    stand_in, port = serving.start(lambda server: None, "trainer", "127.0.0.1", 0)
    try:
        cfg["trainer"] = {"address": f"127.0.0.1:{port}"}
        system = System(RunConfig.model_validate(cfg), tmp_path / "run").start()
        try:
            [replica] = system.rollout
            groups = {g["name"]: g for g in driver.util.placement_group_table().values()}
            [group] = [g for n, g in groups.items() if n.endswith("-rollout-0") and g["state"] == "CREATED"]
            assert len(group["bundles"]) == 2, group  # a bundle per node
            ref = Reference()
            tok = AutoTokenizer.from_pretrained(resolve_model_path("zoo:target"))
            with RolloutClient(replica.address, timeout=300) as client:
                assert client.status().weight_sync_workers == 2
                gap, _ = max_logprob_gap(client, ref, tok)
                assert gap < GAP, f"the two-node replica's logprobs are off the policy's by {gap}"
                ref.perturb(seed=5)
                sender.add_replica(replica.address)
                assert sender.push(1, ref.model.named_parameters).members == [replica.address]
                gap, samples = max_logprob_gap(client, ref, tok)
                assert {s.policy_version for s in samples} == {1}
                assert gap < GAP, (
                    f"after the push, logprobs are off the new policy by {gap}: a node missed it"
                )
            sender.remove_replica(replica.address)

            # node 1 dies: the whole replica starts again, node 0 on the address the run knows
            address = replica.address
            driver.kill(driver.get_actor(_actor(driver, "-rollout-0-node1"), namespace="specrl"))
            wait_for(lambda: replica.exit_code() is not None, 30, "the dead node seen")
            system.check_alive()
            wait_for(lambda: replica.started(), 300, "the replica serving again")
            assert replica.address == address
            ref.restore()  # a fresh engine: the initial policy
            with RolloutClient(address, timeout=300) as client:
                assert max_logprob_gap(client, ref, tok)[0] < GAP
            # node 0 goes: node 1 ends by itself (engine.leader_grace_s, then vLLM's
            # shutdown of workers stuck in collectives with node 0's), as a pod would.
            # Node 1 gives node 0 up only once it has seen it serve (its start may take
            # minutes): it looks every leader_grace_s, so node 0 serves that long first.
            time.sleep(LEADER_GRACE_S + 1)
            leader, worker = replica.nodes
            leader.stop()
            deadline = time.monotonic() + 90
            while (code := worker.exit_code()) is None and time.monotonic() < deadline:
                time.sleep(1.0)
            assert code == 0 and "node 0 (" in worker.log_tail(200), (code, worker.log_tail(20))
        finally:
            sender.close()
            system.stop()
    finally:
        stand_in.stop(grace=None)
    assert not _orphaned_engines(), "engine processes outlived their replica"


def test_rollout_actors_are_added_and_removed_as_the_autoscaler_asks(zoo, ray_head, driver):
    """RayFleet, what the run's autoscaler scales and its loop discovers replicas through
    on Ray, driven here with trainer services (the same actors and placement groups as
    rollout replicas, far cheaper to start than an engine): each replica added gets a group
    of its own and is listed once it serves; one removed is stopped with its group. One
    added while the cluster has no room (its CPUs held by another group, as on an
    autoscaling cluster before the new node is up) is added at once, neither listed nor
    taken for dead while it waits, removed cleanly, and serves once room appears."""
    from ray.util.placement_group import placement_group, remove_placement_group

    groups = ray_launcher.PlacementGroups(driver, f"fleet-{secrets.token_hex(3)}", 60.0)
    made = itertools.count()

    def add() -> ray_launcher.RayService:
        name = f"r{next(made)}"
        groups.add(name, [ray_launcher.bundle(1.0, 0)], "STRICT_PACK")
        service = ray_launcher.RayService(
            groups, name, 0, TrainerServerConfig(port=0), service="trainer", name=name, gpus=0, cpus=1.0
        )
        return service.start(wait=False)

    fleet = ray_launcher.RayFleet([], add, every_s=1.0)
    try:
        fleet.set(2)
        assert fleet.get() == 2
        serving = wait_for(lambda: len(found := fleet()) == 2 and found, 180, "two replicas serving")
        assert all(health_of(a, 10.0) == "SERVING" for a in serving)
        fleet.set(1)  # the last added goes first
        assert fleet() == serving[:1] and fleet.get() == 1
        states = {g["name"]: g["state"] for g in driver.util.placement_group_table().values()}
        assert states[f"{groups.run}-r1"] == "REMOVED" and states[f"{groups.run}-r0"] == "CREATED"

        # no room left: a replica added waits for it without holding the loop up
        room = driver.cluster_resources()["CPU"] - 1  # all but r0's (r1's may still be going)
        held = placement_group([{"CPU": room}], strategy="STRICT_PACK")
        driver.get(held.ready(), timeout=60)
        try:
            t0 = time.monotonic()
            fleet.set(2)
            assert time.monotonic() - t0 < 10, "adding a replica waited for its placement"
            waiting = fleet.replicas[-1]
            time.sleep(2)
            assert waiting.exit_code() is None and not waiting.started() and fleet() == serving[:1]
            assert "waits for room" in waiting.log_tail()
            fleet.set(1)  # removed while it waits: its group with it
            states = {g["name"]: g["state"] for g in driver.util.placement_group_table().values()}
            assert states[f"{groups.run}-r2"] == "REMOVED"
            fleet.set(2)  # placed once room appears
        finally:
            remove_placement_group(held)
        wait_for(lambda: len(fleet()) == 2, 180, "the waiting replica serving once room appeared")
        assert health_of(fleet()[1], 10.0) == "SERVING"
    finally:
        fleet.set(0)


def test_bad_clusters_are_refused_before_anything_starts(ray_head, driver, tmp_path, monkeypatch):
    closed = free_port()  # nothing listens there
    with pytest.raises(ray_launcher.RayUnavailable, match=f"no Ray cluster reachable at 127.0.0.1:{closed}"):
        ray_launcher.connect(RayLauncherConfig(address=f"127.0.0.1:{closed}"))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(ray_launcher.RayUnavailable, match=r"set ray.address .* or RAY_ADDRESS"):
        ray_launcher.connect(RayLauncherConfig())
    # GPUs on a cluster without any: which resource, how much, and what the cluster has
    cfg = RunConfig.model_validate(_config(tmp_path, ray_head, gpus=True))
    with pytest.raises(StartupError, match=r"need 3 GPU \(the cluster has 0\)"):
        System(cfg, tmp_path / "run").start()
    assert not list((tmp_path / "run" / "logs").glob("*.log")), "a service started"
    monkeypatch.setattr(driver, "__version__", "2.9.0")
    with pytest.raises(ray_launcher.RayUnavailable, match=r"ray 2.9.0 is not supported .*>= 2.40"):
        ray_launcher.connect(RayLauncherConfig(address=ray_head))
