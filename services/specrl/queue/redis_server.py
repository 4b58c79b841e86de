"""A Redis server started and owned by specrl (`specrl run` without `redis.url`, tests).

Bound to loopback on a free port, tracked by pid, stopped with SHUTDOWN (then SIGTERM,
SIGKILL). With `aof=True` every write is appended to a file in `data_dir` and replayed
when a server is started again on the same directory, which is how a run survives a
Redis restart. The server dies with the process that started it (`die_with_parent`).
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import redis

from specrl.launcher import die_with_parent, free_port


class RedisUnavailable(RuntimeError):
    pass


class RedisServer:
    def __init__(self, data_dir: Path | None = None, *, aof: bool = True, port: int = 0) -> None:
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            raise RedisUnavailable(
                "redis-server not found: run `make setup` (or apt-get install redis-server)"
            )
        self.data_dir = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="specrl-redis-"))
        self.aof = aof
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 20.0) -> RedisServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        cmd = [
            self.binary,
            "--bind", "127.0.0.1",
            "--port", str(self.port),
            "--dir", str(self.data_dir),
            "--save", "",
            "--appendonly", "yes" if self.aof else "no",
            "--appendfsync", "always",  # a step acknowledged is a step kept
            "--protected-mode", "yes",
        ]  # fmt: skip
        log = open(self.data_dir / "redis.log", "ab")  # noqa: SIM115 (owned by the child)
        self.proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent
        )
        client = redis.Redis.from_url(self.url)
        deadline = time.monotonic() + timeout
        while True:
            try:
                if client.ping():
                    break
            except redis.exceptions.BusyLoadingError:
                pass  # replaying the append-only file
            except redis.exceptions.ConnectionError:
                pass
            if self.proc.poll() is not None:
                raise RedisUnavailable(f"redis-server exited with {self.proc.returncode}: {self.log_tail()}")
            if time.monotonic() > deadline:
                self.stop()
                raise RedisUnavailable(f"redis-server not answering after {timeout}s: {self.log_tail()}")
            time.sleep(0.05)
        client.close()
        return self

    def exit_code(self) -> int | None:
        """None while the server runs (or before it started), else its exit status."""
        return None if self.proc is None else self.proc.poll()

    def log_tail(self, lines: int = 10) -> str:
        path = self.data_dir / "redis.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    def stop(self, timeout: float = 10.0) -> None:
        """Graceful: SHUTDOWN flushes the append-only file first."""
        if self.proc is None or self.proc.poll() is not None:
            return
        with contextlib.suppress(redis.exceptions.ConnectionError):  # SHUTDOWN closes it on exit
            redis.Redis.from_url(self.url, socket_timeout=timeout).shutdown(nosave=not self.aof)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def kill(self) -> None:
        """SIGKILL (a crash, for failure tests)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
