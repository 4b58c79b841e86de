"""Fixtures: the zoo (built once per machine, cached), real rollout servers (one at a
time, reused across tests that ask for the same config) and a shared RL run. Helpers
the tests share are in helpers.py."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

# One compute thread per process, for this process and every service it starts: the
# suite runs a rollout engine, a trainer, a draft-trainer and an orchestrator side by
# side on 2 cores, and torch's default of one OpenMP thread per core in each of them
# oversubscribes the machine, where spinning OpenMP threads take the cores from the
# processes doing the work. Set before torch is imported; a value given is kept.
os.environ.setdefault("OMP_NUM_THREADS", "1")

from helpers import ServerPool, system_run


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
