"""Values the chart refuses (issue 30, GB200 NVL72 readiness): each was accepted before
and broken on the rack. A small user values file over the GB200 (or default) values is
rendered by the real helm, which must fail with a message naming the value: the schema
(values.schema.json) for what JSON schema can say, templates/_validate.tpl for the
rules across values. The chart also declares the oldest Kubernetes it renders for, and
every manifest validates against that release's schemas."""

from __future__ import annotations

import re

import kubernetes_validate
import pytest
import yaml
from test_helm_chart import CHART, CUSTOM, VALUES, helm, render

# values file text -> (base values, a piece of helm's message that names the value)
REFUSED = {
    # a GB200 node has 4 GPUs: 8 per trainer pod never schedules (the pods stay Pending)
    "more GPUs per pod than a node has": (
        "gb200",
        "trainer: {nodes: 2, procsPerNode: 8, gpusPerNode: 8}",
        "trainer.gpusPerNode (8) is more than gpu.perNode (4)",
    ),
    "a rollout pod with more GPUs than a node has": (
        "gb200",
        "rollout: {gpusPerReplica: 8, config: {engine: {tensor_parallel_size: 8}}}",
        "rollout.gpusPerReplica / rollout.podsPerReplica (8 GPUs per pod) is more than gpu.perNode (4)",
    ),
    "a draft-trainer with more GPUs than a node has": (
        "gb200",
        "draftTrainer: {gpus: 6}",
        "draftTrainer.gpus (6) is more than gpu.perNode (4)",
    ),
    # two ranks on one GPU: NCCL stops with "Duplicate GPU detected"
    "ranks per pod other than its GPUs": (
        "gb200",
        "trainer: {nodes: 2, procsPerNode: 8}",
        "trainer.procsPerNode (8) must equal trainer.gpusPerNode (4)",
    ),
    # NCCL weight sync (and IMEX channels, RDMA devices) on a pod without a GPU
    "no GPU where the trainer asks for NCCL": (
        "default",
        "trainer: {config: {weight_sync: {backend: nccl}}}",
        "trainer.gpusPerNode is 0 but trainer.config.weight_sync.backend is nccl",
    ),
    "no GPU where the trainer claims a ComputeDomain": (
        "gb200",
        "trainer: {gpusPerNode: 0, config: {weight_sync: {backend: gloo}}}",
        "trainer.gpusPerNode is 0 but nvlink.computeDomain.enabled",
    ),
    "an unparseable shm size": ("gb200", "shm: {sizeLimit: 64 GB}", "shm.sizeLimit"),
    "an unparseable memory limit": (
        "gb200",
        "trainer: {resources: {limits: {memory: 900 GiB}}}",
        "trainer.resources.limits.memory",
    ),
    "an unparseable volume size": ("default", "runs: {size: 2TB of disk}", "runs.size"),
    "an empty clique label": ("gb200", 'nvlink: {cliqueLabel: ""}', "nvlink.cliqueLabel"),
    # a tensor-parallel group straddling two pods over the network instead of NVLink
    "a tensor-parallel group straddling pods": (
        "default",
        "trainer: {nodes: 2, procsPerNode: 3, config: {trainer: {tp: 2, dp: 3}}}",
        "trainer.config.trainer.tp (2) must divide trainer.procsPerNode (3)",
    ),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_value_broken_on_the_rack_is_refused_with_its_name(tmp_path, case):
    base, text, message = REFUSED[case]
    user = tmp_path / "user.yaml"
    user.write_text(text + "\n")
    out = helm("template", "rl", str(CHART), *VALUES[base], "-f", str(user))
    assert out.returncode != 0, f"{case}: accepted"
    assert message in out.stderr, out.stderr


def test_the_values_files_and_a_whole_trainer_over_nodes_still_render(tmp_path):
    for args in VALUES.values():
        render(*args)
    user = tmp_path / "user.yaml"  # TP over whole nodes (MNNVL inside the rack) is fine
    user.write_text("trainer: {nodes: 4, procsPerNode: 4, config: {trainer: {tp: 8, dp: 2}}}\n")
    render(*VALUES["gb200"], "-f", str(user))


def _oldest_kubernetes() -> str:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    found = re.fullmatch(r">=\s*(\d+\.\d+\.\d+)(-0)?", chart.get("kubeVersion", ""))
    assert found, chart.get("kubeVersion")
    return found.group(1)


def test_the_chart_declares_the_kubernetes_its_dra_claims_need():
    """ComputeDomain IMEX channels are DRA claims (pod resourceClaims with
    resourceClaimTemplateName, resource.k8s.io/v1beta1 made by NVIDIA's driver), which
    the NVIDIA DRA driver supports from Kubernetes 1.32: older clusters are refused."""
    assert tuple(int(x) for x in _oldest_kubernetes().split(".")) >= (1, 32, 0)
    out = helm("template", "rl", str(CHART), *VALUES["gb200"], "--kube-version", "1.31.4")
    assert out.returncode != 0 and "kubeVersion" in out.stderr, out.stderr


@pytest.mark.parametrize("name", list(VALUES))
def test_every_manifest_validates_against_the_oldest_kubernetes_declared(name):
    oldest = _oldest_kubernetes()
    for d in render(*VALUES[name], "--kube-version", oldest):
        if (d["apiVersion"], d["kind"]) not in CUSTOM:
            kubernetes_validate.validate(d, oldest, strict=True)


def test_refusals_live_in_one_template_rendering_nothing():
    validate = (CHART / "templates" / "validate.yaml").read_text()
    assert 'include "specrl.validate"' in validate
    out = helm("template", "rl", str(CHART), "--show-only", "templates/validate.yaml")
    assert out.returncode != 0 and "could not find template" in out.stderr  # renders nothing
    assert (CHART / "templates" / "_validate.tpl").exists()
