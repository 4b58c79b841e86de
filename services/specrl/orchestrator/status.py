"""The orchestrator's status page and control API (`orchestrator.status_port`).

A page for people (the run, its step, versions, acceptance length, reward, the stage
split of recent steps as a chart, the rollout replicas and their health) over a JSON
endpoint for programs (`GET /api/status`), and a small control API that acts at step
boundaries, so a step is never cut in half: `POST /api/pause` (the loop finishes its step
and waits), `/api/resume`, `/api/checkpoint` (a checkpoint at the end of the current
step). Control calls need `Authorization: Bearer <token>`.
"""

from __future__ import annotations

import hmac
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from importlib import resources
from typing import Any

import uvicorn
from fastapi import Depends, FastAPI, HTTPException
from fastapi.responses import HTMLResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from specrl.serving import health_of

HISTORY = 50  # recent steps the page shows


class RunControl:
    """What the control API asks of the loop; the loop takes it at step boundaries."""

    def __init__(self) -> None:
        self._running = threading.Event()
        self._running.set()
        self._checkpoint = threading.Event()
        self.waiting = False  # the loop is waiting in a pause

    @property
    def paused(self) -> bool:
        return not self._running.is_set()

    def pause(self) -> None:
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    def request_checkpoint(self) -> None:
        self._checkpoint.set()

    def take_checkpoint_request(self) -> bool:
        """True once per request (the loop saves, then the request is done)."""
        asked = self._checkpoint.is_set()
        self._checkpoint.clear()
        return asked

    def wait_while_paused(self, check: Callable[[], None] | None = None, poll_s: float = 1.0) -> None:
        """Block while paused; `check` (the services' liveness) runs meanwhile."""
        self.waiting = True
        try:
            while not self._running.wait(poll_s):
                if check is not None:
                    check()
        finally:
            self.waiting = False


class RunStatus:
    """What the page shows, updated by the loop and read by the server's threads."""

    def __init__(self, name: str, steps: int, replicas: list[str], control: RunControl) -> None:
        self.name = name
        self.steps = steps
        self.replicas = replicas
        self.control = control
        self.started = time.time()
        self.state = "starting"
        self.version = 0
        self.checkpoint: str | None = None
        self._records: deque[dict] = deque(maxlen=HISTORY)
        self._lock = threading.Lock()

    def running(self, version: int) -> None:
        with self._lock:
            self.state, self.version = "running", version

    def on_step(self, record: dict, checkpoint: str | None) -> None:
        with self._lock:
            self._records.append(record)
            self.version, self.checkpoint = record["step"] + 1, checkpoint

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            records = list(self._records)
            state = self.state
            if state == "running" and self.control.paused:
                state = "paused" if self.control.waiting else "pausing"
            last = records[-1] if records else {}
            return {
                "run": self.name,
                "state": state,
                "step": self.version,
                "steps": self.steps,
                "elapsed_s": time.time() - self.started,
                "policy_version": self.version,
                "draft_version": last.get("draft", {}).get("version") if last.get("draft") else None,
                "acceptance_length": last.get("acceptance_length"),
                "reward": last.get("reward_mean"),
                "checkpoint": self.checkpoint,
                "recent": [
                    {
                        "step": r["step"],
                        "time": r["time"],
                        "acceptance_length": r["acceptance_length"],
                        "reward": r["reward_mean"],
                    }
                    for r in records
                ],
            }


def replica_health(replicas: list[str], timeout_s: float = 2.0) -> list[dict[str, str]]:
    if not replicas:
        return []
    with ThreadPoolExecutor(max_workers=min(16, len(replicas))) as pool:
        states = list(pool.map(lambda a: health_of(a, timeout_s), replicas))
    return [{"address": a, "health": h} for a, h in zip(replicas, states)]


class HealthCache:
    """The replicas' health, asked at most once per `max_age_s` however many pages poll
    (each asks every 2 s; a fleet of hundreds of replicas would be asked constantly),
    and at once when the set of replicas changed."""

    def __init__(self, max_age_s: float = 5.0) -> None:
        self.max_age_s = max_age_s
        self._lock = threading.Lock()
        self._asked: tuple[float, tuple[str, ...], list[dict[str, str]]] = (-max_age_s, (), [])

    def get(self, replicas: list[str]) -> list[dict[str, str]]:
        now_replicas = tuple(replicas)  # the list is the loop's, changing under us
        with self._lock:  # one asking at a time: concurrent pages wait for it, then share it
            at, which, health = self._asked
            now = time.monotonic()
            if now - at >= self.max_age_s or which != now_replicas:
                health = replica_health(list(now_replicas))
                self._asked = (now, now_replicas, health)
            return health


def create_app(status: RunStatus, token: str) -> FastAPI:
    app = FastAPI(title=f"specrl run {status.name}", docs_url=None, redoc_url=None)
    bearer = HTTPBearer(auto_error=False)
    page = resources.files("specrl.orchestrator").joinpath("status.html").read_text()
    health = HealthCache()

    def authorized(credentials: HTTPAuthorizationCredentials | None = Depends(bearer)) -> None:
        if credentials is None:
            raise HTTPException(401, "control calls need Authorization: Bearer <token>")
        if not hmac.compare_digest(credentials.credentials.encode(), token.encode()):
            raise HTTPException(403, "wrong token")

    @app.get("/", response_class=HTMLResponse)
    def index() -> str:
        return page

    @app.get("/api/status")
    def api_status() -> dict[str, Any]:
        return {**status.snapshot(), "replicas": health.get(status.replicas)}

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"state": status.snapshot()["state"]}

    @app.post("/api/pause", dependencies=[Depends(authorized)])
    def pause() -> dict[str, str]:
        status.control.pause()
        return {"state": status.snapshot()["state"]}

    @app.post("/api/resume", dependencies=[Depends(authorized)])
    def resume() -> dict[str, str]:
        status.control.resume()
        return {"state": status.snapshot()["state"]}

    @app.post("/api/checkpoint", dependencies=[Depends(authorized)])
    def checkpoint() -> dict[str, str]:
        status.control.request_checkpoint()
        return {"checkpoint": "of the current step's version, once the step is logged (paused: on resume)"}

    return app


class StatusServer:
    """The app on `port` (0 picks one), served by uvicorn in a daemon thread."""

    def __init__(self, app: FastAPI, host: str, port: int) -> None:
        self.server = uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, name="status-page", daemon=True)
        self.port: int | None = None

    def start(self, timeout_s: float = 30.0) -> StatusServer:
        self.thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the status page did not start (is its port taken?)")
            time.sleep(0.05)
        self.port = self.server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


class StatusPage:
    """The page of one run: its status, the loop's control, the server."""

    def __init__(self, name: str, steps: int, replicas: list[str], *, port: int, token: str) -> None:
        self.control = RunControl()
        self.status = RunStatus(name, steps, replicas, self.control)
        self.server = StatusServer(create_app(self.status, token), "0.0.0.0", port).start()

    @property
    def port(self) -> int:
        assert self.server.port is not None
        return self.server.port

    def stop(self) -> None:
        self.server.stop()
