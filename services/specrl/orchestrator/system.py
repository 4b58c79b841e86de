"""The services a run needs, on this machine or elsewhere: a Redis server (started here
when no `redis.url` is configured), rollout replicas, trainer ranks and the optional
draft-trainer (started here as child processes from their configs, or reached at
configured addresses). Everything started here is tracked by pid and stopped on exit,
and a service that fails to start stops the others and reports its log tail."""

from __future__ import annotations

import logging
import time
from collections import Counter
from pathlib import Path

from specrl import serving
from specrl.config import RunConfig
from specrl.launcher import ServerDied, ServiceProcess, free_port, start_all
from specrl.orchestrator.discovery import Discovery, DiscoveryError, open_discovery
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
        self.rollout: list[ServiceProcess] = []
        self.trainer: list[ServiceProcess] = []
        self.draft_trainer: ServiceProcess | None = None
        self.discovery: Discovery | None = None  # rollout.discover, once started
        self.redis_url = cfg.redis.url or ""
        self.replicas: list[str] = list(cfg.rollout.addresses)
        self.trainer_address = cfg.trainer.address or ""
        self.draft_address = cfg.draft_trainer.address or ""
        self.run_dir = run_dir
        self._max_restarts = cfg.rollout.max_restarts
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
        if not cfg.redis.url:
            self.redis = RedisServer(self.redis_dir, aof=cfg.redis.aof).start()
            self.redis_url = self.redis.url
        for i in range(cfg.rollout.replicas):
            self.rollout.append(
                ServiceProcess(cfg.rollout.server, service="rollout", log_path=self.logs / f"rollout-{i}.log")
            )
        if not cfg.trainer.address:
            server = cfg.trainer.server
            t = server.trainer
            world = t.tp * t.dp
            env = {"WORLD_SIZE": str(world), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
            for rank in range(world):
                self.trainer.append(
                    ServiceProcess(
                        server,
                        service="trainer",
                        env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)} if world > 1 else {},
                        log_path=self.logs / f"trainer-{rank}.log",
                        wait_ready=rank == 0,  # the other ranks serve nothing themselves
                    )
                )
        try:
            start_all([*self.rollout, *self.trainer])
        except ServerDied as e:
            raise StartupError(str(e)) from None
        for p in self.rollout:  # a restart binds the address its replica is known by
            p.cfg = p.cfg.model_copy(update={"port": p.port})
        self.replicas += [p.address for p in self.rollout]
        if self.trainer:
            self.trainer_address = self.trainer[0].address
        if cfg.draft_trainer.enabled and not cfg.draft_trainer.address:
            self._start_draft_trainer()

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
        self.draft_trainer = ServiceProcess(
            server.model_copy(update=fill), service="draft-trainer", log_path=self.logs / "draft-trainer.log"
        )
        try:
            self.draft_trainer.start()
        except ServerDied as e:
            raise StartupError(str(e)) from None
        self.draft_address = self.draft_trainer.address

    def check_alive(self) -> None:
        """Start a dead rollout server again on its address while it has restarts left
        (not waiting for it: the generators retry it, the loop catches it up); raise
        ServiceDied, naming it and its log tail, for any other service started here that
        exited (the run stops with its state kept; `specrl run --resume` continues)."""
        for p in self.rollout:
            dead = p.proc is not None and p.proc.poll() is not None
            if dead and self._restarts[p.address] < self._max_restarts:
                n = self._restarts[p.address] = self._restarts[p.address] + 1
                log.warning(
                    "rollout server %s exited with %s: starting it again (restart %d of %d); log tail:\n%s",
                    p.address, p.proc.returncode, n, self._max_restarts, p.log_tail(10),
                )  # fmt: skip
                p.start(wait=False)
        named = [(f"trainer rank {i}", p.proc, p.log_tail) for i, p in enumerate(self.trainer)]
        if self.draft_trainer is not None:
            named.append(("draft-trainer", self.draft_trainer.proc, self.draft_trainer.log_tail))
        named += [(f"rollout server {p.address}", p.proc, p.log_tail) for p in self.rollout]
        if self.redis is not None:
            named.append(("redis", self.redis.proc, self.redis.log_tail))
        for what, proc, tail in named:
            if proc is not None and proc.poll() is not None:
                raise ServiceDied(f"{what} exited with {proc.returncode}; log tail:\n{tail()}")
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

    def __enter__(self) -> System:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
