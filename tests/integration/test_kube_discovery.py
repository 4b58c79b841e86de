"""The orchestrator on Kubernetes finds rollout replicas by watching their Service's
EndpointSlices (`rollout.discover: k8s:NAMESPACE/SERVICE:PORT`) through the real
`kubernetes` client, against FakeKubeApi (tests/kube_api_fake.py: a stand-in for the API
server, which cannot run here). Membership changes arrive as they happen, not on a DNS
poll; terminating and not-ready endpoints are not replicas; an expired watch lists again;
an API server that goes away and comes back is followed again."""

from __future__ import annotations

import pytest
from chart_rbac import orchestrator_role
from kube_api_fake import FakeKubeApi, endpoint_slice

from specrl.config import ConfigError
from specrl.orchestrator.discovery import DiscoveryError, open_discovery

from helpers import wait_for

SERVICE = "rl-specrl-rollout-headless"
SPEC = f"k8s:train/{SERVICE}:50051"
# the Role the chart gives the orchestrator with discovery alone
ROLE = orchestrator_role("--set", "orchestrator.releaseOnCompletion=false", scaling=False)


@pytest.fixture
def api(tmp_path, monkeypatch):
    fake = FakeKubeApi(role=ROLE).start()
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(fake.kubeconfig(tmp_path / "kubeconfig", "train")))
    yield fake
    fake.stop()


def test_replicas_follow_the_endpoint_slices_as_they_change(api):
    api.put_slice("train", endpoint_slice("a", SERVICE, ["10.0.0.1", "10.0.0.2"]))
    api.put_slice("train", endpoint_slice("other", "another-service", ["10.9.9.9"]))
    api.put_slice("elsewhere", endpoint_slice("b", SERVICE, ["10.8.8.8"]))
    watch = open_discovery(SPEC, every_s=10.0)
    try:
        wait_for(lambda: _known(watch), 10, "the first list")
        assert watch() == ["10.0.0.1:50051", "10.0.0.2:50051"]
        assert watch.every_s <= 1.0  # reading the watched set costs nothing
        # a pod joins in a second slice: seen without any poll interval
        api.put_slice("train", endpoint_slice("c", SERVICE, ["10.0.0.3"]))
        wait_for(lambda: "10.0.0.3:50051" in watch(), 5, "a new endpoint")
        # a pod terminating (scale-in) or not ready leaves; one ready again comes back
        api.put_slice("train", endpoint_slice("c", SERVICE, ["10.0.0.3"], terminating=True))
        wait_for(lambda: "10.0.0.3:50051" not in watch(), 5, "a terminating endpoint to leave")
        api.put_slice("train", endpoint_slice("a", SERVICE, ["10.0.0.1", "10.0.0.2"], ready=False))
        wait_for(lambda: watch() == [], 5, "not-ready endpoints to leave")
        api.put_slice("train", endpoint_slice("a", SERVICE, ["10.0.0.1"]))
        wait_for(lambda: watch() == ["10.0.0.1:50051"], 5, "a ready endpoint")
        api.delete_slice("train", "a")
        wait_for(lambda: watch() == [], 5, "a deleted slice")
        # the watch's version expires (etcd compaction): it lists again and keeps up
        api.expire_events()
        api.put_slice("train", endpoint_slice("d", SERVICE, ["10.0.0.4"]))
        wait_for(lambda: watch() == ["10.0.0.4:50051"], 10, "a relist after 410 Gone")
        verbs = {verb for verb, *_ in api.requests}
        assert verbs == {"list", "watch"} and not api.denied
        lists = sum(verb == "list" for verb, *_ in api.requests)
        assert lists >= 2, "an expired watch must be followed by a fresh list"
    finally:
        watch.close()


def test_an_api_server_that_goes_away_and_comes_back_is_followed_again(api, tmp_path, monkeypatch):
    api.put_slice("train", endpoint_slice("a", SERVICE, ["10.0.0.1"]))
    watch = open_discovery(SPEC, every_s=10.0)
    try:
        wait_for(lambda: _known(watch), 10, "the first list")
        port = int(api.url.rsplit(":", 1)[1])
        api.stop()
        wait_for(lambda: "refused" in watch._error, 20, "the loss")
        # while the API is away the last known set stands (the loop keeps its replicas)
        assert watch() == ["10.0.0.1:50051"]
        api.put_slice("train", endpoint_slice("a", SERVICE, ["10.0.0.1", "10.0.0.5"]))
        api.start(port)
        wait_for(lambda: watch() == ["10.0.0.1:50051", "10.0.0.5:50051"], 30, "the watch to recover")
    finally:
        watch.close()


def test_a_denied_watch_is_reported_and_nothing_is_assumed(tmp_path, monkeypatch):
    fake = FakeKubeApi(role=ROLE | {"rules": []}).start()  # a Role without the EndpointSlice rule
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(fake.kubeconfig(tmp_path / "kubeconfig", "train")))
    watch = open_discovery(SPEC, every_s=10.0)
    try:
        wait_for(lambda: fake.denied, 10, "the denied list")
        # the fake counts the denial before its reply reaches the watch thread
        wait_for(lambda: "403" in watch._error, 10, "the denial to be recorded")
        with pytest.raises(DiscoveryError, match="403"):
            watch()
    finally:
        watch.close()
        fake.stop()


def test_no_kubernetes_api_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="need the Kubernetes API"):
        open_discovery(SPEC, every_s=10.0)


def _known(watch) -> bool:
    try:
        watch()
    except DiscoveryError:
        return False
    return True
