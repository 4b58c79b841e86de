"""`launcher: ray` joins a Ray cluster with token authentication (what Ray turns on for a
head that finds a token, and KubeRay's `authOptions: {mode: token}`): a driver with
RAY_AUTH_MODE=token and the cluster's token joins and runs work there; one without them
is refused with a message saying what to set. Each driver is a process of its own: a
process fixes its authentication mode when it imports ray."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

import pytest

from helpers import ray_head

pytestmark = [pytest.mark.timeout(300)]

DRIVER = """
import sys
from specrl.config import RayLauncherConfig
from specrl.orchestrator import ray_launcher
try:
    ray = ray_launcher.connect(RayLauncherConfig(address=sys.argv[1]))
except ray_launcher.RayUnavailable as e:
    print("refused:", e)
    sys.exit(3)
print("cpus:", ray.get(ray.remote(lambda: ray.cluster_resources()["CPU"]).remote()))
"""


def _driver(address: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    return subprocess.run(
        [sys.executable, "-c", DRIVER, address],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_cluster_with_token_authentication_is_joined_with_its_token_and_refused_without():
    token = secrets.token_hex(32)
    with ray_head({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token}) as address:
        joined = _driver(address, {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token})
        assert joined.returncode == 0, joined.stdout + joined.stderr[-3000:]
        assert "cpus: 8.0" in joined.stdout
        refused = _driver(address, {})
        assert refused.returncode == 3, refused.stdout + refused.stderr[-3000:]
        assert f"could not join the Ray cluster at {address}" in refused.stdout
        assert "needs RAY_AUTH_MODE=token and its token in RAY_AUTH_TOKEN" in refused.stdout
