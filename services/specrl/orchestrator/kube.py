"""The orchestrator's two uses of the Kubernetes API, through the `kubernetes` client:
watching the rollout Service's EndpointSlices (membership pushed by the API server the
moment a pod appears or goes, in place of polling DNS), and reading and setting the rollout
workload's replicas through its scale subresource (the autoscaler's actuator). Inside a
pod the client authenticates with the pod's ServiceAccount (the Helm chart's Role allows
exactly these calls); elsewhere with the kubeconfig ($KUBECONFIG or ~/.kube/config).
"""

from __future__ import annotations

import logging
import os
import threading

from specrl.config import ConfigError
from specrl.orchestrator.discovery import DiscoveryError

log = logging.getLogger("specrl.orchestrator.kube")

# a JSON merge patch: custom resources (LeaderWorkerSet) take no strategic merge patch
MERGE_PATCH = "application/merge-patch+json"
WATCH_TIMEOUT_S = 240  # a watch is renewed this often (the API server ends it anyway)


def api_client():
    """A client for the cluster this process runs in, or the kubeconfig's; ConfigError
    when there is neither (rollout.discover k8s: or rollout.autoscale asks for one)."""
    from kubernetes import client, config

    try:
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config()
        else:  # $KUBECONFIG read now: the client reads it once, when imported
            config.load_kube_config(config_file=os.environ.get("KUBECONFIG"))
    except (config.ConfigException, OSError) as e:
        raise ConfigError(
            f"rollout.discover k8s: and rollout.autoscale need the Kubernetes API: no in-cluster "
            f"ServiceAccount and no usable kubeconfig ({e})"
        ) from None
    return client.ApiClient()


class EndpointSliceWatch:
    """The addresses of a Service's endpoints (`k8s:NAMESPACE/SERVICE:PORT`), kept by a
    list-then-watch of its EndpointSlices on a background thread. An endpoint that is
    terminating, or not ready (a Service that does not publish not-ready addresses), is
    not a replica. Between a broken watch and the next list the last known set stands;
    a watch whose resource version expired (410 Gone) is followed by a fresh list."""

    every_s = 1.0  # reading the set is free: the loop may look as often as it likes

    def __init__(self, spec: str, api=None) -> None:
        self.spec = spec
        rest = spec.removeprefix("k8s:")
        where, _, port = rest.rpartition(":")
        self.namespace, _, self.service = where.partition("/")
        self.port = int(port)
        self._api = api
        self._lock = threading.Lock()
        self._slices: dict[str, set[str]] = {}
        self._synced = threading.Event()
        self._error = ""
        self._stop = threading.Event()
        self._watch = None
        self._thread = threading.Thread(target=self._run, name="endpointslice-watch", daemon=True)

    def start(self) -> EndpointSliceWatch:
        if self._api is None:
            self._api = api_client()
        self._thread.start()
        return self

    def __call__(self) -> list[str]:
        if not self._synced.is_set():
            raise DiscoveryError(
                f"EndpointSlices of {self.namespace}/{self.service} not listed yet"
                + (f": {self._error}" if self._error else "")
            )
        with self._lock:
            return sorted(set().union(*self._slices.values()))

    def close(self) -> None:
        self._stop.set()
        if self._watch is not None:
            self._watch.stop()
        self._thread.join(5)

    def _run(self) -> None:
        from kubernetes import client, watch
        from kubernetes.client.rest import ApiException

        api = client.DiscoveryV1Api(self._api)
        selector = f"kubernetes.io/service-name={self.service}"
        version = None  # the resource version to watch from; None: list first
        backoff = 1.0
        while not self._stop.is_set():
            try:
                if version is None:
                    listed = api.list_namespaced_endpoint_slice(self.namespace, label_selector=selector)
                    with self._lock:
                        self._slices = {s.metadata.name: self._addresses(s) for s in listed.items}
                    version = listed.metadata.resource_version
                    self._synced.set()
                    self._error = ""
                self._watch = watch.Watch()
                for event in self._watch.stream(
                    api.list_namespaced_endpoint_slice,
                    self.namespace,
                    label_selector=selector,
                    resource_version=version,
                    allow_watch_bookmarks=True,
                    timeout_seconds=WATCH_TIMEOUT_S,
                ):
                    self._apply(event["type"], event["object"])
                    version = self._watch.resource_version or version
                backoff = 1.0
            except ApiException as e:
                if e.status == 410:  # the version is too old to watch from: list again
                    version = None
                    continue
                self._failed(f"HTTP {e.status} {e.reason}")
                version = None
            except Exception as e:  # the API server away (connection refused, reset...)
                self._failed(f"{type(e).__name__}: {e}")
                version = None
            if self._stop.wait(backoff):
                return
            backoff = min(backoff * 2, 8.0)

    def _failed(self, why: str) -> None:
        if not self._stop.is_set():
            self._error = why
            log.warning("watching the EndpointSlices of %s/%s: %s", self.namespace, self.service, why)

    def _apply(self, kind: str, obj) -> None:
        if kind == "BOOKMARK":
            return
        name = obj.metadata.name
        with self._lock:
            if kind == "DELETED":
                self._slices.pop(name, None)
            else:
                self._slices[name] = self._addresses(obj)

    def _addresses(self, endpoint_slice) -> set[str]:
        found = set()
        for endpoint in endpoint_slice.endpoints or ():
            c = endpoint.conditions
            if c is not None and (c.terminating or c.ready is False):
                continue
            for address in endpoint.addresses:
                found.add(f"[{address}]:{self.port}" if ":" in address else f"{address}:{self.port}")
        return found


class WorkloadScale:
    """The rollout workload's replicas through its scale subresource
    (`statefulsets/NAME` in apps/v1, `leaderworkersets/NAME` in leaderworkerset.x-k8s.io/v1)."""

    def __init__(self, workload: str, namespace: str, api=None) -> None:
        self.kind, _, self.name = workload.partition("/")
        self.namespace = namespace
        self._api = api or api_client()

    def __str__(self) -> str:
        return f"{self.namespace}/{self.kind}/{self.name}"

    def get(self) -> int:
        if self.kind == "statefulsets":
            from kubernetes import client

            scale = client.AppsV1Api(self._api).read_namespaced_stateful_set_scale(self.name, self.namespace)
            return int(scale.spec.replicas or 0)
        return int(self._custom("get_namespaced_custom_object_scale")["spec"].get("replicas", 0))

    def set(self, replicas: int) -> None:
        body = {"spec": {"replicas": replicas}}
        if self.kind == "statefulsets":
            from kubernetes import client

            client.AppsV1Api(self._api).patch_namespaced_stateful_set_scale(
                self.name, self.namespace, body, _content_type=MERGE_PATCH
            )
        else:
            self._custom("patch_namespaced_custom_object_scale", body, _content_type=MERGE_PATCH)

    def _custom(self, method: str, *body: dict, **kw: str) -> dict:
        from kubernetes import client

        call = getattr(client.CustomObjectsApi(self._api), method)
        where = ("leaderworkerset.x-k8s.io", "v1", self.namespace, "leaderworkersets", self.name)
        return call(*where, *body, **kw)
