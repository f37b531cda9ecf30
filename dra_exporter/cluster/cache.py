"""What the allocator keeps between cluster states, and the limit of every cache it holds.

Contract: ``AllocatorCache`` holds the compiled DeviceClass selectors, each slice's per-device
class results, the pools built from them and the per-node placeable counts; it is handed from one
``Allocator`` to the next. The ``MAX_*`` limits bound what one ``Allocator`` memoises within a
cluster state. No I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from ..model import ClusterNode, DeviceClassInfo, DeviceTaintRule, ResourceSliceInfo
from .cel_budget import ClassQueue
from .nodes import NodeFilters
from .pools import ClassRow, Pool, PoolKey, UsageKey
from .selectors import CelEngine, ClassSelector, MemoBudget

#: Node views (each node's pools and devices) kept per cluster state; beyond it a view is rebuilt.
MAX_NODE_VIEWS: Final = 10_000
#: (claim shape, node) search results kept until the next commit.
MAX_TRIED: Final = 100_000
#: Per-request diagnoses (why candidates were not used) kept until the next commit.
MAX_DIAGNOSED: Final = 10_000
#: Compiled selectors of requests (by their expressions) kept per cluster state.
MAX_REQUEST_SELECTORS: Final = 1_000
#: Nodes searched with nothing allocated to learn whether freeing anything could unblock a pod (a
#: homogeneous cluster answers on the first; beyond this many, "no" is taken as the answer).
MAX_FREE_PROBES: Final = 64
#: Per-node placeable counts kept, per pool and class, before they are dropped (nodes gone).
PLACEABLE_PER_POOL_AND_CLASS: Final = 4


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
        self._slices: dict[str, tuple[ResourceSliceInfo, tuple[ClassRow, ...]]] = {}
        self._rows: dict[ClassRow, ClassRow] = {}
        self.pools: dict[PoolKey, tuple[tuple[int, ...], tuple[DeviceTaintRule, ...], Pool]] = {}
        #: (class index, node) → the node's pools and their usage when counted, and the count.
        self.placeable: dict[tuple[int, str], tuple[tuple[Pool, ...], tuple[UsageKey, ...], int]] = {}
        self._node_filters: NodeFilters | None = None

    def node_filters(self, nodes: Sequence[ClusterNode] | None) -> NodeFilters | None:
        """The node filters over ``nodes`` (None: not read), built again only when a Node is another
        object (the cluster source keeps unchanged Nodes as the same objects)."""
        if nodes is None:
            return None
        known = self._node_filters
        if known is None or len(known.nodes) != len(nodes) or not all(
                a is b for a, b in zip(known.nodes, nodes, strict=True)):
            known = self._node_filters = NodeFilters(nodes)
        return known

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

    def of_slice(self, sl: ResourceSliceInfo) -> tuple[ClassRow, ...]:
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
        if len(self.placeable) > PLACEABLE_PER_POOL_AND_CLASS * max(1, len(pools)) * max(1, len(self.order)):
            self.placeable.clear()  # nodes gone: start again rather than keep them
