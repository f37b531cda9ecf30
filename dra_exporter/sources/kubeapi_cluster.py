"""Source: the DRA objects of the whole cluster, for ``dra-exporter cluster``.

Contract: ``ClusterSource.collect()`` returns a ``model.ClusterState`` (every ResourceSlice, claim,
DeviceClass and DeviceTaintRule, and the pods that reference claims) and raises ``SourceError`` when
there is no API access; the runner keeps the last good state during an outage, as for the node agent.
When some kinds are read and others cannot be (a 403 on one), it raises ``PartialSnapshot`` with the
state of those read: they are shown, the source counts as down, and each failed kind is listed again
after its own backoff — one failed first list per cycle, so an API server that answers every list a
byte a second costs a cycle one request timeout. Each kind holds at most ``max_objects``
(``--max-objects``).

What it asks the API server: discovery (``GET /apis/resource.k8s.io``, the node agent's choice of
v1, v1beta2, v1beta1), then one list and one watch per kind (core/v1 pods too: a claim is pending
only while a pod waits for it; and core/v1 Nodes, for the scheduler's node filters: without access to
them the rest goes on, ``ClusterState.nodes`` None and one warning), cluster-wide, with the node agent's
reflector (``kubeapi.Reflector``: resume from the last resourceVersion, bookmarks, list again on
410, backoff, bounded answers). Lists are paged (``LIST_PAGE``), so a 5,000-node cluster's slices
never sit in memory as one JSON document. DeviceTaintRules are read in the first of v1, v1beta2,
v1alpha3 that serves them, or left out with a log line. Never polling: after the lists, the load
is one watch per kind every 5-10 minutes. Pods are asked for without those that ended
(``status.phase`` neither Succeeded nor Failed), so completed jobs cost nothing.

What it keeps: each object normalised by ``kubeapi_normalize`` (the one reader) and trimmed to what
the capacity families read — claims lose their device statuses, tolerations and all but one
``reservedFor`` entry; pods keep their namespace, name, creation, the claims they reference and whether
they are being deleted, and their node selector, required node affinity and tolerations (equal ones
shared between pods), and a pod that references no claim is not kept at all; Nodes keep their name,
labels, taints and ``unschedulable``; repeated strings
(attribute names and values, drivers, pools, namespaces) are interned, so 40,000 GPUs of a few models
share their text, and so are the pairs and tuples built from them (``SHARED``: an attribute and its
value, a device's kinds and capacities): a device of NVIDIA's slice kept 1.7 KB, now ~0.6 KB, and
an endless watch of eight-GPU slices stays within the chart's 768 MiB at the 50,000-slice cap
(was 882 MB: ``benchmarks/bench_hardening_iv.py``).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Final

from kubernetes import client as k8s

from .. import model
from ..backoff import Backoff
from ..dra_versions import GROUP
from . import PartialSnapshot, SourceError
from . import kubeapi_http as http
from .kubeapi import ApiServerSource, server_version
from .kubeapi_normalize import (
    claim_from_dict,
    cluster_node_from_dict,
    cluster_pod_from_dict,
    device_class_from_dict,
    slice_from_dict,
    taint_rule_from_dict,
)
from .reflector import Reflector, Timeouts, close_watches

SOURCE: Final = "kubeapi"
RBAC_HINT: Final = ("the cluster mode needs list and watch on resourceslices, resourceclaims, deviceclasses and "
                    "devicetaintrules (resource.k8s.io) and on pods and nodes")
#: What is lost while Nodes cannot be read (the cluster mode goes on without them).
NODES_UNKNOWN: Final = ("node filters unknown: a slice's node selector is taken as met and pods' node selectors, "
                        "affinity and node taints are not checked")
#: Distinct pod node filters shared between pods (pods of one template carry equal ones); past it a
#: pod keeps its own copy.
MAX_SHARED_FILTERS: Final = 10_000
#: Objects per list page (client-go's pager uses 500).
LIST_PAGE: Final = 500
#: Objects held per kind (``--max-objects``) by default: five times the slices of 5,000 nodes (two slices
#: a node: NVIDIA and another driver); at the cap an endless watch of one-GPU slices holds ~0.5 GB
#: (``benchmarks/bench_hostile_peers.py``). A cluster past it raises the limit.
MAX_OBJECTS: Final = 50_000
#: Claims and pods are many more (12 claims and 17 pods a node at 5,000 nodes: 60,000 and 85,000) and
#: each is a few hundred bytes as kept: their default cap is this many times ``MAX_OBJECTS``.
SMALL_KINDS: Final = ("resourceclaims", "pods")
SMALL_KIND_FACTOR: Final = 5
#: Pods that can still wait for a claim; the server drops a pod from the watch once it ends.
PODS_NOT_ENDED: Final = "status.phase!=Succeeded,status.phase!=Failed"


#: Distinct pairs and tuples ``SHARED`` holds before it starts again (~100 B each: ~7 MB). Past it
#: what was shared stays shared; values seen again are shared anew.
MAX_SHARED: Final = 65_536


class Shared:
    """One object for equal values: thousands of devices hold one ``("productName", "NVIDIA H100")``
    pair and one tuple of kinds instead of a copy each. Bounded: emptied when full (unique values,
    UUIDs, would otherwise fill it for ever)."""

    def __init__(self, limit: int = MAX_SHARED) -> None:
        self._limit = limit
        self._table: dict[Any, Any] = {}

    def __call__(self, value: Any) -> Any:
        found = self._table.get(value)
        if found is None:
            if len(self._table) >= self._limit:
                self._table.clear()
            found = self._table.setdefault(value, value)
        return found


SHARED: Final = Shared()


def _intern_pairs(pairs: tuple[tuple[str, Any], ...]) -> tuple[tuple[str, Any], ...]:
    interned = (SHARED((sys.intern(k), sys.intern(v) if isinstance(v, str) else v)) for k, v in pairs)
    shared: tuple[tuple[str, Any], ...] = SHARED(tuple(interned))
    return shared


def slim_slice(sl: model.ResourceSliceInfo) -> model.ResourceSliceInfo:
    """A slice with its repeated strings, pairs and tuples shared (values that are unique, like UUIDs,
    cost nothing more)."""
    devices = tuple(replace(d, name=sys.intern(d.name), attributes=_intern_pairs(d.attributes),
                            attribute_kinds=_intern_pairs(d.attribute_kinds), capacity=_intern_pairs(d.capacity))
                    for d in sl.devices)
    return replace(sl, driver=sys.intern(sl.driver), pool=sys.intern(sl.pool), node_name=sys.intern(sl.node_name),
                   devices=devices)


def slim_claim(claim: model.ClaimInfo) -> model.ClaimInfo:
    """What the claim families read: results' devices, whether a pod reserves it, its requests."""
    return replace(
        claim, namespace=sys.intern(claim.namespace), uid="", devices=(), reserved_for=claim.reserved_for[:1],
        # Shares of a device and what they consume are the allocator's (consumable capacity).
        results=tuple(model.AllocationResult(sys.intern(r.request), sys.intern(r.driver), sys.intern(r.pool),
                                             r.device, r.admin_access, r.share_id,
                                             consumed_capacity=r.consumed_capacity) for r in claim.results))


def slim_pod(obj: Mapping[str, Any], shared: dict[model.PodNodeFilters, model.PodNodeFilters] | None = None
             ) -> model.ClusterPod | None:
    """A pod that references claims, with its namespace interned and its node filters shared with
    the equal ones of other pods (``shared``); None (not kept) for any other."""
    pod = cluster_pod_from_dict(obj)
    if not pod.claims:
        return None
    filters = pod.node_filters
    if shared is not None and filters is not model.NO_NODE_FILTERS:
        filters = shared.get(filters) or (shared.setdefault(filters, filters) if len(shared) < MAX_SHARED_FILTERS
                                          else filters)
    return replace(pod, namespace=sys.intern(pod.namespace), node_filters=filters)


def slim_node(obj: Mapping[str, Any]) -> model.ClusterNode:
    """A Node's name, labels, taints and ``unschedulable``, its strings interned (5,000 nodes share a
    few label keys and values)."""
    node = cluster_node_from_dict(obj)
    return replace(node, name=sys.intern(node.name), labels=_intern_pairs(node.labels),
                   taints=tuple(model.DeviceTaint(sys.intern(t.key), sys.intern(t.value), sys.intern(t.effect))
                                for t in node.taints))


class ClusterSource(ApiServerSource):
    """Cluster-wide list+watch of the DRA objects; see the module docstring."""

    name = SOURCE

    def __init__(self, *, client_factory: Callable[[], k8s.ApiClient] | None = None, kubeconfig: str | None = None,
                 timeouts: Timeouts = Timeouts(), page_size: int = LIST_PAGE, max_objects: int | None = None,
                 logger: logging.Logger | None = None) -> None:
        super().__init__(client_factory=client_factory, kubeconfig=kubeconfig, timeouts=timeouts,
                         max_objects=MAX_OBJECTS if max_objects is None else max_objects, logger=logger)
        self._cap_given = max_objects is not None
        self._page_size = page_size
        self._reflectors: dict[str, Reflector[Any]] = {}
        self._failed: dict[str, tuple[Backoff, str]] = {}
        """Kinds whose first list failed: their backoff and why."""
        self._listing: Reflector[Any] | None = None
        """The reflector whose first list is in flight: ``close`` cuts it."""
        self._discovery_backoff = Backoff(*timeouts.backoff, monotonic=time.monotonic)
        self._discovery_error = ""
        self._revision = 0
        self._revision_lock = threading.Lock()
        self._state: tuple[int, model.ClusterState] | None = None
        self.server_version = ""
        """The API server's ``gitVersion``, read once at discovery; ``""`` when unknown."""
        self._shared_filters: dict[model.PodNodeFilters, model.PodNodeFilters] = {}
        self._nodes_backoff = Backoff(*timeouts.backoff, monotonic=time.monotonic)
        self._nodes_error = ""
        """Why the Nodes could not be listed last ("": they were, or not tried yet)."""

    def collect(self) -> model.ClusterState:
        """The state of every kind that could be read. Raises ``SourceError`` when none could (no
        access, the API server down) and ``PartialSnapshot`` with the state of those that could when
        some could not: a 403 on one kind leaves the others. A kind that failed is tried again
        after its own backoff, never on every cycle."""
        with self._lock:
            self._start()
            missing = [self._failed[kind][1] for kind in self._failed]
            errors = [r.error for r in self._reflectors.values() if r.error] + missing
            if not self._reflectors:
                raise SourceError(errors[0] if errors else "kubeapi: nothing listed yet")
            state = self._build()
            if errors:
                raise PartialSnapshot("; ".join(dict.fromkeys(errors)), state)
            return state

    def close(self) -> None:
        self._stop.set()
        close_watches([*self._reflectors.values(), self._listing], self._client, self._log)

    # --- start -----------------------------------------------------------------------------------

    def _start(self) -> None:
        if self.api_version is None and self._discovery_backoff.remaining():
            raise SourceError(self._discovery_error)
        try:
            client, discovered = self._connect()
        except SourceError as exc:
            self._discovery_backoff.failed()
            self._discovery_error = str(exc)
            raise
        if discovered:
            self._discovery_backoff.succeeded()
        version = self.api_version
        assert version is not None
        if discovered:
            self.requests["version"] += 1
            self.server_version = server_version(client, self._timeouts.request)
            self._log.info("kubeapi: reading %s/%s cluster-wide (API server %s)", GROUP, version,
                           self.server_version or "version unknown")
        kinds: list[tuple[str, str, Callable[[Mapping[str, Any]], Any], str | None]] = [
            ("resourceslices", http.slices_path(version), lambda o: slim_slice(slice_from_dict(o, version)), None),
            ("resourceclaims", f"{http.GROUP_PATH}/{version}/resourceclaims",
             lambda o: slim_claim(claim_from_dict(o, version)), None),
            ("deviceclasses", f"{http.GROUP_PATH}/{version}/deviceclasses", device_class_from_dict, None),
            ("pods", "/api/v1/pods", lambda o: slim_pod(o, self._shared_filters), PODS_NOT_ENDED),
        ]
        for kind, path, normalize, selector in kinds:
            # One failed first list per cycle: an API server that answers every list a byte a second
            # costs a cycle one request deadline, not one per kind; the next kind goes next cycle.
            if kind not in self._reflectors and not self._stop.is_set() and not self._try_add(kind, path, normalize,
                                                                                               selector):
                return
        if "devicetaintrules" not in self._reflectors and self.taint_rule_version is None:
            self._start_taint_rules()
        if "nodes" not in self._reflectors and not self._stop.is_set():
            self._start_nodes()

    def _try_add(self, kind: str, path: str, normalize: Callable[[Mapping[str, Any]], Any],
                 field_selector: str | None = None) -> bool:
        """List and watch ``kind``, unless its last failure's backoff is still running; False when
        the list was tried and failed."""
        backoff, _ = self._failed.get(kind, (None, ""))
        if backoff is not None and backoff.remaining():
            return True
        try:
            self._add(kind, path, normalize, field_selector)
        except SourceError as exc:
            # The first list's own backoff: one list per backoff period, not one per cycle.
            backoff = backoff or Backoff(*self._timeouts.backoff, monotonic=time.monotonic)
            backoff.failed()
            self._failed[kind] = (backoff, str(exc))
            return False
        self._failed.pop(kind, None)
        return True

    def _add(self, kind: str, path: str, normalize: Callable[[Mapping[str, Any]], Any],
             field_selector: str | None = None) -> None:
        assert self._client is not None
        reflector: Reflector[Any] = Reflector(kind, self._client, path, field_selector, normalize, self._timeouts,
                                                self.requests, on_update=self._bump, page_size=self._page_size,
                                                max_objects=self._cap(kind), rbac_hint=RBAC_HINT)
        self._listing = reflector
        try:
            reflector.list_once(self._stop)  # here, so the first frame already has the whole cluster
        finally:
            self._listing = None
        reflector.start(self._stop)
        self._reflectors[kind] = reflector

    def _cap(self, kind: str) -> int:
        """Objects ``kind`` may hold: ``--max-objects`` for every kind when given, else its default."""
        small = kind in SMALL_KINDS and not self._cap_given
        return self._max_objects * SMALL_KIND_FACTOR if small else self._max_objects

    def _start_taint_rules(self) -> None:
        assert self._client is not None
        try:
            version = self._taint_rule_version()
            if version is not None:
                self._add("devicetaintrules", http.taint_rules_path(version), taint_rule_from_dict)
                self.taint_rule_version = version
                return
            self._log.info("kubeapi: %s serves no DeviceTaintRules: only the slices' own taints are shown", GROUP)
        except SourceError as exc:
            self._log.warning("kubeapi: DeviceTaintRules not read: %s", str(exc).removeprefix("kubeapi: "))
        self.taint_rule_version = ""  # asked once; not again

    def _start_nodes(self) -> None:
        """List and watch Nodes. Without them (a ClusterRole of an older chart: 403) the cluster mode
        goes on, its node filters unknown (``ClusterState.nodes`` None): one warning, a new list
        after each backoff."""
        if self._nodes_backoff.remaining():
            return
        try:
            self._add("nodes", "/api/v1/nodes", slim_node)
        except SourceError as exc:
            self._nodes_backoff.failed()
            error = str(exc).removeprefix("kubeapi: ")
            if error != self._nodes_error:
                self._log.warning("kubeapi: Nodes not read (%s): %s", error, NODES_UNKNOWN)
            self._nodes_error = error
            return
        self._nodes_backoff.succeeded()
        if self._nodes_error:
            self._log.info("kubeapi: Nodes read: node filters known again")
        self._nodes_error = ""

    # --- state ---------------------------------------------------------------------------------------

    def _bump(self) -> None:
        with self._revision_lock:
            self._revision += 1

    def _build(self) -> model.ClusterState:
        revision = self._revision
        unread = tuple((kind, why) for kind, (_, why) in sorted(self._failed.items()))
        if self._state is not None and self._state[0] == revision and self._state[1].unread == unread:
            return self._state[1]  # nothing changed: the same object, so the core reuses its work

        def items(kind: str, key: Callable[[Any], Any]) -> tuple[Any, ...]:
            reflector = self._reflectors.get(kind)
            return tuple(sorted(reflector.snapshot(), key=key)) if reflector else ()

        state = model.ClusterState(
            api_version=self.api_version or "",
            slices=items("resourceslices", lambda s: (s.driver, s.pool, s.name)),
            claims=items("resourceclaims", lambda c: (c.namespace, c.name)),
            classes=items("deviceclasses", lambda c: c.name),
            taint_rules=items("devicetaintrules", lambda r: r.name),
            pods=items("pods", lambda p: (p.namespace, p.name)),
            unread=unread,
            server_version=self.server_version,
            nodes=items("nodes", lambda n: n.name) if "nodes" in self._reflectors else None,
        )
        self._state = (revision, state)
        return state
