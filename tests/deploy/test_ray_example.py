"""deploy/ray: the KubeRay RayJob for GB200 NVL72 trays, checked up to what only a real
KubeRay cluster can prove. Its run config loads as specrl's (`launcher: ray`); the
placement groups that config makes (ray_launcher.placement_plan, the launcher's own code)
fit the worker group bundle by bundle, in the order Ray places them, one tray per trainer
bundle; the pod templates are valid Kubernetes pods (strict schema) with the NVLink
fabric claimed the way the Helm chart claims it; the image the pods run is the one
images/gpu.Dockerfile builds with the Ray release the RayJob names. The RayJob and
RayCluster fields themselves follow KubeRay's API reference
(https://ray-project.github.io/kuberay/reference/api/): no schema of that CRD is
available here."""

from __future__ import annotations

import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from specrl.config import RunConfig
from specrl.orchestrator.ray_launcher import RAY_SUPPORTED, placement_plan

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "deploy" / "ray" / "rayjob-gb200-nvl72.yaml"
KUBERNETES = "1.33.0"
GPUS_PER_TRAY = 4  # a GB200 compute tray


@pytest.fixture(scope="module")
def docs() -> dict[str, dict]:
    return {d["kind"]: d for d in yaml.safe_load_all(EXAMPLE.read_text())}


def _run_config(docs: dict, tmp_path: Path) -> RunConfig:
    raw = yaml.safe_load(docs["ConfigMap"]["data"]["run.yaml"])
    assert raw["data"]["source"].endswith(".parquet")
    data = tmp_path / "dapo.parquet"  # the volume's file, which only the cluster has
    data.write_bytes(b"")
    raw["data"]["source"] = str(data)
    return RunConfig.model_validate(raw)


def _cpus(quantity: str) -> float:
    return float(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def test_the_run_config_places_every_service_on_the_worker_trays(docs, tmp_path):
    cfg = _run_config(docs, tmp_path)
    assert cfg.launcher == "ray" and cfg.ray.gpus and cfg.ray.address == "auto"
    (workers,) = docs["RayJob"]["spec"]["rayClusterSpec"]["workerGroupSpecs"]
    (container,) = workers["template"]["spec"]["containers"]
    resources = container["resources"]
    tray = {"GPU": float(resources["limits"]["nvidia.com/gpu"]), "CPU": _cpus(resources["requests"]["cpu"])}
    assert tray["GPU"] == GPUS_PER_TRAY
    assert workers["replicas"] == workers["minReplicas"] == workers["maxReplicas"]
    needs, strategy = placement_plan(cfg)
    # a trainer bundle is a whole tray: its ranks' collectives stay on one node's NVLink
    t = cfg.trainer.server.trainer
    assert cfg.ray.trainer_procs_per_node == GPUS_PER_TRAY and needs["trainer"][0]["GPU"] == GPUS_PER_TRAY
    assert len(needs["trainer"]) == t.tp * t.dp // GPUS_PER_TRAY
    assert len([n for n in needs if n.startswith("rollout-")]) == cfg.rollout.replicas
    # first fit, group by group in the order the launcher creates them (the trainer's
    # first), each group's bundles on the trays: every bundle must find room
    free = [dict(tray) for _ in range(workers["replicas"])]
    for name, bundles in needs.items():
        for b in bundles:
            node = next((f for f in free if all(f.get(r, 0) >= v for r, v in b.items())), None)
            assert node is not None, f"no tray has room for {name}'s bundle {b}: {free}"
            for r, v in b.items():
                node[r] -= v
        assert strategy[name] in {"PACK", "STRICT_PACK"}
    # and no tray is left idle: the worker group is the size the run needs
    assert all(f["GPU"] < GPUS_PER_TRAY for f in free), free


def test_the_driver_runs_on_the_head_with_the_config_redis_and_volumes(docs):
    spec = docs["RayJob"]["spec"]
    head = spec["rayClusterSpec"]["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"  # no actor lands on the head
    pod = head["template"]["spec"]
    mounts = {m["mountPath"]: m["name"] for c in pod["containers"] for m in c.get("volumeMounts", [])}
    config_path = re.fullmatch(r"specrl run --config (\S+)", spec["entrypoint"]).group(1)
    assert mounts[str(Path(config_path).parent)] == "run-config"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["run-config"]["configMap"]["name"] == docs["ConfigMap"]["metadata"]["name"]
    raw = yaml.safe_load(docs["ConfigMap"]["data"]["run.yaml"])
    assert raw["output_dir"].startswith("/runs/") and mounts["/runs"] == "runs"
    # the workers' trainer writes the checkpoints the driver resumes from: one shared volume
    (workers,) = spec["rayClusterSpec"]["workerGroupSpecs"]
    worker_volumes = {v["name"]: v for v in workers["template"]["spec"]["volumes"]}
    claim = volumes["runs"]["persistentVolumeClaim"]["claimName"]
    assert worker_volumes["runs"]["persistentVolumeClaim"]["claimName"] == claim
    # Redis: the head's own container, on loopback, its append-only file on the runs volume
    redis = next(c for c in pod["containers"] if c["name"] == "redis")
    port = re.fullmatch(r"redis://127\.0\.0\.1:(\d+)/0", raw["redis"]["url"]).group(1)
    assert redis["args"][redis["args"].index("--port") + 1] == port and "--appendonly" in redis["args"]
    assert any(m["name"] == "runs" for m in redis["volumeMounts"])


def test_the_pods_are_valid_and_claim_the_nvlink_fabric(docs):
    cluster = docs["RayJob"]["spec"]["rayClusterSpec"]
    (workers,) = cluster["workerGroupSpecs"]
    for where, template in (("head", cluster["headGroupSpec"]["template"]), ("workers", workers["template"])):
        kubernetes_validate.validate(
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": where}, "spec": template["spec"]},
            KUBERNETES,
            strict=True,
        )
    domain = docs["ComputeDomain"]
    assert domain["spec"]["numNodes"] == workers["replicas"]
    pod = workers["template"]["spec"]
    (claim,) = pod["resourceClaims"]
    assert claim["resourceClaimTemplateName"] == domain["spec"]["channel"]["resourceClaimTemplate"]["name"]
    (container,) = pod["containers"]
    assert {"name": claim["name"]} in container["resources"]["claims"]
    env = {e["name"]: e["value"] for e in container["env"]}
    assert env["NCCL_MNNVL_ENABLE"] == env["NCCL_CUMEM_ENABLE"] == "1"  # as the chart's GB200 values


def test_the_image_carries_the_ray_release_the_rayjob_names(docs):
    cluster = docs["RayJob"]["spec"]["rayClusterSpec"]
    dockerfile = (ROOT / "images" / "gpu.Dockerfile").read_text()
    (pinned,) = re.findall(r"^ARG RAY_VERSION=(\S+)$", dockerfile, flags=re.M)
    assert cluster["rayVersion"] == pinned
    (workers,) = cluster["workerGroupSpecs"]
    images = {c["image"] for t in (cluster["headGroupSpec"]["template"], workers["template"])
              for c in t["spec"]["containers"] if c["name"].startswith("ray-")}  # fmt: skip
    assert images == {"ghcr.io/specrl/specrl-ray:0.1.0"}
    low, high = RAY_SUPPORTED  # a release the launcher accepts
    assert low <= tuple(int(part) for part in pinned.split(".")[:2]) < high
