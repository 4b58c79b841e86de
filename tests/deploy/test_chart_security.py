"""Security of the rendered chart (issue 30): a certificate and key per service, mounted
only in that service's pods; egress limited to what each component talks to (checked
by evaluating the rendered NetworkPolicies the way the API defines them); the Redis
password never in a process's arguments (the rendered Redis start runs here for real,
against the real redis-server); IPC_LOCK only on the containers given RDMA devices."""

from __future__ import annotations

import base64
import socket
import subprocess
import time

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from test_helm_chart import VALUES, by_kind, containers, render

from helpers import tool

TLS = ("--set", "tls.enabled=true", "--set", "tls.certManager.enabled=true")
ISSUER = ("--set", "tls.certManager.issuerRef.name=specrl-ca")
SERVERS = ("rollout", "trainer", "draft-trainer")
CLIENTS = ("orchestrator", "health")  # the orchestrator Job and the `helm test` pod


def test_each_service_has_its_own_certificate_mounted_only_in_its_pods():
    docs = render(*VALUES["cpu"], *TLS, *ISSUER)
    certs = by_kind(docs, "Certificate")
    secrets = {c["spec"]["secretName"]: c["spec"] for c in certs.values()}
    assert len(secrets) == len(certs) == 5  # rollout, trainer, draft-trainer, orchestrator, test
    assert {c["spec"]["issuerRef"]["name"] for c in certs.values()} == {"specrl-ca"}  # one CA
    mounted = {}
    for name, c in containers(docs).items():
        if name not in SERVERS + CLIENTS:  # Redis, the orchestrator pod's release step
            continue
        (tls,) = [v for v in c["_pod"]["volumes"] if v["name"] == "tls"]
        mounted[name] = tls["secret"]["secretName"]
        assert {"name": "tls", "mountPath": "/etc/specrl/tls", "readOnly": True} in c["volumeMounts"]
    assert set(mounted.values()) == set(secrets)  # every certificate used, each by one service
    assert len(set(mounted.values())) == len(mounted)
    for name in SERVERS:
        spec = secrets[mounted[name]]
        # peers check the name every specrl server carries (tls.serverName); the rest are
        # the service's own names: its Service's and each of its pods' (headless Service)
        service = "rl-specrl-rollout-headless" if name == "rollout" else f"rl-specrl-{name}"
        assert set(spec["dnsNames"]) == {
            "specrl",
            service,
            f"{service}.train.svc",
            f"*.rl-specrl-{name}-headless.train.svc",
        }, name
        assert {"server auth", "client auth"} <= set(spec["usages"]), name
    for name in CLIENTS:  # a client-only certificate cannot serve as a specrl server
        spec = secrets[mounted[name]]
        assert "server auth" not in spec["usages"] and "client auth" in spec["usages"], name
        assert "specrl" not in spec["dnsNames"], name
    # an existing Secret (the user's PKI) is still one Secret for all
    one = render(*VALUES["cpu"], "--set", "tls.enabled=true", "--set", "tls.existingSecret=mine")
    assert "Certificate" not in {d["kind"] for d in one}
    for name, c in containers(one).items():
        if name in SERVERS + CLIENTS:
            (tls,) = [v for v in c["_pod"]["volumes"] if v["name"] == "tls"]
            assert tls["secret"]["secretName"] == "mine", name


# --- NetworkPolicy evaluation (networking.k8s.io/v1 semantics, for the pod peers used) --


def _selects(selector: dict, labels: dict) -> bool:
    if not all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for e in selector.get("matchExpressions", []):
        present, value = e["key"] in labels, labels.get(e["key"])
        ok = {
            "In": present and value in e.get("values", []),
            "NotIn": not present or value not in e.get("values", []),
            "Exists": present,
            "DoesNotExist": not present,
        }[e["operator"]]
        if not ok:
            return False
    return True


def _port_ok(rule: dict, port: int | str, protocol: str) -> bool:
    if "ports" not in rule or not rule["ports"]:
        return True
    return any(p.get("protocol", "TCP") == protocol and p.get("port", port) == port for p in rule["ports"])


def _peer_ok(rule: dict, dst: dict | None) -> bool:
    """dst: the destination pod's labels (same namespace), None for an address outside."""
    if "to" not in rule or not rule["to"]:
        return True
    for peer in rule["to"]:
        if "ipBlock" in peer:
            if dst is None:
                return True
            continue
        if dst is not None and "namespaceSelector" not in peer and _selects(peer.get("podSelector", {}), dst):
            return True
    return False


def egress_allowed(docs, src: dict, dst: dict | None, port: int | str, protocol: str = "TCP") -> bool:
    policies = [
        p["spec"]
        for p in by_kind(docs, "NetworkPolicy").values()
        if "Egress" in p["spec"].get("policyTypes", []) and _selects(p["spec"]["podSelector"], src)
    ]
    if not policies:
        return True  # no policy isolates the pod's egress
    rules = [r for p in policies for r in p.get("egress", [])]
    return any(_peer_ok(r, dst) and _port_ok(r, port, protocol) for r in rules)


def _pods(docs) -> dict[str, dict]:
    return {name: c["_labels"] for name, c in containers(docs).items()}


def test_each_component_reaches_only_what_it_talks_to():
    for args in VALUES.values():
        docs = render(*args)
        pods = _pods(docs)
        for name, labels in pods.items():
            if name != "redis":  # everything resolves Service names
                assert egress_allowed(docs, labels, None, 53, "UDP"), name
                assert egress_allowed(docs, labels, None, 53, "TCP"), name
            if name not in ("orchestrator", "release"):  # the Kubernetes API, below
                assert not egress_allowed(docs, labels, None, 443), name  # nothing outside
                assert not egress_allowed(docs, labels, None, 6379), name
        o = pods["orchestrator"]
        for peer in SERVERS:
            if peer in pods:
                assert egress_allowed(docs, o, pods[peer], "grpc"), peer
                assert not egress_allowed(docs, o, pods[peer], "weight-sync"), peer
        assert egress_allowed(docs, o, pods["redis"], "redis")
        # the NCCL groups (policy and draft broadcast, torchrun): any port between their pods
        for a in [n for n in SERVERS if n in pods]:
            for b in [n for n in SERVERS if n in pods]:
                assert egress_allowed(docs, pods[a], pods[b], 43127), (a, b)
            assert not egress_allowed(docs, pods[a], pods["redis"], "redis"), a
            assert not egress_allowed(docs, pods[a], o, "metrics"), a
        assert not any(egress_allowed(docs, pods["redis"], pods[p], 43127) for p in SERVERS if p in pods)
        # the orchestrator pod calls the API server (EndpointSlice discovery, the release step)
        assert egress_allowed(docs, o, None, 6443) and not egress_allowed(docs, o, None, 22)
        health = pods["health"]
        assert egress_allowed(docs, health, pods["trainer"], "grpc")
        assert not egress_allowed(docs, health, pods["redis"], "redis")


def test_the_orchestrator_reaches_outside_only_for_the_api_server_or_an_external_redis():
    no_api = ("--set", "orchestrator.releaseOnCompletion=false", "--set", "orchestrator.discovery=dns")
    docs = render(*no_api)
    o = _pods(docs)["orchestrator"]
    assert not egress_allowed(docs, o, None, 443) and not egress_allowed(docs, o, None, 6443)
    # each use of the API opens it: the release step, EndpointSlice discovery, scaling
    for uses in (
        ("--set", "orchestrator.releaseOnCompletion=true"),
        ("--set", "orchestrator.discovery=endpointslices"),
        ("--set", "rollout.orchestratorScaling.enabled=true"),
    ):
        docs = render(*no_api, *uses)
        o = _pods(docs)["orchestrator"]
        assert egress_allowed(docs, o, None, 443) and egress_allowed(docs, o, None, 6443), uses
    external = render(
        *no_api,
        *("--set", "redis.enabled=false", "--set", "redis.url=rediss://redis.example.com:6380/0"),
    )
    o = _pods(external)["orchestrator"]
    assert egress_allowed(external, o, None, 6380) and not egress_allowed(external, o, None, 6379)


def test_egress_can_be_opened_or_left_unrestricted():
    extra = ("--set", "networkPolicy.egress.extra[0].ports[0].port=443")
    docs = render(*extra)
    pods = _pods(docs)
    assert all(egress_allowed(docs, pods[n], None, 443) for n in ("rollout", "trainer", "orchestrator"))
    off = render("--set", "networkPolicy.egress.enabled=false")
    assert all(egress_allowed(off, labels, None, 443) for labels in _pods(off).values())
    assert all("Egress" not in p["spec"]["policyTypes"] for p in by_kind(off, "NetworkPolicy").values())


# --- Redis -------------------------------------------------------------------------------


def test_the_redis_password_is_never_in_a_process_argument(tmp_path):
    docs = render()
    redis_set = by_kind(docs, "StatefulSet")["rl-specrl-redis"]
    pod = redis_set["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    secret = by_kind(docs, "Secret")["rl-specrl-redis"]
    password = base64.b64decode(secret["data"]["password"]).decode()
    argv = [*c.get("command", []), *c.get("args", [])]
    assert not any("$(" in a and "PASSWORD" in a for a in argv), argv  # no env var in the args
    assert not any("secretKeyRef" in str(e) for e in c.get("env", [])), c.get("env")
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    (auth,) = [n for n, v in volumes.items() if v.get("secret", {}).get("secretName") == "rl-specrl-redis"]
    assert mounts[auth]["readOnly"] is True
    assert argv[:2] == ["sh", "-c"], argv
    # run the rendered start for real (a password with the characters a config file
    # quotes), every mounted volume a directory here, on a free loopback port
    password = password[:8] + '"a\\b c'
    server = tool("redis-server", installs="`make setup`: apt-get redis-server")
    root = tmp_path / "pod"
    paths = {m["mountPath"]: root / m["name"] for m in c["volumeMounts"]}
    for p in paths.values():
        p.mkdir(parents=True)
    (paths[mounts[auth]["mountPath"]] / "password").write_text(password)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = argv[2]
    for mount, p in sorted(paths.items(), key=lambda kv: -len(kv[0])):
        script = script.replace(mount, str(p))
    assert "--port 6379" in script
    script = script.replace("redis-server", server).replace("--port 6379", f"--port {port} --bind 127.0.0.1")
    proc = subprocess.Popen(["sh", "-c", script], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        client = redis.Redis(host="127.0.0.1", port=port, password=password, socket_timeout=2)
        deadline = time.monotonic() + 20
        while True:
            try:
                assert client.ping()
                break
            except redis.exceptions.ConnectionError:
                assert proc.poll() is None and time.monotonic() < deadline, "redis did not start"
                time.sleep(0.1)
        once = Retry(NoBackoff(), 0)  # a refused password is not retried
        with pytest.raises(redis.exceptions.AuthenticationError):
            redis.Redis(host="127.0.0.1", port=port, password="wrong", retry=once).ping()
        with pytest.raises(redis.exceptions.AuthenticationError):
            redis.Redis(host="127.0.0.1", port=port, retry=once).get("k")
        assert client.config_get("appendonly")["appendonly"] == "yes"
        # no process shows the password in its command line
        out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        assert password not in out and password[:8] not in out
    finally:
        proc.terminate()
        proc.wait(timeout=20)
    # the readiness probe reads the password from the mounted file into REDISCLI_AUTH
    probe = " ".join(c["readinessProbe"]["exec"]["command"])
    assert mounts[auth]["mountPath"] in probe and "REDISCLI_AUTH" in probe, probe


# --- RDMA --------------------------------------------------------------------------------


def test_ipc_lock_only_on_the_containers_given_rdma_devices():
    rdma = ("--set", "nvlink.rdmaResources.rdma/ib=1")
    docs = render(*VALUES["gb200"], *rdma)
    for name, c in containers(docs).items():
        caps = c["securityContext"]["capabilities"]
        assert caps["drop"] == ["ALL"], name
        if "rdma/ib" in c["resources"].get("limits", {}):
            assert caps.get("add") == ["IPC_LOCK"], name
        else:
            assert "add" not in caps, name
    assert {n for n, c in containers(docs).items() if "rdma/ib" in c["resources"].get("limits", {})} == set(
        SERVERS
    )
    for name, c in containers(render(*VALUES["gb200"])).items():
        assert "add" not in c["securityContext"]["capabilities"], name
