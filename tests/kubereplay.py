"""Replaying what the simulator serves into the real kube-apiserver, object by object.

The simulated API server serves a scenario's objects as one would find them in a cluster; a real server
must accept every one of them. ``replay(kube, label, objects)`` creates them in the real control plane
(``kubetestbed.ControlPlane``) the way their controllers would have: spec first, then the status through
the status subresource (a create drops a claim's or a pod's status), owners before what they own. Each
scenario gets its own names so that several share one control plane: namespaces, Nodes and cluster-scoped
objects are prefixed, and every reference to them (node names, pools named after nodes, device classes,
owner references, ``reservedFor``) follows. UIDs are the server's: a reference by UID is mapped to the
UID the server gave the replayed owner, and one that names no replayed object is a dangling owner, which
the garbage collector deletes (counted as refused).

The outcome (``Replay``) says per object: accepted, refused with the server's message, or skipped with
why (a kind the server does not serve, such as ComputeDomain without its CRDs). ``delete`` removes what a
replay made, so later tests see a clean cluster.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from kubetestbed import ControlPlane, ControlPlaneError, collection_path, object_path

from dra_exporter_sim.admission import CLUSTER_SCOPED
from dra_exporter_sim.dump import as_json

JSON = dict[str, Any]

# Created first: what others name (classes by name, owners by UID).
_ORDER = ("Namespace", "Node", "DeviceClass", "ResourceSlice", "Pod", "ResourceClaim", "DeviceTaintRule",
          "ComputeDomain", "ComputeDomainClique")
#: metadata the server owns: a create ignores or refuses it.
_SERVER_METADATA = ("uid", "resourceVersion", "creationTimestamp", "generation", "managedFields", "selfLink",
                    "deletionTimestamp", "deletionGracePeriodSeconds")
#: Requests in flight at once (creating the objects of one kind, deleting).
_PARALLEL = 6
#: Kinds whose defaults the exporter may read: the simulator serves them as the server stores them.
_DEFAULTS_CHECKED = ("ResourceSlice", "ResourceClaim", "DeviceClass", "DeviceTaintRule")
_WITH_STATUS = ("ResourceClaim", "Pod", "ComputeDomain", "ComputeDomainClique", "DeviceTaintRule")
#: How long the garbage collector may take to delete an object whose owner does not exist.
GC_TIMEOUT = 30.0
_CRD_GROUPS = {"ComputeDomain": "resource.nvidia.com", "ComputeDomainClique": "resource.nvidia.com"}


@dataclass(frozen=True)
class Outcome:
    kind: str
    name: str
    """``namespace/name`` as the source has it (before renaming)."""
    status: str
    """``accepted``, ``refused`` or ``skipped``."""
    reason: str = ""


@dataclass
class Replay:
    label: str
    outcomes: list[Outcome] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """What the replay left out, and why."""
    dropped: dict[str, list[str]] = field(default_factory=dict)
    """Object → the fields it was sent with that the server did not keep (cleared, or gated off)."""
    defaulted: dict[str, list[str]] = field(default_factory=dict)
    """Object → the spec fields the server filled in (defaults) that the source did not have."""
    created: list[str] = field(default_factory=list)
    """API paths of what was created, in creation order (for ``delete``)."""
    finalized: set[str] = field(default_factory=set)
    """Those of them with finalizers (for ``delete``: no controller of a replay removes them)."""

    def of(self, status: str) -> list[Outcome]:
        return [o for o in self.outcomes if o.status == status]

    def row(self) -> str:
        """One line of the replay table: source | accepted | refused (reasons) | skipped (why)."""
        refused = "; ".join(f"{o.kind} {o.name}: {o.reason}" for o in self.of("refused")) or "0"
        skipped = {}
        for o in self.of("skipped"):
            skipped.setdefault(o.reason, []).append(o.kind)
        skips = "; ".join(f"{len(kinds)} {'/'.join(sorted(set(kinds)))} ({why})" for why, kinds in skipped.items())
        accepted = len(self.of("accepted"))
        n_refused = len(self.of("refused"))
        return (f"| {self.label} | {accepted} | {n_refused}{'' if not n_refused else ': ' + refused} "
                f"| {skips or '-'} |")


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def _where(obj: Mapping[str, Any]) -> str:
    meta = _meta(obj)
    return "/".join(str(p) for p in (meta.get("namespace"), meta.get("name")) if p)


class _Names:
    """How one replay renames what several replays would otherwise share."""

    def __init__(self, prefix: str, objects: list[JSON]) -> None:
        self.prefix = prefix
        nodes = {str(_meta(o).get("name")) for o in objects if o.get("kind") == "Node"}
        for o in objects:
            spec = o.get("spec") if isinstance(o.get("spec"), Mapping) else {}
            if o.get("kind") in ("ResourceSlice", "Pod") and isinstance(spec.get("nodeName"), str) and spec["nodeName"]:
                nodes.add(spec["nodeName"])
            for ref in _meta(o).get("ownerReferences") or ():
                if isinstance(ref, Mapping) and ref.get("kind") == "Node" and ref.get("name"):
                    nodes.add(str(ref["name"]))
        self.nodes = {n: f"{prefix}-{n}" for n in sorted(nodes)}
        classes = {str(_meta(o).get("name")) for o in objects if o.get("kind") == "DeviceClass"}
        self.classes = {c: f"{prefix}-{c}" for c in classes}

    def namespace(self, ns: str) -> str:
        return f"{self.prefix}-{ns}"

    def cluster_scoped(self, name: str) -> str:
        return f"{self.prefix}-{name}"

    def node(self, name: str) -> str:
        return self.nodes.get(name, name)

    def pool(self, name: str) -> str:
        return self.nodes.get(name, name)

    def device_class(self, name: str) -> str:
        return self.classes.get(name, name)


def _rename(obj: JSON, names: _Names) -> JSON:
    """``obj`` with the replay's names (see ``_Names``), without the metadata the server owns."""
    out = copy.deepcopy(obj)
    meta = out.setdefault("metadata", {})
    for key in _SERVER_METADATA:
        meta.pop(key, None)
    kind = out.get("kind")
    if kind == "Node":
        meta["name"] = names.node(meta["name"])
    elif kind == "Namespace":
        meta["name"] = names.namespace(meta["name"])
    elif kind in CLUSTER_SCOPED:
        meta["name"] = (names.device_class(meta["name"]) if kind == "DeviceClass"
                        else names.cluster_scoped(meta["name"]))
    if meta.get("namespace"):
        meta["namespace"] = names.namespace(meta["namespace"])
    spec = out.get("spec")
    if not isinstance(spec, dict):
        return out
    if kind in ("ResourceSlice", "Pod") and spec.get("nodeName"):
        spec["nodeName"] = names.node(spec["nodeName"])
    if kind == "ResourceSlice" and isinstance(spec.get("pool"), dict) and spec["pool"].get("name"):
        spec["pool"]["name"] = names.pool(spec["pool"]["name"])
    if kind == "Pod" and isinstance(spec.get("nodeSelector"), dict):
        host = spec["nodeSelector"].get("kubernetes.io/hostname")
        if host:
            spec["nodeSelector"]["kubernetes.io/hostname"] = names.node(host)
    if kind == "ResourceClaim":
        _rename_claim(out, names)
    if kind == "DeviceTaintRule":
        selector = spec.get("deviceSelector")
        if isinstance(selector, dict):
            if selector.get("pool"):
                selector["pool"] = names.pool(selector["pool"])
            if selector.get("deviceClassName"):
                selector["deviceClassName"] = names.device_class(selector["deviceClassName"])
    return out


def _rename_claim(claim: JSON, names: _Names) -> None:
    for request in ((claim.get("spec") or {}).get("devices") or {}).get("requests") or ():
        for holder in (request, request.get("exactly") or {}, *(request.get("firstAvailable") or ())):
            if isinstance(holder, dict) and holder.get("deviceClassName"):
                holder["deviceClassName"] = names.device_class(holder["deviceClassName"])
    status = claim.get("status") if isinstance(claim.get("status"), dict) else {}
    allocation = status.get("allocation") or {}
    for result in (allocation.get("devices") or {}).get("results") or ():
        if result.get("pool"):
            result["pool"] = names.pool(result["pool"])
    for entry in status.get("devices") or ():
        if entry.get("pool"):
            entry["pool"] = names.pool(entry["pool"])
    for term in ((allocation.get("nodeSelector") or {}).get("nodeSelectorTerms")) or ():
        for match in (*(term.get("matchFields") or ()), *(term.get("matchExpressions") or ())):
            if match.get("key") in ("metadata.name", "kubernetes.io/hostname"):
                match["values"] = [names.node(v) for v in match.get("values") or ()]


def _served_kinds(kube: ControlPlane) -> set[str]:
    """The CRD-served kinds this server serves now (ComputeDomain where its CRD is installed)."""
    status, groups = kube.request("GET", "/apis")
    served = {g.get("name") for g in (groups or {}).get("groups", [])} if status == 200 else set()
    return {kind for kind, group in _CRD_GROUPS.items() if group in served}


def _ensure_namespace(kube: ControlPlane, name: str, labels: Mapping[str, str]) -> None:
    kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": dict(labels)}})
    # Pods are refused until the namespace's default ServiceAccount exists.
    kube.wait_for(lambda: kube.request("GET", f"/api/v1/namespaces/{name}/serviceaccounts/default")[0] == 200,
                  f"the default ServiceAccount of {name}")


def _node(kube: ControlPlane, name: str, labels: Mapping[str, str]) -> dict[str, Any]:
    """A Node made Ready by the harness, then cordoned: no other test's pod lands on a replay's node."""
    kube.ready_node(name, labels)
    status, body = kube.request("PATCH", f"/api/v1/nodes/{name}", {"spec": {"unschedulable": True}},
                                content_type="application/merge-patch+json")
    if status != 200:
        raise ControlPlaneError(f"cordon {name}: {status} {body}")
    return dict(body)


def replay(kube: ControlPlane, label: str, objects: Iterable[Mapping[str, Any]], prefix: str) -> Replay:
    """Create ``objects`` (what the simulator serves for ``label``) in the real server; see the module."""
    source = [as_json(dict(o)) for o in objects]
    names = _Names(prefix, source)
    result = Replay(label)
    served_crds = _served_kinds(kube)
    # (kind, namespace, name, uid as the source has it) → the UID the server gave it.
    uids: dict[tuple[str, str, str, str], str] = {}
    orphans: list[tuple[str, str, str, str]] = []

    # Namespaces: as the simulator describes them (labels), else plain.
    described = {str(_meta(o).get("name")): o for o in source if o.get("kind") == "Namespace"}
    used = sorted({str(_meta(o)["namespace"]) for o in source if _meta(o).get("namespace")} | set(described))
    for ns in used:
        labels = _meta(described.get(ns, {})).get("labels") or {}
        _ensure_namespace(kube, names.namespace(ns), labels)
        result.created.append(f"/api/v1/namespaces/{names.namespace(ns)}")
        if ns in described:
            result.outcomes.append(Outcome("Namespace", ns, "accepted"))
    # Nodes: every node an object names, described or not.
    described_nodes = {str(_meta(o).get("name")): o for o in source if o.get("kind") == "Node"}
    for node, renamed in names.nodes.items():
        labels = {k: (names.node(v) if k == "kubernetes.io/hostname" else v)
                  for k, v in (_meta(described_nodes.get(node, {})).get("labels") or {}).items()}
        body = _node(kube, renamed, labels)
        old_uid = _meta(described_nodes.get(node, {})).get("uid") or "*"
        uids[("Node", "", node, str(old_uid))] = body["metadata"]["uid"]
        result.created.append(f"/api/v1/nodes/{renamed}")
        if node in described_nodes:
            result.outcomes.append(Outcome("Node", node, "accepted"))

    rest = [o for o in source if o.get("kind") not in ("Namespace", "Node")]
    node_uids = {n: str(_meta(o).get("uid") or "") for n, o in described_nodes.items()}

    def one(obj: JSON) -> _Step:
        kind, where = str(obj.get("kind")), _where(obj)
        step = _Step(kind, where)
        if kind in _CRD_GROUPS and kind not in served_crds:
            step.outcome = Outcome(kind, where, "skipped", "CRD not installed")
            return step
        renamed = _rename(obj, names)
        dangling = _owners(renamed, obj, names, uids, node_uids)
        status_part = renamed.pop("status", None)
        code, body = kube.request("POST", collection_path(renamed), renamed)
        if code not in (200, 201):
            # In the source's names: the server's message names the replay's.
            step.outcome = Outcome(kind, where, "refused", f"{code} {_message(body).replace(prefix + '-', '')}")
            return step
        created = dict(body)
        step.path, step.finalized = object_path(created), bool(_meta(created).get("finalizers"))
        old_uid = _meta(obj).get("uid")
        if old_uid:
            uids[(kind, str(_meta(obj).get("namespace") or ""), str(_meta(obj).get("name")), str(old_uid))] = \
                created["metadata"]["uid"]
        stored = created
        if status_part and kind in _WITH_STATUS:
            step.notes = [f"{kind} {where}: status.reservedFor pod {pod} is not in the source (not replayed: "
                          "the resourceclaim controller removes it)"
                          for pod in _map_reserved_for(status_part, uids, _meta(obj).get("namespace"))]
            refusal, stored = _put_status(kube, created, status_part)
            if refusal:
                step.outcome = Outcome(kind, where, "refused", f"status: {refusal.replace(prefix + '-', '')}")
                return step
        sent = {**renamed, "status": status_part} if status_part else renamed
        step.dropped = _dropped(sent, stored)
        if kind in _DEFAULTS_CHECKED:
            step.defaulted = _dropped(stored.get("spec"), sent.get("spec"), "spec")
        if dangling:
            step.orphan = dangling
        else:
            step.outcome = Outcome(kind, where, "accepted")
        return step

    # Kind by kind (owners first), the objects of one kind at once: the server answers several requests
    # in the time of one TLS handshake.
    with ThreadPoolExecutor(max_workers=_PARALLEL) as pool:
        for kind in (*_ORDER, *sorted({str(o.get("kind")) for o in rest} - set(_ORDER))):
            for step in pool.map(one, [o for o in rest if o.get("kind") == kind]):
                if step.path:
                    result.created.append(step.path)
                    if step.finalized:
                        result.finalized.add(step.path)
                result.notes += step.notes
                if step.dropped:
                    result.dropped[f"{step.kind} {step.where}"] = step.dropped
                if step.defaulted:
                    result.defaulted[f"{step.kind} {step.where}"] = step.defaulted
                if step.outcome:
                    result.outcomes.append(step.outcome)
                if step.orphan and step.path:
                    orphans.append((step.kind, step.where, step.path, step.orphan))
    # The garbage collector deletes what an owner reference ties to no object: refused, a little later.
    for kind, where, path, why in orphans:
        gone = wait_gone(kube, path, GC_TIMEOUT)
        result.outcomes.append(Outcome(kind, where, "refused" if gone else "accepted",
                                       f"deleted by the garbage collector: {why}" if gone else ""))
    return result


@dataclass
class _Step:
    """What replaying one object did."""

    kind: str
    where: str
    outcome: Outcome | None = None
    path: str = ""
    finalized: bool = False
    notes: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    defaulted: list[str] = field(default_factory=list)
    orphan: str = ""


def _owners(renamed: JSON, source: Mapping[str, Any], names: _Names,
            uids: Mapping[tuple[str, str, str, str], str], described_nodes: Mapping[str, str]) -> str:
    """Point ``renamed``'s owner references at the replayed owners; the reason when one names none.

    ``described_nodes``: node name → UID of the Nodes the source holds; a Node the source does not hold
    (a dump of slices, claims and pods) is the one the replay made by that name."""
    refs = _meta(renamed).get("ownerReferences") or []
    ns = str(_meta(source).get("namespace") or "")
    for i, ref in enumerate(refs):
        kind, name, uid = str(ref.get("kind")), str(ref.get("name")), str(ref.get("uid"))
        owner_ns = "" if kind in CLUSTER_SCOPED else ns
        new = uids.get((kind, owner_ns, name, uid))
        if kind == "Node" and name not in described_nodes:
            new = uids.get(("Node", "", name, "*"))
        if new is None:
            return f"metadata.ownerReferences[{i}]: {kind} {name} uid {uid} does not exist"
        if kind == "Node":
            ref["name"] = names.node(name)
        ref["uid"] = new
    return ""


def _map_reserved_for(status: JSON, uids: Mapping[tuple[str, str, str, str], str], namespace: Any) -> list[str]:
    """Point ``reservedFor`` at the replayed pods; entries for pods the source does not hold are left out
    (the resourceclaim controller removes them at once) and returned."""
    kept, left_out = [], []
    for ref in status.get("reservedFor") or ():
        if isinstance(ref, dict) and ref.get("resource") == "pods":
            new = uids.get(("Pod", str(namespace or ""), str(ref.get("name")), str(ref.get("uid"))))
            if new is None:
                left_out.append(str(ref.get("name")))
                continue
            ref["uid"] = new
        kept.append(ref)
    if "reservedFor" in status:
        status["reservedFor"] = kept or None
    return left_out


def _put_status(kube: ControlPlane, created: JSON, status: JSON) -> tuple[str, JSON]:
    """Replace the object's status (as its controller would): the server's message on refusal, and the
    object as stored."""
    body = copy.deepcopy(created)
    body["status"] = status
    code, answer = kube.request("PUT", object_path(created) + "/status", body)
    return ("", dict(answer)) if code == 200 else (f"{code} {_message(answer)}", created)


def _dropped(sent: Any, stored: Any, path: str = "") -> list[str]:
    """Paths of ``sent`` that ``stored`` lacks (what the server dropped); values it changed are not
    listed (names and UIDs are the replay's, quantities are normalised)."""
    if isinstance(sent, Mapping):
        if not isinstance(stored, Mapping):
            return [path or "."]
        out = []
        for key, value in sent.items():
            if key in ("metadata",) and not path:
                value = {k: v for k, v in value.items() if k in ("labels", "annotations", "finalizers")}
            sub = f"{path}.{key}" if path else str(key)
            if key not in stored:
                if value not in (None, [], {}, ""):
                    out.append(sub)
                continue
            out += _dropped(value, stored[key], sub)
        return out
    if isinstance(sent, list) and isinstance(stored, list):
        out = []
        for i, value in enumerate(sent):
            if i >= len(stored):
                out.append(f"{path}[{i}]")
                continue
            out += _dropped(value, stored[i], f"{path}[{i}]")
        return out
    return []


def _message(body: Any) -> str:
    return str(body.get("message", body)) if isinstance(body, dict) else str(body)


def delete(kube: ControlPlane, result: Replay) -> None:
    """Remove what ``result`` created, newest first: claims lose their finalizers (no controller of a
    replay removes them), pods go at once (no kubelet confirms), namespaces last."""
    def remove(path: str) -> None:
        if path in result.finalized:
            kube.request("PATCH", path, {"metadata": {"finalizers": None}},
                         content_type="application/merge-patch+json")
        kube.request("DELETE", path + ("?gracePeriodSeconds=0" if "/pods/" in path else ""))

    # Namespaced objects first, then what they were in or on (the order matters to no server, only to
    # what a test listing the cluster meanwhile would see).
    last = [p for p in result.created if p.startswith(("/api/v1/namespaces/", "/api/v1/nodes/")) and p.count("/") == 4]
    with ThreadPoolExecutor(max_workers=_PARALLEL) as pool:
        list(pool.map(remove, [p for p in reversed(result.created) if p not in last]))
        list(pool.map(remove, last))


def wait_gone(kube: ControlPlane, path: str, timeout: float) -> bool:
    """Whether the object at ``path`` disappears within ``timeout`` seconds (the garbage collector)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if kube.request("GET", path)[0] == 404:
            return True
        time.sleep(0.2)
    return False


def table(replays: Iterable[Replay]) -> str:
    lines = ["| scenario or dump | accepted | refused (reasons) | skipped |", "|---|---|---|---|"]
    lines += [r.row() for r in replays]
    return "\n".join(lines)
