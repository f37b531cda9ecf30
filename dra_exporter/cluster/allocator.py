"""What kube-scheduler's structured allocator (``k8s.io/dynamic-resource-allocation/structured``,
Kubernetes 1.36, every beta feature on) would allocate, over the cluster mode's records.

Contract: ``Allocator(state)`` is built once from a ``ClusterState`` (its claims' allocations are the
committed state). ``allocate(claim, node)`` tries one claim on one node, or on every node in name
order when ``node`` is None, and returns an ``Outcome``: placeable or not, the devices chosen, and per
request (and subrequest) what matched and why the other candidates could not be used. ``commit``
adds an outcome's devices to the committed state, so callers can place claims one after another;
``placeable_claims(device_class)`` counts the single-device claims of a class placed that way (on a
scratch copy: the committed state does not change). No I/O.

The parts: ``pools`` (each pool's newest generation, completeness, validity and the nodes it is for),
``checks`` (the per-device checks, in the scheduler's order, run by the search, the diagnosis and the
counts alike), ``constraints``, ``consumable`` (shares of a device), ``cache`` (what is kept between
cluster states, and every cache's limit). Here: the search, the diagnosis and the counts.

The rules, as the allocator applies them:

* pools: only each pool's newest generation counts; a pool is used only when that generation has all
  ``resourceSliceCount`` slices (incomplete otherwise) and it is valid (no device name twice, no
  counter set published twice, every consumed counter set and counter published in the pool);
* a node sees the slices that name it, that are for all nodes, whose ``nodeSelector`` it meets, and the
  ``perDeviceNodeSelection`` slices with a device for it (the devices of such a slice that are not
  for the node fail after the selectors are run); counters-only slices belong to every node
  (``nodes.slice_serves``, the one definition); the nodes are the cluster's Nodes when they were read
  (``ClusterState.nodes``), else those the slices name, a label selector then taken as met;
* first fit, not the best packing: pools in (driver, pool) order, their slices by name, devices in
  slice order; for every device, ``checks.Checks.obstacle``; then the claim's
  ``matchAttribute``/``distinctAttribute`` constraints; a search that fails backtracks (a CEL
  run-time error on a device the search reaches fails the claim on that node, it does not skip the
  device);
* allocation modes ExactCount and All (All needs every pool the node sees complete and valid; a
  pool with shared counters every node sees, judged on a node without its devices by the slices it
  gathers there: ``pools.judged_elsewhere``);
  a prioritized list (``firstAvailable``) takes the first subrequest that fits;
* admin access takes no device (another claim's device may be used for it), but within the
  search it marks the device: the same pod's other requests cannot take it, nor another admin
  request of the same claim;
* a pod's pending claims are allocated together, in the pod's order, on one node (``allocate_pod``);
  an error of the search on any node stops the pod's attempt (the scheduler's filter returns an
  error, not "does not fit"): a CEL run-time error on a device the search reaches, All over an
  incomplete or invalid pool, more than 32 devices in a claim;
* pools whose devices carry ``bindingConditions`` are tried after all others;
* consumable capacity (``allowMultipleAllocations``): a share takes what the request asks, rounded up
  by the capacity's ``requestPolicy`` (``validRange`` steps from ``min``, or the next ``validValues``
  entry), its ``default`` when the request names no amount, the whole capacity without a policy; the
  device's counters are consumed once, by its first share.

What is not modelled: waiting for binding conditions, extended resources, scoring (the scheduler picks among
the nodes that fit; for placeability the node does not matter), and the 32-device result limit's
backtracking shortcuts (a claim asking more than 32 devices fails).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from ..model import ClaimInfo, ClusterState, DeviceClassInfo, DeviceRequestInfo, PodNodeFilters
from ..taints import TaintRuleIndex
from .cache import (
    MAX_DIAGNOSED,
    MAX_FREE_PROBES,
    MAX_NODE_VIEWS,
    MAX_REQUEST_SELECTORS,
    MAX_TRIED,
    AllocatorCache,
)
from .checks import NOTHING, PLAIN, Checks, Usage
from .constraints import Constraint, lookup_attribute
from .consumable import EPSILON, consumed_amount, share_of
from .nodes import NodeFilters, refusal, slice_serves, summary
from .nodes import node_labels as node_labels_of
from .pools import (
    Device,
    DeviceKey,
    Pool,
    PoolKey,
    UsageKey,
    allocation_order,
    build_pool,
    newest_generation,
)
from .reasons import (
    CAPACITY,
    CLASS_MISSING,
    CONSTRAINT,
    COUNTERS,
    NODE,
    NODE_FILTERED,
    POOL_INCOMPLETE,
    POOL_INVALID,
    REASONS,
    SELECTOR_ERROR,
    TAINTED,
    TAKEN,
    TOGETHER,
    UNSUPPORTED_SELECTOR,
)
from .scheduler_versions import Behaviours
from .selectors import ClassSelector

__all__ = [
    "CAPACITY", "CLASS_MISSING", "CONSTRAINT", "COUNTERS", "MAX_RESULTS", "NODE", "NODE_FILTERED", "POOL_INCOMPLETE",
    "POOL_INVALID", "REASONS", "SELECTOR_ERROR", "TAINTED", "TAKEN", "TOGETHER", "UNSUPPORTED_SELECTOR", "Allocator",
    "AllocatorCache",
    "Blocked", "Device", "DeviceKey", "Outcome", "Pick", "Pool", "PoolKey", "RequestOutcome", "UsageKey",
    "consumed_amount", "lookup_attribute", "share_of",
]

#: ``resourceapi.AllocationResultsMaxSize``: devices one claim may get.
MAX_RESULTS: Final = 32
#: Devices tried per ``allocate`` on one node before the search gives up (the scheduler has a
#: time limit instead): constraints that cannot be met make the search exhaustive.
MAX_STEPS: Final = 100_000
#: Details (claims, taints …) kept per reason in an outcome.
MAX_DETAILS: Final = 5


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
    most_matching_on_a_node: int | None = None
    """The most matching devices one node sees (a claim must fit on one node); None: not counted."""
    most_usable_on_a_node: int | None = None
    """Of the nodes that see enough matching devices, the most usable ones on one node."""
    node_reason: str = ""
    """What keeps the most devices on the node closest to fitting (most usable, then most matching, of
    those that see enough matching devices): the reason whose removal would unblock the request."""


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
    pod: str = ""
    """The waiting pod whose claims were allocated together (its verdict is the claim's); ``""``: the
    claim alone."""
    attempt_fails: bool = False
    """The scheduler's filter returned an error (``error``): the pod's whole scheduling attempt stops,
    whatever other nodes would fit (a CEL run-time error, All over an incomplete pool, more than 32
    devices asked, a constraint All cannot meet)."""
    together: bool = False
    """The claim fits alone, not on one node with the other pending claims of its pod."""
    fits_when_free: bool | None = None
    """Not placeable: whether the pod's claims would fit on some node were nothing allocated (False:
    no amount of freeing unblocks them; None: not asked, or placeable)."""
    node_filtered: bool = False
    """The pod's node filters (node selector, required node affinity, tolerations of node taints,
    cordon) admit none of the nodes that see its devices (``error`` says the scheduler's summary)."""

    @property
    def devices(self) -> tuple[DeviceKey, ...]:
        return tuple(p.device for p in self.picks)



# --- the search's records ----------------------------------------------------------------------------


@dataclass(slots=True)
class _Request:
    info: DeviceRequestInfo
    claim: int
    """Index of its claim among those searched together."""
    class_index: int | None
    class_selector: ClassSelector | None
    selector: ClassSelector | None
    subrequest: bool
    all_list: list[Device] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.all_list) if self.info.all_devices else self.info.count

    @property
    def tag(self) -> str:
        """What marks its claim's devices in the search's ``Usage.taken``."""
        return str(self.claim)


class _Failure(Exception):
    """The allocator refuses the claim on this node (the scheduler's error return)."""


class _OverLimit(Exception):
    """Taking the current (sub)request's devices would pass ``MAX_RESULTS``: no choice of devices for
    the requests before it changes that, so the search backs up to the nearest prioritized list and
    tries its next subrequest, as the scheduler does, instead of trying every combination."""


@dataclass(slots=True)
class _Search:
    claims: Sequence[ClaimInfo]
    node: str
    labels: Mapping[str, str] | None
    devices: list[Device]
    groups: list[list[_Request]]
    """Each request, or each prioritized list of subrequests, of every claim, claim after claim."""
    layer: Usage
    picks: list[list[Pick]]
    """Per claim."""
    constraints: list[list[Constraint]]
    """Per claim."""
    steps: int = 0


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
        # Node labels as read (``ClusterState.nodes``); None when not read: selectors on labels count as met.
        self.node_labels = node_labels if node_labels is not None else node_labels_of(state.nodes)
        self._state_nodes = state.nodes
        #: Where the scheduler's version decides (``scheduler_versions``).
        self.behaviours = Behaviours.of(state.server_version)
        self._request_selectors: dict[tuple[str, ...], ClassSelector] = {}
        rules = TaintRuleIndex(state.taint_rules)
        self.pools: list[Pool] = []
        self.devices: dict[DeviceKey, Device] = {}
        for key, slices in sorted(newest_generation(state.slices).items()):
            slices.sort(key=lambda s: s.name)
            ids = tuple(id(s) for s in slices)
            known = matches.pools.get(key)
            # Only the rules that can select the pool's devices: a rule elsewhere rebuilds nothing here.
            rules_key = rules.for_pool(*key)
            if known is not None and known[0] == ids and known[1] == rules_key:
                pool = known[2]
            else:
                pool = build_pool(key, slices, rules_key, matches.of_slice, len(matches.order))
                matches.pools[key] = (ids, rules_key, pool)
            self.pools.append(pool)
            for device in pool.devices:
                self.devices.setdefault(device.key, device)
        self._local: dict[str, list[Pool]] = {}
        self._global: list[Pool] = []
        self._some_pool_unusable = any(not p.usable or p.unusable_elsewhere for p in self.pools)
        for pool in self.pools:
            if pool.everywhere or pool.gathered_everywhere or not pool.nodes:
                self._global.append(pool)
            else:
                for n in pool.nodes:
                    self._local.setdefault(n, []).append(pool)
        if self.node_labels is not None:
            names = set(self.node_labels)  # the scheduler places only on Nodes that exist
        else:
            names = set(self._local) | {n for p in self._global for n in p.nodes}
            if not names and self._global:
                names = {""}  # devices for all nodes and no node known: one node stands for them
        self.nodes: tuple[str, ...] = tuple(sorted(names))
        self._views: dict[str, list[tuple[Pool, list[Device]]]] = {}
        self.committed = Usage()
        self.checks = Checks(self.committed)
        self._usage: dict[PoolKey, list[tuple[str, bool, tuple[tuple[str, float], ...]]]] = {}
        self._usage_keys: dict[PoolKey, UsageKey] = {}
        self._candidates: dict[tuple[int, ...], tuple[str, ...]] = {}
        self._failing: dict[int, bool] = {}
        self._free_fits: dict[tuple[object, ...], bool] = {}
        #: What claims of one shape got on a node, and the diagnoses: until the next ``commit``.
        self._tried: dict[tuple[object, ...], tuple[tuple[tuple[Pick, ...], ...] | None, str]] = {}
        self._diagnosed: dict[tuple[object, ...], tuple[RequestOutcome, ...]] = {}
        self._commit_claims(state.claims)

    # --- building -----------------------------------------------------------------------------------

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
        pools = sorted([*self._local.get(node, ()), *self._global], key=allocation_order)
        out: list[tuple[Pool, list[Device]]] = []
        for pool in pools:
            devices = [d for sl, group in pool.by_slice if group and slice_serves(sl, node, labels) for d in group]
            if pool.seen_with(devices):
                out.append((pool, devices))
        if len(self._views) < MAX_NODE_VIEWS:
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

    # --- selectors -------------------------------------------------------------------------------------

    def _request_selector(self, expressions: tuple[str, ...]) -> ClassSelector | None:
        if not expressions:
            return None
        sel = self._request_selectors.get(expressions)
        if sel is None:
            sel = ClassSelector(DeviceClassInfo("(a request's selectors)", expressions), self.matches.engine,
                                self.matches.budget)
            if len(self._request_selectors) < MAX_REQUEST_SELECTORS:
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

    def capacity_left(self, key: DeviceKey) -> dict[str, float]:
        """What the committed shares leave of a device's capacities."""
        return self.checks.capacity_left(self.devices[key])

    # --- one claim --------------------------------------------------------------------------------------

    def allocate(self, claim: ClaimInfo, node: str | None = None) -> Outcome:
        """Whether the scheduler could allocate ``claim`` now on ``node`` (None: on any node, tried in
        name order), alone; see ``Outcome``."""
        return self.allocate_pod((claim,), node)[0]

    def allocate_pod(self, claims: Sequence[ClaimInfo], node: str | None = None, pod: str = "",
                     filters: PodNodeFilters | None = None) -> list[Outcome]:
        """Whether the scheduler could place a pod whose claims are ``claims`` (in the pod's order):
        its pending claims allocated together, on one node (``node``, or any its node ``filters`` admit
        when the Nodes were read, tried in name order).
        One ``Outcome`` per claim: the pod's verdict; an allocated claim says so. An error of the
        scheduler's filter on any node stops the pod's attempt (``Outcome.attempt_fails``)."""
        pending = [c for c in claims if not c.allocated]
        done = {id(c): Outcome(c.namespace, c.name, False, error="already allocated", pod=pod)
                for c in claims if c.allocated}
        if not pending:
            return [done[id(c)] for c in claims]
        held = self._held_on(c for c in claims if c.allocated)
        if len(held) > 1 or (node is not None and held and node not in held):
            error = f"the pod's allocated claims hold devices on {', '.join(sorted(held))}: no node has them all"
            outcomes = [Outcome(c.namespace, c.name, False, error=error if c is pending[0] else "", pod=pod,
                                requests=self._diagnose(c, [], [])) for c in pending]
        else:
            # The scheduler's filter: a pod whose allocated claim is only on one node goes there.
            outcomes = self._place(pending, next(iter(held)) if held else node, pod, filters)
        by_claim = {id(c): o for c, o in zip(pending, outcomes, strict=True)}
        return [by_claim.get(id(c)) or done[id(c)] for c in claims]

    def _place(self, claims: Sequence[ClaimInfo], node: str | None, pod: str,
               filters: PodNodeFilters | None = None) -> list[Outcome]:
        for claim in claims:
            missing = [r for r in claim.requests if r.device_class not in self.classes]
            if not claim.requests or missing:
                # The scheduler's PreFilter: the pod cannot be placed anywhere until the class exists.
                error = (f"request {missing[0].name}: device class {missing[0].device_class or '(none)'} not found"
                         if missing else "no requests")
                return [Outcome(c.namespace, c.name, False, error=error if c is claim else "",
                                requests=tuple(self._summary(c, r, []) for r in c.requests), pod=pod,
                                together=c is not claim)
                        for c in claims]
        classes = {r.device_class for c in claims for r in c.requests}
        if node is not None:
            nodes: tuple[str, ...] = (node,)
        elif any((sel := self.matches.selector(c)) is not None and sel.error for c in classes):
            nodes = self.nodes  # a selector that does not compile fails wherever the search reaches a device
        else:
            nodes = self.candidate_nodes(classes)
        node_filters = self.node_filters if filters is not None else None
        if filters is not None and node_filters is not None:
            # The scheduler's node filters run before DynamicResources: a node they refuse is never
            # searched (a CEL error there stops nothing).
            admitted = node_filters.admission(filters).nodes
            kept = tuple(n for n in nodes if n in admitted)
            if nodes and not kept:
                error = f"the pod's node filters admit no node with its devices: {self._refusals(filters, nodes)}"
                return [Outcome(c.namespace, c.name, False, requests=self._diagnose(c, nodes, []),
                                error=error if c is claims[0] else "", pod=pod, node_filtered=True)
                        for c in claims]
            nodes = kept
        may_fail = self._may_fail(claims)
        tried: list[str] = []
        fit: tuple[str, tuple[tuple[Pick, ...], ...]] | None = None
        for n in nodes:
            tried.append(n)
            found, error = self._try_node(claims, n)
            if error:
                # The scheduler's filter errs on this node: the pod's attempt stops, fit elsewhere or not.
                return [Outcome(c.namespace, c.name, False, "", (), self._diagnose(c, tried, []), f"node {n}: {error}",
                                len(tried), pod=pod, attempt_fails=True) for c in claims]
            if found is not None and fit is None:
                fit = n, found
                if not may_fail:
                    break  # no other node can err: the first fit is the answer
        if fit is not None:
            n, found = fit
            return [Outcome(c.namespace, c.name, True, n, picks, self._diagnose(c, [n], picks),
                            nodes_tried=len(tried), pod=pod) for c, picks in zip(claims, found, strict=True)]
        free = self._fits_when_free(claims, tried) if tried else None
        out = []
        for c in claims:
            alone = len(claims) > 1 and self._place([c], node, pod, filters)[0].placeable
            out.append(Outcome(c.namespace, c.name, False, "", (), self._diagnose(c, tried, []), "", len(tried),
                               pod=pod, together=alone, fits_when_free=free))
        return out

    def _fits_when_free(self, claims: Sequence[ClaimInfo], nodes: Sequence[str]) -> bool:
        """Whether ``claims`` would fit together on one of ``nodes`` (the first ``MAX_FREE_PROBES``) were
        nothing allocated, no device tainted and every pool complete: when not, the node's devices,
        counters or the claims' constraints never allow it, and no reason about the cluster's state
        is the one to give."""
        probe = tuple(nodes[:MAX_FREE_PROBES])
        # Nothing allocated: the answer holds for the whole state (claims of one shape, the same nodes).
        shape = None if any(r.selectors for c in claims for r in c.requests) else (
            tuple((c.requests, c.constraints) for c in claims), probe)
        if shape is not None and (known := self._free_fits.get(shape)) is not None:
            return known
        saved = self.committed, self.checks
        self.committed = Usage()
        self.checks = Checks(self.committed, structural=True)
        try:
            fits = any(self._search_node(claims, n)[0] is not None for n in probe)
        finally:
            self.committed, self.checks = saved
        if shape is not None and len(self._free_fits) < MAX_TRIED:
            self._free_fits[shape] = fits
        return fits

    @property
    def node_filters(self) -> NodeFilters | None:
        """The scheduler's node filters over the Nodes read (None: not read, pods' filters unknown);
        built when a pod first asks, kept across states while the Nodes are the same objects."""
        return self.matches.node_filters(self._state_nodes)

    def _held_on(self, allocated: Iterable[ClaimInfo]) -> set[str]:
        """The nodes the devices of ``allocated`` claims are local to (a device for all nodes or for a
        node selector restricts nothing)."""
        nodes = set()
        for claim in allocated:
            for r in claim.results:
                device = self.devices.get((r.driver, r.pool, r.device))
                if device is not None and not device.pool.everywhere and device.node:
                    nodes.add(device.node)
        return nodes

    def _refusals(self, filters: PodNodeFilters, nodes: Sequence[str]) -> str:
        """The scheduler's summary of why ``nodes`` refuse a pod with ``filters``."""
        by_name = {n.name: n for n in self._state_nodes or ()}
        refused: dict[str, int] = {}
        for name in nodes:
            found = by_name.get(name)
            why = refusal(filters, found) if found is not None else None
            if why is not None:
                refused[why.message] = refused.get(why.message, 0) + 1
        return summary(refused, len(nodes))

    def _may_fail(self, claims: Sequence[ClaimInfo]) -> bool:
        """Whether the search could err on a node after the first that fits (then every candidate
        node is searched, as the scheduler filters them all): a class whose CEL fails on some device,
        All while some pool is incomplete or invalid (All fails on every node that sees such a pool,
        whatever the class: the scheduler checks every pool of the node first). A request's own CEL is not
        run over the whole cluster for this: its errors count on the nodes searched up to the first fit."""
        for c in claims:
            for r in c.requests:
                index = self.matches.index(r.device_class)
                if index is None:
                    continue
                if self._class_fails(index) or (r.all_devices and self._some_pool_unusable):
                    return True
        return False

    def _class_fails(self, index: int) -> bool:
        known = self._failing.get(index)
        if known is None:
            known = self._failing[index] = any(p.class_errors[index] for p in self.pools)
        return known

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

    def _take(self, usage: Usage, pick: Pick, who: str) -> None:
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

    # --- the search ---------------------------------------------------------------------------------------

    def _requests(self, claims: Sequence[ClaimInfo]) -> list[list[_Request]]:
        groups: list[list[_Request]] = []
        for index, claim in enumerate(claims):
            previous = None
            for r in claim.requests:
                req = _Request(r, index, self.matches.index(r.device_class), self.matches.selector(r.device_class),
                               self._request_selector(r.selectors), "/" in r.name)
                if req.subrequest and previous == r.parent:
                    groups[-1].append(req)
                else:
                    groups.append([req])
                previous = r.parent
        return groups

    def _try_node(self, claims: Sequence[ClaimInfo], node: str
                  ) -> tuple[tuple[tuple[Pick, ...], ...] | None, str]:
        # Claims of one shape fare alike on a node until something is committed (``explain --all``
        # over many pending claims of a few shapes); errors of request selectors name their claim.
        shape = None if any(r.selectors for c in claims for r in c.requests) else (
            tuple((c.requests, c.constraints) for c in claims), node)
        if shape is not None and (known := self._tried.get(shape)) is not None:
            return known
        found, error = self._search_node(claims, node)
        result = (tuple(tuple(p) for p in found) if found is not None else None), error
        if shape is not None and len(self._tried) < MAX_TRIED:
            self._tried[shape] = result
        return result

    def _search_node(self, claims: Sequence[ClaimInfo], node: str) -> tuple[list[list[Pick]] | None, str]:
        search = _Search(claims, node, self.labels(node), self.view(node), self._requests(claims), Usage(),
                         [[] for _ in claims], [[Constraint(c) for c in claim.constraints] for claim in claims])
        try:
            for group in search.groups:
                for req in group:
                    if req.info.all_devices:
                        self._all_devices(search, req)
            for index in range(len(claims)):
                asked = sum(min(r.count for r in g) for g in search.groups if g[0].claim == index)
                if asked > MAX_RESULTS:
                    claim = claims[index]
                    raise _Failure(f"claim {claim.namespace}/{claim.name}: {asked} devices asked, more than the "
                                   f"claim limit of {MAX_RESULTS}")
            done = self._allocate_one(search, 0, 0, 0, 0, False)
        except _OverLimit:
            done = False  # no fit on this node, not an error
        except _Failure as exc:
            return None, str(exc)
        return (search.picks if done else None), ""

    def _all_devices(self, search: _Search, req: _Request) -> None:
        """The devices an All request takes: every candidate the node sees, in use or not (the search
        then fails when one of them cannot be had); the pipeline's selector, node and capacity checks."""
        claim = search.claims[req.claim]
        for pool, devices in self.pool_view(search.node):
            why = "" if self.checks.structural else pool.unusable_on(devices)[0]
            if why == POOL_INCOMPLETE:
                raise _Failure(f"request {req.info.name}: asks for all devices, but resource pool "
                               f"{'/'.join(pool.key)} is currently being updated")
            if why == POOL_INVALID:
                raise _Failure(f"request {req.info.name}: asks for all devices, but resource pool "
                               f"{'/'.join(pool.key)} is currently invalid")
            for device in devices:
                if (self._selected(req, device, claim) and device.for_node(search.node, search.labels)
                        and self.checks.capacity_fits(device, req.info, search.layer)):
                    req.all_list.append(device)

    def _allocate_one(self, s: _Search, ri: int, si: int, di: int, start: int, in_sub: bool) -> bool:
        if ri >= len(s.groups):
            return True
        group = s.groups[ri]
        if not in_sub and group[0].subrequest:
            over = 0
            for sub in range(len(group)):
                try:
                    if self._allocate_one(s, ri, sub, 0, 0, True):
                        return True
                except _OverLimit:
                    over += 1
            if over == len(group):
                raise _OverLimit
            return False
        req = group[si]
        if req.info.all_devices and not req.all_list:
            return False
        if di >= req.count:
            if ri + 1 < len(s.groups) and s.groups[ri + 1][0].claim != req.claim:
                try:  # the next claim: its result limit is its own, no choice in this claim changes it
                    return self._allocate_one(s, ri + 1, 0, 0, 0, False)
                except _OverLimit:
                    return False
            return self._allocate_one(s, ri + 1, 0, 0, 0, False)
        if len(s.picks[req.claim]) + req.count - di > MAX_RESULTS:
            raise _OverLimit
        if req.info.all_devices:
            undo = self._allocate_device(s, req, req.all_list[di], must=True)
            if undo is None:
                return False
            return self._allocate_next(s, undo, ri, si, di + 1, 0, in_sub)
        claim = s.claims[req.claim]

        def selected(device: Device) -> bool:
            return self._selected(req, device, claim)

        obstacle = self.checks.obstacle
        for pos in range(start, len(s.devices)):
            device = s.devices[pos]
            if not device.pool.usable and not self.checks.structural:
                continue
            s.steps += 1
            if s.steps > MAX_STEPS:
                raise _Failure(f"search gave up after {MAX_STEPS} devices tried")
            reason = obstacle(device, req.info, s.node, s.labels, s.layer, claim_tag=req.tag, selected=selected)
            if reason:
                if reason == TAINTED:
                    self._keep_rejected_counters(s.layer, device)
                continue
            undo = self._allocate_device(s, req, device, must=False)
            if undo is None:
                continue
            if self._allocate_next(s, undo, ri, si, di + 1, pos + 1, in_sub):
                return True
        return False

    def _allocate_next(self, s: _Search, undo: Callable[[], None], ri: int, si: int, di: int, start: int,
                       in_sub: bool) -> bool:
        """The rest of the search after one device was taken; the device is given back unless it
        leads to a fit (also when the rest passes the result limit, which goes on up)."""
        try:
            if self._allocate_one(s, ri, si, di, start, in_sub):
                return True
        except _OverLimit:
            undo()
            raise
        undo()
        return False

    def _allocate_device(self, s: _Search, req: _Request, device: Device, must: bool) -> Callable[[], None] | None:
        """Take ``device`` for ``req`` in the search (the constraints last); the undo, or None when it
        cannot be taken (an All request's device: ``must``, the checks not yet run on it)."""
        info = device.device
        if must and (self.checks.in_use(device.key, req.info, s.layer, req.tag)
                     or not self.checks.counters_fit(device, s.layer)[0]):
            return None
        if must and not self.checks.structural and self.checks.blocking_taint(device, req.info) is not None:
            self._keep_rejected_counters(s.layer, device)
            return None
        constraints = s.constraints[req.claim]
        added: list[Constraint] = []
        for c in constraints:
            if not c.add(req.info.name, device):
                for a in added:
                    a.remove(req.info.name, device)
                self._keep_rejected_counters(s.layer, device)
                if must:
                    raise _Failure(f"request {req.info.name}: cannot add device {'/'.join(device.key)} because a "
                                   "claim constraint would not be satisfied")
                return None
            added.append(c)
        # The capacity again, after the constraints as the scheduler orders them: a request of the same
        # claim may have taken a share of this device since All's devices were listed.
        if not self.checks.capacity_fits(device, req.info, s.layer):
            for a in added:
                a.remove(req.info.name, device)
            return None
        share: tuple[tuple[str, float], ...] = ()
        if info.allow_multiple_allocations:
            amounts = share_of(info, req.info) or {}
            share = tuple(sorted(amounts.items()))
        pick = Pick(req.info.name, device.key, req.info.admin_access, share)
        layer = s.layer
        first_share = info.allow_multiple_allocations and device.key not in self.committed.shares and (
            device.key not in layer.shares)
        consumes = not info.allow_multiple_allocations or first_share
        # An admin-access pick marks the device too: the claim's other requests cannot take it (the
        # scheduler's ``allocatingDevices``), though other claims' admin requests still may.
        marks = not info.allow_multiple_allocations
        if info.allow_multiple_allocations:
            layer.add_share(device.key, dict(share))
        elif marks:
            layer.taken.setdefault(device.key, []).append(req.tag)
        if consumes:
            layer.consume(device.pool.key, info)
        picks = s.picks[req.claim]
        picks.append(pick)

        def undo() -> None:
            picks.pop()
            for c in constraints:
                c.remove(req.info.name, device)
            if info.allow_multiple_allocations:
                layer.add_share(device.key, dict(share), -1.0)
                if first_share:
                    del layer.shares[device.key]
            elif marks:
                held = layer.taken[device.key]
                held.pop()
                if not held:
                    del layer.taken[device.key]
            if consumes:
                layer.consume(device.pool.key, info, -1.0)
        return undo

    def _keep_rejected_counters(self, layer: Usage, device: Device) -> None:
        """A device rejected after its counters fitted (a taint, a constraint): schedulers up to
        ``scheduler_versions.COUNTERS_KEPT_BY_REJECTED_DEVICE_UNTIL`` keep its counters for the rest
        of the attempt (``layer``); later ones give them back."""
        if self.behaviours.rejected_device_keeps_counters and self.checks.counters_checked(device, layer):
            layer.consume(device.pool.key, device.device)

    # --- why not ---------------------------------------------------------------------------------------

    def verdict(self, device: Device, request: DeviceRequestInfo, node: str,
                layer: Usage | None = None) -> tuple[str, str]:
        """Why ``device`` (a candidate of ``request``) cannot be used on ``node`` now: (reason, detail);
        ("", "") when nothing keeps it."""
        layer = layer or Usage()
        reason = self.checks.obstacle(device, request, node, self.labels(node), layer)
        if not reason:
            return "", ""
        return reason, self.checks.detail(reason, device, request, layer)

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
        if any(s is not None and s.unsupported for s in (class_selector, own)):
            return RequestOutcome(request.name, request.device_class, request.count, request.all_devices,
                                  blocked=(Blocked(UNSUPPORTED_SELECTOR, 0, (request.device_class,)),), error=error)
        chosen = tuple(p.device for p in picks if p.request == request.name)
        best: tuple[int, int, str] | None = None  # (usable, matching, reason) of the node closest to fitting
        most_matching = 0
        for node in nodes:
            node_matching = node_usable = 0
            node_counts: dict[str, int] = {}
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
                    node_matching += 1
                    if device.key in chosen:
                        node_usable += 1
                        continue
                    reason, detail = self.verdict(device, request, node)
                    if not reason:
                        node_usable += 1
                        if picks or not claim.constraints:
                            continue
                        reason, detail = CONSTRAINT, ""
                counts[reason] = counts.get(reason, 0) + 1
                node_counts[reason] = node_counts.get(reason, 0) + 1
                known = details.setdefault(reason, [])
                if detail and detail not in known and len(known) < MAX_DETAILS:
                    known.append(detail)
            matching += node_matching
            usable += node_usable
            most_matching = max(most_matching, node_matching)
            enough = node_matching > 0 if request.all_devices else node_matching >= request.count
            if enough:
                top = min(node_counts.items(), key=lambda kv: (-kv[1], REASONS.index(kv[0])), default=("", 0))[0]
                candidate = (node_usable, node_matching, top)
                if best is None or candidate[:2] > best[:2]:
                    best = candidate
        blocked = tuple(Blocked(r, n, tuple(details.get(r, ()))) for r, n in
                        sorted(counts.items(), key=lambda kv: (-kv[1], REASONS.index(kv[0]))))
        count = request.count
        if request.all_devices:
            count = matching
        return RequestOutcome(request.name, request.device_class, count, request.all_devices, matching, usable,
                              chosen, blocked, error, most_matching, best[0] if best is not None else 0,
                              best[2] if best is not None else "")

    def _diagnose(self, claim: ClaimInfo, nodes: Sequence[str], picks: Sequence[Pick]) -> tuple[RequestOutcome, ...]:
        key = (claim.requests, bool(claim.constraints), tuple(nodes), tuple(picks))
        known = self._diagnosed.get(key)
        if known is None:
            known = tuple(self._summary(claim, r, nodes, picks) for r in claim.requests)
            if len(self._diagnosed) < MAX_DIAGNOSED:
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
        layer = Usage()
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
                       layer: Usage) -> int:
        labels = self.labels(node)
        placed = 0
        obstacle = self.checks.obstacle

        def selected(device: Device) -> bool | None:
            return device.matches[index]

        for pool, devices in pools:
            if not pool.usable:
                continue
            for device in devices:
                reason = obstacle(device, PLAIN, node, labels, layer, selected=selected)
                if reason == SELECTOR_ERROR:
                    return placed  # the search reaches a device its class cannot evaluate: no claim here
                if reason == TAINTED:
                    # Every later claim's search passes this device first: what it keeps, it keeps for them.
                    self._keep_rejected_counters(layer, device)
                if reason:
                    continue
                if not device.device.allow_multiple_allocations:
                    self._take(layer, Pick("", device.key), "")
                    placed += 1
                    continue
                # Shares of one device, counted rather than placed one by one (a 1-byte default on 80Gi
                # would be billions of steps): the first consumes the counters, the others only capacity.
                share = share_of(device.device, PLAIN) or {}
                shares = self._shares_left(device, share, layer)
                self._take(layer, Pick("", device.key, False, tuple(sorted(share.items()))), "")
                layer.add_share(device.key, {n: v * (shares - 1) for n, v in share.items()})
                placed += shares
        return placed

    def _shares_left(self, device: Device, share: Mapping[str, float], layer: Usage) -> int:
        """How many shares of ``share`` still fit the device's capacities (1 when it takes nothing)."""
        have = self.committed.shares.get(device.key, {})
        adding = layer.shares.get(device.key, {})
        counts = [int((value - have.get(n, 0.0) - adding.get(n, 0.0) + EPSILON) // share[n])
                  for n, value in device.device.capacity if share.get(n, 0.0) > 0]
        return max(1, min(counts, default=1))

    def fit_one_after_another(self, devices: Sequence[Device]) -> int:
        """How many of ``devices`` (one profile of one GPU, in slice order) the scheduler could place
        one after another, each for a claim asking for exactly that kind: first fit over them."""
        layer = Usage()
        placed = 0
        for device in devices:
            reason = self.checks.obstacle(device, PLAIN, None, None, layer)
            if reason == TAINTED:
                self._keep_rejected_counters(layer, device)
            elif not reason:
                self._take(layer, Pick("", device.key), "")
                placed += 1
        return placed

    def state(self, device: Device) -> str:
        """The device's state for new claims: unavailable (its pool is incomplete or invalid),
        allocated, tainted, blocked (its counters no longer fit), shared (a device that allows
        multiple allocations, with shares and capacity left) or free. The pipeline's answer for a
        plain claim, except that a taint is shown before used-up counters (the taint is what an
        operator acts on)."""
        reason = self.checks.obstacle(device, PLAIN, None, None, NOTHING)
        if reason in (POOL_INCOMPLETE, POOL_INVALID):
            return "unavailable"
        shared = device.key in self.committed.shares
        if reason == TAKEN or (shared and reason == CAPACITY):
            return "allocated"
        if reason == TAINTED:
            return "tainted"
        if reason == COUNTERS or (reason == CAPACITY and not self.checks.counters_fit(device, NOTHING)[0]):
            # The pipeline stops at the counters; a taint after them is still what the operator sees first.
            return "tainted" if self.checks.blocking_taint(device, PLAIN) is not None else "blocked"
        if reason == CAPACITY and self.checks.blocking_taint(device, PLAIN) is not None:
            return "tainted"
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
