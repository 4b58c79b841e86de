"""The Helm chart, rendered by the real helm (v3, offline) with its default, CPU and
GB200 NVL72 values, every manifest validated strictly against the Kubernetes schemas of
a current release (kubernetes-validate), and every service config it renders loaded by
that service's own config model. No cluster runs here: custom resources (ComputeDomain,
ServiceMonitor), which have no bundled schema, get focused structural checks."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from prometheus_client import CollectorRegistry

from deploygen import chart
from specrl.config import (
    DraftTrainerServerConfig,
    RolloutServerConfig,
    RunConfig,
    TrainerServerConfig,
    validate,
)
from specrl.metrics import OrchestratorMetrics

from helpers import tool

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "specrl"
VALUES = {
    "default": [],
    "cpu": ["-f", str(CHART / "values-cpu.yaml")],
    "gb200": ["-f", str(CHART / "values-gb200-nvl72.yaml")],
}
KUBERNETES = "1.33.0"  # a current release (kubernetes-validate bundles 1.25-1.37)
CONFIGS = {
    "rollout.yaml": RolloutServerConfig,
    "trainer.yaml": TrainerServerConfig,
    "draft-trainer.yaml": DraftTrainerServerConfig,
    "run.yaml": RunConfig,
}
CUSTOM = {
    ("resource.nvidia.com/v1beta1", "ComputeDomain"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("keda.sh/v1alpha1", "ScaledObject"),
    ("keda.sh/v1alpha1", "TriggerAuthentication"),
    ("cert-manager.io/v1", "Certificate"),
    ("jobset.x-k8s.io/v1alpha2", "JobSet"),
    ("scheduling.x-k8s.io/v1alpha1", "PodGroup"),
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"),
}


def _helm() -> str:
    return tool("helm", installs="`make setup` puts it in .tools/bin")


def helm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([_helm(), *args], capture_output=True, text=True, timeout=120)


def render(*args: str) -> list[dict]:
    out = helm("template", "rl", str(CHART), "--namespace", "train", *args)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def by_kind(docs: list[dict], kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


def configs(docs: list[dict]) -> dict[str, dict]:
    cm = by_kind(docs, "ConfigMap")["rl-specrl-config"]
    return {name: yaml.safe_load(text) for name, text in cm["data"].items()}


def containers(docs: list[dict]) -> dict[str, dict]:
    """Every container of every workload (and the test pod), by its name."""
    out = {}
    for d in docs:
        if d["kind"] not in ("StatefulSet", "Job", "Pod"):
            continue
        pod = d if d["kind"] == "Pod" else d["spec"]["template"]
        for c in pod["spec"]["containers"]:
            out[c["name"]] = {**c, "_pod": pod["spec"], "_labels": pod["metadata"]["labels"]}
    return out


@pytest.fixture(scope="module", params=list(VALUES))
def rendered(request) -> tuple[str, list[dict]]:
    return request.param, render(*VALUES[request.param])


def test_the_chart_lints_strictly_with_each_values_file():
    for name, args in VALUES.items():
        out = helm("lint", "--strict", str(CHART), *args)
        assert out.returncode == 0, f"{name}: {out.stdout}{out.stderr}"


def test_every_manifest_validates_against_the_kubernetes_schemas(rendered):
    name, docs = rendered
    kinds = set()
    for d in docs:
        kinds.add(d["kind"])
        if (d["apiVersion"], d["kind"]) in CUSTOM:
            continue  # no bundled schema: structural checks below
        kubernetes_validate.validate(d, KUBERNETES, strict=True)  # raises on any error
    assert {"StatefulSet", "Job", "Service", "ConfigMap", "NetworkPolicy", "Secret"} <= kinds, name


def test_every_rendered_config_loads_in_its_services_own_model(rendered):
    name, docs = rendered
    files = configs(docs)
    assert {"rollout.yaml", "trainer.yaml", "run.yaml"} <= files.keys()
    source = files["run.yaml"]["data"].get("source", "task")
    if source.startswith("/models/"):  # a dataset on the cluster's model volume (gb200)
        files["run.yaml"]["data"]["source"] = "task"  # the loader checks that the file exists
    for file, data in files.items():
        validate(data, CONFIGS[file], f"{name}:{file}")  # ConfigError names every bad field


def test_services_find_each_other_by_the_names_the_chart_gives_them(rendered):
    name, docs = rendered
    files = configs(docs)
    run, trainer = files["run.yaml"], files["trainer.yaml"]
    services = by_kind(docs, "Service")
    sets = by_kind(docs, "StatefulSet")
    rollout = sets["rl-specrl-rollout"]
    # the orchestrator finds every rollout pod through the headless Service: its
    # EndpointSlices, watched through the Kubernetes API (test_orchestrator_api.py)
    assert rollout["spec"]["serviceName"] == "rl-specrl-rollout-headless"
    port = files["rollout.yaml"]["port"]
    assert run["rollout"] == {"replicas": 0, "discover": f"k8s:train/rl-specrl-rollout-headless:{port}"}
    assert services["rl-specrl-rollout-headless"]["spec"]["publishNotReadyAddresses"] is True
    # the trainer's gRPC Service reaches rank 0 only; its broadcast store is pod 0's name
    grpc_svc = services["rl-specrl-trainer"]["spec"]
    assert grpc_svc["selector"]["statefulset.kubernetes.io/pod-name"] == "rl-specrl-trainer-0"
    assert run["trainer"]["address"] == f"rl-specrl-trainer.train.svc:{grpc_svc['ports'][0]['port']}"
    assert trainer["weight_sync"]["host"] == "rl-specrl-trainer-0.rl-specrl-trainer-headless.train.svc"
    assert run["redis"]["url"] == "redis://rl-specrl-redis.train.svc:6379/0"
    assert run["output_dir"] == "/runs/{name}"
    # every Service's target port names a port of the pods it selects (the StatefulSet
    # controller adds the pod-name label to each pod it makes)
    for svc in services.values():
        selector = dict(svc["spec"]["selector"])
        selector.pop("statefulset.kubernetes.io/pod-name", None)
        selected = [c for c in containers(docs).values() if selector.items() <= c["_labels"].items()]
        assert selected, f"{name}: Service {svc['metadata']['name']} selects no pod"
        ports = {p["name"] for c in selected for p in c.get("ports", [])} | {
            p["containerPort"] for c in selected for p in c.get("ports", [])
        }
        for p in svc["spec"]["ports"]:
            assert p.get("targetPort", p["port"]) in ports, (name, svc["metadata"]["name"], p)
    if "draft-trainer.yaml" in files:
        draft = files["draft-trainer.yaml"]
        assert run["draft_trainer"] == {"enabled": True, "address": "rl-specrl-draft-trainer.train.svc:50071"}
        assert draft["trainer"] == run["trainer"]["address"]
        # the draft-trainer knows its target without asking the trainer, so its pod does
        # not crash-loop while the trainer's pod is still starting
        assert draft["target"] == trainer["trainer"]["model"]
        assert draft["save_dir"] == f"/runs/{run['name']}/draft"
        assert trainer["trainer"]["capture"]["enabled"] is True  # the draft-trainer's input


def test_rollout_and_trainer_scale_independently():
    base = render()
    more_rollout = render("--set", "rollout.replicas=5")
    more_trainer = render(
        "--set", "trainer.nodes=2", "--set", "trainer.procsPerNode=2", "--set", "trainer.config.trainer.dp=4"
    )
    replicas = lambda docs, c: by_kind(docs, "StatefulSet")[f"rl-specrl-{c}"]["spec"]["replicas"]  # noqa: E731
    assert (replicas(base, "rollout"), replicas(base, "trainer")) == (1, 1)
    assert (replicas(more_rollout, "rollout"), replicas(more_rollout, "trainer")) == (5, 1)
    assert (
        configs(more_rollout)["run.yaml"]["rollout"] == configs(base)["run.yaml"]["rollout"]
    )  # found at run time (rollout.discover)
    assert (replicas(more_trainer, "rollout"), replicas(more_trainer, "trainer")) == (1, 2)
    assert configs(more_trainer)["run.yaml"]["rollout"] == configs(base)["run.yaml"]["rollout"]
    trainer = containers(more_trainer)["trainer"]
    assert trainer["command"] == ["torchrun"]
    assert "--nnodes=2" in trainer["args"] and "--nproc-per-node=2" in trainer["args"]
    assert "--node-rank=$(NODE_RANK)" in trainer["args"]
    (node_rank,) = [e for e in trainer["env"] if e["name"] == "NODE_RANK"]
    pod_index = "metadata.labels['apps.kubernetes.io/pod-index']"  # the node rank
    assert node_rank["valueFrom"]["fieldRef"]["fieldPath"] == pod_index
    assert containers(base)["trainer"]["args"][:2] == ["serve", "trainer"]  # one rank: no torchrun


def test_bad_values_fail_with_a_message_that_names_the_field():
    cases = {
        ("--set", "rollout.replicas=two"): "rollout.replicas",
        ("--set", "rollout.config.speculation.method=eagle"): "rollout.config.speculation.method",
        ("--set", "rollout.config.engine.max_model_len=4"): "rollout.config.engine.max_model_len",
        ("--set", "trainer.config.trainer.tpp=2"): "tpp",
        ("--set", "trainer.procsPerNode=2"): "must equal trainer.config.trainer.tp x dp",
        ("--set", "redis.enabled=false"): "redis.url is required",
        ("--set", "rollout.autoscaling.enabled=true", "--set", "rollout.keda.enabled=true"): "enable one",
        ("--set", "tls.enabled=true"): "tls.enabled needs tls.existingSecret or tls.certManager.enabled",
        ("--set", "rollout.gpusPerReplica=2"): "must equal rollout.config.engine.tensor_parallel_size",
        ("--set", "orchestrator.config.sampling.temperature=0"): "orchestrator.config.sampling.temperature",
    }
    for args, message in cases.items():
        out = helm("template", "rl", str(CHART), *args)
        assert out.returncode != 0 and message in out.stderr, (args, out.stderr)


def test_a_bare_n_in_a_values_file_is_caught_not_turned_into_false(tmp_path):
    """YAML 1.1 (Helm's) reads an unquoted key `n` as the boolean false: the schema
    refuses the resulting "false" key instead of silently dropping the group size."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("orchestrator:\n  config:\n    sampling:\n      n: 4\n")
    out = helm("template", "rl", str(CHART), "-f", str(bad))
    assert out.returncode != 0 and "false" in out.stderr and "sampling" in out.stderr, out.stderr


def test_the_values_schema_is_generated_from_the_config_models():
    committed = (CHART / "values.schema.json").read_text()
    assert committed == chart.render(), "values.schema.json is stale: run `make chart-schema`"
    schema = json.loads(committed)
    rollout_config = schema["properties"]["rollout"]["properties"]["config"]
    assert set(rollout_config["properties"]) == set(RolloutServerConfig.model_fields)


def test_pods_run_unprivileged_with_limits_and_probes(rendered):
    name, docs = rendered
    for cname, c in containers(docs).items():
        pod = c["_pod"]
        assert pod["securityContext"]["runAsNonRoot"] is True, (name, cname)
        assert pod.get("automountServiceAccountToken") is False, (name, cname)
        sc = c["securityContext"]
        assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True, (name, cname)
        assert sc["capabilities"]["drop"] == ["ALL"], (name, cname)
        assert c["resources"]["limits"].get("memory"), (name, cname)
        if cname in ("rollout", "draft-trainer", "redis") or (cname == "trainer" and "command" not in c):
            assert "readinessProbe" in c and "livenessProbe" in c, (name, cname)
    pdbs = by_kind(docs, "PodDisruptionBudget")
    assert pdbs["rl-specrl-trainer"]["spec"]["maxUnavailable"] == 0  # every rank is needed


def test_only_the_releases_pods_reach_its_services_and_redis(rendered):
    _, docs = rendered
    policies = by_kind(docs, "NetworkPolicy")
    release = {"app.kubernetes.io/name": "specrl", "app.kubernetes.io/instance": "rl"}
    redis = policies["rl-specrl-redis"]["spec"]
    assert redis["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "redis"
    from_release = {"from": [{"podSelector": {"matchLabels": release}}]}
    assert redis["ingress"] == [{**from_release, "ports": [{"port": "redis"}]}]
    services = policies["rl-specrl-services"]["spec"]
    (anything_from_release, metrics) = services["ingress"]
    assert anything_from_release == from_release
    assert metrics["ports"] == [{"port": "metrics"}]  # Prometheus: the metrics port only
    # the password is a Secret the orchestrator and Redis read, never in a config file
    secret = by_kind(docs, "Secret")["rl-specrl-redis"]
    assert secret["data"]["password"] and secret["data"]["password"] not in json.dumps(configs(docs))
    env = {e["name"]: e for e in containers(docs)["orchestrator"]["env"]}
    assert env["SPECRL_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "rl-specrl-redis"
    assert configs(docs)["run.yaml"]["redis"]["password_env"] == "SPECRL_REDIS_PASSWORD"


def test_gb200_values_place_gpus_nvlink_and_the_paper_layout():
    docs = render(*VALUES["gb200"])
    c = containers(docs)
    gpu = "nvidia.com/gpu"
    assert c["rollout"]["resources"]["limits"][gpu] == 1 == c["rollout"]["resources"]["requests"][gpu]
    assert c["trainer"]["resources"]["limits"][gpu] == 4  # a GB200 node's four GPUs
    sets = by_kind(docs, "StatefulSet")
    assert sets["rl-specrl-rollout"]["spec"]["replicas"] == 48  # 12 generation nodes x 4
    assert sets["rl-specrl-trainer"]["spec"]["replicas"] == 4  # 4 training nodes
    pod = c["trainer"]["_pod"]
    (term, _nccl) = pod["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert term["topologyKey"] == "nvidia.com/gpu.clique"  # the trainer inside one NVLink domain
    assert term["labelSelector"]["matchLabels"]["app.kubernetes.io/component"] == "trainer"
    (claim,) = pod["resourceClaims"]
    (domain,) = by_kind(docs, "ComputeDomain").values()
    assert domain["spec"]["numNodes"] == 17  # every NCCL pod's node (test_gb200_rack.py)
    assert domain["spec"]["channel"]["resourceClaimTemplate"]["name"] == claim["resourceClaimTemplateName"]
    assert c["trainer"]["resources"]["claims"] == [{"name": claim["name"]}]
    shm = {v["name"]: v for v in pod["volumes"]}["dshm"]
    assert shm["emptyDir"]["medium"] == "Memory"
    env = {e["name"]: e.get("value") for e in c["rollout"]["env"]}
    assert env["NCCL_MNNVL_ENABLE"] == "1"
    images = {name: c[name]["image"].rsplit(":", 1)[0] for name in ("rollout", "trainer", "draft-trainer")}
    assert images == {  # vLLM's image generates; PyTorch's trains (images/README.md)
        "rollout": "ghcr.io/specrl/specrl-rollout",
        "trainer": "ghcr.io/specrl/specrl-trainer",
        "draft-trainer": "ghcr.io/specrl/specrl-trainer",
    }
    assert configs(docs)["trainer.yaml"]["weight_sync"]["backend"] == "nccl"
    (monitor,) = by_kind(docs, "ServiceMonitor").values()
    assert monitor["spec"]["endpoints"][0]["port"] == "metrics"
    assert monitor["spec"]["selector"]["matchLabels"] == {
        "app.kubernetes.io/name": "specrl",
        "app.kubernetes.io/instance": "rl",
    }


def test_helm_test_asks_every_grpc_service_for_its_health():
    docs = render(*VALUES["cpu"])
    pod = by_kind(docs, "Pod")["rl-specrl-test-health"]
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    args = pod["spec"]["containers"][0]["args"]
    assert args[0] == "health"
    run = configs(docs)["run.yaml"]
    # the rollout replicas by the headless Service's DNS name: the test pod calls no API
    rollout = "dns:rl-specrl-rollout-headless.train.svc:50051"
    services = {run["trainer"]["address"], run["draft_trainer"]["address"], rollout}
    assert set(args) >= services
    assert run["rollout"]["discover"] == "k8s:train/rl-specrl-rollout-headless:50051"


def test_rollout_replicas_autoscale_on_demand_or_on_the_prompt_queues_lag():
    from specrl.queue.streams import GENERATORS, RunStreams

    hpa_docs = render(
        "--set", "rollout.autoscaling.enabled=true", "--set", "rollout.autoscaling.maxReplicas=6"
    )
    for d in hpa_docs:
        if (d["apiVersion"], d["kind"]) not in CUSTOM:
            kubernetes_validate.validate(d, KUBERNETES, strict=True)
    (hpa,) = by_kind(hpa_docs, "HorizontalPodAutoscaler").values()
    target = hpa["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"], hpa["spec"]["maxReplicas"]) == (
        "StatefulSet",
        "rl-specrl-rollout",
        6,
    )
    # on the run's generation demand (External metric), not on a GPU pod's CPU
    # (test_orchestrator_api.py checks the metric and its target)
    assert [m["type"] for m in hpa["spec"]["metrics"]] == ["External"]
    # the autoscaler owns the replica count; the orchestrator follows it (rollout.discover)
    assert "replicas" not in by_kind(hpa_docs, "StatefulSet")["rl-specrl-rollout"]["spec"]
    keda_docs = render("--set", "rollout.keda.enabled=true", "--set", "rollout.keda.trigger=queue")
    (scaled,) = by_kind(keda_docs, "ScaledObject").values()
    assert scaled["spec"]["scaleTargetRef"]["name"] == "rl-specrl-rollout"
    (trigger,) = scaled["spec"]["triggers"]
    run = configs(keda_docs)["run.yaml"]
    streams = RunStreams(None, run["name"])  # the stream and group the generators read
    assert trigger["type"] == "redis-streams"
    assert (
        trigger["metadata"]["stream"] == streams.prompts
        and trigger["metadata"]["consumerGroup"] == GENERATORS
    )
    assert run["redis"]["url"] == f"redis://{trigger['metadata']['address']}/0"
    (auth,) = by_kind(keda_docs, "TriggerAuthentication").values()
    assert trigger["authenticationRef"]["name"] == auth["metadata"]["name"]
    assert auth["spec"]["secretTargetRef"] == [
        {"parameter": "password", "name": "rl-specrl-redis", "key": "password"}
    ]
    # the KEDA operator reads Redis itself: the Redis NetworkPolicy admits its namespace
    (keda_from,) = [
        peer["namespaceSelector"]["matchLabels"]
        for rule in by_kind(keda_docs, "NetworkPolicy")["rl-specrl-redis"]["spec"]["ingress"]
        for peer in rule["from"]
        if "namespaceSelector" in peer
    ]
    assert keda_from == {"kubernetes.io/metadata.name": "keda"}


@pytest.mark.parametrize("capacity", [0, 96])
def test_keda_scales_generation_on_demand_over_capacity(capacity):
    """The default KEDA trigger: Prometheus' sum of the sequences the run's orchestrator
    wants generated now (its own gauge, filtered to this namespace and release), over what
    one replica batches: the engine's max_num_seqs unless sequencesPerReplica says."""
    docs = render(
        *VALUES["gb200"], "--set", "rollout.keda.enabled=true",
        "--set", f"rollout.keda.sequencesPerReplica={capacity}",
    )  # fmt: skip
    (scaled,) = by_kind(docs, "ScaledObject").values()
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    demand = OrchestratorMetrics(CollectorRegistry()).generation_demand._name
    assert trigger["metadata"]["query"] == f'sum({demand}{{namespace="train",release="rl"}})'
    max_num_seqs = configs(docs)["rollout.yaml"]["engine"]["max_num_seqs"]
    assert trigger["metadata"]["threshold"] == str(capacity or max_num_seqs)
    assert not by_kind(docs, "TriggerAuthentication")  # Prometheus, not Redis
    redis_policy = by_kind(docs, "NetworkPolicy")["rl-specrl-redis"]["spec"]["ingress"]
    assert not [p for rule in redis_policy for p in rule["from"] if "namespaceSelector" in p]


def test_mutual_tls_reaches_every_grpc_peer_and_probes_speak_it():
    docs = render(
        *VALUES["cpu"],
        *("--set", "tls.enabled=true", "--set", "tls.certManager.enabled=true"),
        *("--set", "tls.certManager.issuerRef.name=specrl-ca"),
    )
    for d in docs:
        if (d["apiVersion"], d["kind"]) not in CUSTOM:
            kubernetes_validate.validate(d, KUBERNETES, strict=True)
    # one certificate per service (test_chart_security.py), every one from the same issuer
    certs = {
        c["metadata"]["labels"]["specrl.dev/certificate-of"]: c for c in by_kind(docs, "Certificate").values()
    }
    assert {c["spec"]["issuerRef"]["name"] for c in certs.values()} == {"specrl-ca"}
    for name in ("rollout", "trainer", "draft-trainer", "orchestrator", "health"):
        cert = certs["test" if name == "health" else name]
        c = containers(docs)[name]
        env = {e["name"]: e.get("value") for e in c["env"]}
        assert (
            env["SPECRL_TLS_CERT"] == "/etc/specrl/tls/tls.crt" and env["SPECRL_TLS_SERVER_NAME"] == "specrl"
        )
        assert {"name": "tls", "mountPath": "/etc/specrl/tls", "readOnly": True} in c["volumeMounts"], name
        volumes = {v["name"]: v for v in c["_pod"]["volumes"]}
        assert volumes["tls"]["secret"]["secretName"] == cert["spec"]["secretName"], name
        if name in ("rollout", "draft-trainer"):  # the kubelet's gRPC probe cannot speak TLS
            assert c["readinessProbe"]["exec"]["command"][:2] == ["specrl", "health"], name
    assert "Certificate" not in {d["kind"] for d in render(*VALUES["cpu"])}  # off by default


def test_the_trainer_as_one_gang_a_jobset_with_scheduling_hooks():
    docs = render(
        *(
            "--set",
            "trainer.workload=jobset",
            "--set",
            "trainer.nodes=2",
            "--set",
            "trainer.config.trainer.dp=2",
        ),
        *("--set", "trainer.scheduling.podGroup=true", "--set", "trainer.scheduling.kueueQueue=gpus"),
        *("--set", "trainer.scheduling.schedulerName=scheduler-plugins-scheduler"),
    )
    assert "rl-specrl-trainer" not in by_kind(docs, "StatefulSet")
    (jobset,) = by_kind(docs, "JobSet").values()
    (ranks,) = jobset["spec"]["replicatedJobs"]
    job = ranks["template"]["spec"]
    assert job["parallelism"] == job["completions"] == 2 and job["completionMode"] == "Indexed"
    # the Job inside validates strictly as a batch/v1 Job (the JobSet has no bundled schema)
    kubernetes_validate.validate(
        {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "ranks"}, "spec": job},
        KUBERNETES,
        strict=True,
    )
    pod = job["template"]
    trainer = pod["spec"]["containers"][0]
    # rank 0's pod: <jobset>-<replicated job>-<job index>-<pod index>, in the headless Service
    subdomain = jobset["spec"]["network"]["subdomain"]
    master = f"{jobset['metadata']['name']}-{ranks['name']}-0-0.{subdomain}.train.svc"
    assert subdomain in by_kind(docs, "Service") and f"--master-addr={master}" in trainer["args"]
    assert configs(docs)["trainer.yaml"]["weight_sync"]["host"] == master  # the broadcast store: rank 0
    node_rank = {e["name"]: e for e in trainer["env"]}["NODE_RANK"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert node_rank == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    selector = by_kind(docs, "Service")["rl-specrl-trainer"]["spec"]["selector"]
    assert selector["batch.kubernetes.io/job-completion-index"] == "0"  # gRPC: rank 0 only
    assert pod["spec"]["restartPolicy"] == "Never"  # a failed rank fails the gang, restarted whole
    (group,) = by_kind(docs, "PodGroup").values()
    assert group["spec"]["minMember"] == 2
    assert pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == group["metadata"]["name"]
    assert pod["spec"]["schedulerName"] == "scheduler-plugins-scheduler"
    assert jobset["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpus"


def test_a_replica_spanning_pods_is_a_leaderworkerset_group():
    """rollout.podsPerReplica: each replica a LeaderWorkerSet group, the leader serving
    gRPC (`specrl serve rollout`), the workers `specrl serve rollout-worker`, the engine
    config split over them; only leaders behind the Service the orchestrator discovers
    replicas by, and the autoscaler scales the LeaderWorkerSet."""
    docs = render(
        *VALUES["gb200"],
        *("--set", "rollout.podsPerReplica=2", "--set", "rollout.gpusPerReplica=8"),
        *("--set", "rollout.config.engine.tensor_parallel_size=8"),
        *("--set", "rollout.autoscaling.enabled=true"),
    )
    assert "rl-specrl-rollout" not in by_kind(docs, "StatefulSet")
    (lws,) = by_kind(docs, "LeaderWorkerSet").values()
    group = lws["spec"]["leaderWorkerTemplate"]
    assert group["size"] == 2 and group["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert "replicas" not in lws["spec"]  # the HPA owns it
    pods = {role: group[f"{role}Template"] for role in ("leader", "worker")}
    for role, pod in pods.items():
        # each pod template validates strictly as a Pod (the LeaderWorkerSet has no bundled schema)
        kubernetes_validate.validate(
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": role}, "spec": pod["spec"]},
            KUBERNETES,
            strict=True,
        )
        assert pod["metadata"]["labels"]["specrl.dev/rollout-role"] == role
        (c,) = pod["spec"]["containers"]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == 4  # 8 per replica over 2 pods
    leader, worker = (pods[r]["spec"]["containers"][0] for r in ("leader", "worker"))
    assert leader["args"][:2] == ["serve", "rollout"] and "startupProbe" in leader
    assert worker["args"][:2] == ["serve", "rollout-worker"] and "ports" not in worker
    engine = configs(docs)["rollout.yaml"]["engine"]
    assert engine["nnodes"] == 2 and engine["master_port"] == 29600 and "master_addr" not in engine
    RolloutServerConfig.model_validate(configs(docs)["rollout.yaml"])
    selector = by_kind(docs, "Service")["rl-specrl-rollout-headless"]["spec"]["selector"]
    assert selector["specrl.dev/rollout-role"] == "leader"
    (hpa,) = by_kind(docs, "HorizontalPodAutoscaler").values()
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "leaderworkerset.x-k8s.io/v1",
        "kind": "LeaderWorkerSet",
        "name": lws["metadata"]["name"],
    }
    bad = helm("template", "rl", str(CHART), "--set", "rollout.podsPerReplica=3",
               "--set", "rollout.config.engine.tensor_parallel_size=2")  # fmt: skip
    assert bad.returncode != 0 and "must split evenly over rollout.podsPerReplica" in bad.stderr


@pytest.mark.parametrize(("model", "gpus", "ks"), [("qwen3-8b", 64, (3,)), ("qwen3-235b-a22b", 512, (0, 3))])
def test_a_simulator_plans_helm_values_deploy_with_the_chart(tmp_path, model, gpus, ks):
    """What `specrl simulate plan` prints is a values file the chart renders (over the
    GB200 values) into services whose configs load; a 235B replica spans pods."""
    from specrl.sim.hardware import GPU_EFFICIENCY, get_hardware
    from specrl.sim.models import get_model
    from specrl.sim.planner import plan
    from specrl.sim.speculation import Speculation
    from specrl.sim.step import Workload

    chosen = plan(
        model=get_model(model),
        hw=get_hardware("gb200"),
        eff=GPU_EFFICIENCY,
        workload=Workload(
            prompts_per_step=64,
            group_size=8,
            prompt_tokens=100,
            response_mean_tokens=500,
            max_response_tokens=4096,
        ),
        gpus=gpus,
        draft=Speculation.from_acceptance_length("eagle3", 3, 3.0),
        ks=ks,
        lags=(0, 1),
    )
    path = tmp_path / "plan.yaml"
    path.write_text(chosen.helm_values())
    rendered = configs(render(*VALUES["gb200"], "-f", str(path)))
    rollout = RolloutServerConfig.model_validate(rendered["rollout.yaml"])
    TrainerServerConfig.model_validate(rendered["trainer.yaml"])
    assert rollout.engine.tensor_parallel_size == chosen.layout.gen_tp
    assert rollout.engine.nnodes == max(1, chosen.layout.gen_tp // 4)  # 4 GPUs per GB200 node
