"""The Helm chart's values schema (deploy/helm/specrl/values.schema.json), generated.

Each component's `config` in the chart's values is that service's own config file, so
its schema is the JSON schema of the service's pydantic model: a misspelled or
out-of-range field fails `helm install` with the field's name, long before a pod starts
and refuses it. The rest (replicas, ports, GPUs, volumes) is described here. `make
chart-schema` rewrites the file; a test fails when the committed one is stale.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from specrl.config import (
    AutoscaleConfig,
    DraftTrainerServerConfig,
    RolloutServerConfig,
    RunConfig,
    TrainerServerConfig,
)

SCHEMA_PATH = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "specrl" / "values.schema.json"
# RunConfig fields the orchestrator's `config` holds; the chart sets the rest (services'
# addresses, Redis, the run directory).
LOOP_FIELDS = ("name", "seed", "data", "sampling", "reward", "orchestrator")

STRING = {"type": "string"}
BOOL = {"type": "boolean"}
OBJECT = {"type": "object"}
PORT = {"type": "integer", "minimum": 1, "maximum": 65535}
COUNT = {"type": "integer", "minimum": 0}
POSITIVE = {"type": "integer", "minimum": 1}
NAME = {"type": "string", "minLength": 1}
# A Kubernetes resource quantity (8Gi, 500m, 1.5, 2e3): an unparseable one ("64 GB") is
# refused here rather than by the API server after the release half-installed.
QUANTITY_PATTERN = r"^[+]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([KMGTPE]i|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
QUANTITY = {"type": "string", "pattern": QUANTITY_PATTERN}
# A quantity in a resources map, where YAML numbers (cpu: 2, nvidia.com/gpu: 1) are usual
RESOURCE_AMOUNT = {"type": ["string", "number"], "pattern": QUANTITY_PATTERN}
RESOURCE_MAP = {"type": "object", "additionalProperties": RESOURCE_AMOUNT}
RESOURCES = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"requests": RESOURCE_MAP, "limits": RESOURCE_MAP, "claims": {"type": "array"}},
}
# A Kubernetes label key: an optional DNS-subdomain prefix and a name (nvidia.com/gpu.clique)
LABEL_KEY = {
    "type": "string",
    "pattern": r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$",
    "maxLength": 316,
}
LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
IMAGE = {
    "type": "object",
    "additionalProperties": False,
    "properties": {"repository": NAME, "tag": STRING, "pullPolicy": STRING},
}


def _strict(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "additionalProperties": False, "properties": properties}
    if required:
        out["required"] = list(required)
    return out


def _one_member_unions(node: Any) -> Any:
    """A tagged union with one member (the engine union while vLLM is the only engine) as
    that member: as a oneOf, helm adds a line about the oneOf to the error naming the
    bad field."""
    if isinstance(node, list):
        return [_one_member_unions(v) for v in node]
    if not isinstance(node, dict):
        return node
    out = {k: _one_member_unions(v) for k, v in node.items()}
    if len(out.get("oneOf", ())) == 1:
        (member,) = out.pop("oneOf")
        out.pop("discriminator", None)
        out.update(member)
    return out


def _model(cls: type[BaseModel], defs: dict[str, Any], only: tuple[str, ...] = ()) -> dict[str, Any]:
    """`cls`'s JSON schema with its definitions moved into `defs` (the document's root
    $defs, where its `$ref`s point); `only` keeps those top-level fields."""
    schema = _one_member_unions(cls.model_json_schema(mode="validation"))
    defs.update(schema.pop("$defs", {}))
    if only:
        schema["properties"] = {k: v for k, v in schema["properties"].items() if k in only}
    schema.pop("required", None)  # the chart fills what it sets itself
    return schema


# rollout.orchestratorScaling: the orchestrator's own scaler (run.yaml's rollout.autoscale,
# AutoscaleConfig), each value under its camelCase name with the model's bounds; the chart
# sets `workload` and `namespace` itself.
SCALING_FIELDS = (
    "min_replicas",
    "max_replicas",
    "target_exposed_share",
    "tolerance",
    "window_steps",
    "max_factor",
)
_BOUNDS = ("type", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def _camel(name: str) -> str:
    first, *rest = name.split("_")
    return first + "".join(part.title() for part in rest)


def _orchestrator_scaling() -> dict[str, Any]:
    fields = AutoscaleConfig.model_json_schema(mode="validation")["properties"]
    bounds = {_camel(f): {k: v for k, v in fields[f].items() if k in _BOUNDS} for f in SCALING_FIELDS}
    return _strict({"enabled": BOOL, **bounds})


def _component(config: dict[str, Any], **extra: dict[str, Any]) -> dict[str, Any]:
    return _strict({"image": IMAGE, "resources": RESOURCES, "affinity": OBJECT, "config": config, **extra})


def values_schema() -> dict[str, Any]:
    defs: dict[str, Any] = {}
    rollout = _component(
        _model(RolloutServerConfig, defs),
        replicas=COUNT,
        gpusPerReplica=COUNT,
        podsPerReplica={"type": "integer", "minimum": 1},
        port=PORT,
        metricsPort=PORT,
        enginePort=PORT,
        startupSeconds={"type": "integer", "minimum": 10},
        packNodes=BOOL,
        podDisruptionBudget=_strict({"enabled": BOOL, "maxUnavailable": {"type": ["integer", "string"]}}),
        # the HPA's target per replica is the demand scalers' capacity (keda.sequencesPerReplica)
        autoscaling=_strict({"enabled": BOOL, "minReplicas": POSITIVE, "maxReplicas": POSITIVE}),
        keda=_strict(
            {
                "enabled": BOOL,
                "trigger": {"enum": ["demand", "queue"]},
                "minReplicas": COUNT,
                "maxReplicas": POSITIVE,
                "prometheusAddress": {"type": "string", "pattern": "^https?://[^\\s]+$"},
                "sequencesPerReplica": COUNT,
                "lagCount": POSITIVE,
                "operatorNamespace": NAME,
                "pollingInterval": POSITIVE,
                "cooldownPeriod": COUNT,
            }
        ),
        orchestratorScaling=_orchestrator_scaling(),
    )
    trainer = _component(
        _model(TrainerServerConfig, defs),
        nodes=POSITIVE,
        procsPerNode=POSITIVE,
        workload={"enum": ["statefulset", "jobset"]},
        jobset=_strict({"maxRestarts": COUNT}),
        scheduling=_strict({"schedulerName": STRING, "kueueQueue": STRING, "podGroup": BOOL}),
        gpusPerNode=COUNT,
        port=PORT,
        metricsPort=PORT,
        rendezvousPort=PORT,
        weightSyncPort=PORT,
        startupSeconds={"type": "integer", "minimum": 10},
    )
    draft_trainer = _component(
        _model(DraftTrainerServerConfig, defs),
        enabled=BOOL,
        gpus=COUNT,
        port=PORT,
        metricsPort=PORT,
        weightSyncPort=PORT,
    )
    orchestrator = _component(
        _model(RunConfig, defs, only=LOOP_FIELDS),
        metricsPort=PORT,
        statusPort=PORT,
        controlTokenSecret=STRING,
        backoffLimit=COUNT,
        releaseOnCompletion=BOOL,
        # rollout.discover: the headless Service's EndpointSlices (Kubernetes API) or its DNS name
        discovery={"enum": ["endpointslices", "dns"]},
    )
    redis = _strict(
        {
            "enabled": BOOL,
            "url": {"type": "string", "pattern": r"^$|^rediss?://"},
            "image": IMAGE,
            "auth": _strict({"existingSecret": STRING, "existingSecretKey": NAME}),
            "persistence": _strict({"size": QUANTITY, "storageClassName": STRING}),
            "resources": RESOURCES,
        }
    )
    properties = {
        "nameOverride": STRING,
        "fullnameOverride": STRING,
        "commonLabels": OBJECT,
        "image": IMAGE,
        "imagePullSecrets": {"type": "array"},
        "serviceAccount": _strict(
            {"create": BOOL, "name": STRING, "annotations": OBJECT, "automountToken": BOOL}
        ),
        "podSecurityContext": OBJECT,
        "containerSecurityContext": OBJECT,
        "priorityClassName": STRING,
        "priorityClasses": _strict(
            {
                "create": BOOL,
                **{
                    role: _strict({"name": STRING, "value": {"type": "integer", "maximum": 1000000000}})
                    for role in ("trainer", "control", "rollout")
                },
            }
        ),
        "nodeSelector": OBJECT,
        "tolerations": {"type": "array"},
        "podAnnotations": OBJECT,
        "env": {"type": "array", "items": {"type": "object", "required": ["name"]}},
        "models": _strict({"existingClaim": STRING, "mountPath": {"type": "string", "pattern": "^/"}}),
        "runs": _strict(
            {
                "existingClaim": STRING,
                "storageClassName": STRING,
                "size": QUANTITY,
                "mountPath": {"type": "string", "pattern": "^/"},
            }
        ),
        "shm": _strict({"sizeLimit": QUANTITY}),
        "gpu": _strict({"resourceName": NAME, "perNode": POSITIVE}),
        "nvlink": _strict(
            {
                "cliqueLabel": LABEL_KEY,
                "trainerInOneClique": BOOL,
                "computeDomain": _strict({"enabled": BOOL, "numNodes": COUNT}),
                "rdmaResources": RESOURCE_MAP,
            }
        ),
        "rollout": rollout,
        "trainer": trainer,
        "draftTrainer": draft_trainer,
        "orchestrator": orchestrator,
        "redis": redis,
        "tls": _strict(
            {
                "enabled": BOOL,
                "existingSecret": STRING,
                "serverName": NAME,
                "certManager": _strict(
                    {
                        "enabled": BOOL,
                        "issuerRef": _strict({"name": STRING, "kind": NAME, "group": NAME}),
                        "duration": STRING,
                        "renewBefore": STRING,
                    }
                ),
            }
        ),
        "networkPolicy": _strict(
            {
                "enabled": BOOL,
                "metricsFrom": {"type": "array"},
                # egress.extra: NetworkPolicyEgressRules added to every specrl pod's;
                # egress.kubeApi: where the orchestrator's pod reaches the API server
                "egress": _strict(
                    {
                        "enabled": BOOL,
                        "extra": {"type": "array", "items": OBJECT},
                        "kubeApi": _strict(
                            {
                                "cidrs": {"type": "array", "minItems": 1, "items": NAME},
                                "ports": {"type": "array", "minItems": 1, "items": PORT},
                            }
                        ),
                    }
                ),
            }
        ),
        # labels: what kube-prometheus-stack's serviceMonitorSelector / ruleSelector match
        "serviceMonitor": _strict({"enabled": BOOL, "interval": STRING, "labels": LABELS}),
        "prometheusRule": _strict({"enabled": BOOL, "labels": LABELS}),
        "grafana": _strict(
            {
                "dashboards": _strict(
                    {"enabled": BOOL, "label": NAME, "labelValue": STRING, "annotations": OBJECT}
                )
            }
        ),
        "tests": _strict({"enabled": BOOL}),
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "title": "specrl Helm chart values (generated by `make chart-schema` from specrl's config models)",
        **_strict(properties),
        "$defs": dict(sorted(defs.items())),
    }


def render() -> str:
    return json.dumps(values_schema(), indent=2) + "\n"


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else SCHEMA_PATH
    out.write_text(render())
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
