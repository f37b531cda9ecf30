"""How the resource.k8s.io versions differ in shape: the one place that knows, reading and writing.

The exporter reads ResourceSlices and ResourceClaims in whichever version the API server serves
(``sources/kubeapi_normalize.py``), and the simulator stores its objects in ``v1`` and serves
them in every version (``dra_exporter_sim/k8s_objects.py``, ``apiserver.py``). The shapes the
two touch differ in two places only (reference: dra-api.md §2.2-2.3):

* a device's fields (``attributes``, ``capacity``, ``consumesCounters``, ``taints``, per-device
  ``nodeName``…) sit on the device in ``v1`` and ``v1beta2`` and under ``devices[].basic`` in
  ``v1beta1`` (and the older ``v1alpha3``);
* a claim's ``exactly`` request (``deviceClassName``, ``allocationMode``, ``count``…) is a
  member of the request in ``v1`` and ``v1beta2`` and written flat on the request in ``v1beta1``.

Everything else the exporter reads (allocation results, ``reservedFor``, ``status.devices``,
pool and node fields) has one shape from ``v1beta1`` to ``v1``. Pure: dicts in, dicts out.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Final

GROUP: Final = "resource.k8s.io"
#: The versions the exporter reads and the simulator serves, most preferred (newest) first.
SUPPORTED_VERSIONS: Final = ("v1", "v1beta2", "v1beta1")
#: Versions whose devices keep their fields under ``basic``.
_NESTED_DEVICE_VERSIONS: Final = frozenset({"v1beta1", "v1alpha3"})
#: Versions whose ``exactly`` requests are written flat on the request.
_FLAT_REQUEST_VERSIONS: Final = frozenset({"v1beta1", "v1alpha3"})
_BASIC: Final = "basic"
_EXACTLY: Final = "exactly"
_CONVERTIBLE: Final = ("ResourceSlice", "ResourceClaim")


# --- reading -------------------------------------------------------------------------------------


def device_fields(device: Mapping[str, Any], version: str) -> Mapping[str, Any]:
    """The mapping that holds a slice device's fields (all but its ``name``) in ``version``;
    empty when it is missing or not a mapping."""
    body = device.get(_BASIC) if version in _NESTED_DEVICE_VERSIONS else device
    return body if isinstance(body, Mapping) else {}


def device_fields_path(version: str) -> str:
    """Where ``device_fields`` are below a device, for messages: ``basic.`` or ``""``."""
    return f"{_BASIC}." if version in _NESTED_DEVICE_VERSIONS else ""


def exact_request(request: Mapping[str, Any], version: str) -> Mapping[str, Any]:
    """The ``exactly`` part of a claim's device request (``deviceClassName``, ``allocationMode``…)
    in ``version``; empty for a prioritized list (``firstAvailable``) or a malformed request."""
    if version in _FLAT_REQUEST_VERSIONS:
        return {} if request.get("firstAvailable") else request
    exactly = request.get(_EXACTLY)
    return exactly if isinstance(exactly, Mapping) else {}


# --- writing -------------------------------------------------------------------------------------


def api_version_of(obj: Mapping[str, Any]) -> str:
    """The version part of a resource.k8s.io object's ``apiVersion`` (``v1beta1``); ``""`` otherwise."""
    group, _, version = str(obj.get("apiVersion", "")).rpartition("/")
    return version if group == GROUP else ""


def convert(obj: Mapping[str, Any], version: str) -> dict[str, Any]:
    """``obj`` (a ResourceSlice or ResourceClaim of any supported version) in ``version``.

    Other objects, and objects already in ``version``, come back unchanged (as a copy).
    """
    out = copy.deepcopy(dict(obj))
    current = api_version_of(out)
    if not current or current == version or out.get("kind") not in _CONVERTIBLE:
        return out
    if version not in SUPPORTED_VERSIONS:
        raise ValueError(f"cannot convert to {GROUP}/{version}")
    if current in _NESTED_DEVICE_VERSIONS:
        _unnest(out)
    if version in _NESTED_DEVICE_VERSIONS:
        _nest(out)
    out["apiVersion"] = f"{GROUP}/{version}"
    return out


def _devices(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return (obj.get("spec") or {}).get("devices") or []


def _requests(obj: dict[str, Any]) -> list[dict[str, Any]]:
    return (((obj.get("spec") or {}).get("devices") or {}).get("requests")) or []


def _unnest(obj: dict[str, Any]) -> None:
    """v1beta1 → the v1 shape, in place."""
    if obj["kind"] == "ResourceSlice":
        for device in _devices(obj):
            device.update(device.pop(_BASIC, None) or {})
        return
    for request in _requests(obj):
        if request.get("firstAvailable"):
            continue
        request[_EXACTLY] = {k: request.pop(k) for k in list(request) if k != "name"}


def _nest(obj: dict[str, Any]) -> None:
    """The v1 shape → v1beta1, in place."""
    if obj["kind"] == "ResourceSlice":
        for device in _devices(obj):
            device[_BASIC] = {k: device.pop(k) for k in list(device) if k != "name"}
        return
    for request in _requests(obj):
        request.update(request.pop(_EXACTLY, None) or {})
