"""The cluster's device pools as the scheduler's allocator sees them: each pool's newest generation
(``newest_generation``), whether it is complete and valid, which nodes its slices name (``Pool.nodes``,
``Pool.everywhere``; whether a slice serves a node is ``nodes.slice_serves``), which nodes meet it
(``Pool.seen_with``: a pool with shared counters every node), and its devices in the
order the allocator tries them. Each of these is decided here once. No I/O.

Pools whose devices carry ``bindingConditions`` are tried after all others (``Pool.binding_conditions``,
``allocation_order``), as the scheduler does.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from ..model import DeviceTaint, DeviceTaintRule, ResourceSliceInfo, SliceDevice
from .nodes import device_serves
from .reasons import POOL_INCOMPLETE, POOL_INVALID

DeviceKey = tuple[str, str, str]
"""(driver, pool, device)."""
PoolKey = tuple[str, str]
"""(driver, pool)."""
UsageKey = tuple[tuple[str, bool, tuple[tuple[str, float], ...]], ...]
"""What a pool's devices are allocated to: (device, a share?, consumed capacity) per allocation result."""
ClassRow = tuple[bool | None, ...]
"""Per DeviceClass (in the cache's order): whether a device meets its selectors (None: the CEL failed)."""


@dataclass(slots=True, eq=False)
class Pool:
    key: PoolKey
    generation: int
    expected: int
    slices: list[ResourceSliceInfo]
    """The newest generation's slices, by name."""
    devices: list[Device] = field(default_factory=list)
    """In the order the allocator tries them: slices by name, devices in slice order."""
    by_slice: list[tuple[ResourceSliceInfo, list[Device]]] = field(default_factory=list)
    counters: dict[str, dict[str, float]] = field(default_factory=dict)
    """Counter set → counter → what the pool publishes."""
    incomplete: bool = False
    invalid: str = ""
    nodes: frozenset[str] = frozenset()
    """The nodes its slices name (``nodeName``, a device's ``nodeName``)."""
    everywhere: bool = False
    """Some slice is for all nodes or for a node selector."""
    gathered_everywhere: bool = False
    """Some slice publishes shared counters: the scheduler gathers the pool for every node, whatever
    the slices' placement (the pool's devices need the counters wherever they are), and judges it on a
    node without its devices by what it gathered there (``unusable_elsewhere``, ``seen_with``)."""
    unusable_elsewhere: bool = False
    """Gathered everywhere, and incomplete or invalid as judged on a node none of its devices is for
    (``judged_elsewhere``): an All request fails on such a node too."""
    class_mask: tuple[bool, ...] = ()
    """Per class: whether some device of the pool does not fail it (True or None)."""
    class_errors: tuple[bool, ...] = ()
    """Per class: whether the class's CEL fails on some device of the pool (the search may stop there)."""
    binding_conditions: bool = False
    """Some device carries ``bindingConditions``: the allocator tries the pool after all others."""

    @property
    def usable(self) -> bool:
        return not self.incomplete and not self.invalid

    def seen_with(self, devices: Sequence[Device]) -> bool:
        """Whether the scheduler's search on a node meets the pool, given its ``devices`` for that node:
        when it has some there, or it is unusable as judged from nodes without them (All fails there)."""
        return bool(devices) or self.unusable_elsewhere

    def unusable_on(self, devices: Sequence[Device]) -> tuple[str, str]:
        """Why All fails over the pool on a node where it has ``devices`` (none: as judged elsewhere):
        (reason, its detail), or ("", "")."""
        if devices:
            return self.unusable_reason if not self.usable else ("", "")
        if not self.unusable_elsewhere:
            return "", ""
        incomplete, invalid = judged_elsewhere(self.slices, self.expected)
        return (POOL_INCOMPLETE, "") if incomplete else (POOL_INVALID, invalid)

    @property
    def unusable_reason(self) -> tuple[str, str]:
        if self.incomplete:
            return POOL_INCOMPLETE, f"{self.key[1]}: {len(self.slices)} of {self.expected} slices"
        return POOL_INVALID, f"{self.key[1]}: {self.invalid}"


@dataclass(slots=True, eq=False)
class Device:
    key: DeviceKey
    device: SliceDevice
    slice: ResourceSliceInfo
    pool: Pool
    matches: tuple[bool | None, ...]
    """Per class of ``AllocatorCache.order``."""
    taints: tuple[DeviceTaint, ...]
    """Its own taints and those of DeviceTaintRules that select it."""

    @property
    def node(self) -> str:
        d, sl = self.device, self.slice
        if d.placement is not None:
            return d.placement.node_name
        return d.node_name or sl.placement.node_name or sl.node_name

    def for_node(self, node: str, labels: Mapping[str, str] | None) -> bool:
        """Whether a ``perDeviceNodeSelection`` device is for ``node`` (others: their slice says)."""
        return device_serves(self.device, node, labels)


def pool_invalid(slices: Sequence[ResourceSliceInfo], *, device_names: bool = True
                 ) -> tuple[str, dict[str, dict[str, float]]]:
    """Why the pool of ``slices`` is invalid ("" when it is not) and the counters it publishes: a counter
    set published twice, a device name twice (unless ``device_names`` is False), a device consuming a
    counter set or counter the pool does not publish."""
    names: set[str] = set()
    counters: dict[str, dict[str, float]] = {}
    for sl in slices:
        for cs in sl.shared_counters:
            if cs.name in counters:
                return f"duplicate counter set name {cs.name}", {}
            counters[cs.name] = dict(cs.counters)
    for sl in slices:
        for d in sl.devices:
            if device_names and d.name in names:
                return f"duplicate device name {d.name}", {}
            names.add(d.name)
            for use in d.consumes_counters:
                published = counters.get(use.counter_set)
                if published is None:
                    return f"counter set {use.counter_set} not found", {}
                for name, _ in use.counters:
                    if name not in published:
                        return f"counter {name} not found in counter set {use.counter_set}", {}
    return "", counters


def judged_elsewhere(slices: Sequence[ResourceSliceInfo], expected: int) -> tuple[bool, str]:
    """(incomplete, why invalid) of a pool with shared counters as the scheduler judges it on a node
    none of its device slices is for: it gathers the counter-set slices alone; as many as the pool
    says it has make it complete (only their counter sets are checked), else the pool is complete when
    all its slices are there, and then every device's consumption is checked too (its names are not)."""
    counter_slices = [s for s in slices if s.shared_counters]
    if len(counter_slices) == expected:
        return False, pool_invalid(counter_slices)[0]
    if len(slices) != expected:
        return True, ""
    return False, pool_invalid(slices, device_names=False)[0]


def newest_generation(slices: Iterable[ResourceSliceInfo]) -> dict[PoolKey, list[ResourceSliceInfo]]:
    pools: dict[PoolKey, list[ResourceSliceInfo]] = {}
    for sl in slices:
        key = (sl.driver, sl.pool)
        known = pools.get(key)
        if known is None or sl.generation > known[0].generation:
            pools[key] = [sl]
        elif sl.generation == known[0].generation:
            known.append(sl)
    return pools


def build_pool(key: PoolKey, slices: list[ResourceSliceInfo], rules: Sequence[DeviceTaintRule],
               rows_of: Callable[[ResourceSliceInfo], tuple[ClassRow, ...]], classes: int) -> Pool:
    """A pool of the newest generation's ``slices`` (by name), its devices tainted by ``rules`` (those
    for it), each with its row of class results (``rows_of``) over ``classes`` classes."""
    expected = max(s.resource_slice_count for s in slices)
    invalid, counters = pool_invalid(slices)
    nodes = {s.placement.node_name or s.node_name for s in slices if s.placement.node_name or s.node_name}
    nodes |= {d.placement.node_name for s in slices for d in s.devices
              if d.placement is not None and d.placement.node_name}
    everywhere = any(s.placement.all_nodes or s.placement.node_selector is not None for s in slices) or any(
        d.placement is not None and (d.placement.all_nodes or d.placement.node_selector is not None)
        for s in slices for d in s.devices)
    gathered_everywhere = any(s.shared_counters for s in slices)
    pool = Pool(key, slices[0].generation, expected, slices, counters=counters,
                incomplete=len(slices) != expected, invalid=invalid, nodes=frozenset(nodes),
                everywhere=everywhere, gathered_everywhere=gathered_everywhere,
                unusable_elsewhere=gathered_everywhere and any(judged_elsewhere(slices, expected)),
                binding_conditions=any(d.binding_conditions for s in slices for d in s.devices))
    for sl in slices:
        rows = rows_of(sl)
        group: list[Device] = []
        for d, row in zip(sl.devices, rows, strict=True):
            dkey = (sl.driver, sl.pool, d.name)
            taints = d.taints + tuple(r.taint for r in rules if r.selects(*dkey))
            group.append(Device(dkey, d, sl, pool, row, taints))
        pool.devices.extend(group)
        pool.by_slice.append((sl, group))
    pool.class_mask = tuple(any(d.matches[i] is not False for d in pool.devices) for i in range(classes))
    pool.class_errors = tuple(any(d.matches[i] is None for d in pool.devices) for i in range(classes))
    return pool


def allocation_order(pool: Pool) -> tuple[bool, PoolKey]:
    """The order the allocator tries pools in: by (driver, pool), those with binding conditions last."""
    return pool.binding_conditions, pool.key
