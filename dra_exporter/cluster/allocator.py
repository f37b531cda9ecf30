"""What kube-scheduler's structured allocator (``k8s.io/dynamic-resource-allocation/structured``,
Kubernetes 1.36, every beta feature on) would allocate, over the cluster mode's records.

Contract: ``Allocator(state)`` is built once from a ``ClusterState`` (its claims' allocations are the
committed state). ``allocate(claim, node)`` tries one claim on one node, or on every node in name
order when ``node`` is None, and returns an ``Outcome``: placeable or not, the devices chosen, and per
request (and subrequest) what matched and why the other candidates could not be used. ``commit``
adds an outcome's devices to the committed state, so callers can place claims one after another;
``placeable_claims(device_class)`` counts the single-device claims of a class placed that way (on a
scratch copy: the committed state does not change). No I/O.

The rules, as the allocator applies them:

* pools: only each pool's newest generation counts; a pool is used only when that generation has all
  ``resourceSliceCount`` slices (incomplete otherwise) and it is valid (no device name twice, no
  counter set published twice, every consumed counter set and counter published in the pool);
* a node sees the slices that name it, that are for all nodes, whose ``nodeSelector`` it meets, and the
  ``perDeviceNodeSelection`` slices with a device for it (the devices of such a slice that are not
  for the node fail after the selectors are run); counters-only slices belong to every node;
* first fit, not the best packing: pools in (driver, pool) order, their slices by name, devices in
  slice order; for every device: allocated devices are skipped before CEL runs, then the class's and
  the request's selectors (a CEL run-time error on a device the search reaches fails the claim on that
  node, it does not skip the device), the device's own node, its capacity, its counters (every
  counter of the pool's counter sets must still fit), taints (NoSchedule/NoExecute not tolerated by
  the request skip the device; a DeviceTaintRule's taint is the device's), then the claim's
  ``matchAttribute``/``distinctAttribute`` constraints; a search that fails backtracks;
* allocation modes ExactCount and All (All needs every pool the node sees complete and valid);
  a prioritized list (``firstAvailable``) takes the first subrequest that fits;
* admin access takes no device (and another claim's device may be used for it);
* consumable capacity (``allowMultipleAllocations``): a share takes what the request asks, rounded up
  by the capacity's ``requestPolicy`` (``validRange`` steps from ``min``, or the next ``validValues``
  entry), its ``default`` when the request names no amount, the whole capacity without a policy; the
  device's counters are consumed once, by its first share.

What is not modelled: binding conditions, extended resources, scoring (the scheduler picks among
the nodes that fit; for placeability the node does not matter), and the 32-device result limit's
backtracking shortcuts (a claim asking more than 32 devices fails).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from ..model import (
    CapacityRequestPolicy,
    ClaimInfo,
    ClusterState,
    DeviceClassInfo,
    DeviceConstraint,
    DeviceRequestInfo,
    DeviceTaint,
    DeviceTaintRule,
    NodeSelector,
    ResourceSliceInfo,
    SliceDevice,
)
from ..taints import TaintRuleIndex
from .cel_budget import ClassQueue
from .selectors import CelEngine, ClassSelector, MemoBudget

DeviceKey = tuple[str, str, str]
"""(driver, pool, device)."""
PoolKey = tuple[str, str]
"""(driver, pool)."""
UsageKey = tuple[tuple[str, bool, tuple[tuple[str, float], ...]], ...]
"""What a pool's devices are allocated to: (device, a share?, consumed capacity) per allocation result."""

# Why a candidate device (one that meets the class's and the request's selectors) was not used, in
# the order the allocator checks.
POOL_INCOMPLETE: Final = "pool_incomplete"
POOL_INVALID: Final = "pool_invalid"
TAKEN: Final = "taken"
SELECTOR_ERROR: Final = "selector_not_evaluable"
NODE: Final = "node_constraint"
CAPACITY: Final = "capacity_exhausted"
COUNTERS: Final = "counters_exhausted"
TAINTED: Final = "tainted"
CONSTRAINT: Final = "attribute_constraint"
CLASS_MISSING: Final = "class_missing"
REASONS: Final = (CLASS_MISSING, SELECTOR_ERROR, POOL_INCOMPLETE, POOL_INVALID, TAKEN, NODE, CAPACITY, COUNTERS,
                  TAINTED, CONSTRAINT)

#: ``resourceapi.AllocationResultsMaxSize``: devices one claim may get.
MAX_RESULTS: Final = 32
#: Devices tried per ``allocate`` on one node before the search gives up (the scheduler has a
#: time limit instead): constraints that cannot be met make the search exhaustive.
MAX_STEPS: Final = 100_000
#: Details (claims, taints …) kept per reason in an outcome.
MAX_DETAILS: Final = 5
_BLOCKING_EFFECTS: Final = frozenset({"NoSchedule", "NoExecute"})
_EPSILON: Final = 1e-9


# --- outcomes ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Blocked:
    """Candidates of a request that could not be used, for one reason."""

    reason: str
    devices: int
    details: tuple[str, ...] = ()
    """What stands in the way: the claims that hold the devices, the taints, the counter set and what
    is left of it (at most ``MAX_DETAILS``, distinct)."""


@dataclass(frozen=True, slots=True)
class RequestOutcome:
    """One request, or one subrequest of a prioritized list (``main/sub``)."""

    request: str
    device_class: str
    count: int
    """Devices asked (ExactCount); for ``all_devices``, the devices All would take."""
    all_devices: bool = False
    matching: int = 0
    """Devices the node(s) see that meet the class's and the request's selectors."""
    usable: int = 0
    """Of those, the ones nothing kept from this request (before the claim's constraints)."""
    chosen: tuple[DeviceKey, ...] = ()
    blocked: tuple[Blocked, ...] = ()
    """Why the other candidates could not be used, the reason that kept most devices first."""
    error: str = ""


@dataclass(frozen=True, slots=True)
class Pick:
    """One device the allocation takes."""

    request: str
    device: DeviceKey
    admin_access: bool = False
    consumed_capacity: tuple[tuple[str, float], ...] = ()
    """A share of a device that allows multiple allocations: what it takes, base units."""


@dataclass(frozen=True, slots=True)
class Outcome:
    namespace: str
    claim: str
    placeable: bool
    node: str = ""
    """Where it was placed (the first node in name order); ``""`` when not placeable."""
    picks: tuple[Pick, ...] = ()
    requests: tuple[RequestOutcome, ...] = ()
    error: str = ""
    """Why the allocator refused the claim outright (a missing class, a CEL run-time error on the
    node where it happened, All over an incomplete pool …); ``""`` when it just found no fit."""
    nodes_tried: int = 0
    pod_waits: bool | None = None
    """Whether a pod that has not ended references the claim (None: not asked)."""

    @property
    def devices(self) -> tuple[DeviceKey, ...]:
        return tuple(p.device for p in self.picks)


# --- DeviceClass selectors, cached across cluster states ----------------------------------------------


class AllocatorCache:
    """The compiled DeviceClass selectors and, per slice, each device's result for every class
    (True, False or None: the expression failed on it), and the pools built from them. Kept between
    cluster states: a slice is evaluated again only when it is another object, all of them when a
    class changes; a pool is built again only when one of its slices or the taint rules changed."""

    def __init__(self, engine: CelEngine | None = None, budget: MemoBudget | None = None,
                 frame_budget: float | None = None) -> None:
        """``engine`` runs the CEL of classes and requests (default: in this process; the cluster
        mode's is its worker process), ``budget`` bounds what all their selectors memoise,
        ``frame_budget`` the seconds of class CEL a state may cost (``cel_budget``; None: no bound)."""
        self.engine = engine
        self.budget = budget if budget is not None else MemoBudget()
        self.queue = ClassQueue(engine, self.budget, frame_budget)
        self._classes: dict[str, ClassSelector] = {}
        self.order: tuple[str, ...] = ()
        #: Classes whose selectors wait for a later frame's CEL budget (they match nothing meanwhile).
        self.waiting: frozenset[str] = frozenset()
        self._index: dict[str, int] = {}
        self._slices: dict[str, tuple[ResourceSliceInfo, tuple[tuple[bool | None, ...], ...]]] = {}
        self._rows: dict[tuple[bool | None, ...], tuple[bool | None, ...]] = {}
        self.pools: dict[PoolKey, tuple[tuple[int, ...], tuple[DeviceTaintRule, ...], Pool]] = {}
        #: (class index, node) → the node's pools and their usage when counted, and the count.
        self.placeable: dict[tuple[int, str], tuple[tuple[Pool, ...], tuple[UsageKey, ...], int]] = {}

    def update(self, classes: Sequence[DeviceClassInfo], slices: Sequence[ResourceSliceInfo] = ()) -> None:
        """The classes' selectors for a state of ``slices``: evaluated within the frame's budget."""
        got = self.queue.frame(classes, slices)
        order = tuple(sorted(got.selectors))
        changed = order != self.order or any(got.selectors[n] is not self._classes.get(n) for n in order)
        self._classes, self.order, self.waiting = got.selectors, order, got.waiting
        self._index = {name: i for i, name in enumerate(order)}
        if changed:
            self._slices.clear()
            self._rows.clear()
            self.pools.clear()
            self.placeable.clear()

    def index(self, name: str) -> int | None:
        return self._index.get(name)

    def selector(self, name: str) -> ClassSelector | None:
        return self._classes.get(name)

    def of_slice(self, sl: ResourceSliceInfo) -> tuple[tuple[bool | None, ...], ...]:
        cached = self._slices.get(sl.name)
        if cached is not None and cached[0] is sl:
            return cached[1]
        selectors = [self._classes[name] for name in self.order]
        rows = []
        for d in sl.devices:
            row = tuple(sel.matches(sl.driver, d) for sel in selectors)
            rows.append(self._rows.setdefault(row, row))  # few distinct rows: share them
        result = tuple(rows)
        self._slices[sl.name] = (sl, result)
        return result

    def forget(self, slices: Iterable[ResourceSliceInfo]) -> None:
        """Drop what is kept of slices and pools no longer published."""
        names, pools = set(), set()
        for sl in slices:
            names.add(sl.name)
            pools.add((sl.driver, sl.pool))
        for name in [n for n in self._slices if n not in names]:
            del self._slices[name]
        for key in [k for k in self.pools if k not in pools]:
            del self.pools[key]
        if len(self.placeable) > 4 * max(1, len(pools)) * max(1, len(self.order)):
            self.placeable.clear()  # nodes gone: start again rather than keep them


# --- the cluster's devices -----------------------------------------------------------------------------


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
    class_mask: tuple[bool, ...] = ()
    """Per class: whether some device of the pool does not fail it (True or None)."""

    @property
    def usable(self) -> bool:
        return not self.incomplete and not self.invalid

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
        if self.device.placement is None:
            return True
        return _covers(self.device.placement.node_name, self.device.placement.all_nodes,
                       self.device.placement.node_selector, node, labels)


def _covers(node_name: str, all_nodes: bool, selector: NodeSelector | None, node: str,
            labels: Mapping[str, str] | None) -> bool:
    if node_name:
        return node_name == node
    if all_nodes:
        return True
    if selector is not None:
        # Node labels the cluster mode does not read: a term on labels is taken as met.
        return selector.matches(node, dict(labels) if labels is not None else None) or (
            labels is None and selector.needs_labels)
    return False


def _slice_for_node(sl: ResourceSliceInfo, node: str, labels: Mapping[str, str] | None) -> bool:
    if sl.shared_counters and not sl.devices:
        return True  # counters are needed wherever the pool's devices are
    if sl.per_device_node_selection:
        return any(d.placement is not None and _covers(d.placement.node_name, d.placement.all_nodes,
                                                       d.placement.node_selector, node, labels)
                   for d in sl.devices)
    p = sl.placement
    return _covers(p.node_name or sl.node_name, p.all_nodes, p.node_selector, node, labels)


def _pool_invalid(slices: Sequence[ResourceSliceInfo]) -> tuple[str, dict[str, dict[str, float]]]:
    names: set[str] = set()
    counters: dict[str, dict[str, float]] = {}
    for sl in slices:
        for cs in sl.shared_counters:
            if cs.name in counters:
                return f"duplicate counter set name {cs.name}", {}
            counters[cs.name] = dict(cs.counters)
    for sl in slices:
        for d in sl.devices:
            if d.name in names:
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


def _newest(slices: Iterable[ResourceSliceInfo]) -> dict[PoolKey, list[ResourceSliceInfo]]:
    pools: dict[PoolKey, list[ResourceSliceInfo]] = {}
    for sl in slices:
        key = (sl.driver, sl.pool)
        known = pools.get(key)
        if known is None or sl.generation > known[0].generation:
            pools[key] = [sl]
        elif sl.generation == known[0].generation:
            known.append(sl)
    return pools


# --- usage: what allocated devices take ------------------------------------------------------------------


@dataclass(slots=True)
class _Usage:
    """Devices taken (no share: the whole device), shares of devices that allow several, and
    counters consumed; a scratch layer holds what a search or a count adds on top of the committed one."""

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


@dataclass(slots=True)
class _Request:
    info: DeviceRequestInfo
    class_index: int | None
    class_selector: ClassSelector | None
    selector: ClassSelector | None
    subrequest: bool
    all_list: list[Device] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.all_list) if self.info.all_devices else self.info.count


#: A claim for one device that asks nothing more, and a layer that adds nothing (never written to).
_PLAIN: Final = DeviceRequestInfo("", "")
_NOTHING: Final = _Usage()


class _Failure(Exception):
    """The allocator refuses the claim on this node (the scheduler's error return)."""


@dataclass(slots=True)
class _Search:
    claim: ClaimInfo
    node: str
    labels: Mapping[str, str] | None
    devices: list[Device]
    groups: list[list[_Request]]
    layer: _Usage
    picks: list[Pick] = field(default_factory=list)
    constraints: list[_Constraint] = field(default_factory=list)
    steps: int = 0


class _Constraint:
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


# --- consumable capacity -----------------------------------------------------------------------------------


def consumed_amount(requested: float | None, value: float, policy: CapacityRequestPolicy | None) -> float:
    """What a request takes of one capacity: its amount rounded up by the policy; without an amount
    the policy's default, else the whole capacity."""
    if requested is None:
        return policy.default if policy is not None and policy.default is not None else value
    if policy is None:
        return requested
    if policy.min is not None:
        if requested < policy.min:
            return policy.min
        if not policy.step:
            return requested
        steps = -(-(requested - policy.min) // policy.step)
        return policy.min + policy.step * steps
    if policy.valid_values:
        return next((v for v in policy.valid_values if requested <= v), requested)
    return requested


def _violates(amount: float, policy: CapacityRequestPolicy | None) -> bool:
    if policy is None or (policy.default is not None and amount == policy.default):
        return False
    if policy.min is not None or policy.max is not None or policy.step is not None:
        if policy.max is not None and amount > policy.max:
            return True
        if policy.step and policy.min is not None:
            return abs((amount - policy.min) / policy.step - round((amount - policy.min) / policy.step)) > _EPSILON
        return False
    if policy.valid_values:
        return amount not in policy.valid_values
    return False


def share_of(device: SliceDevice, request: DeviceRequestInfo) -> dict[str, float] | None:
    """What ``request`` would take of each of ``device``'s capacities; None when it asks for a
    capacity the device does not have or an amount its policy refuses."""
    capacity = dict(device.capacity)
    asked = dict(request.capacity)
    if any(name not in capacity for name in asked):
        return None
    policies = dict(device.request_policies)
    out = {}
    for name, value in capacity.items():
        amount = consumed_amount(asked.get(name), value, policies.get(name))
        if _violates(amount, policies.get(name)):
            return None
        out[name] = amount
    return out


# --- the allocator -------------------------------------------------------------------------------------------


class Allocator:
    """The scheduler's allocation over one cluster state; see the module docstring."""

    def __init__(self, state: ClusterState, matches: AllocatorCache | None = None,
                 node_labels: Mapping[str, Mapping[str, str]] | None = None) -> None:
        if matches is None:
            matches = AllocatorCache()
        matches.update(state.classes, state.slices)
        self.matches = matches
        self.classes = {c.name: c for c in state.classes}
        self.node_labels = node_labels
        self._request_selectors: dict[tuple[str, ...], ClassSelector] = {}
        rules = TaintRuleIndex(state.taint_rules)
        self.pools: list[Pool] = []
        self.devices: dict[DeviceKey, Device] = {}
        for key, slices in sorted(_newest(state.slices).items()):
            slices.sort(key=lambda s: s.name)
            ids = tuple(id(s) for s in slices)
            known = matches.pools.get(key)
            # Only the rules that can select the pool's devices: a rule elsewhere rebuilds nothing here.
            rules_key = rules.for_pool(*key)
            if known is not None and known[0] == ids and known[1] == rules_key:
                pool = known[2]
            else:
                pool = self._pool(key, slices, rules_key)
                matches.pools[key] = (ids, rules_key, pool)
            self.pools.append(pool)
            for device in pool.devices:
                self.devices.setdefault(device.key, device)
        self._local: dict[str, list[Pool]] = {}
        self._global: list[Pool] = []
        for pool in self.pools:
            if pool.everywhere or not pool.nodes:
                self._global.append(pool)
            else:
                for n in pool.nodes:
                    self._local.setdefault(n, []).append(pool)
        names = set(self._local) | {n for p in self._global for n in p.nodes} | set(node_labels or ())
        if not names and self._global:
            names = {""}  # devices for all nodes and no node known: one node stands for them
        self.nodes: tuple[str, ...] = tuple(sorted(names))
        self._views: dict[str, list[tuple[Pool, list[Device]]]] = {}
        self.committed = _Usage()
        self._usage: dict[PoolKey, list[tuple[str, bool, tuple[tuple[str, float], ...]]]] = {}
        self._usage_keys: dict[PoolKey, UsageKey] = {}
        self._candidates: dict[tuple[int, ...], tuple[str, ...]] = {}
        #: What a claim of one shape got on a node, and the diagnoses: until the next ``commit``.
        self._tried: dict[tuple[object, ...], tuple[tuple[Pick, ...] | None, str]] = {}
        self._diagnosed: dict[tuple[object, ...], tuple[RequestOutcome, ...]] = {}
        self._commit_claims(state.claims)

    # --- building -----------------------------------------------------------------------------------

    def _pool(self, key: PoolKey, slices: list[ResourceSliceInfo], rules: Sequence[DeviceTaintRule]) -> Pool:
        """A pool of the newest generation's ``slices``, its devices tainted by ``rules`` (those for it)."""
        expected = max(s.resource_slice_count for s in slices)
        invalid, counters = _pool_invalid(slices)
        nodes = {s.placement.node_name or s.node_name for s in slices if s.placement.node_name or s.node_name}
        nodes |= {d.placement.node_name for s in slices for d in s.devices
                  if d.placement is not None and d.placement.node_name}
        everywhere = any(s.placement.all_nodes or s.placement.node_selector is not None for s in slices) or any(
            d.placement is not None and (d.placement.all_nodes or d.placement.node_selector is not None)
            for s in slices for d in s.devices)
        pool = Pool(key, slices[0].generation, expected, slices, counters=counters,
                    incomplete=len(slices) != expected, invalid=invalid, nodes=frozenset(nodes),
                    everywhere=everywhere)
        for sl in slices:
            rows = self.matches.of_slice(sl)
            group: list[Device] = []
            for d, row in zip(sl.devices, rows, strict=True):
                dkey = (sl.driver, sl.pool, d.name)
                taints = d.taints + tuple(r.taint for r in rules if r.selects(*dkey))
                device = Device(dkey, d, sl, pool, row, taints)
                group.append(device)
            pool.devices.extend(group)
            pool.by_slice.append((sl, group))
        pool.class_mask = tuple(any(d.matches[i] is not False for d in pool.devices)
                                for i in range(len(self.matches.order)))
        return pool

    def _commit_claims(self, claims: Sequence[ClaimInfo]) -> None:
        for c in claims:
            who = f"{c.namespace}/{c.name}"
            for r in c.results:
                if r.admin_access:
                    continue
                share = bool(r.share_id or r.consumed_capacity)
                self._usage.setdefault((r.driver, r.pool), []).append((r.device, share, r.consumed_capacity))
                key = (r.driver, r.pool, r.device)
                device = self.devices.get(key)
                first = key not in self.committed.taken and key not in self.committed.shared_by
                if share:
                    self.committed.shared_by.setdefault(key, []).append(who)
                    self.committed.add_share(key, dict(r.consumed_capacity))
                else:
                    self.committed.taken.setdefault(key, []).append(who)
                if first and device is not None and device.pool.usable:
                    self.committed.consume(device.pool.key, device.device)

    # --- node views ---------------------------------------------------------------------------------

    def usage(self, pool: PoolKey) -> UsageKey:
        """What the committed allocations of this state take of a pool, in a canonical order: equal
        keys, equal use (``commit`` does not change it)."""
        known = self._usage_keys.get(pool)
        if known is None:
            known = self._usage_keys[pool] = tuple(sorted(self._usage.get(pool, ())))
        return known

    def pool_view(self, node: str) -> list[tuple[Pool, list[Device]]]:
        """The pools ``node`` sees and their devices for it, in the order the allocator tries them."""
        cached = self._views.get(node)
        if cached is not None:
            return cached
        labels = self.labels(node)
        pools = sorted([*self._local.get(node, ()), *self._global], key=lambda p: p.key)
        out: list[tuple[Pool, list[Device]]] = []
        for pool in pools:
            devices = [d for sl, group in pool.by_slice if group and _slice_for_node(sl, node, labels) for d in group]
            if devices:
                out.append((pool, devices))
        if len(self._views) < 10_000:
            self._views[node] = out
        return out

    def view(self, node: str) -> list[Device]:
        """The devices ``node`` sees, in the order the allocator tries them."""
        return [d for _, devices in self.pool_view(node) for d in devices]

    def labels(self, node: str) -> Mapping[str, str] | None:
        return self.node_labels.get(node) if self.node_labels is not None else None

    def candidate_nodes(self, class_names: Iterable[str]) -> tuple[str, ...]:
        """Nodes that see a device meeting (or failing) one of the classes' selectors."""
        indices = tuple(sorted({i for n in class_names if (i := self.matches.index(n)) is not None}))
        known = self._candidates.get(indices)
        if known is None:
            known = self._candidates[indices] = tuple(
                n for n in self.nodes if any(p.class_mask[i] for p, _ in self.pool_view(n) for i in indices))
        return known

    # --- checks ---------------------------------------------------------------------------------------

    def _request_selector(self, expressions: tuple[str, ...]) -> ClassSelector | None:
        if not expressions:
            return None
        sel = self._request_selectors.get(expressions)
        if sel is None:
            sel = ClassSelector(DeviceClassInfo("(a request's selectors)", expressions), self.matches.engine,
                                self.matches.budget)
            if len(self._request_selectors) < 1000:
                self._request_selectors[expressions] = sel
        return sel

    def _selected(self, req: _Request, device: Device, claim: ClaimInfo) -> bool:
        """The class's and the request's selectors; raises ``_Failure`` as the scheduler errors out."""
        cls = req.info.device_class
        if req.class_selector is not None and req.class_selector.error:
            raise _Failure(f"class {cls}: selector: CEL compile error: {req.class_selector.error}")
        result = device.matches[req.class_index] if req.class_index is not None else True
        if result is None:
            raise _Failure(f"class {cls}: selector on device {'/'.join(device.key)}: CEL runtime error")
        if not result:
            return False
        if req.selector is not None:
            if req.selector.error:
                raise _Failure(f"claim {claim.namespace}/{claim.name}: selector: CEL compile error: "
                               f"{req.selector.error}")
            own = req.selector.matches(device.key[0], device.device)
            if own is None:
                raise _Failure(f"claim {claim.namespace}/{claim.name}: selector on device "
                               f"{'/'.join(device.key)}: CEL runtime error")
            if not own:
                return False
        return True

    def _in_use(self, key: DeviceKey, layer: _Usage) -> bool:
        return key in self.committed.taken or key in layer.taken

    def _capacity_fits(self, device: Device, request: DeviceRequestInfo, layer: _Usage) -> bool:
        if not device.device.allow_multiple_allocations and not request.capacity:
            return True  # the whole device, and a default never exceeds the capacity
        share = share_of(device.device, request)
        if share is None:
            return False
        if not device.device.allow_multiple_allocations:
            return all(amount <= value + _EPSILON for (_, value), amount in zip(device.device.capacity,
                                                                                 share.values(), strict=True))
        have = self.committed.shares.get(device.key, {})
        adding = layer.shares.get(device.key, {})
        return all(have.get(n, 0.0) + adding.get(n, 0.0) + amount <= value + _EPSILON
                   for (n, value), amount in zip(device.device.capacity, share.values(), strict=True))

    def capacity_left(self, key: DeviceKey) -> dict[str, float]:
        """What the committed shares leave of a device's capacities."""
        device = self.devices[key]
        used = self.committed.shares.get(key, {})
        return {n: v - used.get(n, 0.0) for n, v in device.device.capacity}

    def _counters_fit(self, device: Device, layer: _Usage) -> tuple[bool, str]:
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
                if left + _EPSILON < adding.get(name, 0.0) + extra.get(name, 0.0):
                    return False, f"{set_name}: {name} {_amount(max(0.0, left - adding.get(name, 0.0)))} left"
        return True, ""

    @staticmethod
    def _blocking_taint(device: Device, request: DeviceRequestInfo) -> DeviceTaint | None:
        for taint in device.taints:
            if taint.effect in _BLOCKING_EFFECTS and not any(t.tolerates(taint) for t in request.tolerations):
                return taint
        return None

    # --- one claim --------------------------------------------------------------------------------------

    def allocate(self, claim: ClaimInfo, node: str | None = None) -> Outcome:
        """Whether the scheduler could allocate ``claim`` now on ``node`` (None: on any node, tried in
        name order); see ``Outcome``."""
        if claim.allocated:
            return Outcome(claim.namespace, claim.name, False, error="already allocated")
        missing = [r for r in claim.requests if r.device_class not in self.classes]
        if not claim.requests or missing:
            error = (f"request {missing[0].name}: device class {missing[0].device_class or '(none)'} not found"
                     if missing else "no requests")
            return Outcome(claim.namespace, claim.name, False, error=error,
                           requests=tuple(self._summary(claim, r, []) for r in claim.requests))
        classes = {r.device_class for r in claim.requests}
        if node is not None:
            nodes: tuple[str, ...] = (node,)
        elif any((sel := self.matches.selector(c)) is not None and sel.error for c in classes):
            nodes = self.nodes  # a selector that does not compile fails wherever the search reaches a device
        else:
            nodes = self.candidate_nodes(classes)
        first_error = ""
        tried: list[str] = []
        for n in nodes:
            tried.append(n)
            picks, error = self._try_node(claim, n)
            if picks is not None:
                return Outcome(claim.namespace, claim.name, True, n, tuple(picks),
                               self._diagnose(claim, [n], picks), nodes_tried=len(tried))
            first_error = first_error or (f"node {n}: {error}" if error else "")
        return Outcome(claim.namespace, claim.name, False, "", (), self._diagnose(claim, tried, []),
                       first_error, len(tried))

    def commit(self, outcome: Outcome) -> None:
        """Take what ``outcome`` chose, as the claim's allocation would."""
        who = f"{outcome.namespace}/{outcome.claim}"
        self._tried.clear()
        self._diagnosed.clear()
        for pick in outcome.picks:
            self._take(self.committed, pick, who)
            if not pick.admin_access:
                pool = pick.device[:2]
                shared = self.devices[pick.device].device.allow_multiple_allocations
                self._usage.setdefault(pool, []).append((pick.device[2], shared, pick.consumed_capacity))
                self._usage_keys.pop(pool, None)  # what is counted of the pool changed

    def _take(self, usage: _Usage, pick: Pick, who: str) -> None:
        if pick.admin_access:
            return
        device = self.devices[pick.device]
        first = not any(pick.device in u.taken or pick.device in u.shares for u in (self.committed, usage))
        if device.device.allow_multiple_allocations:
            usage.shared_by.setdefault(pick.device, []).append(who)
            usage.add_share(pick.device, dict(pick.consumed_capacity))
        else:
            usage.taken.setdefault(pick.device, []).append(who)
        if first:
            usage.consume(device.pool.key, device.device)

    def _requests(self, claim: ClaimInfo) -> list[list[_Request]]:
        groups: list[list[_Request]] = []
        previous = None
        for r in claim.requests:
            index = self.matches.index(r.device_class)
            req = _Request(r, index, self.matches.selector(r.device_class), self._request_selector(r.selectors),
                           "/" in r.name)
            if req.subrequest and previous == r.parent:
                groups[-1].append(req)
            else:
                groups.append([req])
            previous = r.parent
        return groups

    def _try_node(self, claim: ClaimInfo, node: str) -> tuple[list[Pick] | None, str]:
        # Claims of one shape fare alike on a node until something is committed (``explain --all``
        # over many pending claims of a few shapes); errors of request selectors name their claim.
        shape = None if any(r.selectors for r in claim.requests) else (claim.requests, claim.constraints, node)
        if shape is not None and (known := self._tried.get(shape)) is not None:
            return (list(known[0]) if known[0] is not None else None), known[1]
        picks, error = self._search_node(claim, node)
        if shape is not None and len(self._tried) < 100_000:
            self._tried[shape] = (tuple(picks) if picks is not None else None, error)
        return picks, error

    def _search_node(self, claim: ClaimInfo, node: str) -> tuple[list[Pick] | None, str]:
        search = _Search(claim, node, self.labels(node), self.view(node), self._requests(claim), _Usage(),
                         constraints=[_Constraint(c) for c in claim.constraints])
        try:
            for group in search.groups:
                for req in group:
                    if req.info.all_devices:
                        self._all_devices(search, req)
            if sum(min(r.count for r in g) for g in search.groups) > MAX_RESULTS:
                return None, f"more than {MAX_RESULTS} devices asked"
            done = self._allocate_one(search, 0, 0, 0, 0, False)
        except _Failure as exc:
            return None, str(exc)
        return (search.picks if done else None), ""

    def _all_devices(self, search: _Search, req: _Request) -> None:
        seen: set[PoolKey] = set()
        for device in search.devices:
            pool = device.pool
            if pool.key not in seen:
                seen.add(pool.key)
                if pool.incomplete:
                    raise _Failure(f"request {req.info.name}: asks for all devices, but resource pool "
                                   f"{'/'.join(pool.key)} is currently being updated")
                if pool.invalid:
                    raise _Failure(f"request {req.info.name}: asks for all devices, but resource pool "
                                   f"{'/'.join(pool.key)} is currently invalid")
            if (self._selected(req, device, search.claim) and device.for_node(search.node, search.labels)
                    and self._capacity_fits(device, req.info, search.layer)):
                req.all_list.append(device)

    def _allocate_one(self, s: _Search, ri: int, si: int, di: int, start: int, in_sub: bool) -> bool:
        if ri >= len(s.groups):
            return True
        group = s.groups[ri]
        if not in_sub and group[0].subrequest:
            return any(self._allocate_one(s, ri, sub, 0, 0, True) for sub in range(len(group)))
        req = group[si]
        if req.info.all_devices and not req.all_list:
            return False
        if di >= req.count:
            return self._allocate_one(s, ri + 1, 0, 0, 0, False)
        if len(s.picks) + req.count - di > MAX_RESULTS:
            return False
        if req.info.all_devices:
            undo = self._allocate_device(s, req, req.all_list[di], must=True)
            if undo is None:
                return False
            if self._allocate_one(s, ri, si, di + 1, 0, in_sub):
                return True
            undo()
            return False
        for pos in range(start, len(s.devices)):
            device = s.devices[pos]
            if not device.pool.usable:
                continue
            s.steps += 1
            if s.steps > MAX_STEPS:
                raise _Failure(f"search gave up after {MAX_STEPS} devices tried")
            if req.info.admin_access:
                if device.key in s.layer.taken:
                    continue
            elif self._in_use(device.key, s.layer):
                continue
            if not self._selected(req, device, s.claim) or not device.for_node(s.node, s.labels):
                continue
            if not self._capacity_fits(device, req.info, s.layer):
                continue
            undo = self._allocate_device(s, req, device, must=False)
            if undo is None:
                continue
            if self._allocate_one(s, ri, si, di + 1, pos + 1, in_sub):
                return True
            undo()
        return False

    def _allocate_device(self, s: _Search, req: _Request, device: Device, must: bool) -> Callable[[], None] | None:
        info = device.device
        if not req.info.admin_access and self._in_use(device.key, s.layer):
            return None
        if not self._counters_fit(device, s.layer)[0]:
            return None
        if self._blocking_taint(device, req.info) is not None:
            return None
        added: list[_Constraint] = []
        for c in s.constraints:
            if not c.add(req.info.name, device):
                for a in added:
                    a.remove(req.info.name, device)
                if must:
                    raise _Failure(f"request {req.info.name}: cannot add device {'/'.join(device.key)} because a "
                                   "claim constraint would not be satisfied")
                return None
            added.append(c)
        share: tuple[tuple[str, float], ...] = ()
        if info.allow_multiple_allocations:
            amounts = share_of(info, req.info) or {}
            share = tuple(sorted(amounts.items()))
        pick = Pick(req.info.name, device.key, req.info.admin_access, share)
        layer = s.layer
        first_share = info.allow_multiple_allocations and device.key not in self.committed.shares and (
            device.key not in layer.shares)
        consumes = not info.allow_multiple_allocations or first_share
        if info.allow_multiple_allocations:
            layer.add_share(device.key, dict(share))
        elif not req.info.admin_access:
            layer.taken.setdefault(device.key, []).append("")
        if consumes:
            layer.consume(device.pool.key, info)
        s.picks.append(pick)

        def undo() -> None:
            s.picks.pop()
            for c in s.constraints:
                c.remove(req.info.name, device)
            if info.allow_multiple_allocations:
                layer.add_share(device.key, dict(share), -1.0)
                if first_share:
                    del layer.shares[device.key]
            elif not req.info.admin_access:
                del layer.taken[device.key]
            if consumes:
                layer.consume(device.pool.key, info, -1.0)
        return undo

    # --- why not ---------------------------------------------------------------------------------------

    def verdict(self, device: Device, request: DeviceRequestInfo, node: str,
                layer: _Usage | None = None) -> tuple[str, str]:
        """Why ``device`` (a candidate of ``request``) cannot be used on ``node`` now: (reason, detail);
        ("", "") when nothing keeps it."""
        layer = layer or _Usage()
        if not device.pool.usable:
            return device.pool.unusable_reason
        taken = self.committed.taken.get(device.key)
        if taken is not None and not request.admin_access:
            return TAKEN, ", ".join(taken)
        if not device.for_node(node, self.labels(node)):
            return NODE, f"{'/'.join(device.key)} is for {device.node or 'other nodes'}"
        if not self._capacity_fits(device, request, layer):
            left = self.capacity_left(device.key)
            shared = self.committed.shared_by.get(device.key, [])
            return CAPACITY, ", ".join(f"{n} {_amount(v)} left" for n, v in sorted(left.items())) + (
                f" (shared by {', '.join(shared)})" if shared else "")
        fits, detail = self._counters_fit(device, layer)
        if not fits:
            return COUNTERS, detail
        taint = self._blocking_taint(device, request)
        if taint is not None:
            return TAINTED, f"{taint.key}={taint.value}:{taint.effect}" if taint.value else (
                f"{taint.key}:{taint.effect}")
        return "", ""

    def _summary(self, claim: ClaimInfo, request: DeviceRequestInfo, nodes: Sequence[str],
                 picks: Sequence[Pick] = ()) -> RequestOutcome:
        if request.device_class not in self.classes:
            return RequestOutcome(request.name, request.device_class, request.count, request.all_devices,
                                  blocked=(Blocked(CLASS_MISSING, 0, (request.device_class,)),),
                                  error=f"device class {request.device_class or '(none)'} not found")
        index = self.matches.index(request.device_class)
        own = self._request_selector(request.selectors)
        class_selector = self.matches.selector(request.device_class)
        counts: dict[str, int] = {}
        details: dict[str, list[str]] = {}
        matching = usable = 0
        error = ""
        if class_selector is not None and class_selector.error:
            error = f"class {request.device_class}: {class_selector.error}"
        elif own is not None and own.error:
            error = f"request selector: {own.error}"
        chosen = tuple(p.device for p in picks if p.request == request.name)
        for node in nodes:
            for device in self.view(node):
                result = device.matches[index] if index is not None else True
                if result and own is not None:
                    result = own.matches(device.key[0], device.device)
                if result is False:
                    continue
                if result is None:
                    if device.key in self.committed.taken and not request.admin_access:
                        continue  # skipped before CEL runs: not a candidate, not an error
                    reason, detail = SELECTOR_ERROR, f"{'/'.join(device.key)}: CEL runtime error"
                else:
                    matching += 1
                    if device.key in chosen:
                        usable += 1
                        continue
                    reason, detail = self.verdict(device, request, node)
                    if not reason:
                        usable += 1
                        if picks or not claim.constraints:
                            continue
                        reason, detail = CONSTRAINT, ""
                counts[reason] = counts.get(reason, 0) + 1
                known = details.setdefault(reason, [])
                if detail and detail not in known and len(known) < MAX_DETAILS:
                    known.append(detail)
        blocked = tuple(Blocked(r, n, tuple(details.get(r, ()))) for r, n in
                        sorted(counts.items(), key=lambda kv: (-kv[1], REASONS.index(kv[0]))))
        count = request.count
        if request.all_devices:
            count = matching
        return RequestOutcome(request.name, request.device_class, count, request.all_devices, matching, usable,
                              chosen, blocked, error)

    def _diagnose(self, claim: ClaimInfo, nodes: Sequence[str], picks: Sequence[Pick]) -> tuple[RequestOutcome, ...]:
        key = (claim.requests, bool(claim.constraints), tuple(nodes), tuple(picks))
        known = self._diagnosed.get(key)
        if known is None:
            known = tuple(self._summary(claim, r, nodes, picks) for r in claim.requests)
            if len(self._diagnosed) < 10_000:
                self._diagnosed[key] = known
        return known

    # --- counts ------------------------------------------------------------------------------------------

    def placeable_claims(self, device_class: str, nodes: Iterable[str] | None = None) -> int:
        """Single-device claims of ``device_class`` (ExactCount 1, no selectors, no tolerations) the
        scheduler could place one after another now, node after node (``nodes``: only on those, in
        that order); the committed state does not change. A device skipped once stays unusable
        while more are placed, so each node's devices are walked once; a node that sees only its own
        pools is counted again only when they or what is allocated of them changed."""
        index = self.matches.index(device_class)
        selector = self.matches.selector(device_class)
        if index is None or selector is None or selector.error:
            return 0
        layer = _Usage()
        placed = 0
        for node in self.nodes if nodes is None else nodes:
            pools = [(p, ds) for p, ds in self.pool_view(node) if p.class_mask[index]]
            if not pools:
                continue
            local = all(not p.everywhere and p.nodes == {node} for p, _ in pools)
            if local:
                seen = tuple(p for p, _ in pools)
                usage = tuple(self.usage(p.key) for p in seen)
                known = self.matches.placeable.get((index, node))
                if known is not None and len(known[0]) == len(seen) and all(
                        a is b for a, b in zip(known[0], seen, strict=True)) and known[1] == usage:
                    placed += known[2]
                    continue
            count = self._place_on_node(node, pools, index, layer)
            if local:
                self.matches.placeable[(index, node)] = (seen, usage, count)
            placed += count
        return placed

    def _place_on_node(self, node: str, pools: Sequence[tuple[Pool, Sequence[Device]]], index: int,
                       layer: _Usage) -> int:
        labels = self.labels(node)
        placed = 0
        for pool, devices in pools:
            if not pool.usable:
                continue
            for device in devices:
                result = device.matches[index]
                if result is False or self._in_use(device.key, layer):
                    continue
                if result is None:
                    return placed  # the search reaches a device its class cannot evaluate: no claim here
                if not device.for_node(node, labels):
                    continue
                if not (self._capacity_fits(device, _PLAIN, layer) and self._counters_fit(device, layer)[0]
                        and self._blocking_taint(device, _PLAIN) is None):
                    continue
                if not device.device.allow_multiple_allocations:
                    self._take(layer, Pick("", device.key), "")
                    placed += 1
                    continue
                # Shares of one device, counted rather than placed one by one (a 1-byte default on 80Gi
                # would be billions of steps): the first consumes the counters, the others only capacity.
                share = share_of(device.device, _PLAIN) or {}
                shares = self._shares_left(device, share, layer)
                self._take(layer, Pick("", device.key, False, tuple(sorted(share.items()))), "")
                layer.add_share(device.key, {n: v * (shares - 1) for n, v in share.items()})
                placed += shares
        return placed

    def _shares_left(self, device: Device, share: Mapping[str, float], layer: _Usage) -> int:
        """How many shares of ``share`` still fit the device's capacities (1 when it takes nothing)."""
        have = self.committed.shares.get(device.key, {})
        adding = layer.shares.get(device.key, {})
        counts = [int((value - have.get(n, 0.0) - adding.get(n, 0.0) + _EPSILON) // share[n])
                  for n, value in device.device.capacity if share.get(n, 0.0) > 0]
        return max(1, min(counts, default=1))

    def fit_one_after_another(self, devices: Sequence[Device]) -> int:
        """How many of ``devices`` (one profile of one GPU, in slice order) the scheduler could place
        one after another, each for a claim asking for exactly that kind: first fit over them."""
        layer = _Usage()
        request = _PLAIN
        placed = 0
        for device in devices:
            if not device.pool.usable or self._in_use(device.key, layer):
                continue
            if (self._counters_fit(device, layer)[0] and self._blocking_taint(device, request) is None
                    and self._capacity_fits(device, request, layer)):
                self._take(layer, Pick("", device.key), "")
                placed += 1
        return placed

    def state(self, device: Device) -> str:
        """The device's state for new claims: unavailable (its pool is incomplete or invalid),
        allocated, tainted, blocked (its counters no longer fit), shared (a device that allows
        multiple allocations, with shares and capacity left) or free."""
        if not device.pool.usable:
            return "unavailable"
        if device.key in self.committed.taken:
            return "allocated"
        shared = device.key in self.committed.shares
        if shared and not self._capacity_fits(device, _PLAIN, _NOTHING):
            return "allocated"
        if self._blocking_taint(device, _PLAIN) is not None:
            return "tainted"
        if not self._counters_fit(device, _NOTHING)[0]:
            return "blocked"
        return "shared" if shared else "free"

    def counter_set_share_left(self, pool: Pool, set_name: str) -> float:
        """The share of a counter set still free, by the counter that bounds it most (0-1). Numbered
        counters of one kind (NVIDIA's ``memory-slice-0`` … ``-7``) count together, as one resource:
        one slice taken leaves 7 of 8, not nothing."""
        used = self.committed.counters.get((pool.key, set_name), {})
        totals: dict[str, list[float]] = {}
        for name, total in pool.counters.get(set_name, {}).items():
            base, sep, number = name.rpartition("-")
            kind = base if sep and number.isdigit() else name
            have = totals.setdefault(kind, [0.0, 0.0])
            have[0] += max(0.0, total - used.get(name, 0.0))
            have[1] += total
        return min((left / total for left, total in totals.values() if total > 0), default=0.0)


def _amount(value: float) -> str:
    gib = 2**30
    if value >= gib and value % gib == 0:
        return f"{int(value // gib)}Gi"
    return f"{value:g}"
