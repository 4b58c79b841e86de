"""`launcher: ray`: the services a run starts, as Ray actors on a Ray cluster (KubeRay,
Anyscale, `ray start`), placed by placement groups that say what the Helm chart says:
each rollout replica's GPUs in one bundle, the trainer's ranks one node's worth per
bundle (the chart's procsPerNode: their collectives stay on the node's NVLink), the
draft-trainer in a bundle of its own; generation and training sized independently.

Each actor runs the same server a pod runs: `specrl serve ...` as a child process of the
actor (launcher.ServiceProcess, on the actor's node, bound to that node's address, with
the GPUs Ray gave the actor). Everything between the services stays as it is: gRPC, the
weight-sync groups over torch.distributed, Redis streams. Ray places processes; it is
not a second transport.

Faults match the local launcher's (orchestrator/system.py): a rollout replica whose
actor or server died is started again in its bundle (the same node, on the address the
run knows it by); a dead trainer or draft-trainer stops the run with its state kept for
`specrl run --resume`. Placement groups and actors are named after the run and removed
when it stops."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel

from specrl.config import RayLauncherConfig, RunConfig
from specrl.launcher import ServerDied, ServiceProcess, free_port

# Ray releases the launcher is written for: placement groups, named actors, namespaces and
# `ray.util.get_node_ip_address` as in these (KubeRay's images ship 2.40 and later).
RAY_SUPPORTED = ((2, 40), (3, 0))  # [oldest, first unsupported)
ACTOR_CALL_S = 60.0  # a call to a live actor answers within this


class RayUnavailable(RuntimeError):
    """No Ray cluster to run on, a Ray release the launcher does not support, or too few
    resources for the run's placement groups: said before anything starts."""


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RayUnavailable(
            "launcher: ray needs the ray package on this machine and on the cluster's nodes: "
            "pip install 'specrl[ray]'"
        ) from None
    version = tuple(int(part) for part in ray.__version__.split(".")[:2])
    low, high = RAY_SUPPORTED
    if not low <= version < high:
        raise RayUnavailable(
            f"ray {ray.__version__} is not supported by the launcher (ray >= {low[0]}.{low[1]}, "
            f"< {high[0]}.{high[1]})"
        )
    return ray


def connect(cfg: RayLauncherConfig) -> Any:
    """Join the Ray cluster as a driver (its namespace: the run's actors are found by
    name there); the `ray` module. A cluster that is not there is said at once (a GCS
    address is tried by TCP first: ray.init would retry it for a minute)."""
    ray = _ray()
    address = cfg.address or os.environ.get("RAY_ADDRESS")
    if not address:
        raise RayUnavailable(
            "launcher: ray needs a Ray cluster: set ray.address (auto, HOST:PORT or ray://HOST:10001) or "
            "RAY_ADDRESS"
        )
    if address != "auto":
        parts = urlsplit(address if "://" in address else f"gcs://{address}")
        try:
            socket.create_connection((parts.hostname, parts.port or 6379), timeout=5.0).close()
        except OSError as e:
            raise RayUnavailable(f"no Ray cluster reachable at {address} ({e.strerror or e})") from None
    if ray.is_initialized():
        return ray
    try:
        ray.init(address=address, namespace=cfg.namespace, log_to_driver=False, configure_logging=False)
    except (ConnectionError, RuntimeError) as e:
        raise RayUnavailable(f"could not join the Ray cluster at {address}: {e}{_auth_hint()}") from None
    return ray


def _auth_hint() -> str:
    """What a driver without token authentication is told: Ray turns it on for a cluster
    whose head found a token (~/.ray/auth_token, written by any local `ray.init()`), and
    a driver given an address never turns it on by itself; it reads RAY_AUTH_MODE when
    `ray` is imported."""
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "token":
        return ""
    return (
        " (a cluster with token authentication needs RAY_AUTH_MODE=token and its token in "
        "RAY_AUTH_TOKEN or RAY_AUTH_TOKEN_PATH, set before specrl starts)"
    )


def bundle(cpus: float, gpus: int) -> dict[str, float]:
    """A placement-group bundle (Ray refuses empty resource entries)."""
    return {"CPU": cpus, **({"GPU": float(gpus)} if gpus else {})}


def gpus_of(cfg: RunConfig, service: str) -> int:
    """GPUs one process of `service` holds on Ray: a rollout replica's node its share of
    the engine's tensor_parallel_size (all of it on one node), a trainer rank or the
    draft-trainer one; none without ray.gpus."""
    if not cfg.ray.gpus:
        return 0
    engine = cfg.rollout.server.engine
    return engine.tensor_parallel_size // engine.nnodes if service in ("rollout", "rollout-worker") else 1


def replica_group(cfg: RunConfig) -> tuple[list[dict[str, float]], str]:
    """One rollout replica's placement group: its GPUs in one bundle, so on one node; a
    replica spanning engine.nnodes nodes one bundle per node (RayReplica), packed as
    closely as Ray can (one bundle per machine when a bundle is a machine's GPUs)."""
    nnodes = cfg.rollout.server.engine.nnodes
    node = bundle(cfg.ray.cpus_per_process, gpus_of(cfg, "rollout"))
    return [node] * nnodes, "STRICT_PACK" if nnodes == 1 else "PACK"


def placement_plan(cfg: RunConfig) -> tuple[dict[str, list[dict[str, float]]], dict[str, str]]:
    """The run's placement groups: name -> bundles, and name -> strategy. The trainer's
    come first (Ray places groups in the order they are made: whole nodes for its bundles
    before one-GPU replicas fragment them), then the draft-trainer's, then one group per
    rollout replica (replica_group)."""
    ray_cfg = cfg.ray
    cpus = ray_cfg.cpus_per_process
    needs: dict[str, list[dict[str, float]]] = {}
    strategy: dict[str, str] = {}
    if not cfg.trainer.address:
        t = cfg.trainer.server.trainer
        per_node = ray_cfg.trainer_procs_per_node
        node = bundle(cpus * per_node, per_node * gpus_of(cfg, "trainer"))
        needs["trainer"], strategy["trainer"] = [node] * (t.tp * t.dp // per_node), "PACK"
    if cfg.draft_trainer.enabled and not cfg.draft_trainer.address:
        needs["draft-trainer"] = [bundle(cpus, gpus_of(cfg, "draft-trainer"))]
        strategy["draft-trainer"] = "STRICT_PACK"
    for i in range(cfg.rollout.replicas):
        needs[f"rollout-{i}"], strategy[f"rollout-{i}"] = replica_group(cfg)
    return needs, strategy


def check_resources(ray: Any, needs: dict[str, list[dict[str, float]]]) -> None:
    """Every placement group's bundles against the cluster's total resources, before any
    is created: too few is an error naming what is missing (an autoscaling cluster that
    could add nodes is not asked: its maximum is not known here)."""
    total: dict[str, float] = {}
    for bundles in needs.values():
        for b in bundles:
            for resource, amount in b.items():
                total[resource] = total.get(resource, 0.0) + amount
    have = ray.cluster_resources()
    short = {r: (n, have.get(r, 0.0)) for r, n in total.items() if have.get(r, 0.0) < n}
    if short:
        missing = ", ".join(f"{n:g} {r} (the cluster has {h:g})" for r, (n, h) in sorted(short.items()))
        groups = "; ".join(f"{name}: {bundles}" for name, bundles in needs.items())
        raise RayUnavailable(f"the run's placement groups need {missing}: {groups}")


class PlacementGroups:
    """The run's placement groups by name, created together and removed together."""

    def __init__(self, ray: Any, run: str, timeout_s: float) -> None:
        self.ray, self.run, self.timeout_s = ray, run, timeout_s
        self.groups: dict[str, Any] = {}

    def create(self, needs: dict[str, list[dict[str, float]]], strategy: dict[str, str]) -> None:
        """The groups `needs` names, each placed within `timeout_s`."""
        check_resources(self.ray, needs)
        for name, bundles in needs.items():
            self.add(name, bundles, strategy[name])
        for name, group in self.groups.items():
            try:
                self.ray.get(group.ready(), timeout=self.timeout_s)
            except self.ray.exceptions.GetTimeoutError:
                raise RayUnavailable(
                    f"placement group {self.run}-{name} ({needs[name]}, {strategy[name]}) was not placed in "
                    f"{self.timeout_s:g}s: no node has room for one of its bundles"
                ) from None

    def add(self, name: str, bundles: list[dict[str, float]], strategy: str) -> None:
        """One more group, not waited for: an actor scheduled into it waits until it is
        placed (an autoscaling cluster may add a node first)."""
        from ray.util.placement_group import placement_group

        self.groups[name] = placement_group(bundles, strategy=strategy, name=f"{self.run}-{name}")

    def remove_group(self, name: str) -> None:
        from ray.util.placement_group import remove_placement_group

        remove_placement_group(self.groups.pop(name))

    def strategy(self, name: str, index: int) -> Any:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return PlacementGroupSchedulingStrategy(
            placement_group=self.groups[name], placement_group_bundle_index=index
        )

    def remove(self) -> None:
        for name in list(self.groups):
            self.remove_group(name)


class ServiceHost:
    """The actor: hosts one specrl service (a child process) on its node. An async actor,
    so that while a start waits for the service to serve (minutes for a large model), the
    run's liveness checks are answered; its event loop's thread, which forks the
    service, lives as long as the actor (the service dies with it: launcher.die_with_parent)."""

    def __init__(self) -> None:
        self.process: ServiceProcess | None = None

    async def node_address(self) -> str:
        """The address Ray knows this node by (its NodeManagerAddress: the pod IP on
        KubeRay, what `ray start --node-ip-address` set), which the other nodes reach."""
        import ray

        node = ray.get_runtime_context().get_node_id()
        return next(n["NodeManagerAddress"] for n in ray.nodes() if n["NodeID"] == node)

    async def free_port(self) -> int:
        return free_port(await self.node_address())

    async def start(self, cfg: BaseModel, service: str, env: dict[str, str], wait_ready: bool) -> int | None:
        """Start the service on this node (bound to the node's address) and, when it
        serves, return its port."""
        host = await self.node_address()
        update: dict[str, Any] = {"host": host}
        sender = getattr(cfg, "weight_sync", None)
        if sender is not None and hasattr(sender, "host"):  # receivers reach its store here
            update["weight_sync"] = sender.model_copy(update={"host": host})
        self.process = ServiceProcess(
            cfg.model_copy(update=update), service=service, env=env, wait_ready=wait_ready
        )
        self.process.start(wait=False)
        while wait_ready and not self.process.ready():
            await asyncio.sleep(0.5)
        return self.process.port

    async def exit_code(self) -> int | None:
        return None if self.process is None else self.process.exit_code()

    async def log_tail(self, lines: int = 40) -> str:
        return "(not started)" if self.process is None else self.process.log_tail(lines)

    async def stop(self) -> None:
        if self.process is not None:
            self.process.stop()


class RayService:
    """One service in an actor, driven from `specrl run` the way System drives a local
    ServiceProcess (start, wait, exit_code, log_tail, stop)."""

    def __init__(
        self,
        groups: PlacementGroups,
        group: str,
        index: int,
        cfg: BaseModel,
        *,
        service: str,
        name: str,
        gpus: int,
        cpus: float,
        env: dict[str, str] | None = None,
        wait_ready: bool = True,
    ) -> None:
        self.groups, self.group, self.index = groups, group, index
        self.cfg, self.service, self.name = cfg, service, name
        self.gpus, self.cpus, self.env = gpus, cpus, env or {}
        self.wait_ready = wait_ready
        self.actor: Any = None
        self.node: str | None = None  # once the actor is placed
        self._node_ref: Any = None  # the actor's answer to where it runs
        self.port: int | None = None  # kept over a restart: the address the run knows
        self._started: Any = None  # the last start call (its result: the port)
        self._ready = False  # the last start's service serves

    @property
    def address(self) -> str:
        if self.port is None:
            raise RuntimeError(f"{self.name} not started")
        return f"{self.node}:{self.port}"

    def _new_actor(self) -> None:
        """The actor in its bundle, not waited for: it runs once its placement group is
        placed, which on an autoscaling cluster may take a new node (minutes)."""
        ray = self.groups.ray
        host = ray.remote(ServiceHost).options(
            name=f"{self.groups.run}-{self.name}",
            num_cpus=self.cpus,
            num_gpus=self.gpus,
            max_restarts=0,  # a dead service is handled as a dead pod is: System.check_alive
            scheduling_strategy=self.groups.strategy(self.group, self.index),
        )
        self.actor = host.remote()
        self.node, self._node_ref = None, self.actor.node_address.remote()

    def place(self) -> str:
        """Create the actor in its bundle (no service yet) and wait until it is placed:
        the node's address, e.g. for the trainer's rendezvous before any rank starts."""
        self._new_actor()
        self.node = self.groups.ray.get(self._node_ref, timeout=self.groups.timeout_s)
        return self.node

    def _placed(self) -> bool:
        """Whether the actor runs on a node yet, without waiting (its address then in
        `node`); a RayError when it died or cannot be placed."""
        if self.node is None:
            ray = self.groups.ray
            if not ray.wait([self._node_ref], timeout=0)[0]:
                return False
            self.node = ray.get(self._node_ref)
        return True

    def free_port(self) -> int:
        return self.groups.ray.get(self.actor.free_port.remote(), timeout=ACTOR_CALL_S)

    def start(self, *, wait: bool = True) -> RayService:
        """Start the service (placing a new actor when there is none or it died: a
        restart lands in the same bundle, so on the same node)."""
        if self.actor is None or self.exit_code() is not None:
            self.kill()
            self._new_actor()
        self._ready = False
        self._started = self.actor.start.remote(self.cfg, self.service, self.env, self.wait_ready)
        if wait:
            self.wait()
        return self

    def wait(self) -> RayService:
        ray = self.groups.ray
        try:
            port = ray.get(self._started)
            self.node = ray.get(self._node_ref)  # placed: its start ran
        except ray.exceptions.RayError as e:
            raise ServerDied(f"{self.name} on {self.node or 'its node'} did not start: {_cause(e)}") from None
        if port is not None:  # a restart binds the address the run knows the service by
            self.port = port
            self.cfg = self.cfg.model_copy(update={"port": port})
        self._ready = True
        return self

    def started(self) -> bool:
        """Whether the last start's service serves, without waiting (a start still placing
        its actor or loading its model is not, nor one started again on the address of
        the last); a start that failed is False, and `failed` says why."""
        if not self._ready:
            self.failed()  # a start that has finished sets _ready, or says why it failed
        return self._ready

    def failed(self) -> ServerDied | None:
        """Why the last start failed, once it has (without waiting); None otherwise."""
        if self._ready or self._started is None:
            return None
        ready, _ = self.groups.ray.wait([self._started], timeout=0)
        if not ready:
            return None
        try:
            self.wait()
        except ServerDied as e:
            return e
        return None

    def exit_code(self) -> int | None:
        """None while the service runs; its exit status, or -1 for an actor that died."""
        ray = self.groups.ray
        if self.actor is None:
            return None
        try:
            if not self._placed():
                return None  # waiting for room (a node being added), not dead
            return ray.get(self.actor.exit_code.remote(), timeout=ACTOR_CALL_S)
        except ray.exceptions.RayError:  # died, never placeable, or not answering
            return -1

    def log_tail(self, lines: int = 40) -> str:
        ray = self.groups.ray
        try:
            if self.actor is not None and not self._placed():
                return f"(the actor {self.groups.run}-{self.name} waits for room on the cluster)"
            return ray.get(self.actor.log_tail.remote(lines), timeout=ACTOR_CALL_S)
        except (ray.exceptions.RayError, AttributeError):
            return f"(the actor {self.groups.run}-{self.name} on {self.node} is gone with its log)"

    def stop(self) -> None:
        if self.actor is None:
            return
        ray = self.groups.ray
        with contextlib.suppress(ray.exceptions.RayError):
            if self._placed():  # one still waiting for room has no service to stop
                ray.get(self.actor.stop.remote(), timeout=ACTOR_CALL_S)  # gone already: killed below
        self.kill()

    def kill(self) -> None:
        """End the actor (its service, a child that dies with it, goes too)."""
        if self.actor is not None:
            self.groups.ray.kill(self.actor)
            self.actor = None


class RayReplica:
    """A rollout replica whose engine spans engine.nnodes nodes, on Ray as on Kubernetes:
    vLLM's multi-node executor (not its Ray executor), node 0 `specrl serve rollout` and
    node i `specrl serve rollout-worker` (its rank in LWS_WORKER_INDEX, as a
    LeaderWorkerSet's pods have it), each in bundle i of the replica's placement group.
    The launcher picks node 0's gRPC and rendezvous ports on its node and gives every
    node the same config. One unit, as a LeaderWorkerSet's group is: a node that dies
    leaves the engine stuck in collectives, so a start stops every node and starts them
    all (node 0 on the gRPC port the run knows the replica by)."""

    def __init__(self, nodes: list[RayService]) -> None:
        self.nodes = nodes
        self.groups, self.group = nodes[0].groups, nodes[0].group  # the replica's own
        self.env: dict[str, str] = {}
        self.wait_ready = True

    @property
    def cfg(self) -> BaseModel:
        return self.nodes[0].cfg

    @cfg.setter
    def cfg(self, cfg: BaseModel) -> None:
        for node in self.nodes:
            node.cfg = cfg

    @property
    def port(self) -> int | None:
        return self.nodes[0].port

    @property
    def address(self) -> str:
        return self.nodes[0].address

    def start(self, *, wait: bool = True) -> RayReplica:
        leader = self.nodes[0]
        for node in self.nodes:
            node.kill()
        host = leader.place()
        cfg: Any = self.cfg
        port = cfg.port or leader.free_port()
        rendezvous = leader.free_port()
        while rendezvous == port:
            rendezvous = leader.free_port()
        engine = cfg.engine.model_copy(update={"master_addr": host, "master_port": rendezvous})
        self.cfg = cfg.model_copy(update={"port": port, "engine": engine})
        for node in self.nodes[1:]:
            node.start(wait=False)
        leader.start(wait=wait)
        return self

    def wait(self) -> RayReplica:
        """Until node 0 serves; ServerDied as soon as any node exits first (node 0 would
        wait for a dead node until its start timed out)."""
        leader, *workers = self.nodes
        while not leader.started():
            for node in workers:
                if (code := node.exit_code()) is not None:
                    raise ServerDied(
                        f"{node.name} on {node.node} exited with {code} before {leader.name} "
                        f"served; log tail:\n{node.log_tail()}"
                    )
            if failure := leader.failed():
                raise failure
            time.sleep(0.5)
        return self

    def started(self) -> bool:
        return self.nodes[0].started()

    def exit_code(self) -> int | None:
        """None while every node runs; else the first exited node's status."""
        return next((c for c in (n.exit_code() for n in self.nodes) if c is not None), None)

    def log_tail(self, lines: int = 40) -> str:
        first, *others = self.nodes
        exited = [n for n in others if n.exit_code() is not None]
        return "\n".join(f"[{n.name}]\n{n.log_tail(lines)}" for n in [first, *exited])

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def kill(self) -> None:
        for node in self.nodes:
            node.kill()


def _cause(error: Exception) -> str:
    cause = getattr(error, "cause", None)
    return str(cause if cause is not None else error).strip().splitlines()[-1]


class RayFleet:
    """The run's rollout replicas on Ray as the loop finds them and as the orchestrator's
    autoscaler scales them (`rollout.autoscale` with launcher: ray): called, the addresses
    of the replicas that serve (a discovery: a replica that appears joins the running loop
    paused until the next push catches it up, one that goes leaves it, as pods do);
    `get` / `set`, how many there are (the autoscaler's workload). A replica added gets a
    placement group and an actor of its own, started without waiting; one removed is
    stopped and its group removed (the last added first)."""

    spec = "ray"

    def __init__(self, replicas: list, add: Callable[[], RayService | RayReplica], every_s: float) -> None:
        self.replicas, self._add, self.every_s = replicas, add, every_s

    def __str__(self) -> str:
        return "the run's rollout actors on Ray"

    def __call__(self) -> list[str]:
        return [r.address for r in self.replicas if r.started()]

    def get(self) -> int:
        return len(self.replicas)

    def set(self, replicas: int) -> None:
        while len(self.replicas) < replicas:
            self.replicas.append(self._add())
        while len(self.replicas) > replicas:
            gone = self.replicas.pop()
            gone.stop()
            gone.groups.remove_group(gone.group)

    def close(self) -> None:
        """Nothing of its own to end (a Discovery's close): the replicas are System's to stop."""
