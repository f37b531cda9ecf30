"""Which nodes a pod may go to, and which nodes a ResourceSlice's devices are for: the scheduler's
node filters, over the cluster mode's records.

Contract: ``refusal(filters, node)`` is what the first of kube-scheduler's node filters that rejects
``node`` for a pod with ``filters`` would say (``Refusal``: the plugin and its message), None when
all of them admit it; ``NodeFilters(nodes)`` answers it for every node at once, per distinct
``PodNodeFilters`` (pods of one template share one), with the scheduler's summary of the refusals.
``slice_serves`` / ``device_serves`` say whether a slice (or one device of a
``perDeviceNodeSelection`` slice) is for a node: the one definition the allocator uses. No I/O.

The filters, as kube-scheduler v1.36's default profile runs them, first refusal wins:

* NodeUnschedulable: a node with ``spec.unschedulable`` refuses a pod that does not tolerate the
  ``node.kubernetes.io/unschedulable:NoSchedule`` taint;
* TaintToleration: a ``NoSchedule`` or ``NoExecute`` taint of the node that no toleration of the pod
  tolerates refuses it (``PreferNoSchedule`` only scores; it never refuses); the first such is the
  refusal's detail;
* NodeAffinity: the pod's ``nodeSelector`` (every label present with that value) and the required
  terms of its node affinity (terms ORed, each term's expressions and fields ANDed; an empty term
  selects nothing). Before every filter, its PreFilter: when each required term names nodes
  (``metadata.name`` ``In``), the other nodes are not filtered at all, whatever their taints or
  cordon, and are all refused in words of their own (``PREFILTER_MESSAGE``; the test bed shows it).

Not modelled here (nor anywhere in the exporter): CPU, memory and pod-count fit (NodeResourcesFit),
host ports, pod (anti-)affinity, topology spread, volumes, and ``spec.nodeName`` set by hand.

Node labels unknown (Nodes not read: ``labels`` None): a slice's node selector that asks about
labels is taken as met, so a device is never counted out because of what is not known.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from ..model import (
    ClusterNode,
    DeviceTaint,
    DeviceToleration,
    NodePlacement,
    NodeSelector,
    NodeSelectorTerm,
    PodNodeFilters,
    ResourceSliceInfo,
    SliceDevice,
)

#: The scheduler's plugins, by the names its events and logs use.
NODE_UNSCHEDULABLE: Final = "NodeUnschedulable"
TAINT_TOLERATION: Final = "TaintToleration"
NODE_AFFINITY: Final = "NodeAffinity"
#: What each says of a node it refuses (``FailedScheduling``'s ``N node(s) …``).
UNSCHEDULABLE_MESSAGE: Final = "node(s) were unschedulable"
AFFINITY_MESSAGE: Final = "node(s) didn't match Pod's node affinity/selector"
#: What the scheduler says of the nodes NodeAffinity's PreFilter left out (``prefilter_names``).
PREFILTER_MESSAGE: Final = "node(s) didn't satisfy plugin(s) [NodeAffinity]"
#: The taint a cordoned node stands for, as NodeUnschedulable checks tolerations against it.
UNSCHEDULABLE_TAINT: Final = DeviceTaint("node.kubernetes.io/unschedulable", "", "NoSchedule")
#: Taint effects that keep a pod off a node; PreferNoSchedule only lowers its score.
REFUSING_EFFECTS: Final = frozenset({"NoSchedule", "NoExecute"})
#: Distinct pod filters ``NodeFilters`` keeps the answer for (pods of one template share one).
MAX_KEPT_FILTERS: Final = 1_000

Labels = Mapping[str, str] | None
"""A node's labels; None: not known (Nodes not read)."""


#: TaintToleration's words (v1.36 names no taint in them: the test bed's scheduler shows it).
TAINT_MESSAGE: Final = "node(s) had untolerated taint(s)"


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a node filter refuses a pod a node."""

    plugin: str
    message: str
    """The scheduler's words (``FailedScheduling``'s ``N node(s) …``)."""
    detail: str = ""
    """What the words leave out: the taint not tolerated (``key=value:effect``)."""


def taint_text(taint: DeviceTaint) -> str:
    return f"{taint.key}={taint.value}:{taint.effect}" if taint.value else f"{taint.key}:{taint.effect}"


def prefilter_names(filters: PodNodeFilters) -> frozenset[str] | None:
    """The nodes NodeAffinity's PreFilter narrows a pod to when every required term names nodes
    (``matchFields`` ``metadata.name`` ``In``, as a DaemonSet's pods do): the scheduler runs no filter on
    the others, and says ``PREFILTER_MESSAGE`` of them (cordoned or not). None: no such narrowing."""
    if filters.affinity is None:
        return None
    names: set[str] = set()
    for term in filters.affinity.terms:
        term_names: set[str] | None = None
        for r in term.match_fields:
            if r.key == "metadata.name" and r.operator == "In":
                term_names = set(r.values) if term_names is None else term_names & set(r.values)
        if term_names is None:
            return None  # this term may select any node (terms are ORed)
        names |= term_names
    return frozenset(names)


def refusal(filters: PodNodeFilters, node: ClusterNode) -> Refusal | None:
    """The first of the scheduler's node filters that refuses ``node`` to a pod with ``filters``."""
    narrowed = prefilter_names(filters)
    if narrowed is not None and node.name not in narrowed:
        return Refusal(NODE_AFFINITY, PREFILTER_MESSAGE)
    return _cordon_or_taint(filters.tolerations, node.unschedulable, node.taints) or (
        _affinity(filters, node.name, dict(node.labels)) if filters.node_selector or filters.affinity is not None
        else None)


def _cordon_or_taint(tolerations: tuple[DeviceToleration, ...], unschedulable: bool,
                     taints: tuple[DeviceTaint, ...]) -> Refusal | None:
    """NodeUnschedulable, then TaintToleration."""
    if unschedulable and not any(t.tolerates(UNSCHEDULABLE_TAINT) for t in tolerations):
        return Refusal(NODE_UNSCHEDULABLE, UNSCHEDULABLE_MESSAGE)
    for taint in taints:
        if taint.effect in REFUSING_EFFECTS and not any(t.tolerates(taint) for t in tolerations):
            return Refusal(TAINT_TOLERATION, TAINT_MESSAGE, taint_text(taint))
    return None


def _affinity(filters: PodNodeFilters, name: str, labels: dict[str, str]) -> Refusal | None:
    """NodeAffinity: the pod's nodeSelector and required node affinity."""
    if any(labels.get(k) != v for k, v in filters.node_selector) or (
            filters.affinity is not None and not filters.affinity.matches(name, labels)):
        return Refusal(NODE_AFFINITY, AFFINITY_MESSAGE)
    return None


def summary(refused: Mapping[str, int], total: int) -> str:
    """The scheduler's one line for a pod no node admits: ``0/3 nodes are available: 1 node(s) …,
    2 node(s) ….`` (its reasons sorted as text, as the scheduler sorts them)."""
    reasons = sorted(f"{count} {message}" for message, count in refused.items())
    return f"0/{total} nodes are available: {', '.join(reasons)}."


@dataclass(frozen=True, slots=True)
class Admission:
    """The nodes a pod's filters admit, and how many each refusal message kept out."""

    nodes: frozenset[str]
    refused: tuple[tuple[str, int], ...] = ()
    """(message, nodes), most nodes first."""


class NodeFilters:
    """The node filters over one set of Nodes, per distinct ``PodNodeFilters`` (kept up to
    ``MAX_KEPT_FILTERS``). What it costs does not grow with the nodes that merely carry a taint:
    nodes are grouped by what the first two filters read (cordon and refusing taints; a GPU taint on
    every GPU node makes one group), each group judged once per pod; a pod that names labels
    (``nodeSelector``, an ``In`` term, ``metadata.name``) is checked for NodeAffinity only on the nodes an
    index of labels gives. A pod pinned to its node costs a few checks, not one per node."""

    def __init__(self, nodes: Sequence[ClusterNode]) -> None:
        self.nodes = tuple(nodes)
        self.names = frozenset(n.name for n in self.nodes)
        self._by_name = {n.name: n for n in self.nodes}
        #: (cordoned, refusing taints) → its nodes; nodes neither cordoned nor tainted are in no group.
        self._groups: dict[tuple[bool, tuple[DeviceTaint, ...]], list[str]] = {}
        self._group_of: dict[str, tuple[bool, tuple[DeviceTaint, ...]]] = {}
        for n in self.nodes:
            refusing = tuple(t for t in n.taints if t.effect in REFUSING_EFFECTS)
            if n.unschedulable or refusing:
                key = (n.unschedulable, refusing)
                self._groups.setdefault(key, []).append(n.name)
                self._group_of[n.name] = key
        self._index: dict[str, dict[str, set[str]]] = {}
        for n in self.nodes:
            for label, value in n.labels:
                self._index.setdefault(label, {}).setdefault(value, set()).add(n.name)
        self._labels: dict[str, dict[str, str]] = {}
        self._kept: dict[PodNodeFilters, Admission] = {}

    def admission(self, filters: PodNodeFilters) -> Admission:
        known = self._kept.get(filters)
        if known is None:
            narrowed = prefilter_names(filters)
            known = self._admission(filters) if narrowed is None else self._narrowed(filters, narrowed)
            if len(self._kept) < MAX_KEPT_FILTERS:
                self._kept[filters] = known
        return known

    def _narrowed(self, filters: PodNodeFilters, narrowed: frozenset[str]) -> Admission:
        """A pod NodeAffinity's PreFilter narrows to a few named nodes: only they are filtered."""
        refused: dict[str, int] = {}
        out: set[str] = set()
        inside = [self._by_name[n] for n in narrowed if n in self._by_name]
        for node in inside:
            why = refusal(filters, node)
            if why is None:
                out.add(node.name)
            else:
                refused[why.message] = refused.get(why.message, 0) + 1
        if len(self.nodes) > len(inside):
            refused[PREFILTER_MESSAGE] = len(self.nodes) - len(inside)
        return Admission(frozenset(out), tuple(sorted(refused.items(), key=lambda kv: (-kv[1], kv[0]))))

    def _admission(self, filters: PodNodeFilters) -> Admission:
        refused: dict[str, int] = {}
        blocked: set[tuple[bool, tuple[DeviceTaint, ...]]] = set()
        for key, names in self._groups.items():
            why = _cordon_or_taint(filters.tolerations, *key)
            if why is not None:
                blocked.add(key)
                refused[why.message] = refused.get(why.message, 0) + len(names)
        passed = len(self.nodes) - sum(len(self._groups[k]) for k in blocked)
        candidates = self._candidates(filters)
        if candidates is None:  # no selection: every node the first two filters let through
            out = set(self.names)
            for key in blocked:
                out.difference_update(self._groups[key])
        else:
            out = set()
            for name in candidates:
                group = self._group_of.get(name)
                if name not in self._by_name or (group is not None and group in blocked):
                    continue
                if _affinity(filters, name, self._labels_of(name)) is None:
                    out.add(name)
            if passed > len(out):  # the others are refused by NodeAffinity
                refused[AFFINITY_MESSAGE] = refused.get(AFFINITY_MESSAGE, 0) + passed - len(out)
        return Admission(frozenset(out), tuple(sorted(refused.items(), key=lambda kv: (-kv[1], kv[0]))))

    def _labels_of(self, name: str) -> dict[str, str]:
        labels = self._labels.get(name)
        if labels is None:
            labels = self._labels[name] = dict(self._by_name[name].labels)
        return labels

    def _candidates(self, filters: PodNodeFilters) -> set[str] | frozenset[str] | None:
        """Nodes that can meet the pod's node selector and affinity (a superset: each is checked);
        None when the pod selects no nodes (every node that is neither tainted nor cordoned admits it)."""
        if not filters.node_selector and filters.affinity is None:
            return None
        found: set[str] | frozenset[str] = self.names
        for key, value in filters.node_selector:
            found = found & self._index.get(key, {}).get(value, set())
        if filters.affinity is not None:
            terms: set[str] = set()
            for term in filters.affinity.terms:
                narrowed = self._term_candidates(term)
                if narrowed is None:
                    return found  # this term may select any node: the node selector alone narrows
                terms |= narrowed
            found = found & terms
        return found

    def _term_candidates(self, term: NodeSelectorTerm) -> set[str] | None:
        if not (term.match_expressions or term.match_fields):
            return set()  # an empty term selects nothing
        for r in term.match_fields:
            if r.key == "metadata.name" and r.operator == "In":
                return set(r.values)
        for r in term.match_expressions:
            if r.operator == "In":
                by_value = self._index.get(r.key, {})
                return set().union(*(by_value.get(v, set()) for v in r.values))
        return None

    def admits(self, filters: PodNodeFilters, node: str) -> bool:
        return node in self.admission(filters).nodes


class NodeLabels(Mapping[str, Mapping[str, str]]):
    """Each Node's labels by name, made a dict only when asked (only slices that select nodes by
    label ask): a new cluster state of 5,000 nodes costs an index, not 5,000 dicts."""

    def __init__(self, nodes: Iterable[ClusterNode]) -> None:
        self._nodes = {n.name: n for n in nodes}
        self._labels: dict[str, Mapping[str, str]] = {}

    def __getitem__(self, name: str) -> Mapping[str, str]:
        known = self._labels.get(name)
        if known is None:
            known = self._labels[name] = dict(self._nodes[name].labels)
        return known

    def __iter__(self) -> Iterator[str]:
        return iter(self._nodes)

    def __len__(self) -> int:
        return len(self._nodes)

    def __contains__(self, name: object) -> bool:
        return name in self._nodes


def node_labels(nodes: Iterable[ClusterNode] | None) -> NodeLabels | None:
    """Each Node's labels by name; None when the Nodes were not read."""
    return None if nodes is None else NodeLabels(nodes)


# --- which nodes a slice's devices are for --------------------------------------------------------


def placement_serves(placement: NodePlacement, node: str, labels: Labels) -> bool:
    """Whether a ``nodeName`` / ``allNodes`` / ``nodeSelector`` placement is for ``node``; with its
    labels unknown (None), a selector that asks about labels is taken as met."""
    if placement.node_name:
        return placement.node_name == node
    if placement.all_nodes:
        return True
    selector: NodeSelector | None = placement.node_selector
    if selector is None:
        return False  # nothing set that this version knows: a future field, skipped as the scheduler does
    return selector.matches(node, dict(labels) if labels is not None else None) or (
        labels is None and selector.needs_labels)


def device_serves(device: SliceDevice, node: str, labels: Labels) -> bool:
    """Whether one device of a ``perDeviceNodeSelection`` slice is for ``node`` (any other device:
    its slice says, so True here)."""
    return device.placement is None or placement_serves(device.placement, node, labels)


def slice_serves(sl: ResourceSliceInfo, node: str, labels: Labels) -> bool:
    """Whether ``node`` sees ``sl``: a slice of shared counters always (the pool's devices need them
    wherever they are), a ``perDeviceNodeSelection`` slice when one of its devices is for it,
    any other by its own placement (``nodeName`` of old versions included)."""
    if sl.shared_counters:
        return True
    if sl.per_device_node_selection:
        return any(d.placement is not None and placement_serves(d.placement, node, labels) for d in sl.devices)
    p = sl.placement
    if not p.node_name and sl.node_name:
        p = NodePlacement(node_name=sl.node_name)
    return placement_serves(p, node, labels)
