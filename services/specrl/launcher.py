"""Start a specrl service (`specrl serve rollout | trainer`) as a child process (demo,
benchmarks, tests, `specrl run`).

The child is tracked by pid and stopped with SIGTERM (then SIGKILL); its log goes to a
file whose tail is shown if it dies before becoming ready.
"""

from __future__ import annotations

import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

import yaml
from pydantic import BaseModel


class ServerDied(RuntimeError):
    pass


def parent_death_signal(sig: int = signal.SIGTERM) -> Callable[[], None] | None:
    """A hook that, run in a new process, has the kernel send it `sig` when the thread
    that started it dies, even by SIGKILL. Linux only (None elsewhere). Resolved here, not
    in the child: a forked child must not import."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    prctl = ctypes.CDLL(None, use_errno=True).prctl
    pr_set_pdeathsig = 1

    def hook() -> None:
        prctl(pr_set_pdeathsig, sig)

    return hook


# The `preexec_fn` of every child specrl starts (services, Redis): a killed `specrl run`
# (or Ray actor) leaves no service or Redis server running; the services' own children
# (vLLM's engine processes) die with them in turn (rollout/engines/vllm/patches.py).
die_with_parent = parent_death_signal()


_handed_out: set[int] = set()


def free_port(host: str = "127.0.0.1") -> int:
    """A port that was free a moment ago, for a child that cannot bind port 0 itself.

    Taken below the kernel's ephemeral range, which port 0 binds and outgoing connections
    draw from: between this call and the child's bind, a vLLM engine's dozen ZMQ sockets,
    gloo's stores or any connection could take an ephemeral port (a chart test's
    orchestrator once found its metrics port taken: "Address already in use"). Never the
    same port twice from one process."""
    low = _ephemeral_range()[0]
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(max(1024, low - 16384), low)
        if port in _handed_out:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    with socket.socket() as s:  # the range below is crowded: an ephemeral port, as before
        s.bind((host, 0))
        return s.getsockname()[1]


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


class ServiceProcess:
    def __init__(
        self,
        cfg: BaseModel,
        *,
        service: str = "rollout",
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
        ready_timeout: float = 600.0,
        wait_ready: bool = True,
    ) -> None:
        """`cfg` is the service's config (with host and port); `wait_ready=False` for a
        process that serves nothing itself (trainer ranks > 0)."""
        self.cfg = cfg
        self.service = service
        self.env = env or {}
        self.ready_timeout = ready_timeout
        self.wait_ready = wait_ready
        self._dir = Path(tempfile.mkdtemp(prefix=f"specrl-{service}-"))
        self.log_path = log_path or self._dir / "server.log"
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self._deadline = 0.0  # when a start not yet ready times out

    @property
    def address(self) -> str:
        if self.port is None:
            raise RuntimeError("server not started")
        return f"{self.cfg.host}:{self.port}"

    @property
    def metrics_port(self) -> int:
        """The bound /metrics port (metrics_port 0 picks one; the server logs it)."""
        m = re.search(r"metrics on :(\d+)", self.log_path.read_text(errors="replace"))
        if m is None:
            raise RuntimeError("server exports no metrics (metrics_port unset)")
        return int(m.group(1))

    def start(self, *, wait: bool = True) -> ServiceProcess:
        """Fork the service (from the calling thread: the child dies with that thread,
        `die_with_parent`); `wait=False` returns before it is ready.

        A service configured with port 0 is given one below the ephemeral range, kept in
        its config: started again it binds the same address, which no outgoing connection,
        port-0 bind or its own engine (vLLM's ports) can have taken while it was down
        (a restart on a port 0 had picked once failed with "the port is taken")."""
        if self.wait_ready and getattr(self.cfg, "port", None) == 0:
            self.cfg = self.cfg.model_copy(update={"port": free_port(getattr(self.cfg, "host", "127.0.0.1"))})
        cfg_path = self._dir / f"{self.service}.yaml"
        cfg_path.write_text(yaml.safe_dump(self.cfg.model_dump(mode="json")))
        ready = self._dir / "port"
        ready.unlink(missing_ok=True)  # a restart must not read the last life's port
        cmd = [
            sys.executable,
            "-m",
            "specrl.cli",
            "serve",
            self.service,
            "--config",
            str(cfg_path),
            "--ready-file",
            str(ready),
        ]
        # appended to: the log of a service started again keeps its previous life's
        log = open(self.log_path, "a")  # noqa: SIM115 (owned by the child for its lifetime)
        self._deadline = time.monotonic() + self.ready_timeout
        self.proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **self.env},
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        if wait and self.wait_ready:
            self.wait()
        return self

    def ready(self) -> bool:
        """Whether the service has reported its bound port (then `port` is set), without
        waiting: ServerDied if it exited first, TimeoutError (stopping it) once it is
        `ready_timeout` past its start."""
        assert self.proc is not None, "start() first"
        ready = self._dir / "port"
        if ready.exists() and (port := ready.read_text().strip()):
            self.port = int(port)
            return True
        if self.proc.poll() is not None:
            code = self.proc.returncode
            raise ServerDied(f"{self.service} exited with {code}; log tail:\n{self.log_tail()}")
        if time.monotonic() > self._deadline:
            self.stop()
            raise TimeoutError(f"{self.service} not ready in {self.ready_timeout}s:\n{self.log_tail()}")
        return False

    def wait(self) -> ServiceProcess:
        """Block until the service reports its bound port (or dies, or times out)."""
        while not self.ready():
            time.sleep(0.5)
        return self

    def exit_code(self) -> int | None:
        """None while the service runs (or before it started), else its exit status."""
        return None if self.proc is None else self.proc.poll()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except FileNotFoundError:
            return "(no log)"

    def stop(self, timeout: float = 30.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def kill(self) -> None:
        """SIGKILL the server and its engine processes (a crash, as failure tests need)."""
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def __enter__(self) -> ServiceProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Service(Protocol):
    """A service `specrl run` starts: a ServiceProcess here, or one in a Ray actor
    (orchestrator/ray_launcher.py)."""

    cfg: BaseModel
    env: dict[str, str]
    port: int | None
    wait_ready: bool

    @property
    def address(self) -> str: ...
    def start(self, *, wait: bool = True) -> Service: ...
    def wait(self) -> Service: ...
    def exit_code(self) -> int | None: ...
    def log_tail(self, lines: int = 40) -> str: ...
    def stop(self) -> None: ...


def start_all(procs: Sequence[Service]) -> None:
    """Start services side by side: all are started from this thread (a child dies with
    the thread that forked it), then the ones that serve are waited for in parallel. On
    any failure every one is stopped and the error lists each failure."""
    for p in procs:
        p.start(wait=False)
    errors: list[BaseException] = []

    def wait(p: Service) -> None:
        try:
            p.wait()
        except BaseException as e:  # reported below with every other failure
            errors.append(e)

    waiters = [threading.Thread(target=wait, args=(p,)) for p in procs if p.wait_ready]
    for w in waiters:
        w.start()
    for w in waiters:
        w.join()
    if errors:
        for p in procs:
            p.stop()
        raise ServerDied("\n\n".join(str(e) for e in errors))
