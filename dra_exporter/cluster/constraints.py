"""A claim's ``matchAttribute`` and ``distinctAttribute`` constraints, as the scheduler's allocator
adds and removes devices while it searches. No I/O."""

from __future__ import annotations

from typing import Final

from ..model import DeviceConstraint
from .pools import Device


class Constraint:
    """``matchAttribute`` (all the same value) or ``distinctAttribute`` (all different).

    ``distinctAttribute`` as kube-scheduler 1.36 applies it: it keeps one value per request (the
    last device added for it), so a request's devices are compared with the other requests' last
    ones and with the device just before them, not with all of them (three devices of one request
    may carry 1, 0, 1); the real scheduler allocates such claims (the test bed shows it)."""

    def __init__(self, spec: DeviceConstraint) -> None:
        self.requests = frozenset(spec.requests)
        self.attribute = spec.match_attribute or spec.distinct_attribute
        self.distinct = not spec.match_attribute
        self.values: list[tuple[str, str]] = []
        self.by_request: dict[str, tuple[str, str]] = {}
        self.count = 0

    def applies(self, request: str) -> bool:
        return not self.requests or request in self.requests or request.partition("/")[0] in self.requests

    def add(self, request: str, device: Device) -> bool:
        if not self.applies(request):
            return True
        value = lookup_attribute(device, self.attribute)
        if value is None:
            return False
        if self.distinct:
            if self.count and value in self.by_request.values():
                return False
            self.by_request[request.partition("/")[0]] = value
            self.count += 1
            return True
        if self.values and (value != self.values[0] or value[1] not in _SCALAR_KINDS):
            return False
        self.values.append(value)
        return True

    def remove(self, request: str, device: Device) -> None:
        if not self.applies(request):
            return
        if self.distinct:
            self.by_request.pop(request.partition("/")[0], None)
            self.count -= 1
        else:
            self.values.pop()


_SCALAR_KINDS: Final = frozenset({"string", "int", "bool", "version"})


def lookup_attribute(device: Device, qualified: str) -> tuple[str, str] | None:
    """(value as text, kind) of a fully qualified attribute; the driver's own domain is stored
    without it (``gpu.nvidia.com/productName`` → ``productName``)."""
    domain, _, name = qualified.partition("/")
    kinds = dict(device.device.attribute_kinds)
    for key in (qualified, name if domain == device.key[0] else None):
        if key is None:
            continue
        for k, v in device.device.attributes:
            if k == key:
                return v, kinds.get(k, "string")
    return None
