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
