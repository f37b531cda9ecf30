"""Simulated Kubernetes API server: the real REST API, for the real ``kubernetes`` client.

A stdlib ``ThreadingHTTPServer`` on 127.0.0.1 (a free port, plain HTTP, no auth) that
serves the simulated cluster read-only, as of the scenario's simulated time:

* discovery: ``/version``, ``/api``, ``/api/v1``, ``/apis``, ``/apis/resource.k8s.io`` and
  ``/apis/resource.k8s.io/<v>`` for the served versions (``k8s_objects.served_versions``);
* ``resourceslices``, ``deviceclasses`` and ``devicetaintrules`` (cluster-scoped; DeviceTaintRules only in the
  ``taint_rule_versions`` asked for, none by default), ``resourceclaims`` (namespaced), core
  ``pods``, ``nodes`` and ``namespaces``:
  get, list and watch, with ``fieldSelector`` and ``labelSelector`` honoured (an unknown
  field label is a 400, as on a real server), lists carrying ``metadata.resourceVersion``
  and ``limit``/``continue`` paging (a token expires, 410, once anything changed);
* watches stream ``{"type", "object"}`` lines over chunked HTTP: from ``resourceVersion``
  on, or the current objects as ``ADDED`` first when it is absent or ``"0"``;
  ``timeoutSeconds`` (wall seconds) ends the stream cleanly.

The store is a log of changes. A ticker (every ``poll_s``) and every request compare the
objects ``k8s_objects.cluster_objects`` gives for the current simulated time with the
stored ones; each difference gets the next resourceVersion (one counter, increasing
monotonically) and an ``ADDED``/``MODIFIED``/``DELETED`` event. Objects are stored in
one version and converted per request.

Faults, by the scenario's fault kinds (polled by the ticker) or ``inject`` (a test hook,
applied at once): ``apiserver_gone`` (listening socket closed, connections cut: connection
refused until the fault ends, then the same port again), ``apiserver_error`` (every
request a 500 Status), ``apiserver_slow`` (answers wait ``delay`` seconds),
``apiserver_watch_drop`` (watch streams cut without their last chunk) and
``apiserver_gone_410`` (watches get an ``ERROR`` event with a 410 ``Expired`` Status, as
for a too old resourceVersion). ``requests`` counts requests per (verb, resource).
"""

from __future__ import annotations

import base64
import bisect
import contextlib
import json
import logging
import re
import select
import shutil
import socket
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Final
from urllib.parse import parse_qs, urlsplit

import yaml

from dra_exporter.dra_versions import GROUP, convert
from dra_exporter.sources.kubeapi_normalize import TAINT_RULE_VERSIONS

from . import k8s_objects
from .clock import SimClock
from .k8s_objects import JSON
from .scenario import API_VERSIONS, APISERVER_FAULTS, Scenario

GONE: Final = "apiserver_gone"
ERROR: Final = "apiserver_error"
SLOW: Final = "apiserver_slow"
WATCH_DROP: Final = "apiserver_watch_drop"
GONE_410: Final = "apiserver_gone_410"
FAULTS: Final = frozenset(APISERVER_FAULTS)

#: A real API server ends a watch after 30-60 minutes when the client names no timeout.
DEFAULT_WATCH_TIMEOUT_S: Final = 1800.0
_HISTORY: Final = 10_000
_log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Resource:
    name: str
    kind: str
    group: str
    namespaced: bool
    fields: tuple[str, ...]
    """Field labels the real API server accepts in a field selector for this resource."""

    @property
    def singular(self) -> str:
        return self.kind.lower()

    def qualified(self) -> str:
        return f"{self.name}.{self.group}" if self.group else self.name


_META_FIELDS: Final = ("metadata.name", "metadata.namespace")
RESOURCES: Final = {
    "resourceslices": _Resource(
        "resourceslices",
        "ResourceSlice",
        GROUP,
        False,
        ("metadata.name", "spec.nodeName", "spec.driver", "spec.pool.name"),
    ),
    "resourceclaims": _Resource("resourceclaims", "ResourceClaim", GROUP, True, _META_FIELDS),
    "devicetaintrules": _Resource("devicetaintrules", "DeviceTaintRule", GROUP, False, ("metadata.name",)),
    "deviceclasses": _Resource("deviceclasses", "DeviceClass", GROUP, False, ("metadata.name",)),
    "nodes": _Resource("nodes", "Node", "", False, ("metadata.name", "spec.unschedulable")),
    "namespaces": _Resource("namespaces", "Namespace", "", False, ("metadata.name", "status.phase")),
    "pods": _Resource(
        "pods",
        "Pod",
        "",
        True,
        (
            *_META_FIELDS,
            "spec.nodeName",
            "spec.restartPolicy",
            "spec.schedulerName",
            "spec.serviceAccountName",
            "spec.hostNetwork",
            "status.phase",
            "status.podIP",
            "status.nominatedNodeName",
        ),
    ),
}
#: NVIDIA's ComputeDomain CRDs (resource.nvidia.com/v1beta1), served where the scenario has them.
CD_GROUP: Final = "resource.nvidia.com"
CD_VERSION: Final = "v1beta1"
RESOURCES.update({
    "computedomains": _Resource("computedomains", "ComputeDomain", CD_GROUP, True, _META_FIELDS),
    "computedomaincliques": _Resource("computedomaincliques", "ComputeDomainClique", CD_GROUP, True,
                                      _META_FIELDS),
})
_VERBS: Final = ["get", "list", "watch"]


class ApiError(Exception):
    """Ends a request with a ``Status`` body."""

    def __init__(self, code: int, reason: str, message: str, details: JSON | None = None) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details

    def status(self) -> JSON:
        body: JSON = {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        }
        if self.details:
            body["details"] = self.details
        return body


# --- selectors ------------------------------------------------------------------------------------


def _lookup(obj: Mapping[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    if isinstance(value, bool):
        return str(value).lower()
    return "" if value is None else str(value)


_FIELD_TERM = re.compile(r"(?P<key>[A-Za-z0-9_.]+)\s*(?P<op>!=|==|=)\s*(?P<value>.*)")


def parse_field_selector(text: str, resource: _Resource) -> Callable[[Mapping[str, Any]], bool]:
    """A predicate for ``spec.nodeName=n,spec.driver!=d``; unknown field labels are a 400."""
    terms: list[tuple[str, bool, str]] = []
    for raw in filter(None, (t.strip() for t in text.split(","))):
        m = _FIELD_TERM.fullmatch(raw)
        if m is None:
            raise ApiError(400, "BadRequest", f"invalid selector: '{text}'; can't understand '{raw}'")
        if m["key"] not in resource.fields:
            raise ApiError(400, "BadRequest", f"field label not supported: {m['key']}")
        terms.append((m["key"], m["op"] != "!=", m["value"].strip()))
    return lambda obj: all((_lookup(obj, key) == value) == equal for key, equal, value in terms)


_LABEL_TERM = re.compile(
    r"(?P<neg>!)?(?P<key>[A-Za-z0-9_./-]+)(?:\s*(?P<op>!=|==|=|\s+in\s+|\s+notin\s+)\s*(?P<value>.*))?"
)


@dataclass(frozen=True, slots=True)
class _LabelRequirement:
    key: str
    op: str
    """``exists``, ``!exists``, ``=``, ``!=``, ``in`` or ``notin``."""
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.op in ("exists", "!exists"):
            return (self.key in labels) == (self.op == "exists")
        if self.op in ("=", "in"):
            return labels.get(self.key) in self.values
        return labels.get(self.key) not in self.values  # != and notin also match a missing label


def parse_label_selector(text: str) -> Callable[[Mapping[str, Any]], bool]:
    """A predicate for equality, set (``in``/``notin``) and existence label selectors."""
    requirements: list[_LabelRequirement] = []
    for raw in filter(None, (p.strip() for p in re.split(r",(?![^()]*\))", text))):
        m = _LABEL_TERM.fullmatch(raw)
        op = (m["op"] or "").strip() if m else ""
        if m is None or (m["neg"] and op):
            raise ApiError(400, "BadRequest", f"unable to parse requirement: {raw!r}")
        value = (m["value"] or "").strip()
        if not op:
            requirements.append(_LabelRequirement(m["key"], "!exists" if m["neg"] else "exists"))
        elif op in ("in", "notin"):
            if not (value.startswith("(") and value.endswith(")")):
                raise ApiError(400, "BadRequest", f"unable to parse requirement: {raw!r}")
            values = frozenset(v.strip() for v in value[1:-1].split(","))
            requirements.append(_LabelRequirement(m["key"], op, values))
        else:
            requirements.append(_LabelRequirement(m["key"], "!=" if op == "!=" else "=", frozenset({value})))

    def match(obj: Mapping[str, Any]) -> bool:
        labels = (obj.get("metadata") or {}).get("labels") or {}
        return all(r.matches(labels) for r in requirements)

    return match


# --- the store ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Event:
    rv: int
    type: str
    resource: str
    obj: JSON
    """The object after the change (before it, for DELETED), with its resourceVersion."""
    prev: JSON | None = None


def _key(obj: Mapping[str, Any]) -> tuple[str, str]:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def _without_rv(obj: Mapping[str, Any]) -> JSON:
    out = dict(obj)
    out["metadata"] = {k: v for k, v in (obj.get("metadata") or {}).items() if k != "resourceVersion"}
    return out


class _Store:
    """Current objects per resource plus a bounded log of the changes that made them."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.rv = 0
        self.objects: dict[str, dict[tuple[str, str], JSON]] = {r: {} for r in RESOURCES}
        self.events: list[_Event] = []
        self.compacted = 0
        """Events up to this resourceVersion are no longer in the log."""
        self._ordered: dict[str, tuple[int, list[tuple[str, str]], list[JSON]]] = {}

    def ordered(self, resource: str) -> tuple[list[tuple[str, str]], list[JSON]]:
        """The keys of ``resource``'s objects in list order and the objects (caller holds ``cond``).
        Kept until the next change, so the pages of one list cost a bisect each, not a sort: a
        cluster of 85,000 pods is listed in 170 pages."""
        cached = self._ordered.get(resource)
        if cached is None or cached[0] != self.rv:
            items = sorted(self.objects[resource].items())
            cached = (self.rv, [k for k, _ in items], [o for _, o in items])
            self._ordered[resource] = cached
        return cached[1], cached[2]

    def apply(self, desired: Mapping[str, tuple[JSON, ...]]) -> int:
        """Make the store hold ``desired``; returns how many objects changed."""
        changed = 0
        with self.cond:
            for resource, objects in desired.items():
                current = self.objects[resource]
                wanted = {_key(o): o for o in objects}
                for key, stored in list(current.items()):
                    replacement = wanted.get(key)
                    # Same name, new UID: a new object, so the old one is deleted first.
                    if replacement is None or _uid(replacement) != _uid(stored):
                        self._record("DELETED", resource, stored, stored, key)
                        changed += 1
                for key, new in wanted.items():
                    old = current.get(key)
                    if old is None:
                        self._record("ADDED", resource, new, None, key)
                    elif _without_rv(old) != _without_rv(new):
                        self._record("MODIFIED", resource, new, old, key)
                    else:
                        continue
                    changed += 1
            if changed:
                self._compact()
                self.cond.notify_all()
        return changed

    def _record(self, kind: str, resource: str, obj: JSON, prev: JSON | None, key: tuple[str, str]) -> None:
        self.rv += 1
        stored = dict(obj)
        stored["metadata"] = {**(obj.get("metadata") or {}), "resourceVersion": str(self.rv)}
        if kind == "DELETED":
            del self.objects[resource][key]
        else:
            self.objects[resource][key] = stored
        self.events.append(_Event(self.rv, kind, resource, stored, prev))

    def _compact(self) -> None:
        if len(self.events) > _HISTORY:
            drop = len(self.events) - _HISTORY
            self.compacted = self.events[drop - 1].rv
            del self.events[:drop]

    def since(self, rv: int, resource: str) -> list[_Event]:
        """Changes of ``resource`` after ``rv`` (caller holds ``cond``)."""
        lo, hi = 0, len(self.events)
        while lo < hi:  # events are sorted by rv
            mid = (lo + hi) // 2
            if self.events[mid].rv <= rv:
                lo = mid + 1
            else:
                hi = mid
        return [e for e in self.events[lo:] if e.resource == resource]


def _uid(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


# --- the server -----------------------------------------------------------------------------------


class SimulatedApiServer:
    """The simulated cluster's API server; see the module docstring."""

    def __init__(
        self,
        scenario: Scenario,
        clock: SimClock,
        *,
        versions: Collection[str] | None = None,
        slow_delay: float = 5.0,
        poll_s: float = 0.1,
        bookmark_s: float = 60.0,
        taint_rule_versions: Collection[str] | None = (),
        compute_domains: bool | None = None,
        forbidden: Collection[str] | None = None,
    ) -> None:
        """``taint_rule_versions``: the versions DeviceTaintRules are served in; None: those the cluster's
        release serves (``k8s_objects.kubernetes_version``: 1.36 serves v1beta2 and v1alpha3).
        ``forbidden``: resources (``nodes``, ``pods`` …) refused with 403 Forbidden, as a real server
        answers a ServiceAccount whose ClusterRole does not grant them; None: ``nodes`` for a cluster
        dump that holds no Node (its Nodes are unknown, not absent: a cluster mode that read none would
        place nothing), nothing otherwise."""
        served = k8s_objects.served_versions(scenario.api_version)
        if versions is not None:
            unknown = sorted(set(versions) - set(API_VERSIONS))
            if unknown or not versions:
                raise ValueError(
                    f"simulated API server: cannot serve {GROUP} versions {unknown or '(none)'}; "
                    f"known: {', '.join(API_VERSIONS)}"
                )
            served = tuple(v for v in API_VERSIONS if v in versions)
        preferred = scenario.api_version if scenario.api_version in served else served[0]
        release = (k8s_objects.kubernetes_version(scenario) if preferred == scenario.api_version
                   else k8s_objects.KUBERNETES_VERSIONS[preferred])
        if taint_rule_versions is None:
            taint_rule_versions = k8s_objects.taint_rule_versions(release)
        unknown_rules = sorted(set(taint_rule_versions) - set(TAINT_RULE_VERSIONS))
        if unknown_rules:
            raise ValueError(f"simulated API server: DeviceTaintRules exist in {', '.join(TAINT_RULE_VERSIONS)}, "
                             f"not in {', '.join(unknown_rules)}")
        self.scenario = scenario
        self.clock = clock
        self.versions: tuple[str, ...] = served
        #: Versions that serve DeviceTaintRules (v1 from 1.37, v1beta2 from 1.36, v1alpha3 from 1.33, each
        #: behind a gate before 1.37); v1alpha3 serves nothing else.
        self.taint_rule_versions = tuple(v for v in TAINT_RULE_VERSIONS if v in taint_rule_versions)
        self.preferred = preferred
        #: ``/version``: the release, or the first that serves the DeviceTaintRule versions asked for.
        self.kubernetes_version = k8s_objects.release_serving(release, self.taint_rule_versions)
        #: Whether resource.nvidia.com/v1beta1 (ComputeDomains) is served; None: where the scenario has some.
        self.compute_domains = (k8s_objects.serves_compute_domains(scenario) if compute_domains is None
                                else compute_domains)
        if forbidden is None:
            forbidden = ("nodes",) if _dump_without_nodes(scenario) else ()
            if forbidden:
                _log.warning("simulated API server: %s holds no Node: listing nodes is refused (403), so node "
                             "filters are unknown (dump them too: kubectl get ... nodes)", scenario.name)
        self.forbidden = frozenset(forbidden)
        self.requests: Counter[tuple[str, str]] = Counter()
        self._requests_lock = threading.Lock()
        self._slow_delay = slow_delay
        self._poll_s = poll_s
        self._bookmark_s = bookmark_s
        self._store = _Store()
        self._sync_lock = threading.Lock()
        self._synced_key: object = None
        self._injected: str | None = None
        self._lock = threading.RLock()
        self._httpd: ThreadingHTTPServer | None = None
        self._serve_thread: threading.Thread | None = None
        self._ticker: threading.Thread | None = None
        self._stopping = threading.Event()
        self._connections: set[socket.socket] = set()
        self._conn_lock = threading.Lock()
        self._port = 0
        self._dir: str | None = None
        self.kubeconfig_path = ""
        self._running = False

    # --- lifecycle ---------------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._port}"

    def start(self) -> SimulatedApiServer:
        with self._lock:
            if self._running:
                return self
            self._running = True
            self._stopping.clear()
            self.sync()
            self._bring_up()  # even under apiserver_gone: the port must be known for the kubeconfig
            self._dir = tempfile.mkdtemp(prefix="dra-apiserver-")
            self.kubeconfig_path = str(Path(self._dir) / "kubeconfig")
            Path(self.kubeconfig_path).write_text(self._kubeconfig())
            self._apply_gone()
            self._ticker = threading.Thread(target=self._tick, name="sim-apiserver-ticker", daemon=True)
            self._ticker.start()
        return self

    def stop(self) -> None:
        """Stop serving, end every watch and remove the kubeconfig."""
        self._stopping.set()
        with self._store.cond:
            self._store.cond.notify_all()
        ticker, self._ticker = self._ticker, None
        if ticker is not None:
            ticker.join()
        with self._lock:
            self._running = False
            self._bring_down()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def inject(self, fault: str | None) -> None:
        """Force ``fault`` (one of ``FAULTS``) until ``inject(None)``; takes effect at once."""
        if fault is not None and fault not in FAULTS:
            raise ValueError(
                f"simulated API server: unknown fault {fault!r}; known: {', '.join(sorted(FAULTS))}"
            )
        with self._lock:
            self._injected = fault
            if self._running:
                self._apply_gone()
        with self._store.cond:
            self._store.cond.notify_all()  # watches re-check the faults now

    def __enter__(self) -> SimulatedApiServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def resource_version(self) -> int:
        """The newest resourceVersion handed out."""
        with self._store.cond:
            return self._store.rv

    def sync(self) -> None:
        """Bring the store up to the simulated clock (the ticker and every request call it)."""
        with self._sync_lock:
            t = self.clock.now()
            key = k8s_objects.changes_key(self.scenario, t)
            if key == self._synced_key:
                return
            self._store.apply(k8s_objects.cluster_objects(self.scenario, t).by_resource())
            self._synced_key = key

    def _kubeconfig(self) -> str:
        return yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "simulated", "cluster": {"server": self.url}}],
                "users": [{"name": "simulated", "user": {}}],
                "contexts": [{"name": "simulated", "context": {"cluster": "simulated", "user": "simulated"}}],
                "current-context": "simulated",
            },
            sort_keys=False,
        )

    def _tick(self) -> None:
        while not self._stopping.wait(self._poll_s):
            try:
                self.sync()
                with self._lock:
                    if self._running:
                        self._apply_gone()
            except Exception:  # a broken scenario must not kill the ticker
                _log.exception("simulated API server: sync failed")
            with self._store.cond:
                self._store.cond.notify_all()  # lets watches notice faults and timeouts

    # --- faults ------------------------------------------------------------------------------------

    def faults(self) -> set[str]:
        active = {f.kind for f in self.scenario.active_faults(self.clock.now()) if f.kind in FAULTS}
        if self._injected is not None:
            active.add(self._injected)
        return active

    def _slow_seconds(self) -> float:
        delays = [
            float(f.params.get("delay", self._slow_delay))
            for f in self.scenario.active_faults(self.clock.now(), SLOW)
        ]
        if self._injected == SLOW:
            delays.append(self._slow_delay)
        return max(delays, default=0.0)

    def _apply_gone(self) -> None:
        gone = GONE in self.faults()
        if gone and self._httpd is not None:
            self._bring_down()
        elif not gone and self._httpd is None:
            self._bring_up()

    def _bring_up(self) -> None:
        server = self

        class Handler(_Handler):
            api = server

        httpd = _QuietServer(("127.0.0.1", self._port), Handler)
        httpd.daemon_threads = True
        self._port = httpd.server_address[1]
        self._httpd = httpd
        self._serve_thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.5}, name="sim-apiserver", daemon=True
        )
        self._serve_thread.start()

    def _bring_down(self) -> None:
        httpd, self._httpd = self._httpd, None
        thread, self._serve_thread = self._serve_thread, None
        if httpd is not None:
            _shutdown(httpd)
        if thread is not None:
            thread.join()
        with self._conn_lock:
            connections = list(self._connections)
        for conn in connections:  # a server that goes away cuts its connections too
            _cut(conn)

    def _track(self, conn: socket.socket, add: bool) -> None:
        with self._conn_lock:
            (self._connections.add if add else self._connections.discard)(conn)

    def _count(self, verb: str, resource: str) -> None:
        with self._requests_lock:
            self.requests[(verb, resource)] += 1

    # --- answers -----------------------------------------------------------------------------------

    def discovery(self, path: str) -> JSON:
        if path == "/version":
            minor = self._kube_version().split(".")[1]
            return {
                "major": "1",
                "minor": minor,
                "gitVersion": self._kube_version(),
                "gitCommit": "0" * 40,
                "gitTreeState": "clean",
                "buildDate": "2026-01-01T00:00:00Z",
                "goVersion": "go1.25.5",
                "compiler": "gc",
                "platform": "linux/amd64",
            }
        if path == "/api":
            return {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": self.url[7:]}],
            }
        if path == "/api/v1":
            return _resource_list("v1", [RESOURCES["namespaces"], RESOURCES["nodes"], RESOURCES["pods"]])
        if path == "/apis":
            groups = [self._group(), *([self._cd_group()] if self.compute_domains else [])]
            return {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
        if self.compute_domains and path == f"/apis/{CD_GROUP}":
            return {"kind": "APIGroup", "apiVersion": "v1", **self._cd_group()}
        if self.compute_domains and path == f"/apis/{CD_GROUP}/{CD_VERSION}":
            return _resource_list(f"{CD_GROUP}/{CD_VERSION}", [RESOURCES["computedomains"],
                                                               RESOURCES["computedomaincliques"]])
        if path == f"/apis/{GROUP}":
            return {"kind": "APIGroup", "apiVersion": "v1", **self._group()}
        version = path.removeprefix(f"/apis/{GROUP}/")
        if version in self.group_versions:
            resources = ([RESOURCES["deviceclasses"], RESOURCES["resourceclaims"], RESOURCES["resourceslices"]]
                         if version in self.versions else [])
            if version in self.taint_rule_versions:
                resources.insert(0, RESOURCES["devicetaintrules"])
            return _resource_list(f"{GROUP}/{version}", resources)
        raise _not_found()

    @property
    def group_versions(self) -> tuple[str, ...]:
        """Every resource.k8s.io version served, for any kind."""
        return (*self.versions, *(v for v in self.taint_rule_versions if v not in self.versions))

    def _kube_version(self) -> str:
        return self.kubernetes_version

    def _group(self) -> JSON:
        def gv(v: str) -> JSON:
            return {"groupVersion": f"{GROUP}/{v}", "version": v}

        return {
            "name": GROUP,
            "versions": [gv(v) for v in self.group_versions],
            "preferredVersion": gv(self.preferred),
        }

    @staticmethod
    def _cd_group() -> JSON:
        gv = {"groupVersion": f"{CD_GROUP}/{CD_VERSION}", "version": CD_VERSION}
        return {"name": CD_GROUP, "versions": [gv], "preferredVersion": gv}

    def get(self, request: _Request) -> JSON:
        self.sync()
        with self._store.cond:
            obj = self._store.objects[request.resource.name].get((request.namespace, request.name))
        if obj is None:
            raise _not_found(request)
        return request.present(obj)

    def list_objects(self, request: _Request) -> JSON:
        """A list, or one page of it (``limit``/``continue``). A continue token names the
        resourceVersion of the first page and the last key sent; when anything changed since
        that version the token has expired (410), as on a real server once its snapshot is
        compacted, so every page of one list comes from the same state."""
        self.sync()
        with self._store.cond:
            rv = self._store.rv
            keys, objects = self._store.ordered(request.resource.name)
        after: tuple[str, str] | None = None
        if request.continue_token:
            token_rv, after = _parse_continue(request.continue_token)
            if token_rv != rv:
                raise ApiError(410, "Expired", "The provided continue parameter is too old to display a "
                               "consistent list result. You can start a new list without the continue parameter.")
            rv = token_rv
        items: list[JSON] = []
        token, last = "", ("", "")
        for index in range(bisect.bisect_right(keys, after) if after is not None else 0, len(keys)):
            obj = objects[index]
            if request.matches(obj):
                if request.limit and len(items) == request.limit:
                    token = _continue_token(rv, last)
                    break
                item = request.present(obj)
                # A real list's items carry no kind/apiVersion; the list says them once.
                item.pop("kind", None)
                item.pop("apiVersion", None)
                items.append(item)
                last = keys[index]
        metadata: JSON = {"resourceVersion": str(rv)}
        if token:
            metadata["continue"] = token
        return {
            "kind": f"{request.resource.kind}List",
            "apiVersion": request.api_version,
            "metadata": metadata,
            "items": items,
        }

    def watch(
        self, request: _Request, timeout_s: float, alive: Callable[[], bool] = lambda: True
    ) -> Iterator[JSON | None]:
        """Watch events for ``request``; ``None`` asks the handler to cut the stream (a drop fault).

        Ends after ``timeout_s``, when the server stops, or when ``alive()`` says the client
        has gone (checked while idle, so abandoned watches do not hold a thread for long).
        """
        self.sync()
        deadline = time.monotonic() + timeout_s
        start = request.resource_version
        with self._store.cond:  # never yield while holding it: the consumer writes to a socket
            current, compacted = self._store.rv, self._store.compacted
            initial = [] if start is not None else list(self._store.objects[request.resource.name].values())
        if start is not None and start < compacted:
            yield _expired(start, current)
            return
        cursor = current if start is None else start
        for obj in sorted(initial, key=_key):
            if request.matches(obj):
                yield {"type": "ADDED", "object": request.present(obj)}
        if request.initial_events_bookmark:
            yield _bookmark(request, cursor, {"k8s.io/initial-events-end": "true"})
        last_sent = time.monotonic()
        while not self._stopping.is_set() and alive():
            faults = self.faults()
            if GONE_410 in faults:
                yield _expired(cursor, self.resource_version)
                return
            if WATCH_DROP in faults:
                yield None
                return
            latest, events = self._next_events(request, cursor, deadline)
            if latest is None:
                yield _expired(cursor, self.resource_version)
                return
            if latest > cursor:
                cursor = latest
                for event in events:
                    if (out := _watch_event(request, event)) is not None:
                        yield out
                        last_sent = time.monotonic()
                continue
            now = time.monotonic()
            if request.bookmarks and (now >= deadline or now - last_sent >= self._bookmark_s):
                # Like a real server: bookmarks while idle, and one just before a timeout ends it.
                yield _bookmark(request, cursor)
                last_sent = now
            if now >= deadline:
                return

    def _next_events(
        self, request: _Request, cursor: int, deadline: float
    ) -> tuple[int | None, list[_Event]]:
        """The newest resourceVersion and the changes after ``cursor``, waiting up to one poll for
        some; ``(None, [])`` when ``cursor`` has been compacted away."""
        store = self._store
        with store.cond:
            if cursor < store.compacted:
                return None, []
            if store.rv <= cursor:
                store.cond.wait(max(0.0, min(deadline - time.monotonic(), self._poll_s)))
            if cursor < store.compacted:
                return None, []
            return store.rv, store.since(cursor, request.resource.name)


def _dump_without_nodes(scenario: Scenario) -> bool:
    """A cluster scenario (objects only, no node of its own) whose objects hold no Node."""
    return bool(scenario.raw_objects) and not scenario.node_name and not any(
        o.get("kind") == "Node" for o in scenario.raw_objects)


def _continue_token(rv: int, key: tuple[str, str]) -> str:
    return base64.urlsafe_b64encode(json.dumps([rv, *key]).encode()).decode()


def _parse_continue(token: str) -> tuple[int, tuple[str, str]]:
    try:
        rv, namespace, name = json.loads(base64.urlsafe_b64decode(token.encode()))
        return int(rv), (str(namespace), str(name))
    except (ValueError, TypeError):
        raise ApiError(400, "BadRequest", f"invalid continue token: {token[:40]!r}") from None


def _bookmark(request: _Request, rv: int, annotations: Mapping[str, str] | None = None) -> JSON:
    metadata: JSON = {"resourceVersion": str(rv)}
    if annotations:
        metadata["annotations"] = dict(annotations)
    return {
        "type": "BOOKMARK",
        "object": {"kind": request.resource.kind, "apiVersion": request.api_version, "metadata": metadata},
    }


def _expired(rv: int, current: int) -> JSON:
    return {
        "type": "ERROR",
        "object": ApiError(410, "Expired", f"too old resource version: {rv} ({current})").status(),
    }


def _watch_event(request: _Request, event: _Event) -> JSON | None:
    """The event as this watch sees it: an object that starts or stops matching its selectors
    is ADDED or DELETED for it, as on a real API server; None when the watch does not see it."""
    now = event.type != "DELETED" and request.matches(event.obj)
    before = event.prev is not None and request.matches(event.prev)
    if event.type == "ADDED":
        kind = "ADDED" if now else None
    elif event.type == "DELETED":
        kind = "DELETED" if before else None
    else:
        kind = ("MODIFIED" if before else "ADDED") if now else ("DELETED" if before else None)
    return None if kind is None else {"type": kind, "object": request.present(event.obj)}


def _resource_list(group_version: str, resources: list[_Resource]) -> JSON:
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": [
            {
                "name": r.name,
                "singularName": r.singular,
                "namespaced": r.namespaced,
                "kind": r.kind,
                "verbs": list(_VERBS),
            }
            for r in resources
        ],
    }


def _not_found(request: _Request | None = None) -> ApiError:
    if request is None or not request.name:
        return ApiError(404, "NotFound", "the server could not find the requested resource")
    return ApiError(
        404,
        "NotFound",
        f'{request.resource.qualified()} "{request.name}" not found',
        {"name": request.name, "group": request.resource.group, "kind": request.resource.name},
    )


class _QuietServer(ThreadingHTTPServer):
    """Clients that hang up mid-answer (a watch the exporter closes, a test's timeout) are
    normal here; http.server would print a traceback to stderr for each."""

    def handle_error(self, request: object, client_address: object) -> None:
        _log.debug("simulated API server: client %s went away", client_address, exc_info=True)


def _shutdown(httpd: ThreadingHTTPServer) -> None:
    """``httpd.shutdown()`` without waiting for its poll interval: a connection wakes the loop."""
    stopper = threading.Thread(target=httpd.shutdown, name="sim-apiserver-shutdown", daemon=True)
    stopper.start()
    while stopper.is_alive():
        with contextlib.suppress(OSError):
            socket.create_connection(("127.0.0.1", httpd.server_address[1]), timeout=1).close()
        stopper.join(0.01)
    httpd.server_close()


def _cut(conn: socket.socket) -> None:
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_RDWR)


# --- requests -------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Request:
    """A parsed resource request: ``GET /apis/resource.k8s.io/v1/namespaces/ns/resourceclaims/x``."""

    resource: _Resource
    version: str
    """The resource.k8s.io version asked for; ``v1`` for core."""
    namespace: str
    name: str
    watch: bool
    field_filter: Callable[[Mapping[str, Any]], bool]
    label_filter: Callable[[Mapping[str, Any]], bool]
    resource_version: int | None
    """Where a watch starts; None: from the current state."""
    timeout_s: float
    bookmarks: bool
    """``allowWatchBookmarks``: the watch gets BOOKMARK events with the current resourceVersion."""
    initial_events_bookmark: bool
    limit: int = 0
    """A list's page size (``limit``); 0: the whole list."""
    continue_token: str = ""

    @property
    def api_version(self) -> str:
        return f"{self.resource.group}/{self.version}" if self.resource.group else self.version

    @property
    def verb(self) -> str:
        return "watch" if self.watch else "get" if self.name else "list"

    def matches(self, obj: Mapping[str, Any]) -> bool:
        if self.resource.namespaced and self.namespace and _key(obj)[0] != self.namespace:
            return False
        if self.name and _key(obj)[1] != self.name:
            return False
        return self.field_filter(obj) and self.label_filter(obj)

    def present(self, obj: Mapping[str, Any]) -> JSON:
        out = convert(obj, self.version) if self.resource.group else dict(obj)
        out["apiVersion"] = self.api_version
        out["kind"] = self.resource.kind
        return out


_CORE_PATH = re.compile(r"/api/v1(?:/namespaces/(?P<ns>[^/]+))?/(?P<res>[^/]+)(?:/(?P<name>[^/]+))?")
_GROUP_PATH = re.compile(
    rf"/apis/{re.escape(GROUP)}/(?P<ver>[^/]+)(?:/namespaces/(?P<ns>[^/]+))?/(?P<res>[^/]+)(?:/(?P<name>[^/]+))?"
)
_CD_PATH = re.compile(
    rf"/apis/{re.escape(CD_GROUP)}/(?P<ver>[^/]+)(?:/namespaces/(?P<ns>[^/]+))?/(?P<res>[^/]+)"
    r"(?:/(?P<name>[^/]+))?"
)
_TRUE: Final = ("true", "1")


def parse_request(path: str, query: Mapping[str, list[str]], versions: Collection[str],
                  taint_rule_versions: Collection[str] = (), compute_domains: bool = False) -> _Request | None:
    """The resource request ``path`` names, or None when it is not one (discovery, unknown)."""
    m = _CORE_PATH.fullmatch(path)
    version, group = "v1", ""
    if m is None:
        m = _GROUP_PATH.fullmatch(path)
        group = GROUP
        if m is None and compute_domains:
            m, group = _CD_PATH.fullmatch(path), CD_GROUP
        if m is None:
            return None
        version = m["ver"]
        served = (taint_rule_versions if m["res"] == "devicetaintrules" else
                  (CD_VERSION,) if group == CD_GROUP else versions)
        if version not in served:
            raise _not_found()
    resource = RESOURCES.get(m["res"])
    if resource is None or resource.group != group:
        raise _not_found()
    if m["ns"] and not resource.namespaced:
        raise _not_found()

    def arg(name: str) -> str:
        return (query.get(name) or [""])[-1]

    watch = arg("watch").lower() in _TRUE
    if watch and m["name"]:
        raise ApiError(
            405, "MethodNotAllowed", "watch of a single object: use a fieldSelector on metadata.name"
        )
    rv_text = arg("resourceVersion")
    rv: int | None = None
    if watch and rv_text not in ("", "0"):
        if not rv_text.isdigit():
            raise ApiError(400, "BadRequest", f"invalid resource version: {rv_text!r}")
        rv = int(rv_text)
    timeout = arg("timeoutSeconds")
    if timeout and not timeout.isdigit():
        raise ApiError(400, "BadRequest", f"invalid timeoutSeconds: {timeout!r}")
    send_initial = arg("sendInitialEvents").lower() in _TRUE
    return _Request(
        resource=resource,
        version=version,
        namespace=m["ns"] or "",
        name=m["name"] or "",
        watch=watch,
        field_filter=parse_field_selector(arg("fieldSelector"), resource),
        label_filter=parse_label_selector(arg("labelSelector")),
        resource_version=None if send_initial else rv,
        timeout_s=float(timeout) if timeout and int(timeout) > 0 else DEFAULT_WATCH_TIMEOUT_S,
        bookmarks=arg("allowWatchBookmarks").lower() in _TRUE,
        initial_events_bookmark=send_initial and arg("allowWatchBookmarks").lower() in _TRUE,
        limit=int(arg("limit")) if arg("limit").isdigit() else 0,
        continue_token=arg("continue"),
    )


class _Handler(BaseHTTPRequestHandler):
    """One connection; HTTP/1.1 so clients keep connections and watches stream chunked."""

    protocol_version = "HTTP/1.1"
    api: SimulatedApiServer
    server_version = "sim-kube-apiserver"

    def setup(self) -> None:
        super().setup()
        # Headers and body go out as separate writes; without this, Nagle's algorithm and the
        # client's delayed ACK add ~40 ms to every answer on a kept-alive connection.
        with contextlib.suppress(OSError):
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.api._track(self.connection, True)

    def finish(self) -> None:
        with contextlib.suppress(OSError):
            super().finish()
        self.api._track(self.connection, False)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        _log.debug("simulated API server: " + format, *args)

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        parts = urlsplit(self.path)
        path = parts.path.rstrip("/") or "/"
        try:
            request = parse_request(path, parse_qs(parts.query), self.api.versions, self.api.taint_rule_versions,
                                    self.api.compute_domains)
        except ApiError as e:
            self.api._count("get", "unknown")
            self._fail(e)
            return
        self.api._count(
            request.verb if request else "get",
            request.resource.name if request else "version" if path == "/version" else "discovery",
        )
        try:
            self._before_answer()
            if request is not None and request.resource.name in self.api.forbidden:
                raise ApiError(403, "Forbidden", f'{request.resource.name} is forbidden: User "simulated" cannot '
                               f'{request.verb} resource "{request.resource.name}" in API group '
                               f'"{request.resource.group}" at the cluster scope')
            if request is None:
                self._json(200, self.api.discovery(path))
            elif request.watch:
                self._stream(self.api.watch(request, request.timeout_s, self._peer_open))
            elif request.name:
                self._json(200, self.api.get(request))
            else:
                self._json(200, self.api.list_objects(request))
        except ApiError as e:
            self._fail(e)
        except OSError:  # the client went away, or the server cut the connection (a fault)
            self.close_connection = True

    def _refuse(self) -> None:
        self.close_connection = True  # the request body stays unread; the connection cannot be reused
        self._fail(ApiError(405, "MethodNotAllowed", "the simulated API server is read-only"))

    do_POST = do_PUT = do_PATCH = do_DELETE = _refuse  # noqa: N815

    def _before_answer(self) -> None:
        delay = self.api._slow_seconds()
        if delay > 0:
            self.api._stopping.wait(delay)
        if ERROR in self.api.faults():
            raise ApiError(500, "InternalError", "simulated API server error (apiserver_error fault)")

    def _fail(self, error: ApiError) -> None:
        self._json(error.code, error.status())

    def _json(self, code: int, body: JSON) -> None:
        data = json.dumps(body, separators=(",", ":")).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _peer_open(self) -> bool:
        """False once the client has closed its end (readable, with nothing left to read)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return not readable or bool(self.connection.recv(1, socket.MSG_PEEK))
        except (OSError, ValueError):
            return False

    def _stream(self, events: Iterator[JSON | None]) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.wfile.flush()
        for event in events:
            if event is None:
                # Cut, not closed: no terminating chunk, as when a connection breaks.
                self.close_connection = True
                self.wfile.flush()
                _cut(self.connection)
                return
            data = json.dumps(event, separators=(",", ":")).encode() + b"\n"
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
