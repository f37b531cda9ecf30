"""Source: the DRA objects of the whole cluster, for ``dra-exporter cluster``.

Contract: ``ClusterSource.collect()`` returns a ``model.ClusterState`` (every ResourceSlice, claim,
DeviceClass and DeviceTaintRule, and the pods that reference claims) and raises ``SourceError`` when
there is no API access; the runner keeps the last good state during an outage, as for the node agent.

What it asks the API server: discovery (``GET /apis/resource.k8s.io``, the node agent's choice of
v1, v1beta2, v1beta1), then one list and one watch per kind (core/v1 pods too: a claim is pending
only while a pod waits for it), cluster-wide, with the node agent's
reflector (``kubeapi.Reflector``: resume from the last resourceVersion, bookmarks, list again on
410, backoff, bounded answers). Lists are paged (``LIST_PAGE``), so a 5,000-node cluster's slices
never sit in memory as one JSON document. DeviceTaintRules are read in the first of v1, v1beta2,
v1alpha3 that serves them, or left out with a log line. Never polling: after the lists, the load
is one watch per kind every 5-10 minutes. Pods are asked for without those that ended
(``status.phase`` neither Succeeded nor Failed), so completed jobs cost nothing.

What it keeps: each object normalised by ``kubeapi_normalize`` (the one reader) and trimmed to what
the capacity families read — claims lose their device statuses, tolerations and all but one
``reservedFor`` entry; pods keep their namespace, name, creation, the claims they reference and whether
they are being deleted, and a pod that references no claim is not kept at all; repeated strings
(attribute names and values, drivers, pools, namespaces) are interned, so 40,000 GPUs of a few models
share their text.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any, Final

from kubernetes import client as k8s

from .. import model
from ..dra_versions import GROUP
from . import SourceError
from . import kubeapi_http as http
from .kubeapi import discover, load_client, taint_rule_version
from .kubeapi_normalize import (
    claim_from_dict,
    cluster_pod_from_dict,
    device_class_from_dict,
    slice_from_dict,
    taint_rule_from_dict,
)
from .reflector import Reflector, Timeouts, close_watches

SOURCE: Final = "kubeapi"
#: Objects per list page (client-go's pager uses 500).
LIST_PAGE: Final = 500
#: Pods that can still wait for a claim; the server drops a pod from the watch once it ends.
PODS_NOT_ENDED: Final = "status.phase!=Succeeded,status.phase!=Failed"
RBAC_HINT: Final = ("the cluster mode needs list and watch on resourceslices, resourceclaims, deviceclasses and "
                    "devicetaintrules (resource.k8s.io) and on pods")


def _intern_pairs(pairs: tuple[tuple[str, Any], ...]) -> tuple[tuple[str, Any], ...]:
    return tuple((sys.intern(k), sys.intern(v) if isinstance(v, str) else v) for k, v in pairs)


def slim_slice(sl: model.ResourceSliceInfo) -> model.ResourceSliceInfo:
    """A slice with its repeated strings interned (values that are unique, like UUIDs, cost nothing more)."""
    devices = tuple(replace(d, name=sys.intern(d.name), attributes=_intern_pairs(d.attributes),
                            attribute_kinds=_intern_pairs(d.attribute_kinds), capacity=_intern_pairs(d.capacity))
                    for d in sl.devices)
    return replace(sl, driver=sys.intern(sl.driver), pool=sys.intern(sl.pool), node_name=sys.intern(sl.node_name),
                   devices=devices)


def slim_claim(claim: model.ClaimInfo) -> model.ClaimInfo:
    """What the claim families read: results' devices, whether a pod reserves it, its requests."""
    return replace(
        claim, namespace=sys.intern(claim.namespace), uid="", devices=(), reserved_for=claim.reserved_for[:1],
        results=tuple(model.AllocationResult(sys.intern(r.request), sys.intern(r.driver), sys.intern(r.pool),
                                             r.device, r.admin_access) for r in claim.results))


def slim_pod(obj: Mapping[str, Any]) -> model.ClusterPod | None:
    """A pod that references claims, with its namespace interned; None (not kept) for any other."""
    pod = cluster_pod_from_dict(obj)
    return replace(pod, namespace=sys.intern(pod.namespace)) if pod.claims else None


class ClusterSource:
    """Cluster-wide list+watch of the DRA objects; see the module docstring."""

    name = SOURCE

    def __init__(self, *, client_factory: Callable[[], k8s.ApiClient] | None = None, kubeconfig: str | None = None,
                 timeouts: Timeouts = Timeouts(), page_size: int = LIST_PAGE,
                 logger: logging.Logger | None = None) -> None:
        self._client_factory = client_factory or (lambda: load_client(kubeconfig))
        self._timeouts = timeouts
        self._page_size = page_size
        self._log = logger or logging.getLogger(__name__)
        self.requests: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._client: k8s.ApiClient | None = None
        self.api_version: str | None = None
        self.served: tuple[str, ...] = ()
        self.taint_rule_version: str | None = None
        self._reflectors: dict[str, Reflector[Any]] = {}
        self._revision = 0
        self._revision_lock = threading.Lock()
        self._state: tuple[int, model.ClusterState] | None = None

    def collect(self) -> model.ClusterState:
        with self._lock:
            self._start()
            for reflector in self._reflectors.values():
                if reflector.error:
                    raise SourceError(reflector.error)
            return self._build()

    def close(self) -> None:
        self._stop.set()
        close_watches(self._reflectors.values(), self._client, self._log)

    # --- start -----------------------------------------------------------------------------------

    def _start(self) -> None:
        if self._client is None:
            self._client = self._client_factory()
        if self.api_version is None:
            self.requests["discover"] += 1
            self.served, self.api_version = discover(self._client, self._timeouts.request)
            self._log.info("kubeapi: reading %s/%s cluster-wide", GROUP, self.api_version)
        version = self.api_version
        kinds: list[tuple[str, str, Callable[[Mapping[str, Any]], Any], str | None]] = [
            ("resourceslices", http.slices_path(version), lambda o: slim_slice(slice_from_dict(o, version)), None),
            ("resourceclaims", f"{http.GROUP_PATH}/{version}/resourceclaims",
             lambda o: slim_claim(claim_from_dict(o, version)), None),
            ("deviceclasses", f"{http.GROUP_PATH}/{version}/deviceclasses", device_class_from_dict, None),
            ("pods", "/api/v1/pods", slim_pod, PODS_NOT_ENDED),
        ]
        for kind, path, normalize, selector in kinds:
            if kind not in self._reflectors:
                self._add(kind, path, normalize, selector)
        if "devicetaintrules" not in self._reflectors and self.taint_rule_version is None:
            self._start_taint_rules()

    def _add(self, kind: str, path: str, normalize: Callable[[Mapping[str, Any]], Any],
             field_selector: str | None = None) -> None:
        assert self._client is not None
        reflector: Reflector[Any] = Reflector(kind, self._client, path, field_selector, normalize, self._timeouts,
                                                self.requests, on_update=self._bump, page_size=self._page_size,
                                                rbac_hint=RBAC_HINT)
        reflector.list_once()  # here, so the first frame already has the whole cluster
        reflector.start(self._stop)
        self._reflectors[kind] = reflector

    def _start_taint_rules(self) -> None:
        assert self._client is not None
        try:
            version = taint_rule_version(self._client, self.served, self._timeouts, self.requests)
            if version is not None:
                self._add("devicetaintrules", http.taint_rules_path(version), taint_rule_from_dict)
                self.taint_rule_version = version
                return
            self._log.info("kubeapi: %s serves no DeviceTaintRules: only the slices' own taints are shown", GROUP)
        except SourceError as exc:
            self._log.warning("kubeapi: DeviceTaintRules not read: %s", str(exc).removeprefix("kubeapi: "))
        self.taint_rule_version = ""  # asked once; not again

    # --- state ---------------------------------------------------------------------------------------

    def _bump(self) -> None:
        with self._revision_lock:
            self._revision += 1

    def _build(self) -> model.ClusterState:
        revision = self._revision
        if self._state is not None and self._state[0] == revision:
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
        )
        self._state = (revision, state)
        return state
