"""FakeKubeApi: a stand-in for the Kubernetes API server, which cannot run here (no
kube-apiserver or etcd binary is installable on these machines). It serves the few
endpoints the orchestrator calls, over real HTTP to the real `kubernetes` client:
EndpointSlices (list and watch, with resource versions and 410 Gone for an expired one)
and the scale subresource of StatefulSets and LeaderWorkerSets. Every request is
authorized against the Role the test gives (the chart's rendered Role), as the API
server's RBAC authorizer would (chart_rbac.request_allowed). A scale change calls
`on_scale`, the test's stand-in for the workload's controller."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import yaml
from chart_rbac import api_request, request_allowed

TOKEN = "fake-token"
SERVICE_LABEL = "kubernetes.io/service-name"


def endpoint_slice(name: str, service: str, addresses: list[str], **conditions: bool) -> dict:
    """An EndpointSlice of `service` with one endpoint per address (IPv4)."""
    cond = {"ready": True, "serving": True, "terminating": False} | conditions
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "labels": {SERVICE_LABEL: service}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": [a], "conditions": dict(cond)} for a in addresses],
        "ports": [{"name": "grpc", "port": 50051, "protocol": "TCP"}],
    }


class FakeKubeApi:
    def __init__(self, role: dict | None = None, keep_events: int = 1000) -> None:
        """`role`: the Role (with metadata.namespace) every request must be allowed by
        (None: allow all)."""
        self.role = role
        self.keep_events = keep_events
        self.requests: list[tuple[str, str, str, str]] = []  # (verb, group, resource, name)
        self.denied: list[tuple[str, str, str, str]] = []
        self.scales: dict[tuple[str, str, str], int] = {}  # (namespace, resource, name) -> replicas
        self.on_scale: Callable[[str, str, int], None] | None = None  # (resource, name, replicas)
        self._lock = threading.Condition()
        self._version = 100
        self._slices: dict[tuple[str, str], dict] = {}  # (namespace, name) -> slice
        self._events: list[tuple[int, str, str, dict]] = []  # (version, namespace, type, object)
        self._horizon = 0  # events after this version are kept; a watch from before: 410
        self._server: ThreadingHTTPServer | None = None
        self._closing = False
        self._connections: set[socket.socket] = set()  # open client connections

    # -- the test's side ----------------------------------------------------------------

    def start(self, port: int = 0) -> FakeKubeApi:
        """Serve on `port` (0: a free one; an earlier server's: the API server back)."""
        api = self
        self._closing = False

        class Handler(_Handler):
            owner = api

        self._server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        with self._lock:
            self._closing = True
            self._lock.notify_all()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
        for conn in list(self._connections):  # an API server that goes away drops them all
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_port}"

    def kubeconfig(self, path: Path, namespace: str = "default") -> Path:
        """A kubeconfig file for the `kubernetes` client to reach this server."""
        path.write_text(
            yaml.safe_dump({
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": self.url}}],
                "users": [{"name": "orchestrator", "user": {"token": TOKEN}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "orchestrator",
                                                          "namespace": namespace}}],
                "current-context": "fake",
            })
        )  # fmt: skip
        return path

    def put_slice(self, namespace: str, obj: dict) -> None:
        with self._lock:
            key = (namespace, obj["metadata"]["name"])
            kind = "MODIFIED" if key in self._slices else "ADDED"
            self._version += 1
            obj = json.loads(json.dumps(obj))
            obj["metadata"] |= {"namespace": namespace, "resourceVersion": str(self._version)}
            self._slices[key] = obj
            self._record(namespace, kind, obj)

    def delete_slice(self, namespace: str, name: str) -> None:
        with self._lock:
            obj = self._slices.pop((namespace, name))
            self._version += 1
            obj["metadata"]["resourceVersion"] = str(self._version)
            self._record(namespace, "DELETED", obj)

    def expire_events(self) -> None:
        """Forget the event history: a watch from an older version gets 410 Gone (as after
        etcd compaction)."""
        with self._lock:
            self._events.clear()
            self._version += 1
            self._horizon = self._version
            self._lock.notify_all()

    def _record(self, namespace: str, kind: str, obj: dict) -> None:
        self._events.append((self._version, namespace, kind, obj))
        if len(self._events) > self.keep_events:
            del self._events[: -self.keep_events]
            self._horizon = self._events[0][0] - 1
        self._lock.notify_all()


class _Handler(BaseHTTPRequestHandler):
    owner: FakeKubeApi
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet
        pass

    def setup(self):
        super().setup()
        self.owner._connections.add(self.connection)

    def finish(self):
        self.owner._connections.discard(self.connection)
        with contextlib.suppress(OSError):
            super().finish()

    def do_GET(self):
        self._handle("GET")

    def do_PATCH(self):
        self._handle("PATCH")

    def _handle(self, method: str) -> None:
        api = self.owner
        if self.headers.get("Authorization") != f"Bearer {TOKEN}":
            return self._reply(401, _status(401, "Unauthorized", "no valid bearer token"))
        query = {k: v[0] for k, v in parse_qs(urlparse(self.path).query).items()}
        try:
            req = api_request(method, self.path)
        except ValueError:
            return self._reply(404, _status(404, "NotFound", self.path))
        seen = (req.verb, req.group, req.resource, req.name)
        api.requests.append(seen)
        if api.role is not None and not request_allowed(api.role, method, self.path):
            api.denied.append(seen)
            why = f'cannot {req.verb} resource "{req.resource}" in API group "{req.group}"'
            return self._reply(403, _status(403, "Forbidden", why))
        resource, _, sub = req.resource.partition("/")
        if resource == "endpointslices" and req.verb in ("list", "watch"):
            selector = query.get("labelSelector", "")
            if req.verb == "watch":
                return self._watch(req.namespace, selector, query)
            return self._list(req.namespace, selector)
        if sub == "scale" and resource in ("statefulsets", "leaderworkersets"):
            return self._scale(method, req.namespace, resource, req.name)
        return self._reply(404, _status(404, "NotFound", self.path))

    def _selected(self, obj: dict, selector: str) -> bool:
        if not selector:
            return True
        key, _, value = selector.partition("=")
        return obj["metadata"].get("labels", {}).get(key) == value

    def _list(self, namespace: str, selector: str) -> None:
        api = self.owner
        with api._lock:
            items = [
                o for (ns, _), o in api._slices.items() if ns == namespace and self._selected(o, selector)
            ]
            version = str(api._version)
        body = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSliceList"}
        self._reply(200, body | {"metadata": {"resourceVersion": version}, "items": items})

    def _watch(self, namespace: str, selector: str, query: dict) -> None:
        api = self.owner
        since = int(query.get("resourceVersion") or 0)
        deadline = time.monotonic() + float(query.get("timeoutSeconds") or 300)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        try:
            with api._lock:
                expired = since < api._horizon
            if expired:
                why = f"too old resource version: {since} ({api._version})"
                self._chunk(json.dumps({"type": "ERROR", "object": _status(410, "Expired", why)}) + "\n")
                return self._chunk("")
            while time.monotonic() < deadline and not api._closing:
                with api._lock:
                    if since < api._horizon:  # history forgotten while watching: the API server ends it
                        break
                    fresh = [e for e in api._events if e[0] > since and e[1] == namespace]
                    if not fresh:
                        api._lock.wait(0.2)
                        continue
                for version, _, kind, obj in fresh:
                    since = version
                    if self._selected(obj, selector):
                        self._chunk(json.dumps({"type": kind, "object": obj}) + "\n")
            self._chunk("")
        except (BrokenPipeError, ConnectionResetError):
            pass

    def _scale(self, method: str, namespace: str, resource: str, name: str) -> None:
        api = self.owner
        key = (namespace, resource, name)
        if key not in api.scales:
            return self._reply(404, _status(404, "NotFound", f'{resource} "{name}" not found'))
        if method == "PATCH":
            ctype = self.headers.get("Content-Type", "")
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            if resource == "leaderworkersets" and "strategic-merge" in ctype:
                return self._reply(415, _status(415, "UnsupportedMediaType", "no strategic merge for CRDs"))
            api.scales[key] = int(body["spec"]["replicas"])
            if api.on_scale is not None:
                api.on_scale(resource, name, api.scales[key])
        replicas = api.scales[key]
        self._reply(200, {
            "apiVersion": "autoscaling/v1", "kind": "Scale",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"replicas": replicas}, "status": {"replicas": replicas},
        })  # fmt: skip

    def _chunk(self, text: str) -> None:
        data = text.encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()

    def _reply(self, code: int, body: dict) -> None:
        reply_json(self, code, body)


def reply_json(handler: BaseHTTPRequestHandler, code: int, body: dict) -> None:
    """An API server's JSON answer (the fake API servers of the deploy tests share it)."""
    data = json.dumps(body).encode()
    handler.send_response(code)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def _status(code: int, reason: str, message: str) -> dict:
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason,
            "message": message}  # fmt: skip
