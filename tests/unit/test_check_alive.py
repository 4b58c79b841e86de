"""System.check_alive restarts a dead rollout server while it has restarts left and
stops the run only after that. A stand-in server (not a real process) dies on a chosen
read of its exit code: the race a real kill hits only by chance (CI saw it, a Ray
actor killed between the restart's read and the stop check's) made repeatable."""

from __future__ import annotations

import pytest

from specrl.config import RunConfig
from specrl.orchestrator.system import ServiceDied, System


class DiesOnRead:
    """A rollout server stand-in whose exit code reads None until read number `dies_on`."""

    def __init__(self, dies_on: int) -> None:
        self.port: int | None = 50051
        self.reads = 0
        self.dies_on = dies_on
        self.starts = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def exit_code(self) -> int | None:
        self.reads += 1
        return -1 if self.reads >= self.dies_on else None

    def start(self, *, wait: bool = True) -> DiesOnRead:
        self.starts += 1
        self.reads, self.dies_on = 0, 10**9  # started again: alive
        return self

    def log_tail(self, lines: int = 40) -> str:
        return "(killed)"


def _system(tmp_path, max_restarts: int) -> System:
    cfg = RunConfig.model_validate({"rollout": {"max_restarts": max_restarts}})
    return System(cfg, tmp_path)


def test_a_server_dead_on_its_first_read_is_started_again_not_reported(tmp_path):
    system = _system(tmp_path, max_restarts=3)
    server = DiesOnRead(dies_on=1)
    system.rollout = [server]  # type: ignore[list-item]
    system.check_alive()
    assert server.starts == 1


def test_a_server_that_dies_after_the_restart_check_waits_for_the_next_check(tmp_path):
    """Read alive by the restart's check and dead by a later read in the same call:
    the old check_alive stopped the run here with restarts unspent."""
    system = _system(tmp_path, max_restarts=3)
    server = DiesOnRead(dies_on=2)
    system.rollout = [server]  # type: ignore[list-item]
    system.check_alive()  # reads it once: alive
    system.check_alive()  # dead now: started again, the run goes on
    assert server.starts == 1


def test_a_server_out_of_restarts_stops_the_run_naming_it(tmp_path):
    system = _system(tmp_path, max_restarts=0)
    system.rollout = [DiesOnRead(dies_on=1)]  # type: ignore[list-item]
    with pytest.raises(ServiceDied, match=r"rollout server 127.0.0.1:50051 exited with -1 after 0 restarts"):
        system.check_alive()
