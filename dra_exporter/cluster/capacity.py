"""The cluster mode's core: the whole cluster's DRA objects → a ``Frame`` of capacity families.

Contract: ``Capacity.frame(state, now, health)`` is a function of its arguments (``Capacity`` only
memoises what is costly — CEL results per slice — so equal inputs give equal frames). No I/O.

The arithmetic is the scheduler's (KEP-4815, ``k8s.io/dynamic-resource-allocation/structured``):

* only the slices of each pool's newest generation count; a pool is complete when it has
  ``resourceSliceCount`` of them and no slice of an older generation is left;
* a device is allocated when some claim's ``status.allocation`` names it (admin-access results do
  not take the device: such claims share it with its owner);
* a counter set's remaining counters are its ``sharedCounters`` minus what the allocated devices
  that consume from it take (``consumesCounters``); an unallocated device fits when every counter it
  consumes is still there. Counter sets are per pool (1.35+ requires unique names per pool);
* a NoSchedule or NoExecute taint (the slice's own, or a DeviceTaintRule's) keeps a device from
  new claims; a ``None`` effect does not.

State of each device, one of: ``allocated``, ``tainted``, ``blocked`` (its counters do not fit),
``free``. What the cluster mode cannot know is not guessed: device health is the kubelet's, and the
node agent reports it (``dra_device_health``). The states of claims, which need the pods that wait
for them, are ``claims``'s.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .. import catalog as cat
from ..model import (
    ClaimInfo,
    ClusterState,
    DeviceClassInfo,
    DeviceTaintRule,
    Family,
    Frame,
    Labels,
    ResourceSliceInfo,
    Sample,
    SliceDevice,
    SourceHealth,
)
from .claims import PENDING, ClaimStatus, FirstBlocking, claim_families, claim_statuses, missing_class, pending_ages
from .selectors import ClassSelector

ALLOCATED, TAINTED, BLOCKED, FREE = "allocated", "tainted", "blocked", "free"
STATES = (ALLOCATED, TAINTED, BLOCKED, FREE)
_BLOCKING_EFFECTS = frozenset({"NoSchedule", "NoExecute"})
#: Device attributes behind labels (NVIDIA's names; ``model`` is the example driver's).
_MODEL_ATTRIBUTES = ("productName", "model")
_GIB = 2**30

DeviceKey = tuple[str, str, str]
"""(driver, pool, device)."""


@dataclass(frozen=True, slots=True)
class _Device:
    """A current device with what its labels and the counter arithmetic need."""

    key: DeviceKey
    device: SliceDevice
    node: str


@dataclass(slots=True)
class _Builder:
    samples: dict[str, dict[Labels, float]] = field(default_factory=lambda: defaultdict(dict))

    def set(self, spec: cat.MetricSpec, labels: Labels, value: float) -> None:
        self.samples[spec.name][spec.check(labels)] = float(value)

    def add(self, spec: cat.MetricSpec, labels: Labels, value: float = 1.0) -> None:
        family = self.samples[spec.name]
        family[spec.check(labels)] = family.get(labels, 0.0) + value

    def families(self) -> list[Family]:
        return [Family(spec.name, tuple(Sample(labels, v) for labels, v in sorted(found.items())))
                for spec in cat.CATALOG if (found := self.samples.get(spec.name))]


def current_generation(slices: Iterable[ResourceSliceInfo]) -> dict[tuple[str, str], int]:
    """The newest generation of each (driver, pool)."""
    newest: dict[tuple[str, str], int] = {}
    for s in slices:
        key = (s.driver, s.pool)
        newest[key] = max(newest.get(key, s.generation), s.generation)
    return newest


def allocated_devices(claims: Iterable[ClaimInfo]) -> set[DeviceKey]:
    """Devices some claim's allocation takes (admin access takes none)."""
    return {(r.driver, r.pool, r.device) for c in claims for r in c.results if not r.admin_access}


def remaining_counters(slices: Sequence[ResourceSliceInfo], allocated: set[DeviceKey]
                       ) -> dict[tuple[str, str, str], dict[str, float]]:
    """(driver, pool, counter set) → counter → what is left after the allocated devices' consumption."""
    left: dict[tuple[str, str, str], dict[str, float]] = {}
    for s in slices:
        for cs in s.shared_counters:
            left[(s.driver, s.pool, cs.name)] = dict(cs.counters)
    for s in slices:
        for d in s.devices:
            if (s.driver, s.pool, d.name) not in allocated:
                continue
            for use in d.consumes_counters:
                counters = left.get((s.driver, s.pool, use.counter_set))
                if counters is None:
                    continue  # its counter set is not published (an incomplete pool)
                for name, value in use.counters:
                    counters[name] = counters.get(name, 0.0) - value
    return left


def fits(driver: str, pool: str, device: SliceDevice,
         left: dict[tuple[str, str, str], dict[str, float]]) -> bool:
    """Whether every counter ``device`` consumes is still available; a counter set or counter the
    pool does not publish never fits (the scheduler cannot allocate against it)."""
    for use in device.consumes_counters:
        counters = left.get((driver, pool, use.counter_set))
        if counters is None:
            return False
        for name, value in use.counters:
            if counters.get(name, -1.0) < value:
                return False
    return True


def blocking_taint(key: DeviceKey, device: SliceDevice, rules: Sequence[DeviceTaintRule]) -> bool:
    if any(t.effect in _BLOCKING_EFFECTS for t in device.taints):
        return True
    return any(r.taint.effect in _BLOCKING_EFFECTS and r.selects(*key) for r in rules)


def device_state(key: DeviceKey, device: SliceDevice, allocated: set[DeviceKey], rules: Sequence[DeviceTaintRule],
                 left: dict[tuple[str, str, str], dict[str, float]]) -> str:
    if key in allocated:
        return ALLOCATED
    if blocking_taint(key, device, rules):
        return TAINTED
    if device.consumes_counters and not fits(key[0], key[1], device, left):
        return BLOCKED
    return FREE


def partition_profile(device: SliceDevice) -> str:
    """What kind of partition a device is: NVIDIA's ``profile`` (``1g.18gb``), else its ``type``
    (``gpu``), else what it consumes (``compute=25,memory=20Gi``: the example driver's partitions)."""
    for attr in ("profile", "type"):
        if value := device.attribute(attr):
            return value
    return ",".join(f"{name}={_amount(v)}" for use in device.consumes_counters for name, v in use.counters)


def _amount(value: float) -> str:
    if value >= _GIB and value % _GIB == 0:
        return f"{int(value // _GIB)}Gi"
    return f"{value:g}"


def _node(sl: ResourceSliceInfo, device: SliceDevice) -> str:
    if device.placement is not None:
        return device.placement.node_name
    return device.node_name or sl.placement.node_name or sl.node_name


def _placement(sl: ResourceSliceInfo) -> str:
    if sl.per_device_node_selection:
        return "per-device"
    if sl.placement.node_name or sl.node_name:
        return "node"
    if sl.placement.all_nodes:
        return "all-nodes"
    if sl.placement.node_selector is not None:
        return "node-selector"
    return "counters-only" if sl.shared_counters and not sl.devices else ""


class Capacity:
    """Builds cluster frames; keeps compiled DeviceClass selectors and each slice's class matches
    between frames (recomputed only for classes and slices that changed). ``first_blocking`` says why
    each pending claim waits (``claims.FirstBlocking``)."""

    def __init__(self, first_blocking: FirstBlocking = missing_class) -> None:
        self._first_blocking = first_blocking
        self._selectors: dict[str, tuple[DeviceClassInfo, ClassSelector]] = {}
        self._matches: dict[str, tuple[ResourceSliceInfo, tuple[tuple[int, ...], ...]]] = {}
        self._class_order: tuple[str, ...] = ()
        self._errors: Counter[str] = Counter()
        self._static: tuple[ClusterState, dict[str, dict[Labels, float]], tuple[ClaimStatus, ...]] | None = None

    def frame(self, state: ClusterState, now: float, health: Sequence[SourceHealth] = (),
              build_labels: Labels = ()) -> Frame:
        """The frame of ``state`` at ``now``. What depends on the objects alone is computed again only
        when ``state`` is a different object (the source hands out the same one while nothing changed);
        the ages of pending claims and the self-metrics are computed every time."""
        if self._static is None or self._static[0] is not state:
            self._static = (state, *self._static_samples(state))
        out = _Builder()
        out.samples.update({name: dict(found) for name, found in self._static[1].items()})
        pending_ages(out.set, self._static[2], now)
        for h in health:
            src = (("source", h.source),)
            out.set(cat.SOURCE_UP, src, 1 if h.up else 0)
            out.set(cat.COLLECT_DURATION, src, h.duration_seconds)
            out.set(cat.COLLECT_ERRORS, src, h.errors_total)
            out.set(cat.LAST_SUCCESS, src, h.last_success_timestamp)
        if build_labels:
            out.set(cat.BUILD_INFO, build_labels, 1)
        return Frame(tuple(out.families()), now)

    def _static_samples(self, state: ClusterState) -> tuple[dict[str, dict[Labels, float]], tuple[ClaimStatus, ...]]:
        """The samples that depend on the objects alone, and the pending claims (their ages do not)."""
        out = _Builder()
        newest = current_generation(state.slices)
        current = [s for s in state.slices if s.generation == newest[(s.driver, s.pool)]]
        self._pool_families(out, state.slices, newest)
        allocated = allocated_devices(state.claims)
        left = remaining_counters(current, allocated)
        rules = [r for r in state.taint_rules if not r.unsupported_selector]
        self._update_selectors(state.classes)
        class_states: Counter[tuple[str, str]] = Counter()
        for sl in current:
            matches = self._slice_matches(sl)
            for device, matched in zip(sl.devices, matches, strict=True):
                key = (sl.driver, sl.pool, device.name)
                st = device_state(key, device, allocated, rules, left)
                node = _node(sl, device)
                model = next((v for a in _MODEL_ATTRIBUTES if (v := device.attribute(a))), "")
                out.add(cat.CLUSTER_DEVICES, (("driver", sl.driver), ("pool", sl.pool), ("node", node),
                                              ("type", device.attribute("type")), ("model", model),
                                              ("profile", device.attribute("profile")), ("state", st)))
                for index in matched:
                    class_states[(self._class_order[index], st)] += 1
                for use in device.consumes_counters[:1]:
                    # Free means it fits: a zero keeps the series of a full GPU.
                    out.add(cat.CLUSTER_PARTITIONS_FIT, (
                        ("driver", sl.driver), ("pool", sl.pool), ("node", node), ("counter_set", use.counter_set),
                        ("profile", partition_profile(device))), 1.0 if st == FREE else 0.0)
        self._class_families(out, class_states)
        statuses = claim_statuses(state.claims, state.pods)
        pending = tuple(s for s in statuses if s.state == PENDING)
        claim_families(out.set, statuses, self._first_blocking(state, [s.claim for s in pending]))
        self._taint_rule_families(out, state.taint_rules, current)
        for kind, count in (("ResourceSlice", len(state.slices)), ("ResourceClaim", len(state.claims)),
                            ("DeviceClass", len(state.classes)), ("DeviceTaintRule", len(state.taint_rules)),
                            ("Pod", len(state.pods))):
            out.set(cat.CLUSTER_OBJECTS, (("kind", kind),), count)
        return out.samples, pending

    # --- DeviceClasses ---------------------------------------------------------------------------

    def _update_selectors(self, classes: Sequence[DeviceClassInfo]) -> None:
        order = tuple(sorted(c.name for c in classes))
        changed = order != self._class_order
        fresh = {}
        for c in classes:
            known = self._selectors.get(c.name)
            if known is not None and known[0] == c:
                fresh[c.name] = known
            else:
                fresh[c.name] = (c, ClassSelector(c))
                changed = True
        self._selectors, self._class_order = fresh, order
        if changed:
            self._matches.clear()  # every slice's matches are against the old classes
            self._errors.clear()

    def _slice_matches(self, sl: ResourceSliceInfo) -> tuple[tuple[int, ...], ...]:
        cached = self._matches.get(sl.name)
        if cached is not None and cached[0] is sl:
            return cached[1]
        if cached is not None:
            self._count_errors(cached[0], cached[1], -1)
        selectors = [self._selectors[name][1] for name in self._class_order]
        matches = tuple(tuple(i for i, sel in enumerate(selectors) if sel.matches(sl.driver, d) is True)
                        for d in sl.devices)
        self._matches[sl.name] = (sl, matches)
        self._count_errors(sl, matches, 1)
        return matches

    def _count_errors(self, sl: ResourceSliceInfo, matches: tuple[tuple[int, ...], ...], sign: int) -> None:
        # Results are memoised by the selector, so asking again costs a lookup.
        for name in self._class_order:
            sel = self._selectors[name][1]
            failed = sum(1 for d in sl.devices if sel.matches(sl.driver, d) is None)
            if failed:
                self._errors[name] += sign * failed

    def _class_families(self, out: _Builder, class_states: Counter[tuple[str, str]]) -> None:
        for name in self._class_order:
            sel = self._selectors[name][1]
            labels = (("device_class", name),)
            out.set(cat.CLUSTER_CLASS_EVALUABLE, labels, 0 if sel.error else 1)
            if sel.error:
                continue
            out.set(cat.CLUSTER_CLASS_ERRORS, labels, max(0, self._errors.get(name, 0)))
            for st in STATES:
                out.set(cat.CLUSTER_CLASS_DEVICES, (*labels, ("state", st)), class_states.get((name, st), 0))

    # --- pools, taint rules (claims: .claims) ------------------------------------------------------

    @staticmethod
    def _pool_families(out: _Builder, slices: Sequence[ResourceSliceInfo], newest: dict[tuple[str, str], int]) -> None:
        seen: Counter[tuple[str, str, str]] = Counter()
        expected: dict[tuple[str, str], int] = {}
        for s in slices:
            current = s.generation == newest[(s.driver, s.pool)]
            seen[(s.driver, s.pool, "current" if current else "older")] += 1
            if current:
                expected[(s.driver, s.pool)] = max(expected.get((s.driver, s.pool), 0), s.resource_slice_count)
                placement = _placement(s)
                out.set(cat.CLUSTER_POOL_INFO, (("driver", s.driver), ("pool", s.pool),
                                                ("node", s.placement.node_name or s.node_name),
                                                ("placement", placement)), 1)
        for (driver, pool), count in expected.items():
            labels = (("driver", driver), ("pool", pool))
            in_current, older = seen[(driver, pool, "current")], seen[(driver, pool, "older")]
            out.set(cat.CLUSTER_POOL_SLICES, (*labels, ("generation", "current")), in_current)
            out.set(cat.CLUSTER_POOL_SLICES, (*labels, ("generation", "older")), older)
            out.set(cat.CLUSTER_POOL_SLICES_EXPECTED, labels, count)
            out.set(cat.CLUSTER_POOL_COMPLETE, labels, 1 if in_current >= count and not older else 0)

    @staticmethod
    def _taint_rule_families(out: _Builder, rules: Sequence[DeviceTaintRule], current: Sequence[ResourceSliceInfo]
                             ) -> None:
        for r in rules:
            count = 0 if r.unsupported_selector else sum(
                1 for s in current for d in s.devices if r.selects(s.driver, s.pool, d.name))
            out.set(cat.CLUSTER_TAINT_RULE_DEVICES, (
                ("rule", r.name), ("driver", r.driver), ("pool", r.pool), ("device", r.device),
                ("key", r.taint.key), ("value", r.taint.value), ("effect", r.taint.effect)), count)
