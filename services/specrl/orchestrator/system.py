"""The services a run needs, on this machine or elsewhere: a Redis server (started here
when no `redis.url` is configured), rollout replicas, trainer ranks and the optional
draft-trainer (started by the run from their configs, or reached at configured
addresses). The run starts them as child processes (`launcher: local`) or as Ray actors
on a Ray cluster (`launcher: ray`, orchestrator/ray_launcher.py). Everything started is
tracked and stopped on exit, and a service that fails to start stops the others and
reports its log tail."""

from __future__ import annotations

import logging
import secrets
import time
from collections import Counter
from pathlib import Path
from typing import Any, cast

from pydantic import BaseModel

from specrl import serving
from specrl.config import RunConfig
from specrl.launcher import ServerDied, Service, ServiceProcess, free_port, start_all
from specrl.orchestrator.discovery import Discovery, DiscoveryError, open_discovery
from specrl.orchestrator.ray_launcher import (
    PlacementGroups,
    RayFleet,
    RayReplica,
    RayService,
    RayUnavailable,
    connect,
    gpus_of,
    placement_plan,
    replica_group,
)
from specrl.queue.redis_server import RedisServer

log = logging.getLogger("specrl.system")


class StartupError(RuntimeError):
    """A service could not be started or reached."""


class ServiceDied(RuntimeError):
    """A service started here exited, or a trainer running elsewhere became unreachable,
    while the run went on."""


class ServicesNotReady(StartupError):
    """A service running elsewhere did not serve in time: one that is starting (again)
    may serve later, so a retry may succeed."""


def check_reachable(address: str, what: str, timeout_s: float) -> None:
    """Wait up to `timeout_s` for the gRPC health of a service that runs elsewhere (in a
    cluster it may be starting again, e.g. a trainer pod reloading its model)."""
    deadline = time.monotonic() + timeout_s
    while (status := serving.health_of(address, min(10.0, timeout_s))) != "SERVING":
        if time.monotonic() > deadline:
            raise ServicesNotReady(f"{what} at {address} is not serving after {timeout_s:g}s ({status})")
        log.info("%s at %s: %s; waiting", what, address, status)
        time.sleep(2.0)


class System:
    def __init__(self, cfg: RunConfig, run_dir: Path) -> None:
        self.cfg = cfg
        self.logs = run_dir / "logs"
        self.redis_dir = run_dir / "redis"
        self.redis: RedisServer | None = None
        self.rollout: list[Service] = []
        self.trainer: list[Service] = []
        self.draft_trainer: Service | None = None
        self.placement: PlacementGroups | None = None  # launcher: ray
        self.discovery: Discovery | None = None  # rollout.discover, once started
        self.redis_url = cfg.redis.url or ""
        self.replicas: list[str] = list(cfg.rollout.addresses)
        self.trainer_address = cfg.trainer.address or ""
        self.draft_address = cfg.draft_trainer.address or ""
        self.run_dir = run_dir
        self._max_restarts = cfg.rollout.max_restarts
        self._replicas_made = cfg.rollout.replicas  # launcher: ray, RayFleet names the next
        self._restarts: Counter[str] = Counter()
        self._asked_trainer_at = 0.0

    def start(self) -> System:
        self.logs.mkdir(parents=True, exist_ok=True)
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def _start(self) -> None:
        cfg = self.cfg
        wait_s = cfg.orchestrator.services_timeout_s
        for address in cfg.rollout.addresses:
            check_reachable(address, "rollout server", wait_s)
        if cfg.rollout.discover:
            self.discovery = open_discovery(cfg.rollout.discover, cfg.rollout.discover_every_s)
            self.replicas += self._first_replicas(self.discovery, cfg.rollout.discover_timeout_s)
        if cfg.trainer.address:
            check_reachable(cfg.trainer.address, "trainer", wait_s)
        if cfg.draft_trainer.enabled and cfg.draft_trainer.address:
            check_reachable(cfg.draft_trainer.address, "draft-trainer", wait_s)
        if cfg.launcher == "ray":
            self._place_on_ray()
        if not cfg.redis.url:
            self.redis = RedisServer(self.redis_dir, aof=cfg.redis.aof).start()
            self.redis_url = self.redis.url
        for i in range(cfg.rollout.replicas):
            self.rollout.append(self._replica(f"rollout-{i}"))
        if not cfg.trainer.address:
            self._trainer_ranks()
        try:
            start_all([*self.rollout, *self.trainer])
        except ServerDied as e:
            raise StartupError(str(e)) from None
        self.replicas += [p.address for p in self.rollout]
        if self.placement is not None and cfg.rollout.autoscale.enabled:  # the autoscaler's to scale
            self.discovery = RayFleet(self.rollout, self._add_replica, cfg.rollout.discover_every_s)
        if self.trainer:
            self.trainer_address = self.trainer[0].address
        if cfg.draft_trainer.enabled and not cfg.draft_trainer.address:
            self._start_draft_trainer()

    def _service(
        self, cfg: BaseModel, service: str, name: str, group: str, index: int = 0, **kw: Any
    ) -> Service:
        """A service to start: a child process here, or an actor in bundle `index` of
        placement group `group` (launcher: ray; the GPUs it takes: ray_launcher)."""
        if self.placement is None:
            return ServiceProcess(cfg, service=service, log_path=self.logs / f"{name}.log", **kw)
        return RayService(
            self.placement, group, index, cfg, service=service, name=name, gpus=gpus_of(self.cfg, service),
            cpus=self.cfg.ray.cpus_per_process, **kw,
        )  # fmt: skip

    def _replica(self, name: str) -> Service:
        """A rollout replica: one server; on Ray one actor in placement group `name`, or
        with engine.nnodes > 1 one per node, bundle i node i's (RayReplica)."""
        server = self.cfg.rollout.server
        if self.placement is None or server.engine.nnodes == 1:
            return self._service(server, "rollout", name, name)
        nodes = [
            self._service(
                server, "rollout-worker" if i else "rollout", f"{name}-node{i}", name, i,
                env={"LWS_WORKER_INDEX": str(i)} if i else {}, wait_ready=not i,
            )
            for i in range(server.engine.nnodes)
        ]  # fmt: skip
        return RayReplica(cast(list[RayService], nodes))

    def _add_replica(self) -> Service:
        """One more rollout replica on Ray (RayFleet): a placement group and actors of
        its own, started without waiting."""
        assert self.placement is not None
        name = f"rollout-{self._replicas_made}"
        self._replicas_made += 1
        self.placement.add(name, *replica_group(self.cfg))
        return self._replica(name).start(wait=False)

    def _trainer_ranks(self) -> None:
        """The trainer's tp x dp ranks (torchrun's environment), rank 0 the one that
        serves; on Ray `trainer_procs_per_node` ranks per bundle, each rank's one GPU its
        device 0 (Ray sets CUDA_VISIBLE_DEVICES), the rendezvous on rank 0's node."""
        server = self.cfg.trainer.server
        world = server.trainer.tp * server.trainer.dp
        per_node = self.cfg.ray.trainer_procs_per_node
        for rank in range(world):
            group_index = rank // per_node if self.placement is not None else 0
            self.trainer.append(
                self._service(
                    server, "trainer", f"trainer-{rank}", "trainer", group_index,
                    wait_ready=rank == 0,  # the other ranks serve nothing themselves
                )
            )  # fmt: skip
        if world == 1:
            return
        if self.placement is None:
            env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
        else:
            first = self.trainer[0]
            assert isinstance(first, RayService)
            env = {"MASTER_ADDR": first.place(), "MASTER_PORT": str(first.free_port())}
        for rank, p in enumerate(self.trainer):
            local = rank if self.placement is None else 0
            p.env = {**env, "WORLD_SIZE": str(world), "RANK": str(rank), "LOCAL_RANK": str(local)}

    def _place_on_ray(self) -> None:
        """Join the Ray cluster and create the run's placement groups (ray_launcher), if
        the run starts any service itself."""
        needs, strategy = placement_plan(self.cfg)
        if not needs:
            return
        try:
            ray = connect(self.cfg.ray)
            # named per start: a comparison run's groups and actors may coexist with the last's
            run = f"specrl-{self.cfg.name}-{secrets.token_hex(3)}"
            self.placement = PlacementGroups(ray, run, self.cfg.ray.placement_timeout_s)
            self.placement.create(needs, strategy)
        except RayUnavailable as e:
            raise StartupError(str(e)) from None

    @staticmethod
    def _first_replicas(discover: Discovery, timeout_s: float) -> list[str]:
        """The discovered replicas that serve, once there is at least one; the others
        join the running loop when they do (the orchestrator looks again)."""
        spec = discover.spec
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                found = discover()
            except DiscoveryError as e:
                found, why = [], str(e)
            else:
                why = f"found {found or 'none'}, none serving"
            up = [a for a in found if serving.health_of(a, 5.0) == "SERVING"]
            if up:
                log.info("rollout replicas found by %s: %s serving of %s", spec, up, found)
                return up
            if time.monotonic() > deadline:
                raise ServicesNotReady(f"no rollout replica serves at {spec} after {timeout_s:g}s ({why})")
            time.sleep(2.0)

    def _start_draft_trainer(self) -> None:
        """After the trainer is up (it reads the trainer's captures): the rollout servers'
        draft, adapted, published drafts saved in the run directory (a resumed run's
        draft-trainer starts from the last one)."""
        cfg = self.cfg
        server = cfg.draft_trainer.server
        fill = {
            "trainer": self.trainer_address,
            "draft": server.draft or cfg.rollout.server.speculation.draft,
            "save_dir": server.save_dir or str((self.run_dir / "draft").resolve()),
        }
        if not cfg.trainer.address and server.target is None:
            fill["target"] = cfg.trainer.server.trainer.model
        self.draft_trainer = self._service(
            server.model_copy(update=fill), "draft-trainer", "draft-trainer", "draft-trainer"
        )
        try:
            self.draft_trainer.start()
        except ServerDied as e:
            raise StartupError(str(e)) from None
        self.draft_address = self.draft_trainer.address

    def check_alive(self) -> None:
        """Start a dead rollout server again on its address while it has restarts left
        (not waiting for it: the generators retry it, the loop catches it up); raise
        ServiceDied, naming it and its log tail, for one out of restarts and for any
        other service started here that exited (the run stops with its state kept;
        `specrl run --resume` continues)."""
        for p in self.rollout:
            if p.port is None:  # still starting (a replica the autoscaler added)
                continue
            # read once: a server that dies between two reads must not be taken as
            # alive by the restart and dead by the check that stops the run
            if (code := p.exit_code()) is None:
                continue
            if self._restarts[p.address] >= self._max_restarts:
                raise ServiceDied(
                    f"rollout server {p.address} exited with {code} after {self._max_restarts} "
                    f"restarts; log tail:\n{p.log_tail()}"
                )
            n = self._restarts[p.address] = self._restarts[p.address] + 1
            log.warning(
                "rollout server %s exited with %s: starting it again (restart %d of %d); log tail:\n%s",
                p.address, code, n, self._max_restarts, p.log_tail(10),
            )  # fmt: skip
            p.start(wait=False)
        named: list[tuple[str, Service | RedisServer]] = [
            (f"trainer rank {i}", p) for i, p in enumerate(self.trainer)
        ]
        if self.draft_trainer is not None:
            named.append(("draft-trainer", self.draft_trainer))
        if self.redis is not None:
            named.append(("redis", self.redis))
        for what, p in named:
            if (code := p.exit_code()) is not None:
                raise ServiceDied(f"{what} exited with {code}; log tail:\n{p.log_tail()}")
        self._check_trainer_elsewhere()

    def _check_trainer_elsewhere(self, every_s: float = 5.0) -> None:
        """A trainer running elsewhere (a pod) is asked for its health every `every_s`
        while the loop waits for rollouts: one that went away stops the run at once
        rather than when the loop next calls it (rollouts may keep it waiting long)."""
        if not self.cfg.trainer.address or time.monotonic() - self._asked_trainer_at < every_s:
            return
        self._asked_trainer_at = time.monotonic()
        if (status := serving.health_of(self.trainer_address, every_s)) == "UNAVAILABLE":
            raise ServiceDied(f"the trainer at {self.trainer_address} is unreachable ({status})")

    def stop(self) -> None:
        if self.discovery is not None:
            self.discovery.close()
        for p in filter(None, [self.draft_trainer, *self.trainer, *self.rollout]):
            p.stop()
        if self.redis is not None:
            self.redis.stop()
        if self.placement is not None:
            self.placement.remove()

    def __enter__(self) -> System:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
