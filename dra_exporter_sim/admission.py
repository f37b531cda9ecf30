"""What a real API server refuses, checked when a cluster dump is loaded: the simulator serves nothing
that a real cluster would not hold.

Replaying every dump into a real kube-apiserver (tests/test_testbed_replay.py) found these classes of
objects that it refuses or that its garbage collector deletes; ``check`` refuses them too, with the first
one found in one line naming the object (``Kind/namespace/name``) and the field, in the server's words:

* a ResourceSlice without ``spec.driver``, ``spec.pool.name``, a ``spec.pool.resourceSliceCount`` above
  zero, or exactly one node selection (``nodeName``, ``nodeSelector``, ``allNodes``,
  ``perDeviceNodeSelection``);
* a Pod without containers, or a container without an image;
* a ResourceClaim allocated more than 32 devices;
* an admin-access ResourceClaim in a namespace the dump holds without the label
  ``resource.kubernetes.io/admin-access: "true"``;
* an object whose owner reference names an object of a kind the dump holds that the dump does not
  have by that name and UID (a real cluster's garbage collector deletes it within seconds).

Only what the dump shows is judged: a dump without Namespaces or Nodes (``kubectl get
resourceslices,resourceclaims,pods``) says nothing about labels or node owners.

``defaulted`` fills in what the server fills in on create, so that a hand-written dump is served as a
real server would have stored it: a request's ``allocationMode: ExactCount`` and ``count: 1`` (in
``exactly``, in each ``firstAvailable`` subrequest, or next to the name in v1beta1), a taint's
``timeAdded`` (the object's creation time here, else the simulated time 0; the server's clock there).
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any, Final

from .k8s_objects import ADMIN_ACCESS_LABEL, admin_access_requests, timestamp
from .scenario import MAX_CLAIM_DEVICES, ScenarioError

_NODE_SELECTIONS: Final = ("nodeName", "nodeSelector", "allNodes", "perDeviceNodeSelection")
#: The kinds a dump may hold that have no namespace.
CLUSTER_SCOPED: Final = frozenset({"Node", "Namespace", "ResourceSlice", "DeviceClass", "DeviceTaintRule"})


def _map(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _str(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _where(obj: Mapping[str, Any]) -> str:
    meta = _map(obj.get("metadata"))
    parts = (obj.get("kind"), meta.get("namespace"), meta.get("name"))
    return "/".join(str(p) for p in parts if isinstance(p, str) and p)


def check(objects: Iterable[Mapping[str, Any]], label: str) -> None:
    """Raise ``ScenarioError`` for the first object of a dump that a real cluster would not hold."""
    items = [o for o in objects if isinstance(o, Mapping)]
    namespaces = {_str(_map(o.get("metadata")).get("name")): o for o in items if o.get("kind") == "Namespace"}
    for obj in items:
        refusal = _refusal(obj, namespaces)
        if refusal:
            raise ScenarioError(f"{label}: {_where(obj)}: {refusal} (a real API server refuses it)")
    dangling = _dangling_owner(items)
    if dangling:
        obj, message = dangling
        raise ScenarioError(f"{label}: {_where(obj)}: {message} (a real cluster's garbage collector deletes it)")


def _refusal(obj: Mapping[str, Any], namespaces: Mapping[str, Mapping[str, Any]]) -> str:
    kind = obj.get("kind")
    spec = _map(obj.get("spec"))
    if kind == "ResourceSlice":
        return _slice_refusal(spec)
    if kind == "Pod":
        containers = _list(spec.get("containers"))
        if not containers:
            return "spec.containers: Required value"
        for field in ("initContainers", "containers"):
            for i, container in enumerate(_list(spec.get(field))):
                image = _map(container).get("image")
                if not isinstance(image, str) or not image.strip():
                    return f"spec.{field}[{i}].image: Required value"
        return ""
    if kind == "ResourceClaim":
        results = _list(_map(_map(_map(obj.get("status")).get("allocation")).get("devices")).get("results"))
        if len(results) > MAX_CLAIM_DEVICES:
            return (f"status.allocation.devices.results: Too many: {len(results)}: must have at most "
                    f"{MAX_CLAIM_DEVICES} items")
        ns = _map(obj.get("metadata")).get("namespace")
        namespace = namespaces.get(_str(ns)) if _str(ns) else None
        if namespace is None or _map(_map(namespace.get("metadata")).get("labels")).get(ADMIN_ACCESS_LABEL) == "true":
            return ""
        for i in admin_access_requests(obj)[:1]:
            return (f"spec.devices.requests[{i}].adminAccess: Forbidden: admin access to devices requires the "
                    f"`{ADMIN_ACCESS_LABEL}: true` label on the containing namespace (Namespace/{ns} has none)")
    return ""


def _slice_refusal(spec: Mapping[str, Any]) -> str:
    if not spec.get("driver"):
        return "spec.driver: Required value"
    pool = _map(spec.get("pool"))
    if not pool.get("name"):
        return "spec.pool.name: Required value"
    count = pool.get("resourceSliceCount")
    if not isinstance(count, int) or isinstance(count, bool) or count <= 0:
        shown = count if count is not None else 0
        return f"spec.pool.resourceSliceCount: Invalid value: {shown}: must be greater than zero"
    chosen = [f for f in _NODE_SELECTIONS if spec.get(f) not in (None, "", False)]
    if len(chosen) != 1:
        names = ", ".join(f"`{f}`" for f in _NODE_SELECTIONS)
        what = "Required value" if not chosen else f"Invalid value: {', '.join(chosen)}"
        return f"spec: {what}: exactly one of {names} is required"
    return ""


def _dangling_owner(items: list[Mapping[str, Any]]) -> tuple[Mapping[str, Any], str] | None:
    kinds = {_str(o.get("kind")) for o in items}
    present: dict[tuple[str, str, str], str] = {}
    for o in items:
        meta = _map(o.get("metadata"))
        ns = "" if _str(o.get("kind")) in CLUSTER_SCOPED else _str(meta.get("namespace"))
        present[(_str(o.get("kind")), ns, _str(meta.get("name")))] = _str(meta.get("uid"))
    for obj in items:
        meta = _map(obj.get("metadata"))
        for i, ref in enumerate(_list(meta.get("ownerReferences"))):
            ref = _map(ref)
            kind = _str(ref.get("kind"))
            if not kind or kind not in kinds:
                continue  # the dump does not hold that kind: it cannot say whether the owner exists
            ns = "" if kind in CLUSTER_SCOPED else _str(meta.get("namespace"))
            key = (kind, ns, _str(ref.get("name")))
            # A hand-written owner without a UID matches by name.
            if key not in present or present[key] not in ("", _str(ref.get("uid"))):
                return obj, (f"metadata.ownerReferences[{i}]: {kind} {ref.get('name')} (uid {ref.get('uid')}) "
                             "is not in the dump")
    return None


def defaulted(obj: Mapping[str, Any]) -> dict[str, Any]:
    """``obj`` with the defaults the API server fills in on create (see the module docstring)."""
    out = copy.deepcopy(dict(obj))
    kind, spec = out.get("kind"), out.get("spec")
    if not isinstance(spec, dict):
        return out
    created = _str(_map(out.get("metadata")).get("creationTimestamp")) or timestamp(0)
    if kind == "ResourceClaim":
        devices = spec.get("devices")
        for request in _list(devices.get("requests") if isinstance(devices, dict) else None):
            if not isinstance(request, dict):
                continue
            subrequests = _list(request.get("firstAvailable"))
            if subrequests:
                targets = subrequests
            elif isinstance(request.get("exactly"), dict):
                targets = [request["exactly"]]
            elif str(out.get("apiVersion", "")).endswith("/v1beta1"):
                targets = [request]
            else:
                targets = []
            for target in (t for t in targets if isinstance(t, dict)):
                target.setdefault("allocationMode", "ExactCount")
                if target["allocationMode"] == "ExactCount":
                    target.setdefault("count", 1)
    elif kind == "ResourceSlice":
        for device in _list(spec.get("devices")):
            holder = device.get("basic", device) if isinstance(device, dict) else None
            for taint in _list(holder.get("taints") if isinstance(holder, dict) else None):
                if isinstance(taint, dict):
                    taint.setdefault("timeAdded", created)
    elif kind == "DeviceTaintRule" and isinstance(spec.get("taint"), dict):
        spec["taint"].setdefault("timeAdded", created)
    return out
