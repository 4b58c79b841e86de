"""Shared fixtures: the zoo (built once per machine, cached) and real rollout servers
(one at a time, reused across tests that ask for the same config)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from specrl.config import RolloutServerConfig
from specrl.rollout.launcher import RolloutProcess


@pytest.fixture(scope="session")
def zoo() -> dict:
    """The zoo manifest; builds the zoo on first use (minutes), then reuses the cache."""
    from specrl.zoo.build import build_zoo, zoo_root

    manifest = build_zoo()
    return {**manifest, "root": str(zoo_root())}


class ServerPool:
    """Keeps at most one rollout server alive; a request for another config stops it."""

    def __init__(self) -> None:
        self._key: str | None = None
        self._proc: RolloutProcess | None = None

    def get(self, cfg: RolloutServerConfig, env: dict[str, str] | None = None) -> RolloutProcess:
        key = json.dumps([cfg.model_dump(mode="json"), env or {}], sort_keys=True)
        if key != self._key:
            self.close()
            self._proc = RolloutProcess(cfg, env=env).start()
            self._key = key
        assert self._proc is not None
        return self._proc

    def close(self) -> None:
        if self._proc is not None:
            self._proc.stop()
        self._proc, self._key = None, None


@pytest.fixture(scope="session")
def servers(zoo) -> Iterator[ServerPool]:
    pool = ServerPool()
    yield pool
    pool.close()


def server_config(method: str = "none", k: int = 3, draft: str | None = None, **kw) -> RolloutServerConfig:
    """A zoo rollout-server config (float32: the exact reference is computed in float32)."""
    spec = {"method": method, "num_speculative_tokens": k}
    if draft:
        spec["draft"] = draft
    return RolloutServerConfig.model_validate(
        {"port": 0, "engine": {"model": "zoo:target", "dtype": "float32"}, "speculation": spec, **kw}
    )
