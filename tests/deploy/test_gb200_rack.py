"""GB200 NVL72 readiness of the Helm chart (issue 30), on the rendered manifests (real
helm, offline): every pod of every NCCL group claims the IMEX channel of the release's
one ComputeDomain; every cache the engines write points at a writable volume under the
read-only root filesystem; rollout pods pack onto whole nodes and the roles have
priorities; a change to one service's config restarts only that service, the
orchestrator Job survives `helm upgrade` and a chart bump rolls nothing; a finished run
gives its GPUs back. What only a cluster can prove (MNNVL, scheduling) is cited in
deploy/README.md; the scale-down script runs here for real against a fake API server."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import kubernetes_validate
import pytest
import yaml
from kube_api_fake import reply_json
from test_helm_chart import CHART, CUSTOM, KUBERNETES, VALUES, by_kind, helm, render

GB200 = VALUES["gb200"]
# every rollout replica spanning two pods: a LeaderWorkerSet with leader and worker templates
LWS = (
    *GB200,
    *("--set", "rollout.podsPerReplica=2", "--set", "rollout.gpusPerReplica=8"),
    *("--set", "rollout.config.engine.tensor_parallel_size=8", "--set", "rollout.replicas=6"),
)
JOBSET = (*GB200, "--set", "trainer.workload=jobset")
NCCL = {"trainer", "rollout", "draft-trainer"}  # the policy and draft broadcast groups' pods
CACHES = (
    "XDG_CACHE_HOME",
    "XDG_CONFIG_HOME",
    "TRITON_CACHE_DIR",
    "TRITON_HOME",
    "TORCHINDUCTOR_CACHE_DIR",
    "TORCH_EXTENSIONS_DIR",
    "TORCH_HOME",
    "CUDA_CACHE_PATH",
    "VLLM_CACHE_ROOT",
    "VLLM_CONFIG_ROOT",
    "HF_HOME",
)


def pod_templates(docs: list[dict]) -> dict[str, dict]:
    """Every pod template of every workload (and the test pod), by
    `<kind>/<name>[/<role>]`."""
    out = {}
    for d in docs:
        kind, name = d["kind"], d["metadata"]["name"]
        if kind in ("StatefulSet", "Job"):
            out[f"{kind}/{name}"] = d["spec"]["template"]
        elif kind == "Pod":
            out[f"Pod/{name}"] = d
        elif kind == "LeaderWorkerSet":
            group = d["spec"]["leaderWorkerTemplate"]
            for role in ("leader", "worker"):
                out[f"{kind}/{name}/{role}"] = group[f"{role}Template"]
        elif kind == "JobSet":
            for job in d["spec"]["replicatedJobs"]:
                out[f"{kind}/{name}/{job['name']}"] = job["template"]["spec"]["template"]
    return out


def component(pod: dict) -> str:
    return pod["metadata"]["labels"].get("app.kubernetes.io/component", "")


# 1. Weight sync over multi-node NVLink ------------------------------------------------


@pytest.mark.parametrize("args", [GB200, LWS, JOBSET], ids=["gb200", "lws-rollout", "jobset-trainer"])
def test_every_nccl_pod_claims_the_channel_of_the_releases_one_compute_domain(args):
    docs = render(*args)
    (domain,) = by_kind(docs, "ComputeDomain").values()  # one per release: no overlapping domains
    channel = domain["spec"]["channel"]["resourceClaimTemplate"]["name"]
    # the driver's controller makes the channel's ResourceClaimTemplate: the chart makes none
    assert not by_kind(docs, "ResourceClaimTemplate")
    pods = pod_templates(docs)
    seen = set()
    for where, pod in pods.items():
        spec = pod["spec"]
        if component(pod) not in NCCL:
            assert "resourceClaims" not in spec, where  # orchestrator, Redis, helm test: no fabric
            continue
        seen.add(component(pod))
        claims = {c["name"]: c["resourceClaimTemplateName"] for c in spec.get("resourceClaims", [])}
        assert channel in claims.values(), f"{where} claims no IMEX channel of {domain['metadata']['name']}"
        (claim,) = [n for n, t in claims.items() if t == channel]
        for c in spec["containers"]:  # each container that runs NCCL names the claim
            assert {"name": claim} in c["resources"].get("claims", []), (where, c["name"])
        # every member of the groups inside one NVLink clique (one rack's fabric)
        terms = spec["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        clique = [t for t in terms if t["topologyKey"] == "nvidia.com/gpu.clique"]
        assert any(
            {"key": "app.kubernetes.io/component", "operator": "In", "values": sorted(NCCL)}
            in t["labelSelector"].get("matchExpressions", [])
            for t in clique
        ), where
        kubernetes_validate.validate(
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec},
            KUBERNETES,
            strict=True,
        )
    assert seen == NCCL
    if args is GB200:  # 4 training nodes + 48 one-GPU replicas packed 4 a node + the draft-trainer's
        assert domain["spec"]["numNodes"] == 4 + 12 + 1
    roles = {w.rsplit("/", 1)[-1] for w in pods if w.startswith("LeaderWorkerSet/")}
    assert args is not LWS or roles == {"leader", "worker"}


def test_without_a_compute_domain_no_pod_claims_one():
    docs = render(*GB200, "--set", "nvlink.computeDomain.enabled=false")
    assert not by_kind(docs, "ComputeDomain")
    assert all("resourceClaims" not in p["spec"] for p in pod_templates(docs).values())


# 2. Writable caches under readOnlyRootFilesystem ---------------------------------------


@pytest.mark.parametrize("args", [(), VALUES["cpu"], GB200, LWS], ids=["default", "cpu", "gb200", "lws"])
def test_every_cache_the_engines_write_is_on_a_writable_volume(args):
    docs = render(*args)
    checked = 0
    for where, pod in pod_templates(docs).items():
        if component(pod) == "redis":
            continue  # not a specrl container: Redis writes only its data volume
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        for c in pod["spec"]["containers"]:
            if not c["securityContext"].get("readOnlyRootFilesystem"):
                continue
            env = {e["name"]: e.get("value") for e in c.get("env", [])}
            writable = [
                m["mountPath"]
                for m in c["volumeMounts"]
                if not m.get("readOnly") and "emptyDir" in volumes[m["name"]]
            ]
            for var in CACHES:
                path = env.get(var)
                assert path, f"{where}/{c['name']}: {var} unset (it defaults under the read-only $HOME)"
                assert any(path == m or path.startswith(m.rstrip("/") + "/") for m in writable), (
                    where,
                    c["name"],
                    var,
                    path,
                    writable,
                )
            checked += 1
    assert checked >= 4


# 3. Scheduling on a rack ------------------------------------------------------------


def test_rollout_pods_pack_onto_whole_nodes_and_roles_have_priorities():
    docs = render(*GB200, "--set", "priorityClasses.create=true")
    pods = {component(p): p for p in pod_templates(docs).values()}
    rollout = pods["rollout"]["spec"]
    (pack,) = rollout["affinity"]["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    term = pack["podAffinityTerm"]
    assert term["topologyKey"] == "kubernetes.io/hostname" and pack["weight"] == 100
    assert term["labelSelector"]["matchLabels"] == {
        "app.kubernetes.io/name": "specrl",
        "app.kubernetes.io/instance": "rl",
        "app.kubernetes.io/component": "rollout",
    }
    classes = {d["metadata"]["name"]: d for d in docs if d["kind"] == "PriorityClass"}
    for d in classes.values():
        kubernetes_validate.validate(d, KUBERNETES, strict=True)
    value = {
        c: classes[pods[c]["spec"]["priorityClassName"]]["value"] for c in NCCL | {"orchestrator", "redis"}
    }
    assert (
        value["trainer"]
        == value["draft-trainer"]
        > value["orchestrator"]
        == value["redis"]
        > value["rollout"]
    )
    assert all(not c["globalDefault"] for c in classes.values())
    assert classes[pods["rollout"]["spec"]["priorityClassName"]]["preemptionPolicy"] == "Never"
    # the names are the user's, the objects optional (cluster-scoped: often an admin's)
    named = render(*GB200, "--set", "priorityClasses.trainer.name=ours-high")
    assert not [d for d in named if d["kind"] == "PriorityClass"]
    trainer = {component(p): p for p in pod_templates(named).values()}["trainer"]
    assert trainer["spec"]["priorityClassName"] == "ours-high"


def test_the_trainer_can_be_gang_scheduled_and_queued_by_kueue():
    docs = render(
        *JOBSET,
        *("--set", "trainer.scheduling.podGroup=true", "--set", "trainer.scheduling.kueueQueue=rack"),
        *("--set", "trainer.scheduling.schedulerName=scheduler-plugins-scheduler"),
    )
    (jobset,) = by_kind(docs, "JobSet").values()
    assert jobset["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "rack"
    pod = pod_templates(docs)["JobSet/rl-specrl-trainer/ranks"]
    (group,) = by_kind(docs, "PodGroup").values()
    assert group["spec"]["minMember"] == 4
    assert pod["metadata"]["labels"]["scheduling.x-k8s.io/pod-group"] == group["metadata"]["name"]
    assert pod["spec"]["schedulerName"] == "scheduler-plugins-scheduler"


# 4. Upgrades ------------------------------------------------------------------------


def _templates_by_component(docs: list[dict]) -> dict[str, dict]:
    return {component(p): p for w, p in pod_templates(docs).items() if not w.startswith("Pod/")}


def _changed(a: list[dict], b: list[dict]) -> set[str]:
    ta, tb = _templates_by_component(a), _templates_by_component(b)
    assert ta.keys() == tb.keys()
    return {c for c in ta if ta[c] != tb[c]}


def _job_name(docs: list[dict]) -> str:
    (name,) = by_kind(docs, "Job")
    return name


@pytest.mark.parametrize(
    ("change", "restarted"),
    [
        ("rollout.config.speculation.num_speculative_tokens=4", {"rollout"}),  # the draft length
        ("trainer.config.trainer.micro_batch_size=2", {"trainer"}),
        ("draftTrainer.config.publish_every=2", {"draft-trainer"}),
        ("orchestrator.config.orchestrator.steps=300", {"orchestrator"}),
    ],
)
def test_a_change_to_one_services_config_restarts_only_that_service(change, restarted):
    base = render(*GB200)
    changed = render(*GB200, "--set", change)
    assert _changed(base, changed) == restarted
    assert _changed(base, render(*GB200)) == set()  # rendering is deterministic


def test_the_orchestrator_job_survives_an_upgrade_that_changes_its_pod_template():
    base, same = render(*GB200), render(*GB200)
    changed = render(*GB200, "--set", "orchestrator.config.orchestrator.steps=300")
    # the pod template of a Job is immutable: a changed one is a new Job (which resumes the
    # run with --continue), an unchanged one the same Job (a running run is left alone)
    assert _job_name(base) == _job_name(same)
    assert _job_name(base) != _job_name(changed)
    assert _job_name(base).startswith("rl-specrl-orchestrator-") and len(_job_name(base)) <= 63
    long = render(*GB200, "--set", "fullnameOverride=" + "x" * 63)
    assert len(_job_name(long)) <= 63


def test_a_chart_version_bump_rolls_no_pod(tmp_path):
    bumped = tmp_path / "specrl"
    shutil.copytree(CHART, bumped)
    chart = yaml.safe_load((bumped / "Chart.yaml").read_text())
    chart["version"] = "9.9.9"
    (bumped / "Chart.yaml").write_text(yaml.safe_dump(chart))
    for args in (GB200, LWS, JOBSET):
        base = render(*args)
        out = helm("template", "rl", str(bumped), "--namespace", "train", *args)
        assert out.returncode == 0, out.stderr
        after = [d for d in yaml.safe_load_all(out.stdout) if d]
        assert _changed(base, after) == set()
        assert _job_name(base) == _job_name(after)
        for where, pod in pod_templates(after).items():
            if where.startswith("Pod/"):  # not a workload: helm test's pod
                continue
            meta = json.dumps(pod["metadata"])
            assert "9.9.9" not in meta and "helm.sh/chart" not in meta, where


# 5. A finished run gives its GPUs back -----------------------------------------------


def _release_parts(docs: list[dict]) -> tuple[dict, dict, dict]:
    (job,) = by_kind(docs, "Job").values()
    pod = job["spec"]["template"]
    containers = {c["name"]: c for c in pod["spec"]["containers"]}
    return job, pod, containers


@pytest.mark.parametrize("args", [(), GB200, LWS, JOBSET], ids=["default", "gb200", "lws", "jobset"])
def test_a_finished_run_scales_its_gpu_workloads_to_zero(args):
    docs = render(*args)
    for d in docs:
        if (d["apiVersion"], d["kind"]) not in CUSTOM:
            kubernetes_validate.validate(d, KUBERNETES, strict=True)
    _, pod, containers = _release_parts(docs)
    # the run itself is unchanged: the image's `specrl` entry point, the Job's own args
    run = containers["orchestrator"]
    assert "command" not in run and run["args"] == ["run", "--config", "/etc/specrl/run.yaml", "--continue"]
    release = containers["release"]
    assert pod["spec"]["automountServiceAccountToken"] is False  # the pod mounts no token by itself
    sa_dir = "/var/run/secrets/kubernetes.io/serviceaccount"
    token = [m for m in release["volumeMounts"] if m["mountPath"] == sa_dir]
    assert token and token[0]["readOnly"]
    account = pod["spec"]["serviceAccountName"]
    assert account in by_kind(docs, "ServiceAccount") and account != "rl-specrl"
    (role,) = by_kind(docs, "Role").values()
    assert role["metadata"]["name"] == "rl-specrl-orchestrator"
    (binding,) = by_kind(docs, "RoleBinding").values()
    rbac = "rbac.authorization.k8s.io"
    assert binding["roleRef"] == {"apiGroup": rbac, "kind": "Role", "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account, "namespace": "train"}]
    rules = {(g, r): rule for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    # its own pod (to read the run's exit code), and patch on exactly this release's workloads
    assert rules[("", "pods")]["verbs"] == ["get"]
    targets = json.loads({e["name"]: e.get("value") for e in release["env"]}["SPECRL_RELEASE_TARGETS"])
    for t in targets:
        rule = rules[(t["group"], t["resource"])]
        assert rule["verbs"] == ["patch"] and t["name"] in rule["resourceNames"], t
    kinds = {(t["resource"], t["name"]) for t in targets}
    rollout = "leaderworkersets/scale" if args is LWS else "statefulsets/scale"
    trainer = "jobsets" if args is JOBSET else "statefulsets/scale"
    assert (rollout, "rl-specrl-rollout") in kinds and (trainer, "rl-specrl-trainer") in kinds
    assert ("statefulsets/scale", "rl-specrl-draft-trainer") in kinds or args == ()
    # besides the release step's: the orchestrator's EndpointSlice watch (discovery, by
    # default; test_orchestrator_api.py goes through every combination)
    assert rules[("discovery.k8s.io", "endpointslices")]["verbs"] == ["list", "watch"]
    verbs = {v for rule in role["rules"] for v in rule["verbs"]}
    assert verbs == {"get", "patch", "list", "watch"}  # nothing to create or delete
    assert [m["name"] for m in run["volumeMounts"] if m["mountPath"] == sa_dir] == ["kube-api-access"]
    # kept on request: no release container, no rule of its own
    kept = render(*args, "--set", "orchestrator.releaseOnCompletion=false")
    _, _, kept_containers = _release_parts(kept)
    assert set(kept_containers) == {"orchestrator"}
    (kept_role,) = by_kind(kept, "Role").values()
    assert [(r["apiGroups"], r["resources"]) for r in kept_role["rules"]] == [
        (["discovery.k8s.io"], ["endpointslices"])
    ]
    # and with DNS discovery the orchestrator calls no API: no Role, no token
    dns = render(
        *args, "--set", "orchestrator.releaseOnCompletion=false", "--set", "orchestrator.discovery=dns"
    )
    _, _, dns_containers = _release_parts(dns)
    assert not by_kind(dns, "Role")
    assert not any(
        m["mountPath"].startswith("/var/run/secrets") for m in dns_containers["orchestrator"]["volumeMounts"]
    )


class _FakeApi(BaseHTTPRequestHandler):
    """The Kubernetes API as the release container sees it: its own pod, and the
    PATCHes it sends (recorded)."""

    exit_code: int | None = None
    patches: ClassVar[list] = []

    def log_message(self, *args):  # quiet
        pass

    def do_GET(self):
        assert self.headers["Authorization"] == "Bearer t0ken"
        state = {"running": {}} if self.exit_code is None else {"terminated": {"exitCode": self.exit_code}}
        body = {"status": {"containerStatuses": [{"name": "orchestrator", "state": state}]}}
        self._reply(200, body)

    def do_PATCH(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).patches.append((self.path, self.headers["Content-Type"], body))
        self._reply(200, {})

    def _reply(self, code, body):
        reply_json(self, code, body)


@pytest.mark.parametrize("exit_code", [0, 75, 1])
def test_the_release_step_scales_down_only_after_a_successful_run(tmp_path, exit_code):
    """The release container's script, from the rendered ConfigMap, against a fake API
    server: after exit 0 it patches every workload to zero; after a failure it patches
    nothing (the state stays for inspection, the Job retries) and never exits non-zero
    itself (the pod's failure is the run's)."""
    docs = render(*JOBSET)
    _, pod, containers = _release_parts(docs)
    release = containers["release"]
    (script_volume,) = [v for v in pod["spec"]["volumes"] if v["name"] == "release"]
    script = by_kind(docs, "ConfigMap")[script_volume["configMap"]["name"]]["data"]["release.py"]
    (tmp_path / "release.py").write_text(script)
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("t0ken")
    (sa / "namespace").write_text("train")
    _FakeApi.exit_code, _FakeApi.patches = exit_code, []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _FakeApi)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = {e["name"]: e["value"] for e in release["env"] if "value" in e}
    env.update(
        POD_NAME="rl-specrl-orchestrator-abc-xyz",
        SPECRL_KUBE_API=f"http://127.0.0.1:{server.server_port}",
        SPECRL_KUBE_SA_DIR=str(sa),
        SPECRL_RELEASE_POLL_SECONDS="0.05",
        PATH=os.environ["PATH"],
    )
    assert release["command"][-1] == "/etc/specrl/release/release.py"
    try:
        out = subprocess.run(
            [sys.executable, str(tmp_path / "release.py")],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
    finally:
        server.shutdown()
    assert out.returncode == 0, out.stderr
    paths = {p for p, _, _ in _FakeApi.patches}
    if exit_code:
        assert _FakeApi.patches == [], _FakeApi.patches
        assert "not releasing" in out.stderr
        return
    base = "/apis/{}/namespaces/train/{}"
    assert paths == {
        base.format("apps/v1", "statefulsets/rl-specrl-rollout/scale"),
        base.format("apps/v1", "statefulsets/rl-specrl-draft-trainer/scale"),
        base.format("jobset.x-k8s.io/v1alpha2", "jobsets/rl-specrl-trainer"),
    }
    for path, ctype, body in _FakeApi.patches:
        assert ctype == "application/merge-patch+json"
        assert body == ({"spec": {"suspend": True}} if "jobsets" in path else {"spec": {"replicas": 0}})
