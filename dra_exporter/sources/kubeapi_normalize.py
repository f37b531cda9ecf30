"""Pure normalisation of API server objects (plain JSON dicts) into the cluster records of ``model``.

Contract: every function here is pure — a dict as the API server sends it (camelCase JSON,
what ``kubectl get -o json`` prints) in, frozen records out; no client, no I/O, no clock.
``kubeapi.py`` feeds it what it lists and watches; the tests feed it hand-written dicts.

resource.k8s.io differs between the versions the exporter reads (reference: dra-api.md §2.2-2.3):

* ``v1`` and ``v1beta2`` put device fields on the device (``devices[].attributes``); ``v1beta1``
  (and the older ``v1alpha3``) nest them under ``devices[].basic`` (``dra_versions``, the one
  place that knows how the versions' shapes differ);
* capacities are ``{value: <quantity>}`` (``v1alpha3``: a bare quantity) — both are accepted;
* an attribute is a union of ``int``/``bool``/``string``/``version`` (1.36 adds list forms);
* ``nodeName``/``allNodes`` are pointers in v1beta2/v1 (absent when unset) and plain values in
  v1beta1 (``""``/``false`` when unset); both become ``""``.

Objects come from outside, so nothing here trusts a field's type: a missing or mistyped field
reads as empty, a quantity that does not parse is left out, and one bad entry never hides the rest.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from typing import Any, Final

from .. import model
from ..dra_versions import SUPPORTED_VERSIONS, device_fields, exact_request
from ..quantity import quantity

__all__ = ["SUPPORTED_VERSIONS"]  # the exporter's sources read the versions from here
_ATTRIBUTE_SCALARS: Final = ("string", "int", "bool", "version")
_ATTRIBUTE_LISTS: Final = ("strings", "ints", "bools", "versions")
_CLAIM_STATUS_PREFIX: Final = "claim:"
#: ``allocatedResourcesStatus[].resources[].message`` is kept up to this many characters (the API
#: allows 1024): enough for a driver's reason, and a hostile pod status costs no memory.
HEALTH_MESSAGE_CHARS: Final = 256
#: A pod label value is kept up to this many characters: Kubernetes' own limit, so a real API
#: server's value is never cut, and a hostile one costs no more memory than a valid one.
POD_LABEL_VALUE_CHARS: Final = 63
#: Opaque configs per claim (the API allows 32) and top-level fields kept per config.
MAX_CONFIGS: Final = 32
MAX_CONFIG_FIELDS: Final = 32


def choose_version(served: Iterable[str], usable: Iterable[str] = SUPPORTED_VERSIONS) -> str | None:
    """The version to read: the first of ``SUPPORTED_VERSIONS`` that the server serves and the
    installed client can talk (``usable``); None when there is none."""
    served, usable = set(served), set(usable)
    return next((v for v in SUPPORTED_VERSIONS if v in served and v in usable), None)


def served_versions(api_group: Mapping[str, Any]) -> tuple[str, ...]:
    """Versions listed in an ``APIGroup`` discovery document (``GET /apis/resource.k8s.io``)."""
    return tuple(v for entry in _list(api_group, "versions") if (v := _str(_map_of(entry), "version")))


# --- ResourceSlice -------------------------------------------------------------------------------


def slice_from_dict(obj: Mapping[str, Any], version: str) -> model.ResourceSliceInfo:
    """One ResourceSlice in any supported version."""
    meta, spec = _map(obj, "metadata"), _map(obj, "spec")
    pool = _map(spec, "pool")
    driver = _str(spec, "driver")
    per_device = spec.get("perDeviceNodeSelection") is True
    return model.ResourceSliceInfo(
        name=_str(meta, "name"),
        driver=driver,
        pool=_str(pool, "name"),
        generation=_int(pool, "generation"),
        resource_slice_count=_int(pool, "resourceSliceCount", 1),
        node_name=_str(spec, "nodeName"),
        # In the slice's order: the scheduler tries devices in it (first fit).
        devices=tuple(_device(d, driver, version, per_device) for d in _list(spec, "devices")
                      if _str(_map_of(d), "name")),
        shared_counters=_counter_sets(_list(spec, "sharedCounters")),
        placement=_placement(spec),
        per_device_node_selection=per_device,
    )


def _placement(obj: Mapping[str, Any]) -> model.NodePlacement:
    """``nodeName`` / ``allNodes`` / ``nodeSelector`` of a slice or a device (v1beta1 writes
    ``""``/``false`` for unset, later versions leave them out: both read as unset)."""
    raw = obj.get("nodeSelector")
    return model.NodePlacement(node_name=_str(obj, "nodeName"), all_nodes=obj.get("allNodes") is True,
                               node_selector=node_selector(raw) if isinstance(raw, Mapping) else None)


def node_selector(raw: Mapping[str, Any]) -> model.NodeSelector:
    """A core/v1 NodeSelector."""
    return model.NodeSelector(tuple(
        model.NodeSelectorTerm(_requirements(_list(term, "matchExpressions")),
                               _requirements(_list(term, "matchFields")))
        for term in map(_map_of, _list(raw, "nodeSelectorTerms"))))


def _requirements(raw: Sequence[Any]) -> tuple[model.NodeSelectorRequirement, ...]:
    return tuple(
        model.NodeSelectorRequirement(_str(r, "key"), _str(r, "operator"),
                                      tuple(v for v in _list(r, "values") if isinstance(v, str)))
        for r in map(_map_of, raw))


def _device(raw: Any, driver: str, version: str, per_device: bool = False) -> model.SliceDevice:
    dev = _map_of(raw)
    body = device_fields(dev, version)
    attributes = _map(body, "attributes")
    return model.SliceDevice(
        name=_str(dev, "name"),
        attributes=tuple(sorted(_attributes(attributes, driver))),
        attribute_kinds=tuple(sorted(_attribute_kinds(attributes, driver))),
        capacity=tuple(sorted(_capacities(_map(body, "capacity")))),
        consumes_counters=tuple(
            model.CounterConsumption(_str(c, "counterSet"), _counters(_map(c, "counters")))
            for c in map(_map_of, _list(body, "consumesCounters")) if _str(c, "counterSet")),
        taints=tuple(
            model.DeviceTaint(_str(t, "key"), _str(t, "value"), _str(t, "effect"))
            for t in map(_map_of, _list(body, "taints")) if _str(t, "key")),
        node_name=_str(body, "nodeName"),
        placement=_placement(body) if per_device else None,
        allow_multiple_allocations=body.get("allowMultipleAllocations") is True,
        request_policies=tuple(sorted(_request_policies(_map(body, "capacity")))),
        binding_conditions=tuple(c for c in _list(body, "bindingConditions") if isinstance(c, str)),
        binds_to_node=body.get("bindsToNode") is True,
    )


def _request_policies(raw: Mapping[str, Any]) -> Iterable[tuple[str, model.CapacityRequestPolicy]]:
    for key, value in raw.items():
        policy = _map(_map_of(value), "requestPolicy")
        if not policy or not isinstance(key, str):
            continue
        valid_range = _map(policy, "validRange")
        yield key, model.CapacityRequestPolicy(
            default=quantity(policy.get("default")),
            valid_values=tuple(n for v in _list(policy, "validValues") if (n := quantity(v)) is not None),
            min=quantity(valid_range.get("min")), max=quantity(valid_range.get("max")),
            step=quantity(valid_range.get("step")))


def _attributes(raw: Mapping[str, Any], driver: str) -> Iterable[tuple[str, str]]:
    for key, value in raw.items():
        text = attribute_value(_map_of(value))
        if text is None or not isinstance(key, str):
            continue
        # An unqualified key is in the driver's domain (the CEL rule), so both spellings mean one thing.
        domain, sep, name = key.rpartition("/")
        yield (name if sep and domain == driver else key), text


def _attribute_kinds(raw: Mapping[str, Any], driver: str) -> Iterable[tuple[str, str]]:
    """(key as ``_attributes`` spells it, union member) for every attribute that is not a string."""
    for key, value in raw.items():
        member = attribute_kind(_map_of(value))
        if member is None or member == "string" or not isinstance(key, str):
            continue
        domain, sep, name = key.rpartition("/")
        yield (name if sep and domain == driver else key), member


def attribute_kind(value: Mapping[str, Any]) -> str | None:
    """Which member of a ``DeviceAttribute`` union is set (``int``, ``versions`` …); None: none."""
    for member in _ATTRIBUTE_SCALARS:
        if member in value and value[member] is not None:
            return member
    return next((m for m in _ATTRIBUTE_LISTS if isinstance(value.get(m), list)), None)


def attribute_value(value: Mapping[str, Any]) -> str | None:
    """A ``DeviceAttribute`` union as text; None when no known member is set."""
    for member in _ATTRIBUTE_SCALARS:
        if member in value and value[member] is not None:
            return _scalar_text(value[member])
    for member in _ATTRIBUTE_LISTS:
        if isinstance(value.get(member), list):
            return ",".join(_scalar_text(v) for v in value[member])
    return None


def _scalar_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _capacities(raw: Mapping[str, Any]) -> Iterable[tuple[str, float]]:
    for key, value in raw.items():
        # v1alpha3 wrote the quantity itself; later versions wrap it as {value: …}.
        number = amount(value.get("value") if isinstance(value, Mapping) else value)
        if number is not None and isinstance(key, str):
            yield key, number


def _counter_sets(raw: Sequence[Any]) -> tuple[model.CounterSet, ...]:
    sets = (model.CounterSet(_str(s, "name"), _counters(_map(s, "counters"))) for s in map(_map_of, raw))
    return tuple(sorted((s for s in sets if s.name), key=lambda s: s.name))


def amount(value: object) -> float | None:
    """A capacity, counter or consumption: a finite quantity (``quantity.quantity``: no NaN, no
    infinity) that is not negative; None (the entry left out) for anything else, so no bad number
    reaches the fit arithmetic ("NaN" would fit everywhere, a negative amount would add room)."""
    number = quantity(value)
    return number if number is not None and number >= 0 else None


def _counters(raw: Mapping[str, Any]) -> tuple[tuple[str, float], ...]:
    return tuple(sorted(
        (key, number) for key, value in raw.items()
        if isinstance(key, str) and (number := amount(_map_of(value).get("value"))) is not None))


def slices_for_node(slices: Iterable[model.ResourceSliceInfo], node: str,
                    labels: dict[str, str] | None) -> tuple[model.ResourceSliceInfo, ...]:
    """What of ``slices`` covers ``node`` (slice or per-device ``nodeName``, ``allNodes``, a
    ``nodeSelector`` its ``labels`` meet; None: labels unknown, such selectors do not match).
    A counters-only slice without a node of its own stays when a device slice of its pool does."""
    kept, counters_only = [], []
    for s in slices:
        if not s.devices and s.shared_counters and not s.placement.node_name:
            counters_only.append(s)
        elif (mine := s.for_node(node, labels)) is not None:
            kept.append(mine)
    pools = {(s.driver, s.pool) for s in kept}
    return (*kept, *(s for s in counters_only if (s.driver, s.pool) in pools))


def current_slices(slices: Iterable[model.ResourceSliceInfo]) -> tuple[model.ResourceSliceInfo, ...]:
    """Only the slices of each (driver, pool) with the highest pool generation: consumers "must
    only use ResourceSlices with the highest generation number" (older ones are being replaced)."""
    slices = tuple(slices)
    newest: dict[tuple[str, str], int] = {}
    for s in slices:
        key = (s.driver, s.pool)
        newest[key] = max(newest.get(key, s.generation), s.generation)
    return tuple(sorted((s for s in slices if s.generation == newest[(s.driver, s.pool)]),
                        key=lambda s: (s.driver, s.pool, s.name)))


# --- ResourceClaim ----------------------------------------------------------------------------------


def claim_from_dict(obj: Mapping[str, Any], version: str) -> model.ClaimInfo:
    """One ResourceClaim: the status has one shape in every version; the spec's requests do not
    (``claim_requests``)."""
    meta, status = _map(obj, "metadata"), _map(obj, "status")
    devices = _map(_map(status, "allocation"), "devices")
    return model.ClaimInfo(
        namespace=_str(meta, "namespace"),
        name=_str(meta, "name"),
        uid=_str(meta, "uid"),
        requests=claim_requests(_map(_map(obj, "spec"), "devices"), version),
        constraints=claim_constraints(_map(_map(obj, "spec"), "devices")),
        created=timestamp(_str(meta, "creationTimestamp")),
        results=tuple(
            model.AllocationResult(
                request=_str(r, "request"), driver=_str(r, "driver"), pool=_str(r, "pool"),
                device=_str(r, "device"), admin_access=r.get("adminAccess") is True,
                share_id=_str(r, "shareID"), tolerations=_tolerations(_list(r, "tolerations")),
                consumed_capacity=tuple(sorted(
                    (k, n) for k, v in _map(r, "consumedCapacity").items()
                    if isinstance(k, str) and (n := amount(v)) is not None)))
            for r in map(_map_of, _list(devices, "results")) if _str(r, "device")),
        reserved_for=tuple(
            model.ConsumerRef(_str(c, "resource"), _str(c, "name"), _str(c, "uid"), _str(c, "apiGroup"))
            for c in map(_map_of, _list(status, "reservedFor"))),
        devices=tuple(
            model.ClaimDeviceStatus(
                driver=_str(d, "driver"), pool=_str(d, "pool"), device=_str(d, "device"),
                share_id=_str(d, "shareID"),
                conditions=tuple(
                    model.DeviceCondition(_str(c, "type"), _str(c, "status"), _str(c, "reason"))
                    for c in map(_map_of, _list(d, "conditions")) if _str(c, "type")),
                uuid=_data_uuid(_map(d, "data")),
                network=_network(d.get("networkData")))
            for d in map(_map_of, _list(status, "devices")) if _str(d, "device")),
        configs=tuple(
            model.OpaqueConfig(
                driver=_str(opaque, "driver"),
                requests=tuple(r for r in _list(c, "requests") if isinstance(r, str)),
                source=_str(c, "source"),
                parameters=_scalar_fields(_map(opaque, "parameters")))
            for c in map(_map_of, _list(devices, "config"))
            if _str(opaque := _map(c, "opaque"), "driver"))[:MAX_CONFIGS],
    )


def claim_requests(devices: Mapping[str, Any], version: str) -> tuple[model.DeviceRequestInfo, ...]:
    """``spec.devices.requests[]``: v1beta2/v1 put a plain request under ``exactly``, v1beta1 (and
    v1alpha3) on the request itself; a prioritized list (``firstAvailable``) gives one entry per
    subrequest, named ``main/sub`` as allocation results name it."""
    out = []
    for req in map(_map_of, _list(devices, "requests")):
        name = _str(req, "name")
        if not name:
            continue
        subrequests = _list(req, "firstAvailable")
        if subrequests:
            out += [_request(f"{name}/{_str(sub, 'name')}", sub) for sub in map(_map_of, subrequests)]
        else:
            out.append(_request(name, exact_request(req, version)))
    return tuple(out)


def _request(name: str, body: Mapping[str, Any]) -> model.DeviceRequestInfo:
    mode = _str(body, "allocationMode")
    return model.DeviceRequestInfo(
        name, _str(body, "deviceClassName"), max(_int(body, "count", 1), 1), all_devices=mode == "All",
        selectors=_cel_selectors(body), admin_access=body.get("adminAccess") is True,
        tolerations=_tolerations(_list(body, "tolerations")),
        capacity=tuple(sorted((k, n) for k, v in _map(_map(body, "capacity"), "requests").items()
                              if isinstance(k, str) and (n := quantity(v)) is not None)))


def _cel_selectors(body: Mapping[str, Any]) -> tuple[str, ...]:
    """``selectors[].cel.expression`` of a DeviceClass or a request, in order."""
    return tuple(e for s in map(_map_of, _list(body, "selectors")) if (e := _str(_map(s, "cel"), "expression")))


def claim_constraints(devices: Mapping[str, Any]) -> tuple[model.DeviceConstraint, ...]:
    """``spec.devices.constraints[]`` (the same in every version)."""
    return tuple(
        model.DeviceConstraint(tuple(r for r in _list(c, "requests") if isinstance(r, str)),
                               _str(c, "matchAttribute"), _str(c, "distinctAttribute"))
        for c in map(_map_of, _list(devices, "constraints")))


def timestamp(text: str) -> float:
    """An RFC 3339 time (``2026-01-01T00:00:00Z``) as Unix time; 0.0 when absent or invalid."""
    if not text:
        return 0.0
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0


def device_class_from_dict(obj: Mapping[str, Any]) -> model.DeviceClassInfo:
    """One DeviceClass (same shape in v1beta1, v1beta2 and v1): its CEL selectors, in order."""
    spec = _map(obj, "spec")
    return model.DeviceClassInfo(
        name=_str(_map(obj, "metadata"), "name"),
        selectors=_cel_selectors(spec),
        extended_resource_name=_str(spec, "extendedResourceName"))


def _scalar_fields(raw: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    """The top-level scalar fields of opaque parameters (driver-defined JSON, up to 10 KiB by the
    API): ``kind``, ``apiVersion``, ``domainID``…; nested values are not needed and not kept."""
    return tuple(sorted(
        (k, _scalar_text(v)[:256]) for k, v in raw.items()
        if isinstance(k, str) and isinstance(v, str | int | float | bool) and len(k) <= 64
    )[:MAX_CONFIG_FIELDS])


def _tolerations(raw: Sequence[Any]) -> tuple[model.DeviceToleration, ...]:
    return tuple(sorted({
        model.DeviceToleration(_str(t, "key"), _str(t, "operator") or "Equal", _str(t, "value"), _str(t, "effect"))
        for t in map(_map_of, raw) if _str(t, "key") or _str(t, "operator") == "Exists"},
        key=lambda t: (t.key, t.operator, t.value, t.effect)))


def _data_uuid(data: Mapping[str, Any]) -> str:
    """The device identity a driver publishes in ``status.devices[].data`` (free-form JSON, at
    most 10 KiB): a top-level ``uuid`` string, in any letter case (NVIDIA's proposal for dynamic
    MIG devices, dra-driver-nvidia-gpu#1456, names no schema yet)."""
    for key, value in data.items():
        if isinstance(key, str) and key.lower() == "uuid" and isinstance(value, str) and 0 < len(value) <= 128:
            return value
    return ""


def _network(raw: Any) -> model.NetworkDeviceData | None:
    if not isinstance(raw, Mapping):
        return None
    data = model.NetworkDeviceData(_str(raw, "interfaceName"), _str(raw, "hardwareAddress"),
                                   tuple(sorted(ip for ip in _list(raw, "ips") if isinstance(ip, str))[:16]))
    return data if data != model.NetworkDeviceData() else None


# --- DeviceTaintRule ----------------------------------------------------------------------------------

#: DeviceTaintRule versions, most preferred first: v1 (1.37), v1beta2 (1.36, off by default),
#: v1alpha3 (1.33-1.35; the gate is off by default until 1.37).
TAINT_RULE_VERSIONS: Final = ("v1", "v1beta2", "v1alpha3")


def taint_rule_from_dict(obj: Mapping[str, Any]) -> model.DeviceTaintRule:
    """One DeviceTaintRule; the shape is the same in every version but for v1alpha3's older
    ``deviceClassName`` and CEL ``selectors``, which mark the rule as not applicable here."""
    spec = _map(obj, "spec")
    selector, taint = _map(spec, "deviceSelector"), _map(spec, "taint")
    return model.DeviceTaintRule(
        name=_str(_map(obj, "metadata"), "name"),
        taint=model.DeviceTaint(_str(taint, "key"), _str(taint, "value"), _str(taint, "effect")),
        driver=_str(selector, "driver"), pool=_str(selector, "pool"), device=_str(selector, "device"),
        unsupported_selector=bool(_str(selector, "deviceClassName") or _list(selector, "selectors")),
    )


def resource_names(resource_list: Mapping[str, Any]) -> frozenset[str]:
    """Resource names in an ``APIResourceList`` (``GET /apis/<group>/<version>``)."""
    return frozenset(n for r in map(_map_of, _list(resource_list, "resources")) if (n := _str(r, "name")))


def node_labels(obj: Mapping[str, Any]) -> dict[str, str]:
    """A core/v1 Node's labels."""
    return {k: v for k, v in _map(_map(obj, "metadata"), "labels").items()
            if isinstance(k, str) and isinstance(v, str)}


def _string_map(raw: Mapping[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in raw.items() if isinstance(k, str) and isinstance(v, str)))


def cluster_node_from_dict(obj: Mapping[str, Any]) -> model.ClusterNode:
    """A core/v1 Node as the cluster mode keeps it: name, labels, taints, ``spec.unschedulable``."""
    meta, spec = _map(obj, "metadata"), _map(obj, "spec")
    return model.ClusterNode(
        name=_str(meta, "name"), labels=_string_map(_map(meta, "labels")),
        taints=tuple(model.DeviceTaint(_str(t, "key"), _str(t, "value"), _str(t, "effect"))
                     for t in map(_map_of, _list(spec, "taints"))),
        unschedulable=spec.get("unschedulable") is True)


def pod_node_filters(spec: Mapping[str, Any]) -> model.PodNodeFilters:
    """A pod's ``nodeSelector``, required node affinity and tolerations (``NO_NODE_FILTERS`` when it
    has none, so that most pods share one object)."""
    required = _map(_map(_map(spec, "affinity"), "nodeAffinity"), "requiredDuringSchedulingIgnoredDuringExecution")
    filters = model.PodNodeFilters(
        node_selector=_string_map(_map(spec, "nodeSelector")),
        affinity=node_selector(required) if "nodeSelectorTerms" in required else None,
        tolerations=_tolerations(_list(spec, "tolerations")))
    return model.NO_NODE_FILTERS if filters == model.NO_NODE_FILTERS else filters


# --- Pod ---------------------------------------------------------------------------------------------


def pod_from_dict(obj: Mapping[str, Any], keep_labels: Iterable[str] = ()) -> model.PodInfo:
    """One core/v1 Pod: its UID, the claim objects it references, per container the claim requests
    it uses, its container ID and the health of its DRA devices; of its labels only those named in
    ``keep_labels`` (``--pod-labels``), each value at most ``POD_LABEL_VALUE_CHARS`` long."""
    meta, spec, status = _map(obj, "metadata"), _map(obj, "spec"), _map(obj, "status")
    names = claim_object_names(spec, status)
    extended = _map(status, "extendedResourceClaimStatus")
    extended_claim = _str(extended, "resourceClaimName")
    container_ids, health = _container_statuses(status, names)
    containers = []
    for ctr in map(_map_of, [*_list(spec, "initContainers"), *_list(spec, "containers")]):
        name = _str(ctr, "name")
        if not name:
            continue
        uses = [model.ContainerClaim(ref, names.get(ref, ""), _str(c, "request"))
                for c in map(_map_of, _list(_map(ctr, "resources"), "claims")) if (ref := _str(c, "name"))]
        if extended_claim:
            # DRA extended resources (1.34+): ``nvidia.com/gpu: 1`` served by a claim the scheduler made.
            uses += [model.ContainerClaim("", extended_claim, _str(m, "requestName"))
                       for m in map(_map_of, _list(extended, "requestMappings"))
                       if _str(m, "containerName") == name]
        containers.append(model.ContainerInfo(
            name=name, container_id=container_ids.get(name, ""),
            claims=tuple(sorted(set(uses), key=lambda c: (c.ref, c.claim, c.request))),
            health=tuple(sorted(set(health.get(name, ())),
                                key=lambda h: (h.claim, h.request, h.driver, h.pool, h.device)))))
    claims = referenced_claims(names, extended_claim)
    return model.PodInfo(
        namespace=_str(meta, "namespace"), name=_str(meta, "name"), uid=_str(meta, "uid"),
        phase=_str(status, "phase"), claims=tuple(sorted(claims)),
        containers=tuple(sorted(containers, key=lambda c: c.name)),
        labels=_kept_labels(_map(meta, "labels"), keep_labels))


def _kept_labels(labels: Mapping[str, Any], keep: Iterable[str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((key, value[:POD_LABEL_VALUE_CHARS]) for key in keep
                        if isinstance(value := labels.get(key), str)))


def cluster_pod_from_dict(obj: Mapping[str, Any]) -> model.ClusterPod:
    """One core/v1 Pod as the cluster mode reads it: the claims it references, its creation,
    whether it has ended (Succeeded, Failed, or ``deletionTimestamp`` set) and what it says about
    the nodes it may go to."""
    meta, status = _map(obj, "metadata"), _map(obj, "status")
    names = claim_object_names(_map(obj, "spec"), status)
    return model.ClusterPod(
        namespace=_str(meta, "namespace"), name=_str(meta, "name"),
        created=timestamp(_str(meta, "creationTimestamp")),
        claims=referenced_claims(names, _str(_map(status, "extendedResourceClaimStatus"), "resourceClaimName")),
        ended=_str(status, "phase") in model.TERMINAL_PHASES or bool(_str(meta, "deletionTimestamp")),
        node_filters=pod_node_filters(_map(obj, "spec")))


def referenced_claims(names: Mapping[str, str], extended_claim: str) -> tuple[str, ...]:
    """The claim objects a pod references, in the order of its ``spec.resourceClaims`` (the order the
    scheduler allocates them in): those whose name is known (``claim_object_names``), then the one the
    scheduler made for its extended resources; each once."""
    ordered = [n for n in names.values() if n] + ([extended_claim] if extended_claim else [])
    return tuple(dict.fromkeys(ordered))


def claim_object_names(spec: Mapping[str, Any], status: Mapping[str, Any]) -> dict[str, str]:
    """Pod-level claim reference name → ResourceClaim object name (``""`` while not known).

    A reference names its claim directly (``resourceClaimName``) or through a template, whose
    generated claim's name is only in ``status.resourceClaimStatuses`` (where an unset name
    means that no claim is needed)."""
    generated = {_str(s, "name"): _str(s, "resourceClaimName")
                 for s in map(_map_of, _list(status, "resourceClaimStatuses"))}
    names = {}
    for ref in map(_map_of, _list(spec, "resourceClaims")):
        if name := _str(ref, "name"):
            names[name] = _str(ref, "resourceClaimName") or generated.get(name, "")
    return names


def _container_statuses(status: Mapping[str, Any], names: Mapping[str, str]
                        ) -> tuple[dict[str, str], dict[str, list[model.DeviceHealth]]]:
    ids: dict[str, str] = {}
    health: dict[str, list[model.DeviceHealth]] = {}
    for cs in map(_map_of, [*_list(status, "initContainerStatuses"), *_list(status, "containerStatuses")]):
        name = _str(cs, "name")
        if not name:
            continue
        ids[name] = _str(cs, "containerID")
        for entry in map(_map_of, _list(cs, "allocatedResourcesStatus")):
            ref, request = _health_name(_str(entry, "name"))
            if ref is None:
                continue  # a device-plugin resource, not a DRA claim
            for res in map(_map_of, _list(entry, "resources")):
                text = _str(res, "resourceID")
                triplet, cdi_id = resource_id(text), text if is_cdi_name(text) else ""
                if triplet is None and not cdi_id:
                    continue
                health.setdefault(name, []).append(model.DeviceHealth(
                    names.get(ref, ""), request, *(triplet or ("", "", "")),
                    health=_str(res, "health") or "Unknown", cdi_id=cdi_id,
                    message=_one_line(_str(res, "message"), HEALTH_MESSAGE_CHARS)))
    return ids, health


def is_cdi_name(text: str) -> bool:
    """A fully qualified CDI device name, ``<vendor>/<class>=<name>``. The kubelet writes one as
    ``resourceID`` when the driver returned CDI IDs; a triplet never holds ``=`` (driver and pool
    names are DNS subdomains, device names DNS labels)."""
    kind, sep, name = text.partition("=")
    vendor, slash, cls = kind.partition("/")
    return bool(sep and name and vendor and slash and cls)


def _one_line(text: str, limit: int) -> str:
    """Free text from outside made safe for one log line: whitespace runs and control characters
    become one space, and at most ``limit`` characters are kept."""
    return " ".join("".join(c if c.isprintable() else " " for c in text[:limit * 4]).split())[:limit]


def _health_name(name: str) -> tuple[str | None, str]:
    """``claim:<ref>/<request>`` or ``claim:<ref>`` → (ref, request); (None, "") for other names."""
    if not name.startswith(_CLAIM_STATUS_PREFIX):
        return None, ""
    ref, _, request = name[len(_CLAIM_STATUS_PREFIX):].partition("/")
    return (ref or None), request


def resource_id(text: str) -> tuple[str, str, str] | None:
    """``<driver>/<pool>/<device>`` → the triplet. Pool names may contain ``/``; driver names
    (DNS subdomains) and device names (DNS labels) never do."""
    driver, sep, rest = text.partition("/")
    pool, sep2, device = rest.rpartition("/")
    if not (sep and sep2 and driver and pool and device):
        return None
    return driver, pool, device


# --- untrusted-field helpers ---------------------------------------------------------------------------


# --- reading fields -------------------------------------------------------------------------------
#
# A field of the wrong type reads as absent: an API server has validated what it serves, and one odd
# field must not cost the node its view. A file a person wrote (a cluster dump) deserves better than
# a silent default: under ``noting_wrong_types`` every such field is also noted, and the simulator's
# dump reader refuses the object, naming the field.

_wrong_types: ContextVar[list[str] | None] = ContextVar("kubeapi_normalize_wrong_types", default=None)


@contextmanager
def noting_wrong_types() -> Iterator[list[str]]:
    """Within the block, each field read with the wrong type is noted (``"name: a mapping, not a
    string"``) in the list this yields, besides being read as absent."""
    noted: list[str] = []
    token = _wrong_types.set(noted)
    try:
        yield noted
    finally:
        _wrong_types.reset(token)


def _note(key: str, value: Any, wanted: str) -> None:
    noted = _wrong_types.get()
    if noted is not None and value is not None:
        noted.append(f"{key or 'an entry'}: {_kind_of(value)}, not {wanted}")


def _kind_of(value: Any) -> str:
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, str):
        return "a string"
    return f"a {type(value).__name__}"


def _map_of(value: Any, key: str = "") -> Mapping[str, Any]:
    if isinstance(value, Mapping):
        return value
    _note(key, value, "a mapping")
    return {}


def _map(obj: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    return _map_of(obj.get(key), key)


def _list(obj: Mapping[str, Any], key: str) -> list[Any]:
    value = obj.get(key)
    if isinstance(value, list):
        return value
    _note(key, value, "a list")
    return []


def _str(obj: Mapping[str, Any], key: str) -> str:
    value = obj.get(key)
    if isinstance(value, str):
        return value
    _note(key, value, "a string")
    return ""


def _int(obj: Mapping[str, Any], key: str, default: int = 0) -> int:
    value = obj.get(key)
    if isinstance(value, bool):
        return default
    if isinstance(value, int):
        return value
    # int64 may arrive quoted; only ASCII digits ("²" is a digit to str.isdigit, not to int) and
    # no more than an int64 holds (a 5,000-digit number is past what int() parses).
    if isinstance(value, str) and (digits := value.removeprefix("-")).isascii() and digits.isdigit() \
            and len(digits) <= 19:
        return int(value)
    return default
