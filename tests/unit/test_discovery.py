"""Where the rollout replicas are (rollout.discover): DNS and file lookups, and what a
failed lookup means (unknown, not empty)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from specrl.config import RolloutFleetConfig
from specrl.orchestrator.discovery import DiscoveryError, discover


def test_dns_gives_every_address_the_name_resolves_to_with_the_port():
    found = discover("dns:localhost:50051")
    assert found and all(a.endswith(":50051") for a in found)
    assert "127.0.0.1:50051" in found or "[::1]:50051" in found
    assert discover("dns:127.0.0.1:7") == ["127.0.0.1:7"]
    with pytest.raises(DiscoveryError, match="does not resolve"):
        discover("dns:no-such-host.invalid:1")


def test_a_file_lists_one_address_a_line(tmp_path):
    path = tmp_path / "replicas"
    path.write_text("# the pool\n10.0.0.2:50051\n\n10.0.0.1:50051  # rack 1\n10.0.0.2:50051\n")
    assert discover(f"file:{path}") == ["10.0.0.1:50051", "10.0.0.2:50051"]
    with pytest.raises(DiscoveryError, match="cannot read"):
        discover(f"file:{tmp_path / 'missing'}")
    with pytest.raises(DiscoveryError, match="unknown discovery"):
        discover("consul:x")


def test_the_fleet_is_started_listed_or_discovered_never_two_of_these():
    assert RolloutFleetConfig(replicas=0, discover="dns:rollout-headless:50051").elsewhere
    assert not RolloutFleetConfig(replicas=2).elsewhere
    for bad in (
        {"replicas": 1, "discover": "file:/x"},
        {"replicas": 0},
        {"replicas": 0, "discover": "dns:x"},
    ):
        with pytest.raises(ValidationError):
            RolloutFleetConfig.model_validate(bad)
