"""What the chart lets the orchestrator's pod do through the Kubernetes API: its Role
(`<fullname>-orchestrator`, rendered by the real helm) and RBAC's decision on one API
request against that Role's rules, as kube-apiserver's RBAC authorizer makes it for the
requests a namespaced Role can allow (verb from the HTTP method, API group, resource and
subresource, object name, namespace).

FakeKubeApi (kube_api_fake.py) authorizes every request it serves with `request_allowed`
against the Role a test gives it, e.g.:

    role = orchestrator_role()  # rollout.orchestratorScaling.enabled=true, plus any --set
    scale = "/apis/apps/v1/namespaces/train/statefulsets/rl-specrl-rollout/scale"
    assert request_allowed(role, "PATCH", scale)

The chart is rendered as release `rl` in namespace `train` (fullname `rl-specrl`) unless
told otherwise.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import yaml

from helpers import tool

CHART = Path(__file__).resolve().parents[1] / "deploy" / "helm" / "specrl"
SCALING = ("--set", "rollout.orchestratorScaling.enabled=true")


def render_chart(*args: str, release: str = "rl", namespace: str = "train") -> list[dict]:
    """`helm template` of the chart (offline) with `args` (--set, -f ...)."""
    helm = tool("helm", installs="`make setup` puts it in .tools/bin")
    out = subprocess.run(
        [helm, "template", release, str(CHART), "--namespace", namespace, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def role_of_orchestrator(docs: list[dict]) -> dict | None:
    """The Role bound to the orchestrator Job's ServiceAccount, None when none is."""
    (job,) = [d for d in docs if d["kind"] == "Job"]
    account = job["spec"]["template"]["spec"]["serviceAccountName"]
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Role"}
    bound = [
        roles[b["roleRef"]["name"]]
        for b in docs
        if b["kind"] == "RoleBinding"
        and b["roleRef"]["kind"] == "Role"
        and any(s["kind"] == "ServiceAccount" and s["name"] == account for s in b["subjects"])
    ]
    assert len(bound) <= 1, bound
    return bound[0] if bound else None


def orchestrator_role(
    *args: str, scaling: bool = True, release: str = "rl", namespace: str = "train"
) -> dict:
    """The orchestrator's Role as the chart renders it with `args`, by default with
    rollout.orchestratorScaling on (its metadata.namespace set: helm leaves it to the
    install)."""
    docs = render_chart(*(SCALING if scaling else ()), *args, release=release, namespace=namespace)
    role = role_of_orchestrator(docs)
    assert role is not None, "no Role is bound to the orchestrator's ServiceAccount"
    return {**role, "metadata": {**role["metadata"], "namespace": namespace}}


def orchestrator_role_rules(*args: str, scaling: bool = True) -> list[dict]:
    """The rules of `orchestrator_role`: each with apiGroups, resources, verbs and, where
    the rule names its objects, resourceNames."""
    return orchestrator_role(*args, scaling=scaling)["rules"]


@dataclass(frozen=True)
class ApiRequest:
    """An API request's RBAC attributes. `resource` carries the subresource
    ("statefulsets/scale"); `name` is "" for a collection; `namespace` "" when
    cluster-scoped."""

    verb: str
    group: str
    resource: str
    namespace: str
    name: str = ""


def api_request(method: str, path: str) -> ApiRequest:
    """The RBAC attributes of `method path` (the path with its query), as the API server
    derives them: GET of a collection is list, or watch with ?watch=true; DELETE of a
    collection is deletecollection."""
    url = urlsplit(path)
    parts = [p for p in url.path.split("/") if p]
    if parts[:1] == ["api"]:
        group, rest = "", parts[2:]  # /api/v1/...
    elif parts[:1] == ["apis"]:
        group, rest = parts[1], parts[3:]  # /apis/<group>/<version>/...
    else:
        raise ValueError(f"not a resource path: {path}")
    # the API server reads it with Go's strconv.ParseBool (the Python client sends "True")
    watch = parse_qs(url.query).get("watch", [""])[0] in ("1", "t", "T", "true", "TRUE", "True")
    if rest[:1] == ["watch"]:  # the deprecated /watch/ prefix
        watch, rest = True, rest[1:]
    namespace = ""
    if rest[:1] == ["namespaces"] and len(rest) >= 3:
        namespace, rest = rest[1], rest[2:]
    resource, name, sub = [*rest, "", "", ""][:3]
    verb = {"GET": "get", "HEAD": "get", "POST": "create", "PUT": "update", "PATCH": "patch"}.get(
        method.upper(), "delete"
    )
    if not name:
        verb = {"get": "watch" if watch else "list", "delete": "deletecollection"}.get(verb, verb)
    elif watch and verb == "get":
        verb = "watch"
    return ApiRequest(verb, group, f"{resource}/{sub}" if sub else resource, namespace, name)


def _resource_matches(allowed: str, requested: str) -> bool:
    if allowed in ("*", requested):
        return True
    _, _, sub = requested.partition("/")
    return bool(sub) and allowed == f"*/{sub}"


def rule_allows(rule: dict, req: ApiRequest) -> bool:
    """One PolicyRule's decision (rbac/v1 semantics): verb, API group and resource match
    (or `*`), and the object's name is listed when the rule lists names (a request
    without a name, list or watch, never matches a rule with resourceNames)."""
    if not any(v in ("*", req.verb) for v in rule.get("verbs", [])):
        return False
    if not any(g in ("*", req.group) for g in rule.get("apiGroups", [])):
        return False
    if not any(_resource_matches(r, req.resource) for r in rule.get("resources", [])):
        return False
    names = rule.get("resourceNames") or []
    return not names or req.name in names


def request_allowed(role: dict, method: str, path: str) -> bool:
    """Whether `role` (a Role with metadata.namespace, as `orchestrator_role` returns it)
    allows `method path`: a request in its namespace that one of its rules allows."""
    req = api_request(method, path)
    if req.namespace != role["metadata"]["namespace"]:
        return False  # a Role grants nothing outside its namespace, nor cluster-scoped
    return any(rule_allows(rule, req) for rule in role["rules"])
