"""Fixtures: the zoo (built once per machine, cached), real rollout servers (one at a
time, reused across tests that ask for the same config) and a shared RL run. Helpers
the tests share are in helpers.py."""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# One compute thread per process, for this process and every service it starts: the
# suite runs a rollout engine, a trainer, a draft-trainer and an orchestrator side by
# side on 2 cores, and torch's default of one OpenMP thread per core in each of them
# oversubscribes the machine, where spinning OpenMP threads take the cores from the
# processes doing the work. Set before torch is imported; a value given is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from helpers import ServerPool, system_run


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Iterator[None]:
    """Under pytest-xdist (`make test`: two workers, a module's tests on one), a test
    marked `timed` (what time or costs measured at run time decide) runs alone: it takes
    an exclusive lock the other tests share, and waits for the other worker's test to end
    (setup and teardown included, so a module's servers too); a turnstile keeps the other
    worker from starting another meanwhile. Outside xdist this does nothing."""
    root = _locks()
    if root is None:
        yield
        return
    root.mkdir(exist_ok=True)
    with open(root / "turnstile", "w") as turnstile, open(root / "alone", "w") as alone:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        timed = item.get_closest_marker("timed") is not None
        fcntl.flock(alone, fcntl.LOCK_EX if timed else fcntl.LOCK_SH)
        if not timed:
            fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(alone, fcntl.LOCK_UN)
            fcntl.flock(turnstile, fcntl.LOCK_UN)


def pytest_sessionfinish() -> None:
    """A worker done with its tests removes the locks (the other, if still running,
    makes them again: it is the only one left)."""
    root = _locks()
    if root is not None:
        shutil.rmtree(root, ignore_errors=True)


def _locks() -> Path | None:
    """Where this xdist run's workers keep their locks (None outside xdist)."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    return None if run is None else Path(tempfile.gettempdir()) / f"specrl-tests-{run}"


@pytest.fixture(scope="session")
def zoo() -> dict:
    """The zoo manifest; builds the zoo on first use (minutes), then reuses the cache."""
    from specrl.zoo.build import build_zoo, zoo_root

    manifest = build_zoo()
    return {**manifest, "root": str(zoo_root())}


@pytest.fixture(scope="session")
def servers(zoo) -> Iterator[ServerPool]:
    pool = ServerPool()
    yield pool
    pool.close()


@pytest.fixture(scope="session")
def adapted_run(servers, tmp_path_factory):
    """EAGLE-3 from the generic-init draft with the draft-trainer adapting it, and its AR
    comparison run (`compare.runs: [ar]`), shared by the system-level lossless test and
    the online-adaptation test."""
    servers.close()  # two cores: no other engine while it runs
    return system_run(tmp_path_factory.mktemp("adapted"), "adapted", adapt=True, compare=("ar",))
