"""The per-device checks of the scheduler's allocator, in its order, written once: what allocated
devices take (``Usage``) and ``Checks.obstacle``, the one pipeline the search, the diagnosis
(``explain``) and the counts (placeable claims, partitions that fit) run a device through. No I/O.

The order (upstream's ``allocateOne``/``allocateDevice``): the device's pool must be complete and
valid; a device in use is skipped before any CEL runs; then the class's and the request's selectors;
the device's own node (``perDeviceNodeSelection``); its capacity (consumable capacity); the counters
of its pool (every counter must still fit with its consumption added); its taints (NoSchedule and
NoExecute not tolerated by the request). The claim's attribute constraints come last, in the search.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

from ..model import DeviceRequestInfo, DeviceTaint, SliceDevice
from .consumable import EPSILON, share_of
from .pools import Device, DeviceKey, PoolKey
from .reasons import CAPACITY, COUNTERS, NODE, SELECTOR_ERROR, TAINTED, TAKEN

#: ``obstacle``'s answer for a device the selectors do not pick (not a candidate, so no reason).
NOT_SELECTED: Final = "not_selected"
_BLOCKING_EFFECTS: Final = frozenset({"NoSchedule", "NoExecute"})


@dataclass(slots=True)
class Usage:
    """Devices taken (no share: the whole device), shares of devices that allow several, and
    counters consumed; a scratch layer holds what a search or a count adds on top of the committed one.

    In a scratch layer ``taken`` lists, per device, the tags of the claims of the search that took it
    (admin access included: an admin pick keeps the device from the same claim's other requests)."""

    taken: dict[DeviceKey, list[str]] = field(default_factory=dict)
    shares: dict[DeviceKey, dict[str, float]] = field(default_factory=dict)
    shared_by: dict[DeviceKey, list[str]] = field(default_factory=dict)
    counters: dict[tuple[PoolKey, str], dict[str, float]] = field(default_factory=dict)

    def consume(self, pool: PoolKey, device: SliceDevice, sign: float = 1.0) -> None:
        for use in device.consumes_counters:
            used = self.counters.setdefault((pool, use.counter_set), {})
            for name, value in use.counters:
                used[name] = used.get(name, 0.0) + sign * value

    def add_share(self, key: DeviceKey, amounts: Mapping[str, float], sign: float = 1.0) -> None:
        have = self.shares.setdefault(key, {})
        for name, value in amounts.items():
            have[name] = have.get(name, 0.0) + sign * value


#: A claim for one device that asks nothing more, and a layer that adds nothing (never written to).
PLAIN: Final = DeviceRequestInfo("", "")
NOTHING: Final = Usage()

Selected = Callable[[Device], "bool | None"]
"""The class's and the request's selectors over a device: True, False, None (the CEL failed); it may
raise instead, as the search does to stop the claim."""


class Checks:
    """The per-device checks over the committed usage of one cluster state."""

    def __init__(self, committed: Usage, structural: bool = False) -> None:
        self.committed = committed
        #: Only what no change of state unblocks (devices, counters, capacity, constraints): pools
        #: taken as complete and valid, taints as tolerated (``Allocator._fits_when_free``).
        self.structural = structural

    def obstacle(self, device: Device, request: DeviceRequestInfo, node: str | None,
                 labels: Mapping[str, str] | None, layer: Usage, *, claim_tag: str = "",
                 selected: Selected | None = None) -> str:
        """The first check, in the allocator's order, that keeps ``device`` from ``request`` on ``node``
        with ``layer`` added to the committed usage: a reason of ``reasons``, ``NOT_SELECTED``, or ``""``
        when the device can be taken (before the claim's constraints). ``selected`` runs the
        selectors (None: the caller already knows the device is a candidate); ``node`` None leaves the
        device's own node unchecked (counts per GPU); ``claim_tag`` names the claim of the search in
        ``layer.taken``."""
        if not device.pool.usable and not self.structural:
            return device.pool.unusable_reason[0]
        if self.in_use(device.key, request, layer, claim_tag):
            return TAKEN
        if selected is not None:
            result = selected(device)
            if result is None:
                return SELECTOR_ERROR
            if not result:
                return NOT_SELECTED
        if node is not None and not device.for_node(node, labels):
            return NODE
        if not self.capacity_fits(device, request, layer):
            return CAPACITY
        if not self.counters_fit(device, layer)[0]:
            return COUNTERS
        if not self.structural and self.blocking_taint(device, request) is not None:
            return TAINTED
        return ""

    def in_use(self, key: DeviceKey, request: DeviceRequestInfo, layer: Usage, claim_tag: str = "") -> bool:
        """Another allocation holds the device. An admin-access request may use a device others hold,
        but not one its own claim took in this search."""
        if request.admin_access:
            return claim_tag in layer.taken.get(key, ())
        return key in self.committed.taken or key in layer.taken

    def capacity_fits(self, device: Device, request: DeviceRequestInfo, layer: Usage) -> bool:
        if not device.device.allow_multiple_allocations and not request.capacity:
            return True  # the whole device, and a default never exceeds the capacity
        share = share_of(device.device, request)
        if share is None:
            return False
        if not device.device.allow_multiple_allocations:
            return all(amount <= value + EPSILON for (_, value), amount in zip(device.device.capacity,
                                                                                share.values(), strict=True))
        have = self.committed.shares.get(device.key, {})
        adding = layer.shares.get(device.key, {})
        return all(have.get(n, 0.0) + adding.get(n, 0.0) + amount <= value + EPSILON
                   for (n, value), amount in zip(device.device.capacity, share.values(), strict=True))

    def capacity_left(self, device: Device) -> dict[str, float]:
        """What the committed shares leave of a device's capacities."""
        used = self.committed.shares.get(device.key, {})
        return {n: v - used.get(n, 0.0) for n, v in device.device.capacity}

    def counters_fit(self, device: Device, layer: Usage) -> tuple[bool, str]:
        """Whether every counter of the pool still fits with this device's consumption added; the
        counter set that does not, with what is left of it, when not."""
        if not device.device.consumes_counters:
            return True, ""
        if device.device.allow_multiple_allocations and (
                device.key in self.committed.shares or device.key in layer.shares):
            return True, ""  # a further share: its counters were consumed by the first
        pool = device.pool
        mine: dict[str, dict[str, float]] = {}
        for use in device.device.consumes_counters:
            for name, value in use.counters:
                mine.setdefault(use.counter_set, {})[name] = mine.get(use.counter_set, {}).get(name, 0.0) + value
        for set_name, published in pool.counters.items():
            used = self.committed.counters.get((pool.key, set_name), {})
            adding = layer.counters.get((pool.key, set_name), {})
            extra = mine.get(set_name, {})
            for name, total in published.items():
                left = total - used.get(name, 0.0)
                if left + EPSILON < adding.get(name, 0.0) + extra.get(name, 0.0):
                    # The pool (a node's) with the set: every GPU 0 has a "gpu-0-counter-set".
                    return False, (f"{pool.key[1]}/{set_name}: {name} "
                                   f"{amount_text(max(0.0, left - adding.get(name, 0.0)))} left")
        return True, ""

    def counters_checked(self, device: Device, layer: Usage) -> bool:
        """Whether taking ``device`` would check (and add) its counters: it consumes some, and is not
        a further share of a device whose first share consumed them."""
        return bool(device.device.consumes_counters) and not (device.device.allow_multiple_allocations and (
            device.key in self.committed.shares or device.key in layer.shares))

    @staticmethod
    def blocking_taint(device: Device, request: DeviceRequestInfo) -> DeviceTaint | None:
        for taint in device.taints:
            if taint.effect in _BLOCKING_EFFECTS and not any(t.tolerates(taint) for t in request.tolerations):
                return taint
        return None

    def detail(self, reason: str, device: Device, request: DeviceRequestInfo, layer: Usage) -> str:
        """What stands in the way, for ``explain``: the claims holding the device, what is left of
        its capacity or counters, the taint."""
        if reason in (device.pool.unusable_reason[0],) and not device.pool.usable:
            return device.pool.unusable_reason[1]
        if reason == TAKEN:
            return ", ".join(self.committed.taken.get(device.key, ()))
        if reason == NODE:
            return f"{'/'.join(device.key)} is for {device.node or 'other nodes'}"
        if reason == CAPACITY:
            left = self.capacity_left(device)
            shared = self.committed.shared_by.get(device.key, [])
            return ", ".join(f"{n} {amount_text(v)} left" for n, v in sorted(left.items())) + (
                f" (shared by {', '.join(shared)})" if shared else "")
        if reason == COUNTERS:
            return self.counters_fit(device, layer)[1]
        if reason == TAINTED:
            taint = self.blocking_taint(device, request)
            if taint is not None:
                return f"{taint.key}={taint.value}:{taint.effect}" if taint.value else f"{taint.key}:{taint.effect}"
        return ""


def amount_text(value: float) -> str:
    gib = 2**30
    if value >= gib and value % gib == 0:
        return f"{int(value // gib)}Gi"
    return f"{value:g}"
