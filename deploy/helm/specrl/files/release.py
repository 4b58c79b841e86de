"""The release step of a finished run (orchestrator.releaseOnCompletion): the `release`
container of the orchestrator Job's pod runs this beside `specrl run`. When the run's
container (`orchestrator`) exits 0, it scales the run's GPU workloads to zero through the
Kubernetes API: StatefulSets and LeaderWorkerSets through their scale subresource, a
JobSet suspended, a KEDA ScaledObject paused at zero replicas (first, so KEDA does not
scale the rollout back). A run that failed is left as it is: its pods keep their state for
inspection and the Job may retry it. This script always exits 0: the pod's outcome is the
run's own exit code (the Job's podFailurePolicy reads the orchestrator container's).
Standard library only; the ServiceAccount token is re-read for every call (it rotates)."""

import json
import os
import ssl
import sys
import time
import urllib.request

SA = os.environ.get("SPECRL_KUBE_SA_DIR", "/var/run/secrets/kubernetes.io/serviceaccount")
API = os.environ.get("SPECRL_KUBE_API") or "https://{}:{}".format(
    os.environ.get("KUBERNETES_SERVICE_HOST", "kubernetes.default.svc"),
    os.environ.get("KUBERNETES_SERVICE_PORT", "443"),
)
CONTAINER = os.environ.get("SPECRL_RELEASE_CONTAINER", "orchestrator")
POLL_S = float(os.environ.get("SPECRL_RELEASE_POLL_SECONDS", "10"))


def log(message):
    print(f"release: {message}", file=sys.stderr, flush=True)


def read(name):
    with open(os.path.join(SA, name)) as f:
        return f.read().strip()


def call(method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(API + path, data=data, method=method)
    request.add_header("Authorization", "Bearer " + read("token"))
    request.add_header("Accept", "application/json")
    if body is not None:
        request.add_header("Content-Type", "application/merge-patch+json")
    context = (
        ssl.create_default_context(cafile=os.path.join(SA, "ca.crt")) if API.startswith("https") else None
    )
    with urllib.request.urlopen(request, context=context, timeout=30) as reply:
        return json.load(reply)


def run_exit_code(namespace, pod):
    """Wait for the run's container of this pod to end; its exit code."""
    while True:
        try:
            status = call("GET", f"/api/v1/namespaces/{namespace}/pods/{pod}").get("status", {})
            for c in status.get("containerStatuses", []):
                ended = c.get("state", {}).get("terminated")
                if c.get("name") == CONTAINER and ended is not None:
                    return int(ended.get("exitCode", 1))
        except (OSError, ValueError) as e:  # the API server away for a while: ask again
            log(f"reading pod {pod}: {e}")
        time.sleep(POLL_S)


def main():
    namespace, pod = read("namespace"), os.environ["POD_NAME"]
    targets = json.loads(os.environ["SPECRL_RELEASE_TARGETS"])
    code = run_exit_code(namespace, pod)
    if code != 0:
        log(f"the run exited {code}: not releasing its workloads (kept for inspection; the Job may retry)")
        return
    for t in targets:
        plural, _, sub = t["resource"].partition("/")
        path = f"/apis/{t['group']}/{t['version']}/namespaces/{namespace}/{plural}/{t['name']}"
        try:
            call("PATCH", path + (f"/{sub}" if sub else ""), t["patch"])
            log(f"the run ended: {plural} {t['name']} released ({json.dumps(t['patch'])})")
        except (OSError, ValueError) as e:
            log(f"could not release {plural} {t['name']}: {e} (scale it down by hand)")


if __name__ == "__main__":
    main()
