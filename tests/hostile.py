"""Hostile peers on loopback: an OTLP collector, an API server and a Prometheus that answer the way
an attacker (or a broken proxy) would — endless, huge, a byte a second, redirects elsewhere, watches
that never stop adding objects, lists that never end, objects nothing can read.

One small HTTP/1.1 server (``HostileServer``) runs a *behaviour* per request: a function of the
parsed request and the raw socket, which writes whatever it likes. Writing stops quietly when the
client goes away (that is the point: the exporter hangs up), and ``sent`` counts the body bytes that
left, so a test can say how much the client took before it refused. ``requests`` records every
request (method, path, query, headers) for tests that check what was asked and with which
credentials.
"""

from __future__ import annotations

import json
import socket
import socketserver
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes


Behaviour = Callable[[Request, "Reply"], None]


class Gone(Exception):
    """The client closed the connection."""


class Reply:
    """Writes one answer on the raw socket, counting the body bytes sent."""

    def __init__(self, sock: socket.socket, server: HostileServer) -> None:
        self.sock = sock
        self.server = server

    def raw(self, data: bytes) -> None:
        try:
            self.sock.sendall(data)
        except OSError:
            raise Gone() from None

    def head(self, status: int = 200, headers: Mapping[str, str] | None = None) -> None:
        lines = [f"HTTP/1.1 {status} X"] + [f"{k}: {v}" for k, v in (headers or {}).items()]
        self.raw(("\r\n".join(lines) + "\r\n\r\n").encode())

    def body(self, data: bytes) -> None:
        self.raw(data)
        self.server.sent += len(data)

    def whole(self, status: int, data: bytes, content_type: str = "application/json",
              headers: Mapping[str, str] | None = None) -> None:
        self.head(status, {"Content-Type": content_type, "Content-Length": str(len(data)), **(headers or {})})
        self.body(data)

    def json(self, doc: Any, status: int = 200) -> None:
        self.whole(status, json.dumps(doc).encode())

    def chunked(self, pieces: Iterable[bytes], status: int = 200, content_type: str = "application/json") -> None:
        self.head(status, {"Content-Type": content_type, "Transfer-Encoding": "chunked"})
        for piece in pieces:
            if piece:
                self.raw(f"{len(piece):x}\r\n".encode())
                self.body(piece)
                self.raw(b"\r\n")
        self.raw(b"0\r\n\r\n")


class HostileServer:
    """``behaviour(request, reply)`` answers every request, one thread per connection."""

    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self.sent = 0
        self.requests: list[Request] = []
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                outer._serve(self.request)

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._server = Server(("127.0.0.1", 0), Handler)
        self.port = int(self._server.server_address[1])
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> HostileServer:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _serve(self, sock: socket.socket) -> None:
        reader = sock.makefile("rb")
        try:
            while True:
                request = _read_request(reader)
                if request is None:
                    return
                self.requests.append(request)
                self.behaviour(request, Reply(sock, self))
        except (Gone, OSError, ValueError):
            return
        finally:
            reader.close()


def _read_request(reader: Any) -> Request | None:
    line = reader.readline(65536)
    if not line:
        return None
    method, target, _ = line.decode("latin-1").split(" ", 2)
    headers: dict[str, str] = {}
    while (header := reader.readline(65536)) not in (b"\r\n", b"\n", b""):
        name, _, value = header.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    body = reader.read(int(headers.get("content-length", "0") or 0))
    parts = urllib.parse.urlsplit(target)
    query = dict(urllib.parse.parse_qsl(parts.query))
    if headers.get("content-type", "").startswith("application/x-www-form-urlencoded"):
        query.update(urllib.parse.parse_qsl(body.decode()))
    return Request(method, parts.path, query, headers, body)


# --- what the peers send ---------------------------------------------------------------------------


def forever(piece: bytes) -> Iterator[bytes]:
    while True:
        yield piece


def trickle(data: bytes, every: float) -> Iterator[bytes]:
    """``data`` a byte at a time, ``every`` seconds apart."""
    for i in range(len(data)):
        time.sleep(every)
        yield data[i:i + 1]


# --- a hostile API server --------------------------------------------------------------------------

GROUP_PATH = "/apis/resource.k8s.io"


def api_group(version: str = "v1") -> dict[str, Any]:
    return {"kind": "APIGroup", "name": "resource.k8s.io", "versions": [{"groupVersion": f"resource.k8s.io/{version}",
                                                                         "version": version}],
            "preferredVersion": {"groupVersion": f"resource.k8s.io/{version}", "version": version}}


def resource_slice(name: str, node: str = "n1", generation: Any = 1, devices: int = 1) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name, "resourceVersion": "5"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                     "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
                     "devices": [{"name": f"gpu-{i}", "attributes": {"uuid": {"string": f"GPU-{name}-{i}"}}}
                                 for i in range(devices)]}}


def gpu_slice(name: str) -> dict[str, Any]:
    """A slice as NVIDIA's driver publishes one for a node of eight GPUs (its usual attributes)."""
    obj = resource_slice(name, devices=8)
    for i, device in enumerate(obj["spec"]["devices"]):
        device["attributes"].update({
            "type": {"string": "gpu"}, "index": {"int": i}, "minor": {"int": i},
            "productName": {"string": "NVIDIA H100 80GB HBM3"}, "brand": {"string": "Nvidia"},
            "architecture": {"string": "Hopper"}, "cudaComputeCapability": {"version": "9.0.0"},
            "driverVersion": {"version": "570.124.6"}, "cudaDriverVersion": {"version": "12.8.0"},
            "pcieBusID": {"string": f"0000:{i + 0x18:02x}:00.0"}})
        device["capacity"] = {"memory": {"value": "81559Mi"}}
    return obj


def device_class(name: str, expression: str) -> dict[str, Any]:
    """A DeviceClass with one CEL selector, as the API serves it."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": name, "resourceVersion": "3"},
            "spec": {"selectors": [{"cel": {"expression": expression}}]}}


def object_list(items: list[dict[str, Any]], version: str = "10", token: str = "") -> dict[str, Any]:
    meta: dict[str, Any] = {"resourceVersion": version}
    if token:
        meta["continue"] = token
    return {"kind": "List", "apiVersion": "v1", "metadata": meta, "items": items}


def watch_event(kind: str, obj: Mapping[str, Any]) -> bytes:
    return json.dumps({"type": kind, "object": obj}).encode() + b"\n"


@dataclass
class ApiServer:
    """Routes of a minimal API server: discovery, then ``lists[resource](request, reply)`` and
    ``watches[resource](request, reply)``; anything not routed is 404."""

    lists: dict[str, Behaviour] = field(default_factory=dict)
    watches: dict[str, Behaviour] = field(default_factory=dict)
    version: str = "v1"

    def __call__(self, request: Request, reply: Reply) -> None:
        path = request.path.rstrip("/")
        if path == GROUP_PATH:
            return reply.json(api_group(self.version))
        if path == f"{GROUP_PATH}/{self.version}":
            return reply.json({"kind": "APIResourceList", "resources": []})
        resource = path.rsplit("/", 1)[-1]
        routes = self.watches if request.query.get("watch") in ("true", "True", "1") else self.lists
        if resource in routes:
            return routes[resource](request, reply)
        return reply.json({"kind": "Status", "code": 404}, status=404)


def empty_list(request: Request, reply: Reply) -> None:
    reply.json(object_list([]))


def idle_watch(request: Request, reply: Reply) -> None:
    """A watch that says nothing for 30 s (the client may leave before)."""
    reply.head(200, {"Content-Type": "application/json", "Transfer-Encoding": "chunked"})
    time.sleep(30)
    reply.raw(b"0\r\n\r\n")


def api_client(url: str) -> Any:
    from kubernetes import client as k8s

    cfg = k8s.Configuration(host=url)
    cfg.retries = 0
    return k8s.ApiClient(cfg)


def kubeconfig(url: str) -> str:
    return json.dumps({"apiVersion": "v1", "kind": "Config", "current-context": "h",
                       "clusters": [{"name": "h", "cluster": {"server": url}}],
                       "users": [{"name": "h", "user": {"token": "t"}}],
                       "contexts": [{"name": "h", "context": {"cluster": "h", "user": "h"}}]})


# --- a Prometheus with very many series --------------------------------------------------------------


@dataclass
class ManySeries:
    """A Prometheus whose every report query has ``series`` series (claims ``c<i>`` in 100 namespaces):
    range queries a point per step over the asked window, instant ones one point; ``count(...)`` is 1.
    Each answer is built once per kind and kept (the answers of 150,000 series are ~60 MB each)."""

    series: int
    _cache: dict[tuple[str, int], bytes] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, request: Request, reply: Reply) -> None:
        query = request.query.get("query", "")
        if query.startswith("count("):
            return reply.json({"status": "success", "data": {"resultType": "vector", "result": [
                {"metric": {}, "value": [float(request.query.get("time", "0")), "1"]}]}})
        ranged = request.path.endswith("/query_range")
        times = ([float(request.query["start"]) + i * float(request.query["step"])
                  for i in range(int((float(request.query["end"]) - float(request.query["start"]))
                                     // float(request.query["step"])) + 1)]
                 if ranged else [float(request.query.get("time", "0"))])
        key = ("range" if ranged else "pods" if "pod" in query else "instant", len(times))
        with self._lock:
            body = self._cache.get(key)
            if body is None:
                body = self._cache[key] = self._answer(ranged, times, pods=key[0] == "pods")
        reply.whole(200, body)

    def _answer(self, ranged: bool, times: list[float], *, pods: bool) -> bytes:
        points = ",".join(f'[{t:.0f},"0.5"]' for t in times)
        parts = [b'{"status":"success","data":{"resultType":"%s","result":[' % (b"matrix" if ranged else b"vector")]
        for i in range(self.series):
            metric = f'{{"namespace":"ns-{i % 100}","claim":"claim-{i}","model":"NVIDIA H100 80GB HBM3"' + \
                     (f',"pod":"pod-{i}"}}' if pods else "}")
            parts.append((f'{{"metric":{metric},' + (f'"values":[{points}]}}' if ranged else
                                                   f'"value":{points}}}') +
                          ("," if i < self.series - 1 else "")).encode())
        parts.append(b"]}}")
        return b"".join(parts)
