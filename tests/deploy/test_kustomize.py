"""deploy/kustomize: base and overlays build with the real kustomize (kubectl v1.33),
each deploys exactly what the chart renders with the matching values file, every
manifest validates strictly, and the committed files are what `make kustomize` makes."""

from __future__ import annotations

import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from test_helm_chart import CUSTOM, KUBERNETES

from deploygen import kustomize

from helpers import tool

KUSTOMIZE = kustomize.OUT


def build(target: Path) -> list[dict]:
    kubectl = tool("kubectl", installs="`make setup` puts it in .tools/bin")
    out = subprocess.run([kubectl, "kustomize", str(target)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _without_namespace(docs: list[dict]) -> dict:
    """By resource; kustomize writes the namespace into each, helm leaves it to the
    install."""
    out = {}
    for d in docs:
        d["metadata"].pop("namespace", None)
        out[kustomize.key(d)] = d
    return out


def test_the_committed_files_are_what_make_kustomize_generates():
    generated = kustomize.files()
    committed = {str(p.relative_to(KUSTOMIZE)): p.read_text() for p in KUSTOMIZE.rglob("*.yaml")}
    assert committed == generated, "deploy/kustomize is stale: run `make kustomize`"


@pytest.mark.parametrize("overlay", [None, *kustomize.OVERLAYS], ids=lambda o: o or "base")
def test_each_kustomization_deploys_what_the_chart_renders(overlay):
    target = KUSTOMIZE / ("base" if overlay is None else f"overlays/{overlay}")
    docs = build(target)
    assert all(d["metadata"]["namespace"] == kustomize.NAMESPACE for d in docs)
    for d in docs:
        if (d["apiVersion"], d["kind"]) not in CUSTOM:
            kubernetes_validate.validate(d, KUBERNETES, strict=True)
    chart = kustomize.render(kustomize.OVERLAYS.get(overlay))
    assert _without_namespace(docs) == _without_namespace(chart)


def test_the_kustomize_orchestrator_watches_endpointslices_with_its_own_role():
    """The chart's default (orchestrator.discovery endpointslices): the kustomize base
    carries the same ServiceAccount, Role and token mount as a Helm release."""
    docs = build(KUSTOMIZE / "base")
    kinds = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    config = yaml.safe_load(kinds[("ConfigMap", "specrl-config")]["data"]["run.yaml"])
    assert config["rollout"]["discover"] == "k8s:specrl/specrl-rollout-headless:50051"
    role = kinds[("Role", "specrl-orchestrator")]
    assert {
        "apiGroups": ["discovery.k8s.io"],
        "resources": ["endpointslices"],
        "verbs": ["list", "watch"],
    } in role["rules"]
    binding = kinds[("RoleBinding", "specrl-orchestrator")]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "specrl-orchestrator", "namespace": "specrl"}
    ]
    (job,) = [d for d in docs if d["kind"] == "Job"]
    pod = job["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "specrl-orchestrator"
    (orchestrator,) = [c for c in pod["containers"] if c["name"] == "orchestrator"]
    sa_dir = "/var/run/secrets/kubernetes.io/serviceaccount"
    assert any(m["mountPath"] == sa_dir for m in orchestrator["volumeMounts"])
