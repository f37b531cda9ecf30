"""Why is this claim pending? The allocator's outcome for a claim, as an operator reads it.

Contract: ``explain(state, targets)`` tries each named claim (or, with no targets, every claim not
yet allocated) with the scheduler's allocator (``allocator.py``, the one place that computes fit)
and returns its ``Outcome``; ``render_text`` and ``render_json`` give the two forms of
``dra-exporter explain``; ``first_blocking`` is the one reason ``dra_cluster_claim_pending_reason``
publishes. No I/O.

The text is what goes into a ticket: one line with the verdict, one with the reason that blocks the
claim first (a missing class, a selector the scheduler cannot evaluate, then the reason that kept
most candidate devices), then each request with the counts and what stood in the way.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from .. import printable
from ..model import ClaimInfo, ClusterPod, ClusterState, PodNodeFilters
from .allocator import (
    CAPACITY,
    CLASS_MISSING,
    CONSTRAINT,
    COUNTERS,
    NODE,
    NODE_FILTERED,
    POOL_INCOMPLETE,
    POOL_INVALID,
    SELECTOR_ERROR,
    TAINTED,
    TAKEN,
    TOGETHER,
    UNSUPPORTED_SELECTOR,
    Allocator,
    AllocatorCache,
    Outcome,
    RequestOutcome,
)
from .selectors import CelEngine

#: When no candidate was kept from a request by anything, yet too few devices match it.
NO_MATCH: Final = "no_matching_device"
TOO_FEW: Final = "too_few_devices"

#: What each reason means, for the text form ("N devices …").
_SAYS: Final = {
    CLASS_MISSING: "the device class does not exist",
    UNSUPPORTED_SELECTOR: "the class's or the request's CEL is not supported by this exporter (the scheduler runs "
                          "it: whether the claim is placeable is not known here)",
    SELECTOR_ERROR: "the class's or the request's CEL fails on them (the scheduler refuses the claim on that node)",
    POOL_INCOMPLETE: "in a pool whose newest generation is not fully published (the scheduler skips it)",
    POOL_INVALID: "in an invalid pool (a device or counter set published twice, a counter not published)",
    TAKEN: "allocated to other claims",
    NODE: "not available to the node tried",
    CAPACITY: "not enough capacity left",
    COUNTERS: "shared counters used up (other devices of the same GPU hold them: the whole GPU or partitions)",
    TAINTED: "tainted, not tolerated by the request",
    CONSTRAINT: "usable alone, not together with the claim's matchAttribute/distinctAttribute constraints",
    NO_MATCH: "no device matches the class and the request's selectors",
    TOO_FEW: "no node has as many matching devices as the claim asks that can be allocated together, even "
             "with nothing allocated",
    TOGETHER: "the claim fits alone, but not on one node with its pod's other pending claims",
    NODE_FILTERED: "the pod's node selector, node affinity or tolerations keep it off every node with such devices",
}


# --- what the verdict covers ----------------------------------------------------------------------------

#: The scheduler's filters (by plugin) the verdict can cover, and what each checks.
DRA_FILTER: Final = "DynamicResources (devices)"
NODE_FILTERS: Final = ("NodeAffinity (the pod's node selector and required node affinity)",
                       "TaintToleration (node taints)", "NodeUnschedulable (cordoned nodes)")
#: Filters the verdict never covers: a placeable claim's pod may still wait for one of these.
NEVER_COVERED: Final = ("NodeResourcesFit (CPU and memory fit)", "InterPodAffinity (pod affinity)",
                        "PodTopologySpread (topology spread)",
                        "volumes (VolumeBinding, VolumeRestrictions, VolumeZone, NodeVolumeLimits)",
                        "NodePorts (host ports)")
#: Whether the allocator tries a claim only on the nodes its pods may go to (``nodes.NodeFilters``,
#: ``Allocator.allocate_pod``): it does once the Nodes are read.
POD_NODE_FILTERS_APPLIED: Final = True


@dataclass(frozen=True, slots=True)
class Coverage:
    """Which of the scheduler's filters a verdict covers and which it does not, so that "placeable"
    is never read as more than it is."""

    covered: tuple[str, ...]
    not_covered: tuple[str, ...]

    def line(self) -> str:
        return (f"the verdicts cover the scheduler's filters {', '.join(self.covered)}; not: "
                f"{', '.join(self.not_covered)}")


def coverage(nodes_read: bool) -> Coverage:
    """What the verdicts over a state cover: its Nodes read (``ClusterState.nodes`` not None) or not."""
    dra = DRA_FILTER if nodes_read else (
        "DynamicResources (devices; Nodes not read: slices' node selectors taken as met)")
    if nodes_read and POD_NODE_FILTERS_APPLIED:
        return Coverage((dra, *NODE_FILTERS), NEVER_COVERED)
    return Coverage((dra,), (*NODE_FILTERS, *NEVER_COVERED))


class ClaimNotFound(LookupError):
    """A target named on the command line that the cluster does not have, or that names both a claim
    and a pod."""


def parse_target(text: str) -> tuple[str, str]:
    """``NAMESPACE/NAME`` (a claim or a pod) → (namespace, name); ValueError naming what is wrong."""
    namespace, sep, name = text.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise ValueError(f"{text!r}: expected NAMESPACE/CLAIM or NAMESPACE/POD")
    return namespace, name


def waiting_pods(state: ClusterState) -> dict[tuple[str, str], ClusterPod]:
    """(namespace, claim) → the pod the scheduler places it with: of the pods that have not ended and
    reference it, the earliest created (then by name)."""
    out: dict[tuple[str, str], ClusterPod] = {}
    for pod in sorted(state.pods, key=lambda p: (p.created, p.namespace, p.name)):
        if not pod.ended:
            for name in pod.claims:
                out.setdefault((pod.namespace, name), pod)
    return out


class _PodPlacer:
    """Each waiting pod's claims allocated together, once per pod."""

    def __init__(self, state: ClusterState, allocator: Allocator) -> None:
        self.allocator = allocator
        self.claims = {(c.namespace, c.name): c for c in state.claims}
        self.pod_of = waiting_pods(state)
        self._done: dict[tuple[str, str], dict[str, Outcome]] = {}

    def pod(self, pod: ClusterPod) -> list[Outcome]:
        """The outcome of each claim the pod references that exists, in the pod's order."""
        claims = [c for n in pod.claims if (c := self.claims.get((pod.namespace, n))) is not None]
        key = (pod.namespace, pod.name)
        if key not in self._done:
            outcomes = self.allocator.allocate_pod(claims, pod=f"{pod.namespace}/{pod.name}",
                                                   filters=pod.node_filters)
            self._done[key] = {o.claim: replace(o, pod_waits=True) for o in outcomes}
        return [self._done[key][c.name] for c in claims]

    def claim(self, claim: ClaimInfo) -> Outcome:
        if claim.allocated:
            return _allocated(claim)
        pod = self.pod_of.get((claim.namespace, claim.name))
        if pod is None:
            return replace(self.allocator.allocate(claim), pod_waits=False)
        self.pod(pod)
        return self._done[(pod.namespace, pod.name)][claim.name]


def explain(state: ClusterState, targets: Sequence[tuple[str, str]] = (), engine: CelEngine | None = None,
            *, namespace: str | None = None) -> list[Outcome]:
    """The allocator's outcome for each target (``NAMESPACE/CLAIM``, or ``NAMESPACE/POD``: each claim of
    the pod), or for every unallocated claim when ``targets`` is empty (of ``namespace`` alone when
    given). A claim a pod waits for is
    placed with the pod's other pending claims (the pod's verdict is the claim's); an allocated claim
    says so. ``ClaimNotFound`` for a name that is neither a claim nor a pod, or both.
    ``engine`` runs the CEL (default: in this process)."""
    by_key = {(c.namespace, c.name): c for c in state.claims}
    pods = {(p.namespace, p.name): p for p in state.pods}
    for ns, name in targets:
        # A pod named as its own claim is one answer (the claim's verdict is the pod's): the pod's.
        if (ns, name) in by_key and (ns, name) in pods and name not in pods[(ns, name)].claims:
            raise ClaimNotFound(f"{ns}/{name} names both a ResourceClaim and a Pod that does not use it: "
                                f"explain the pod's claims by their names")
    missing = [f"{ns}/{name}" for ns, name in targets if (ns, name) not in by_key and (ns, name) not in pods]
    if missing:
        raise ClaimNotFound(f"no ResourceClaim or Pod {', '.join(missing)} in the cluster")
    placer = _PodPlacer(state, Allocator(state, AllocatorCache(engine)))
    out: list[Outcome] = []
    if not targets:
        pending = sorted((c for c in state.claims if not c.allocated and namespace in (None, c.namespace)),
                         key=lambda c: (c.namespace, c.name))
        out = [placer.claim(c) for c in pending]
    for key in targets:
        claim = by_key.get(key)
        out.extend(placer.pod(pods[key]) if key in pods else [placer.claim(claim)] if claim is not None else [])
    pods_read = state.read("pods")  # unread: whether a pod waits is unknown (None), not "no"
    known = [c.name for c in state.classes]
    return [o if o.error == "already allocated" else
            _nearest_classes(o if pods_read else replace(o, pod_waits=None), known) for o in out]


_DID_YOU_MEAN: Final = "did you mean"


def _nearest_classes(outcome: Outcome, known: Sequence[str]) -> Outcome:
    """A missing class's request with the existing class nearest its name (a typo), as its detail."""
    requests = []
    for r in outcome.requests:
        near = difflib.get_close_matches(r.device_class, known, n=1, cutoff=0.75) if r.device_class else []
        requests.append(replace(r, blocked=tuple(
            replace(b, details=(*b.details, f"{_DID_YOU_MEAN} {near[0]}?")) if b.reason == CLASS_MISSING and near else b
            for b in r.blocked)))
    return replace(outcome, requests=tuple(requests))


def unread_warnings(state: ClusterState) -> list[str]:
    """One line per kind the source could not read, with what its absence leaves unknown."""
    hidden = {"pods": "whether a pod waits for a claim (pending or unused) is unknown"}
    return [f"could not read {kind} ({why.removeprefix('kubeapi: ')}): "
            f"{hidden.get(kind, f'what the {kind} would tell is unknown')}" for kind, why in state.unread]


def _allocated(claim: ClaimInfo) -> Outcome:
    return Outcome(claim.namespace, claim.name, False, error="already allocated")


def first_blocking(outcome: Outcome) -> tuple[str, str] | None:
    """(request, reason) of what keeps a claim from being allocated first; None when placeable."""
    if outcome.placeable or outcome.error == "already allocated":
        return None
    if outcome.together and outcome.requests:
        return outcome.requests[0].request, TOGETHER
    if outcome.node_filtered:
        return (outcome.requests[0].request if outcome.requests else ""), NODE_FILTERED
    for r in outcome.requests:  # an error the allocator stops at, before any count
        if r.error:
            return r.request, r.blocked[0].reason if r.blocked else SELECTOR_ERROR
    if outcome.fits_when_free is False and outcome.requests:
        # Nothing that ends unblocks it: the claim asks more than any one node can give at once.
        short = next((r for r in outcome.requests if (r.most_matching_on_a_node or 0) < r.count), None)
        if short is None and any(r.blocked and r.blocked[0].reason == CONSTRAINT for r in outcome.requests):
            return outcome.requests[0].request, CONSTRAINT  # enough devices, never together
        r = short or outcome.requests[0]
        return r.request, NO_MATCH if r.matching == 0 else TOO_FEW
    for r in outcome.requests:
        if r.all_devices or r.most_usable_on_a_node is None:
            if r.usable < r.count or (r.all_devices and r.matching == 0):
                return r.request, _reason(r)
        elif r.most_usable_on_a_node < r.count:
            # A claim must fit on one node: the reason is the one that would unblock it there.
            if (r.most_matching_on_a_node or 0) < r.count:
                return r.request, NO_MATCH if r.matching == 0 else TOO_FEW
            return r.request, r.node_reason or _reason(r)
    first = outcome.requests[0] if outcome.requests else None
    if first is None:
        return "", CLASS_MISSING
    # Each request alone would fit: what is left is what they cannot have together.
    return first.request, first.blocked[0].reason if first.blocked else CONSTRAINT


def undecided(outcome: Outcome) -> bool:
    """Whether the exporter cannot tell (a selector it cannot run): neither placeable nor not."""
    blocking = first_blocking(outcome)
    return blocking is not None and blocking[1] == UNSUPPORTED_SELECTOR


def _reason(r: RequestOutcome) -> str:
    if r.blocked:
        return r.blocked[0].reason
    return NO_MATCH if r.matching == 0 else TOO_FEW


# --- the two forms ---------------------------------------------------------------------------------


def as_dict(outcome: Outcome, covers: Coverage | None = None) -> dict[str, Any]:
    blocking = first_blocking(outcome)
    filters = {} if covers is None else {"scheduler_filters": {"covered": list(covers.covered),
                                                                "not_covered": list(covers.not_covered)}}
    return {**filters,
        "namespace": outcome.namespace, "claim": outcome.claim,
        "placeable": None if undecided(outcome) else outcome.placeable,
        "allocated": outcome.error == "already allocated",
        "node": outcome.node or None, "nodes_tried": outcome.nodes_tried, "pod_waits": outcome.pod_waits,
        "pod": outcome.pod or None, "attempt_fails": outcome.attempt_fails,
        "devices": ["/".join(p.device) for p in outcome.picks],
        "blocking": None if blocking is None else {"request": blocking[0], "reason": blocking[1]},
        "error": outcome.error or None,
        "requests": [{
            "request": r.request, "device_class": r.device_class, "count": r.count, "all_devices": r.all_devices,
            "matching": r.matching, "usable": r.usable, "chosen": ["/".join(k) for k in r.chosen],
            "excluded": [{"reason": b.reason, "devices": b.devices, "details": list(b.details)} for b in r.blocked],
            "error": r.error or None,
        } for r in outcome.requests],
    }


def render_json(outcomes: Sequence[Outcome], *, single: bool, covers: Coverage | None = None) -> str:
    """``covers``: each outcome says which of the scheduler's filters it covers (``scheduler_filters``)."""
    items = [as_dict(o, covers) for o in outcomes]
    return json.dumps(items[0] if single and items else items, indent=2)


def render_text(outcomes: Sequence[Outcome], covers: Coverage | None = None) -> str:
    """``covers``: a last line says which of the scheduler's filters the verdicts cover."""
    if not outcomes:
        return "no unallocated ResourceClaims in the cluster\n"
    text = "\n".join("".join(f"{printable.for_terminal(line)}\n" for line in _lines(o)) for o in outcomes)
    return text if covers is None else f"{text}({printable.for_terminal(covers.line())})\n"


def _lines(o: Outcome) -> list[str]:
    """The lines of ``o``'s text, before ``printable.for_terminal`` shows what came from the API
    server (names, the allocator's words about them) without letting the terminal obey it."""
    name = f"{o.namespace}/{o.claim}"
    if o.error == "already allocated":
        return [f"{name}: already allocated (nothing to explain)"]
    if o.placeable:
        devices = ", ".join("/".join(p.device[1:]) for p in o.picks)
        return [f"{name}: placeable now, on node {o.node or '(any)'}: {devices}{_waits(o)}"]
    tried = f" ({o.nodes_tried} node{'s' if o.nodes_tried != 1 else ''} tried)" if o.nodes_tried else ""
    verdict = "placeable or not: NOT KNOWN" if undecided(o) else "NOT placeable"
    lines = [f"{name}: {verdict}{tried}{_waits(o)}"]
    blocking = first_blocking(o)
    if blocking is not None:
        request, reason = blocking
        lines.append(f"  blocked first by: request {request or '(none)'}: {_sentence(o, request, reason)}")
    if o.error and (blocking is None or blocking[1] != CLASS_MISSING):
        fails = " (an error, not a misfit: the pod's whole scheduling attempt stops)" if o.attempt_fails else ""
        lines.append(f"  the allocator says: {o.error}{fails}")
    for r in o.requests:
        if any(b.reason == CLASS_MISSING for b in r.blocked):
            lines.append(f"  request {r.request}: device class {r.device_class or '(none)'} does not exist"
                         f"{_hint(r)}")
            continue
        asked = "all" if r.all_devices else str(r.count)
        lines.append(f"  request {r.request}: {asked} × {r.device_class or '(no class)'} — "
                     f"{r.matching} match, {r.usable} usable")
        for b in r.blocked:
            if blocking is not None and (r.request, b.reason) == blocking:
                continue  # said on the second line
            more = f" ({', '.join(b.details)})" if b.details else ""
            lines.append(f"    {b.devices}: {_SAYS.get(b.reason, b.reason)}{more} [{b.reason}]")
        if r.error:
            lines.append(f"    {r.error}")
    return lines


def _waits(o: Outcome) -> str:
    return "" if o.pod_waits is not False else "; no pod waits for it (unused: the scheduler does not try it)"


def _sentence(o: Outcome, request: str, reason: str) -> str:
    r = next((r for r in o.requests if r.request == request), None)
    said = _SAYS.get(reason, reason)
    if reason == CLASS_MISSING and r is not None:
        return f"device class {r.device_class or '(none)'} does not exist{_hint(r)} [{reason}]"
    if reason in (TOGETHER, NODE_FILTERED) and o.pod:
        return f"{said} (pod {o.pod}) [{reason}]"
    if r is None or reason in (NO_MATCH, TOO_FEW, CLASS_MISSING, TOGETHER, NODE_FILTERED):
        return f"{said} [{reason}]"
    blocked = next((b for b in r.blocked if b.reason == reason), None)
    count = blocked.devices if blocked is not None else 0
    details = f" ({', '.join(blocked.details)})" if blocked is not None and blocked.details else ""
    # A selector that fails is no match: those devices are not among the matching ones.
    of = f" of {r.matching} matching" if reason != SELECTOR_ERROR and count <= r.matching else ""
    return f"{count}{of} device{'s' if count != 1 or of else ''}: {said}{details} [{reason}]"


def _hint(r: RequestOutcome) -> str:
    """``: did you mean X?`` where a missing class has a near name (``_nearest_classes``)."""
    return next((f": {d}" for b in r.blocked if b.reason == CLASS_MISSING for d in b.details
                 if d.startswith(_DID_YOU_MEAN)), "")


# --- why pending claims wait, for the cluster mode's frames -------------------------------------------


ClaimKey = tuple[str, str]
"""(namespace, name)."""
#: Seconds a shape's reason is kept before it is asked again while the cluster changes.
REASON_REFRESH: Final = 60.0
#: Shapes the allocator is asked about per frame: one unplaceable claim over 5,000 nodes costs ~1 s
#: (every candidate node is tried), so a frame after a change pays for a few, never for all.
MAX_SHAPES_PER_FRAME: Final = 3


class PendingReasons:
    """The first blocking (request, reason) of each pending claim, from its waiting pod's outcome (the
    pod's pending claims allocated together), asked of the allocator once per *shape* (what the pod's
    pending claims ask: their requests and constraints; pods made from one template share it), kept
    ``REASON_REFRESH`` seconds of ``now``, at most ``MAX_SHAPES_PER_FRAME`` shapes asked per frame (the
    others keep their last reason; ``complete`` is False while a shape has no answer yet, so that the
    next frame asks again even when nothing changed). ``every_shape``: no such limit, for a single frame
    (``cluster --once``), which has no next frame to catch up in."""

    def __init__(self, *, every_shape: bool = False) -> None:
        self._known: dict[object, tuple[tuple[tuple[str, str] | None, ...], float]] = {}
        self._every_shape = every_shape
        self.complete = True

    def __call__(self, allocator: Allocator, pending: Sequence[ClaimInfo], now: float,
                 pods: Sequence[ClusterPod] = ()) -> dict[ClaimKey, tuple[str, str]]:
        by_key = {(c.namespace, c.name): c for c in pending}
        groups: list[list[ClaimInfo]] = []
        group_filters: list[PodNodeFilters | None] = []
        grouped: set[ClaimKey] = set()
        # Of every pod, only those waiting for a pending claim (a few among tens of thousands), oldest first.
        waiting = [p for p in pods if not p.ended and any((p.namespace, n) in by_key for n in p.claims)]
        for pod in sorted(waiting, key=lambda p: (p.created, p.namespace, p.name)):
            group = [c for n in pod.claims if (c := by_key.get((pod.namespace, n))) is not None
                     and (c.namespace, c.name) not in grouped]
            if group:
                grouped.update((c.namespace, c.name) for c in group)
                groups.append(group)
                group_filters.append(pod.node_filters)
        alone = [[c] for c in pending if (c.namespace, c.name) not in grouped]  # no pod known: alone
        groups += alone
        group_filters += [None] * len(alone)

        def shape_of(group: list[ClaimInfo], filters: PodNodeFilters | None) -> object:
            return tuple((c.requests, c.constraints) for c in group), filters

        shapes: dict[object, tuple[list[ClaimInfo], PodNodeFilters | None]] = {}
        for group, filters in zip(groups, group_filters, strict=True):
            shapes.setdefault(shape_of(group, filters), (group, filters))
        asked = 0
        fresh: dict[object, tuple[tuple[tuple[str, str] | None, ...], float]] = {}
        self.complete = True
        for shape, (group, filters) in shapes.items():
            known = self._known.get(shape)
            if known is None or now - known[1] >= REASON_REFRESH:
                if self._every_shape or asked < MAX_SHAPES_PER_FRAME:
                    asked += 1
                    known = (tuple(first_blocking(o) for o in allocator.allocate_pod(group, filters=filters)), now)
                elif known is None:
                    self.complete = False  # no answer yet: the next frame asks again; a stale one waits for a change
            if known is not None:
                fresh[shape] = known
        self._known = fresh
        out = {}
        for group, filters in zip(groups, group_filters, strict=True):
            found = fresh.get(shape_of(group, filters))
            if found is None:
                continue
            for c, why in zip(group, found[0], strict=True):
                if why is not None:
                    out[(c.namespace, c.name)] = why
        return out
