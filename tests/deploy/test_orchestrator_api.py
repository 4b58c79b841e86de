"""The orchestrator's use of the Kubernetes API, as the chart sets it up (real helm,
offline): EndpointSlice discovery of the rollout replicas (orchestrator.discovery), its
own scaling of the rollout workload (rollout.orchestratorScaling), and the release step
(orchestrator.releaseOnCompletion). For every combination: run.yaml's rollout.discover
and rollout.autoscale; one Role with exactly the calls made (no more), evaluated request
by request with RBAC's rules (chart_rbac.py); the token mounted in exactly the containers
that call the API; egress to the API server exactly then; every manifest valid for the
oldest Kubernetes the chart declares. Then the scalers: one at most, the HPA on the
External demand metric, the replica count a `helm upgrade` keeps (helm's `lookup`
against a fake API server), the ComputeDomain sized for the most replicas."""

from __future__ import annotations

import itertools
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import kubernetes_validate
import pytest
import yaml
from chart_rbac import (
    SCALING,
    api_request,
    orchestrator_role,
    orchestrator_role_rules,
    request_allowed,
    role_of_orchestrator,
)
from kube_api_fake import reply_json
from prometheus_client import CollectorRegistry
from test_chart_refusals import _oldest_kubernetes
from test_chart_security import egress_allowed
from test_helm_chart import CHART, CUSTOM, KUBERNETES, VALUES, by_kind, configs, containers, helm, render

from specrl.config import RunConfig, validate
from specrl.metrics import OrchestratorMetrics

SA_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
# every rollout replica spanning two pods: a LeaderWorkerSet
LWS = ("--set", "rollout.podsPerReplica=2", "--set", "rollout.config.engine.tensor_parallel_size=2")
ROLLOUT, TRAINER = "rl-specrl-rollout", "rl-specrl-trainer"
HEADLESS = "rl-specrl-rollout-headless"


def _args(release: bool, discovery: str, scaling: bool, lws: bool) -> tuple[str, ...]:
    return (
        *("--set", f"orchestrator.releaseOnCompletion={str(release).lower()}"),
        *("--set", f"orchestrator.discovery={discovery}"),
        *(SCALING if scaling else ()),
        *(LWS if lws else ()),
    )


def _rule(group: str, resource: str, names: tuple[str, ...], verbs: tuple[str, ...]) -> tuple:
    return ((group,), (resource,), tuple(sorted(names)), tuple(sorted(verbs)))


def _canonical(rule: dict) -> tuple:
    assert set(rule) <= {"apiGroups", "resources", "resourceNames", "verbs"}, rule
    return (
        tuple(rule["apiGroups"]),
        tuple(rule["resources"]),
        tuple(sorted(rule.get("resourceNames", ()))),
        tuple(sorted(rule["verbs"])),
    )


def expected_rules(release: bool, discovery: str, scaling: bool, lws: bool) -> set[tuple]:
    """The calls each feature makes, and nothing else."""
    rollout = (
        ("leaderworkerset.x-k8s.io", "leaderworkersets/scale") if lws else ("apps", "statefulsets/scale")
    )
    rules = set()
    if release:  # its own pod's status, then scale-to-zero of each GPU workload by name
        rules.add(_rule("", "pods", (), ("get",)))
        if lws:
            rules.add(_rule(*rollout, (ROLLOUT,), ("patch",)))
            rules.add(_rule("apps", "statefulsets/scale", (TRAINER,), ("patch",)))
        else:
            rules.add(_rule("apps", "statefulsets/scale", (ROLLOUT, TRAINER), ("patch",)))
    if discovery == "endpointslices":  # the headless Service's slices, by label selector
        rules.add(_rule("discovery.k8s.io", "endpointslices", (), ("list", "watch")))
    if scaling:  # the rollout workload's scale subresource, by name
        rules.add(_rule(*rollout, (ROLLOUT,), ("get", "patch")))
    return rules


COMBINATIONS = list(itertools.product((True, False), ("endpointslices", "dns"), (True, False), (False, True)))


def _id(c: tuple) -> str:
    release, discovery, scaling, lws = c
    return "-".join(
        [
            "release" if release else "keep",
            discovery,
            "scaling" if scaling else "fixed",
            "lws" if lws else "sts",
        ]
    )


# --- run.yaml -------------------------------------------------------------------------------


def test_the_orchestrator_watches_the_headless_services_endpointslices_by_default():
    docs = render()
    run = configs(docs)["run.yaml"]
    service = by_kind(docs, "Service")[HEADLESS]
    port = service["spec"]["ports"][0]["port"]
    assert run["rollout"] == {"replicas": 0, "discover": f"k8s:train/{HEADLESS}:{port}"}
    # the slices of that Service: every pod, not-ready ones too (a replica waiting for its
    # first weights must be reachable), leaders only for a multi-pod replica
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    validate(run, RunConfig, "run.yaml")
    dns = configs(render("--set", "orchestrator.discovery=dns"))["run.yaml"]
    assert dns["rollout"] == {"replicas": 0, "discover": f"dns:{HEADLESS}.train.svc:{port}"}
    # `helm test` calls no API: it reaches the replicas by the DNS name either way
    health = containers(docs)["health"]
    assert f"dns:{HEADLESS}.train.svc:{port}" in health["args"]
    out = helm("template", "rl", str(CHART), "--set", "orchestrator.discovery=consul")
    assert out.returncode != 0 and "orchestrator.discovery" in out.stderr, out.stderr


@pytest.mark.parametrize("lws", [False, True], ids=["statefulset", "leaderworkerset"])
def test_orchestrator_scaling_renders_rollout_autoscale_for_the_rollout_workload(tmp_path, lws):
    values = tmp_path / "scaling.yaml"
    values.write_text(
        "rollout:\n  orchestratorScaling: {enabled: true, minReplicas: 2, maxReplicas: 12,\n"
        "    targetExposedShare: 0.2, tolerance: 0.03, windowSteps: 3, maxFactor: 1.5}\n"
    )
    docs = render("-f", str(values), *(LWS if lws else ()))
    run = configs(docs)["run.yaml"]
    assert run["rollout"]["autoscale"] == {
        "enabled": True,
        "workload": f"{'leaderworkersets' if lws else 'statefulsets'}/{ROLLOUT}",
        "namespace": "train",
        "min_replicas": 2,
        "max_replicas": 12,
        "target_exposed_share": 0.2,
        "tolerance": 0.03,
        "window_steps": 3,
        "max_factor": 1.5,
    }
    assert run["rollout"]["discover"] == f"k8s:train/{HEADLESS}:50051"
    config = validate(run, RunConfig, "run.yaml")  # the orchestrator's own model loads it
    assert config.rollout.autoscale.enabled and config.rollout.autoscale.max_replicas == 12
    # the workload named is the one rendered, in the release's namespace
    kind = "LeaderWorkerSet" if lws else "StatefulSet"
    assert ROLLOUT in by_kind(docs, kind)
    # off: no autoscale section at all (the orchestrator's default, off)
    assert "autoscale" not in configs(render(*(LWS if lws else ())))["run.yaml"]["rollout"]
    # with DNS discovery it still finds the replicas it adds
    dns = configs(render(*SCALING, "--set", "orchestrator.discovery=dns"))["run.yaml"]
    assert dns["rollout"]["discover"].startswith("dns:") and dns["rollout"]["autoscale"]["enabled"] is True
    validate(dns, RunConfig, "run.yaml (dns)")


# --- RBAC, token, egress: every combination ------------------------------------------------


@pytest.mark.parametrize("combo", COMBINATIONS, ids=_id)
def test_the_orchestrator_pod_gets_exactly_the_api_access_it_uses(combo):
    release, discovery, scaling, _ = combo
    docs = render(*_args(*combo))
    oldest = _oldest_kubernetes()
    for d in docs:
        if (d["apiVersion"], d["kind"]) not in CUSTOM:
            kubernetes_validate.validate(d, oldest, strict=True)
    expected = expected_rules(*combo)
    uses_api = discovery == "endpointslices" or scaling  # the orchestrator container itself
    (job,) = by_kind(docs, "Job").values()
    pod = job["spec"]["template"]["spec"]
    role = role_of_orchestrator(docs)
    if not expected:  # no API calls: no account, Role or binding of its own
        assert role is None and not by_kind(docs, "RoleBinding")
        assert pod["serviceAccountName"] == "rl-specrl"  # the services' (no role bound)
        assert "rl-specrl-orchestrator" not in by_kind(docs, "ServiceAccount")
    else:
        assert role is not None and role["metadata"]["name"] == "rl-specrl-orchestrator"
        assert pod["serviceAccountName"] == "rl-specrl-orchestrator"
        account = by_kind(docs, "ServiceAccount")["rl-specrl-orchestrator"]
        assert account["automountServiceAccountToken"] is False
        rules = [_canonical(r) for r in role["rules"]]
        assert len(rules) == len(set(rules)) and set(rules) == expected, role["rules"]
        verbs = {v for r in role["rules"] for v in r["verbs"]}
        assert verbs <= {"get", "list", "watch", "patch"}  # nothing to create, update or delete
        assert "*" not in json.dumps(role["rules"])
        (binding,) = by_kind(docs, "RoleBinding").values()
        assert binding["roleRef"]["name"] == role["metadata"]["name"]
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "rl-specrl-orchestrator", "namespace": "train"}
        ]
    # the token: mounted in the containers that call the API, and only there
    assert pod["automountServiceAccountToken"] is False
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounted = {
        c["name"]
        for c in pod["containers"]
        for m in c["volumeMounts"]
        if m["mountPath"] == SA_DIR and m["readOnly"] and m["name"] == "kube-api-access"
    }
    assert mounted == ({"orchestrator"} if uses_api else set()) | ({"release"} if release else set())
    assert {c["name"] for c in pod["containers"]} == {"orchestrator"} | ({"release"} if release else set())
    if mounted:  # what the kubernetes client's in-cluster config reads
        sources = volumes["kube-api-access"]["projected"]["sources"]
        paths = {i["path"] for s in sources for part in s.values() for i in part.get("items", [part])}
        assert paths == {"token", "ca.crt", "namespace"}
    else:
        assert "kube-api-access" not in volumes
    for name, c in containers(docs).items():
        if c["_labels"]["app.kubernetes.io/component"] != "orchestrator":
            assert not any(m["mountPath"].startswith("/var/run/secrets") for m in c["volumeMounts"]), name
    # egress to the API server exactly when the pod calls it (443: the kubernetes Service,
    # 6443: the API server's own port after the Service's translation)
    labels = job["spec"]["template"]["metadata"]["labels"]
    for port in (443, 6443):
        assert egress_allowed(docs, labels, None, port) is bool(expected), port
    assert not egress_allowed(docs, labels, None, 22)


@pytest.mark.parametrize("combo", [c for c in COMBINATIONS if expected_rules(*c)], ids=_id)
def test_each_request_the_orchestrator_makes_is_allowed_and_no_other(combo):
    """The requests each feature sends, as the API server authorizes them against the
    rendered Role (chart_rbac.request_allowed). (Without any, there is no Role: above.)"""
    release, discovery, scaling, lws = combo
    role = {**role_of_orchestrator(render(*_args(*combo))), "metadata": {"namespace": "train"}}
    group = "/apis/leaderworkerset.x-k8s.io/v1" if lws else "/apis/apps/v1"
    plural = "leaderworkersets" if lws else "statefulsets"
    scale = f"{group}/namespaces/train/{plural}/{ROLLOUT}/scale"
    slices = "/apis/discovery.k8s.io/v1/namespaces/train/endpointslices"
    selector = f"labelSelector=kubernetes.io%2Fservice-name%3D{HEADLESS}"
    calls = {
        ("GET", f"{slices}?{selector}"): discovery == "endpointslices",
        ("GET", f"{slices}?{selector}&watch=True&resourceVersion=1"): discovery == "endpointslices",
        ("GET", scale): scaling,
        ("PATCH", scale): scaling or release,
        ("GET", "/api/v1/namespaces/train/pods/rl-specrl-orchestrator-0a1b2c3d-x7k2p"): release,
        ("PATCH", f"/apis/apps/v1/namespaces/train/statefulsets/{TRAINER}/scale"): release,
        # never: another namespace, the workload itself, other objects, writes beyond patch
        ("GET", f"/apis/discovery.k8s.io/v1/namespaces/other/endpointslices?{selector}"): False,
        ("GET", "/apis/discovery.k8s.io/v1/endpointslices"): False,  # every namespace
        ("PATCH", scale.replace("/train/", "/other/")): False,
        ("PATCH", scale.removesuffix("/scale")): False,
        ("PUT", scale): False,
        ("GET", f"{group}/namespaces/train/{plural}/{ROLLOUT}"): False,
        ("PATCH", "/apis/apps/v1/namespaces/train/statefulsets/rl-specrl-redis/scale"): False,
        ("GET", "/api/v1/namespaces/train/secrets/rl-specrl-redis"): False,
        ("GET", "/api/v1/namespaces/train/pods"): False,
        ("POST", "/api/v1/namespaces/train/pods"): False,
        ("DELETE", f"/apis/apps/v1/namespaces/train/statefulsets/{ROLLOUT}"): False,
        ("POST", slices): False,
    }
    for (method, path), allowed in calls.items():
        assert request_allowed(role, method, path) is allowed, (method, path, api_request(method, path))


def test_the_exported_helper_gives_the_role_with_orchestrator_scaling():
    """chart_rbac.orchestrator_role: what tests outside tests/deploy check requests against."""
    role = orchestrator_role()
    assert role["kind"] == "Role"
    assert (role["metadata"]["name"], role["metadata"]["namespace"]) == ("rl-specrl-orchestrator", "train")
    assert orchestrator_role_rules() == role["rules"]
    scale = f"/apis/apps/v1/namespaces/train/statefulsets/{ROLLOUT}/scale"
    assert request_allowed(role, "GET", scale) and request_allowed(role, "PATCH", scale)
    lws = orchestrator_role(*LWS)
    lws_scale = f"/apis/leaderworkerset.x-k8s.io/v1/namespaces/train/leaderworkersets/{ROLLOUT}/scale"
    assert request_allowed(lws, "GET", lws_scale) and not request_allowed(lws, "GET", scale)
    # without the scaler (scaling=False): the default release's Role, which has no `get` on it
    assert not request_allowed(orchestrator_role(scaling=False), "GET", scale)


def test_the_api_servers_address_can_be_narrowed():
    docs = render(
        *("--set", "networkPolicy.egress.kubeApi.cidrs={10.96.0.1/32}"),
        *("--set", "networkPolicy.egress.kubeApi.ports={6443}"),
    )
    policy = by_kind(docs, "NetworkPolicy")["rl-specrl-egress-orchestrator"]["spec"]["egress"]
    (api,) = [r for r in policy if any("ipBlock" in p for p in r.get("to", []))]
    assert api == {
        "to": [{"ipBlock": {"cidr": "10.96.0.1/32"}}],
        "ports": [{"port": 6443, "protocol": "TCP"}],
    }
    out = helm("template", "rl", str(CHART), "--set", "networkPolicy.egress.kubeApi.ports={0}")
    assert out.returncode != 0 and "networkPolicy.egress.kubeApi.ports" in out.stderr, out.stderr


# --- the scalers -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ("--set", "rollout.autoscaling.enabled=true", *SCALING),
            "rollout.autoscaling (HorizontalPodAutoscaler) and rollout.orchestratorScaling both scale "
            "the rollout replicas: enable one",
        ),
        (
            ("--set", "rollout.keda.enabled=true", *SCALING),
            "rollout.keda and rollout.orchestratorScaling both scale the rollout replicas: enable one",
        ),
        (
            ("--set", "rollout.keda.enabled=true", "--set", "rollout.autoscaling.enabled=true"),
            "rollout.autoscaling (HorizontalPodAutoscaler) and rollout.keda both scale",
        ),
        (
            (*SCALING, "--set", "rollout.orchestratorScaling.minReplicas=9"),
            "rollout.orchestratorScaling.minReplicas (9) is more than its maxReplicas (8)",
        ),
        (
            (*SCALING, "--set", "rollout.orchestratorScaling.targetExposedShare=1"),
            "rollout.orchestratorScaling.targetExposedShare",
        ),
        (
            ("--set", "rollout.autoscaling.targetCPUUtilizationPercentage=80"),
            "targetCPUUtilizationPercentage",
        ),
    ],
    ids=["hpa", "keda", "hpa-keda", "min-over-max", "share-of-1", "cpu-target-gone"],
)
def test_one_scaler_at_most_and_its_values_checked(args, message):
    out = helm("template", "rl", str(CHART), *args)
    assert out.returncode != 0 and message in out.stderr, out.stderr


@pytest.mark.parametrize("capacity", [0, 96])
def test_the_hpa_scales_on_the_external_demand_metric_over_one_replicas_capacity(capacity):
    """rollout.autoscaling: the orchestrator's demand gauge through the external metrics
    API, a per-replica target (AverageValue) of the capacity KEDA's demand trigger uses."""
    base = (*VALUES["gb200"], "--set", f"rollout.keda.sequencesPerReplica={capacity}")
    docs = render(
        *base, "--set", "rollout.autoscaling.enabled=true", "--set", "rollout.autoscaling.maxReplicas=64"
    )
    for version in (KUBERNETES, _oldest_kubernetes()):
        for d in docs:
            if (d["apiVersion"], d["kind"]) not in CUSTOM:
                kubernetes_validate.validate(d, version, strict=True)
    (hpa,) = by_kind(docs, "HorizontalPodAutoscaler").values()
    (metric,) = hpa["spec"]["metrics"]
    demand = OrchestratorMetrics(CollectorRegistry()).generation_demand._name
    max_num_seqs = configs(docs)["rollout.yaml"]["engine"]["max_num_seqs"]
    assert metric == {
        "type": "External",
        "external": {
            "metric": {"name": demand, "selector": {"matchLabels": {"namespace": "train", "release": "rl"}}},
            "target": {"type": "AverageValue", "averageValue": str(capacity or max_num_seqs)},
        },
    }
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 64)
    assert "replicas" not in by_kind(docs, "StatefulSet")[ROLLOUT]["spec"]  # the HPA owns it
    keda = render(*base, "--set", "rollout.keda.enabled=true")
    (trigger,) = next(iter(by_kind(keda, "ScaledObject").values()))["spec"]["triggers"]
    assert trigger["metadata"]["threshold"] == metric["external"]["target"]["averageValue"]


def test_orchestrator_scaling_keeps_the_live_replica_count_across_upgrades_without_a_cluster():
    """`helm template` has no cluster: rollout.replicas, clamped into [minReplicas,
    maxReplicas]. The workload stays with the chart's count when the orchestrator does not
    scale it."""
    replicas = lambda docs: by_kind(docs, "StatefulSet")[ROLLOUT]["spec"]["replicas"]  # noqa: E731
    assert replicas(render(*SCALING)) == 1
    assert replicas(render(*SCALING, "--set", "rollout.replicas=20")) == 8
    assert replicas(render(*SCALING, "--set", "rollout.replicas=0")) == 1
    assert replicas(render(*SCALING, "--set", "rollout.replicas=5")) == 5
    (lws,) = by_kind(render(*SCALING, *LWS, "--set", "rollout.replicas=20"), "LeaderWorkerSet").values()
    assert lws["spec"]["replicas"] == 8
    assert replicas(render("--set", "rollout.replicas=20")) == 20
    # a PodDisruptionBudget, as for the other scalers (more than one replica may come)
    assert ROLLOUT in by_kind(render(*SCALING), "PodDisruptionBudget")


class _FakeCluster(BaseHTTPRequestHandler):
    """The API server as helm's `lookup` reads it: discovery of the workload's group
    version, and the live rollout workload (`live`: its spec.replicas, None: absent)."""

    live: ClassVar[dict[str, int | None]] = {}

    def log_message(self, *args):  # quiet
        pass

    def do_GET(self):
        path = self.path.split("?")[0]
        kinds = {
            "/apis/apps/v1": ("apps/v1", "statefulsets", "StatefulSet"),
            "/apis/leaderworkerset.x-k8s.io/v1": (
                "leaderworkerset.x-k8s.io/v1",
                "leaderworkersets",
                "LeaderWorkerSet",
            ),
            "/api/v1": ("v1", "secrets", "Secret"),
        }
        if path in kinds:
            gv, plural, kind = kinds[path]
            resources = [
                {
                    "name": plural,
                    "singularName": kind.lower(),
                    "namespaced": True,
                    "kind": kind,
                    "verbs": ["get"],
                }
            ]
            return self._reply(200, {"kind": "APIResourceList", "groupVersion": gv, "resources": resources})
        for gv, plural, kind in kinds.values():
            prefix = f"/apis/{gv}" if "/" in gv else f"/api/{gv}"
            if path == f"{prefix}/namespaces/train/{plural}/{ROLLOUT}" and self.live.get(plural) is not None:
                obj = {"apiVersion": gv, "kind": kind, "metadata": {"name": ROLLOUT, "namespace": "train"}}
                return self._reply(200, {**obj, "spec": {"replicas": self.live[plural]}})
        self._reply(
            404,
            {"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404},
        )

    def _reply(self, code: int, body: dict) -> None:
        reply_json(self, code, body)


@pytest.mark.parametrize(
    ("lws", "live", "chart", "rendered"),
    [
        (False, 5, 1, 5),  # the orchestrator scaled it to 5: an upgrade keeps 5
        (False, 0, 3, 1),  # released at the end of a run: back to minReplicas, not 0
        (False, 30, 1, 8),  # scaled by hand past maxReplicas
        (False, None, 3, 3),  # first install: rollout.replicas
        (True, 3, 6, 3),
    ],
    ids=["kept", "released", "clamped", "install", "lws"],
)
def test_an_upgrade_keeps_the_count_the_orchestrator_set(tmp_path, lws, live, chart, rendered):
    """helm's `lookup` against a fake API server (`helm template --dry-run=server`, as
    `helm upgrade` renders): the live workload's replicas, clamped, not rollout.replicas."""
    _FakeCluster.live = {("leaderworkersets" if lws else "statefulsets"): live}
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeCluster)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [
                    {"name": "fake", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}
                ],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "fake", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    try:
        args = (*SCALING, *(LWS if lws else ()), "--set", f"rollout.replicas={chart}")
        out = helm(
            "template", "rl", str(CHART), "--namespace", "train", "--dry-run=server",
            "--kubeconfig", str(kubeconfig), *args,
        )  # fmt: skip
    finally:
        server.shutdown()
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    workload = by_kind(docs, "LeaderWorkerSet" if lws else "StatefulSet")[ROLLOUT]
    assert workload["spec"]["replicas"] == rendered
    assert configs(docs)["run.yaml"] == configs(render(*args))["run.yaml"]  # the Job is not renewed


def test_the_compute_domain_holds_the_most_replicas_any_scaler_may_ask_for():
    gb200 = VALUES["gb200"]
    # 4 trainer nodes + 20 one-GPU replicas over 4 GPUs a node + the draft-trainer's node
    for scaler in ("autoscaling", "keda", "orchestratorScaling"):
        docs = render(
            *gb200, "--set", f"rollout.{scaler}.enabled=true", "--set", f"rollout.{scaler}.maxReplicas=20"
        )
        (domain,) = by_kind(docs, "ComputeDomain").values()
        assert domain["spec"]["numNodes"] == 4 + 5 + 1, scaler
    docs = render(*gb200)  # no scaler: rollout.replicas (48: 12 nodes)
    assert next(iter(by_kind(docs, "ComputeDomain").values()))["spec"]["numNodes"] == 17


def test_the_gb200_values_render_with_the_orchestrator_scaling_generation():
    docs = render(*VALUES["gb200"], *SCALING, "--set", "rollout.orchestratorScaling.maxReplicas=48")
    oldest = _oldest_kubernetes()
    for d in docs:
        if (d["apiVersion"], d["kind"]) not in CUSTOM:
            kubernetes_validate.validate(d, oldest, strict=True)
    assert by_kind(docs, "StatefulSet")[ROLLOUT]["spec"]["replicas"] == 48
    run = configs(docs)["run.yaml"]
    run["data"]["source"] = "task"  # the dataset is on the cluster's volume
    assert validate(run, RunConfig, "gb200").rollout.autoscale.workload == f"statefulsets/{ROLLOUT}"
    rules = {_canonical(r) for r in role_of_orchestrator(docs)["rules"]}
    assert rules == expected_rules(True, "endpointslices", True, False) - {
        _rule("apps", "statefulsets/scale", (ROLLOUT, TRAINER), ("patch",))
    } | {_rule("apps", "statefulsets/scale", (ROLLOUT, TRAINER, "rl-specrl-draft-trainer"), ("patch",))}


def test_the_orchestrator_scaling_values_schema_follows_the_orchestrators_model():
    schema = json.loads((CHART / "values.schema.json").read_text())
    scaling = schema["properties"]["rollout"]["properties"]["orchestratorScaling"]["properties"]
    from specrl.config import AutoscaleConfig

    camel = {
        f: "".join(w.title() if i else w for i, w in enumerate(f.split("_")))
        for f in AutoscaleConfig.model_fields
    }
    # every field but those the chart sets itself (the workload it renders, its namespace)
    assert set(scaling) == {
        camel[f] for f in AutoscaleConfig.model_fields if f not in ("workload", "namespace")
    }
