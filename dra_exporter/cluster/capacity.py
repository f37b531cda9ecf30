"""The cluster mode's core: the whole cluster's DRA objects → a ``Frame`` of capacity families.

Contract: ``Capacity.frame(state, now, health)`` is a function of its arguments (``Capacity`` only
memoises what is costly — CEL results per slice — so equal inputs give equal frames), unless it is
given a CEL time budget per frame: then classes the budget did not reach wait for a later frame
(``cel_budget``; ``dra_cluster_class_selectors_pending``). No I/O.

What is placeable, and every figure that depends on it, is the allocator's (``allocator.py``: the
scheduler's structured allocator, first fit); nothing here computes fit. Per device, one state:
``unavailable`` (its pool's newest generation is incomplete or invalid: the scheduler does not use
it), ``allocated``, ``shared`` (it allows multiple allocations, has shares and capacity left),
``tainted`` (a NoSchedule/NoExecute taint, the slice's own or a DeviceTaintRule's), ``blocked`` (its
counters no longer fit) or ``free``. Per class, the single-device claims the scheduler could place
one after another; per GPU and profile, the partitions it could place one after another; per model
and node, GPU-equivalents (a partitionable GPU counts by the share of its counter set still free,
by the counter that bounds it most). What the cluster mode cannot know is not guessed: device health
is the kubelet's, and the node agent reports it (``dra_device_health``). The states of claims, which
need the pods that wait for them, are ``claims``'s; why a pending claim waits is the allocator's
(``explain.PendingReasons``).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from .. import catalog as cat
from ..model import (
    ClusterState,
    DeviceTaintRule,
    Family,
    Frame,
    Labels,
    ResourceSliceInfo,
    Sample,
    SliceDevice,
    SourceHealth,
)
from ..taints import devices_per_rule
from .allocator import Allocator, AllocatorCache, Device, Pool, UsageKey
from .claims import PENDING, ClaimStatus, claim_families, claim_statuses, pending_ages
from .explain import PendingReasons
from .selectors import CelEngine

STATES = ("allocated", "shared", "tainted", "blocked", "unavailable", "free")
#: Device attributes behind labels (NVIDIA's names; ``model`` is the example driver's).
_MODEL_ATTRIBUTES = ("productName", "model")
_GIB = 2**30
#: GPU-equivalent states: a GPU (or the part of it) that can be allocated, is, or cannot be.
_FREE_STATES = frozenset({"free", "shared"})


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


@dataclass(slots=True)
class _PoolSamples:
    """What one pool adds to a frame: its samples, and its devices per (class, state) and class errors."""

    out: _Builder = field(default_factory=_Builder)
    class_states: Counter[tuple[int, str]] = field(default_factory=Counter)
    errors: Counter[int] = field(default_factory=Counter)


def current_generation(slices: Iterable[ResourceSliceInfo]) -> dict[tuple[str, str], int]:
    """The newest generation of each (driver, pool)."""
    newest: dict[tuple[str, str], int] = {}
    for s in slices:
        key = (s.driver, s.pool)
        newest[key] = max(newest.get(key, s.generation), s.generation)
    return newest


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


def _model(device: SliceDevice) -> str:
    return next((v for a in _MODEL_ATTRIBUTES if (v := device.attribute(a))), "")


def _mig_share(device: SliceDevice) -> float:
    """A MIG device's share of its GPU without shared counters (static MIG): its compute slices of 7."""
    head = device.attribute("profile").split("g.", 1)[0]
    return min(1.0, int(head) / 7) if head.isdigit() else 1.0


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
    between frames (recomputed only for classes and slices that changed)."""

    def __init__(self, engine: CelEngine | None = None, cel_budget: float | None = None, *,
                 every_reason: bool = False) -> None:
        """``engine`` runs the classes' CEL (default: in this process, without a time limit);
        ``cel_budget``: the seconds of class CEL one frame may spend (``cel_budget``; None: no bound,
        and then a frame is a function of its arguments); ``every_reason``: each frame has every
        pending claim's reason (a single frame: ``--once``), not those of a few claim shapes more a frame."""
        self._matches = AllocatorCache(engine, frame_budget=cel_budget)
        #: Per pool: its samples and class counts, with the pool object and its usage they are of.
        self._pools: dict[tuple[str, str], tuple[Pool, UsageKey, _PoolSamples]] = {}
        self._reasons = PendingReasons(every_shape=every_reason)
        self._static: tuple[ClusterState, dict[str, dict[Labels, float]], tuple[ClaimStatus, ...]] | None = None

    def frame(self, state: ClusterState, now: float, health: Sequence[SourceHealth] = (),
              build_labels: Labels = ()) -> Frame:
        """The frame of ``state`` at ``now``. What depends on the objects alone is computed again only
        when ``state`` is a different object (the source hands out the same one while nothing changed);
        the ages of pending claims and the self-metrics are computed every time."""
        if (self._static is None or self._static[0] is not state or not self._reasons.complete
                or self._matches.waiting):  # classes wait for this frame's CEL budget
            self._static = (state, *self._static_samples(state, now))
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

    def _static_samples(self, state: ClusterState, now: float
                        ) -> tuple[dict[str, dict[Labels, float]], tuple[ClaimStatus, ...]]:
        """The samples that depend on the objects alone, and the pending claims (their ages do not).
        ``now`` only decides whose pending reasons are asked again (``PendingReasons``)."""
        out = _Builder()
        newest = current_generation(state.slices)
        current = [s for s in state.slices if s.generation == newest[(s.driver, s.pool)]]
        self._pool_families(out, state.slices, newest)
        allocator = Allocator(state, self._matches)
        self._matches.forget(state.slices)
        class_states: Counter[tuple[int, str]] = Counter()
        errors: Counter[int] = Counter()
        fresh = {}
        for pool in allocator.pools:
            usage = allocator.usage(pool.key)
            known = self._pools.get(pool.key)
            if known is not None and known[0] is pool and known[1] == usage:
                samples = known[2]
            else:
                samples = _PoolSamples()
                self._pool_devices(samples, allocator, pool)
            fresh[pool.key] = (pool, usage, samples)
            for name, found in samples.out.samples.items():
                family = out.samples[name]
                for labels, value in found.items():
                    family[labels] = family.get(labels, 0.0) + value
            class_states.update(samples.class_states)
            errors.update(samples.errors)
        self._pools = fresh
        gpus = out.samples.get(cat.CLUSTER_GPU_EQUIVALENTS.name, {})
        for labels, v in gpus.items():
            gpus[labels] = round(v, 6)  # sums of shares: whole GPUs without float noise
        self._class_families(out, allocator, class_states, errors)
        statuses = claim_statuses(state.claims, state.pods, pods_read=state.read("pods"))
        pending = tuple(s for s in statuses if s.state == PENDING)
        claim_families(out.set, statuses, self._reasons(allocator, [s.claim for s in pending], now, state.pods))
        self._taint_rule_families(out, state.taint_rules, current)
        for kind, resource, count in (
                ("ResourceSlice", "resourceslices", len(state.slices)),
                ("ResourceClaim", "resourceclaims", len(state.claims)),
                ("DeviceClass", "deviceclasses", len(state.classes)),
                ("DeviceTaintRule", "devicetaintrules", len(state.taint_rules)), ("Pod", "pods", len(state.pods)),
                *((("Node", "nodes", len(state.nodes)),) if state.nodes is not None else ())):
            if state.read(resource):  # an unread kind's count is unknown, not 0
                out.set(cat.CLUSTER_OBJECTS, (("kind", kind),), count)
        return out.samples, pending

    @staticmethod
    def _pool_devices(samples: _PoolSamples, allocator: Allocator, pool: Pool) -> None:
        """Devices by state, what shared devices have left, partitions that fit, GPU-equivalents."""
        out, class_states, errors = samples.out, samples.class_states, samples.errors
        driver, name = pool.key
        profiles: dict[tuple[str, str], list[Device]] = {}
        counter_sets: dict[str, list[Device]] = {}
        for device in pool.devices:
            d = device.device
            st = allocator.state(device)
            node, model = device.node, _model(d)
            out.add(cat.CLUSTER_DEVICES, (("driver", driver), ("pool", name), ("node", node),
                                          ("type", d.attribute("type")), ("model", model),
                                          ("profile", d.attribute("profile")), ("state", st)))
            for index, result in enumerate(device.matches):
                if result:
                    class_states[(index, st)] += 1
                elif result is None:
                    errors[index] += 1
            if d.allow_multiple_allocations and pool.usable:
                for capacity, left in allocator.capacity_left(device.key).items():
                    out.set(cat.CLUSTER_DEVICE_CAPACITY_LEFT, (("driver", driver), ("pool", name), ("node", node),
                                                               ("device", d.name), ("capacity", capacity)), left)
            if d.consumes_counters:
                counter_set = d.consumes_counters[0].counter_set
                profiles.setdefault((counter_set, partition_profile(d)), []).append(device)
                counter_sets.setdefault(counter_set, []).append(device)
            elif model:
                share = _mig_share(d) if d.attribute("type") == "mig" else 1.0
                gpu_state = "allocated" if st == "allocated" else "free" if st in _FREE_STATES else "blocked"
                out.add(cat.CLUSTER_GPU_EQUIVALENTS, (("model", model), ("node", node), ("state", gpu_state)), share)
        for (counter_set, profile), devices in profiles.items():
            out.set(cat.CLUSTER_PARTITIONS_FIT, (
                ("driver", driver), ("pool", name), ("node", devices[0].node), ("counter_set", counter_set),
                ("profile", profile)), allocator.fit_one_after_another(devices))
        for counter_set, devices in counter_sets.items():
            model = next((m for dev in devices if (m := _model(dev.device))), "")
            if not model:
                continue
            left = allocator.counter_set_share_left(pool, counter_set) if pool.usable else 0.0
            usable = pool.usable and any(allocator.state(dev) in _FREE_STATES for dev in devices)
            labels = (("model", model), ("node", devices[0].node))
            out.add(cat.CLUSTER_GPU_EQUIVALENTS, (*labels, ("state", "free")), left if usable else 0.0)
            out.add(cat.CLUSTER_GPU_EQUIVALENTS, (*labels, ("state", "blocked")),
                    0.0 if usable else (left if pool.usable else 1.0))
            out.add(cat.CLUSTER_GPU_EQUIVALENTS, (*labels, ("state", "allocated")), 1.0 - left if pool.usable else 0.0)

    def _class_families(self, out: _Builder, allocator: Allocator, class_states: Counter[tuple[int, str]],
                        errors: Counter[int]) -> None:
        for index, name in enumerate(self._matches.order):
            sel = self._matches.selector(name)
            labels = (("device_class", name),)
            out.set(cat.CLUSTER_CLASS_EVALUABLE, labels, 0 if sel is None or sel.error else 1)
            out.set(cat.CLUSTER_CLASS_PENDING, labels, 1 if name in self._matches.waiting else 0)
            if sel is None or sel.error:
                continue
            out.set(cat.CLUSTER_CLASS_ERRORS, labels, errors.get(index, 0))
            out.set(cat.CLUSTER_CLASS_PLACEABLE, labels, allocator.placeable_claims(name))
            for st in STATES:
                out.set(cat.CLUSTER_CLASS_DEVICES, (*labels, ("state", st)), class_states.get((index, st), 0))

    # --- pools, claims, taint rules ------------------------------------------------------------------

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
            out.set(cat.CLUSTER_POOL_COMPLETE, labels, 1 if in_current == count and not older else 0)

    @staticmethod
    def _taint_rule_families(out: _Builder, rules: Sequence[DeviceTaintRule], current: Sequence[ResourceSliceInfo]
                             ) -> None:
        counts = devices_per_rule(rules, ((s.driver, s.pool, d.name) for s in current for d in s.devices))
        for r in rules:
            count = counts.get(r.name, 0)
            out.set(cat.CLUSTER_TAINT_RULE_DEVICES, (
                ("rule", r.name), ("driver", r.driver), ("pool", r.pool), ("device", r.device),
                ("key", r.taint.key), ("value", r.taint.value), ("effect", r.taint.effect)), count)
