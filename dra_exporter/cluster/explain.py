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

import json
from collections.abc import Sequence
from dataclasses import replace
from typing import Any, Final

from ..model import ClaimInfo, ClusterState
from .allocator import (
    CAPACITY,
    CLASS_MISSING,
    CONSTRAINT,
    COUNTERS,
    NODE,
    POOL_INCOMPLETE,
    POOL_INVALID,
    SELECTOR_ERROR,
    TAINTED,
    TAKEN,
    UNSUPPORTED_SELECTOR,
    Allocator,
    AllocatorCache,
    Outcome,
    RequestOutcome,
)
from .claims import waiting_since
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
    COUNTERS: "shared counters used up (other partitions of the same GPU hold them)",
    TAINTED: "tainted, not tolerated by the request",
    CONSTRAINT: "usable alone, not together with the claim's matchAttribute/distinctAttribute constraints",
    NO_MATCH: "no device matches the class and the request's selectors",
    TOO_FEW: "fewer devices match than the request asks",
}


class ClaimNotFound(LookupError):
    """A claim named on the command line that the cluster does not have."""


def parse_target(text: str) -> tuple[str, str]:
    """``NAMESPACE/NAME`` → (namespace, name); ValueError naming what is wrong."""
    namespace, sep, name = text.partition("/")
    if not sep or not namespace or not name or "/" in name:
        raise ValueError(f"{text!r}: expected NAMESPACE/CLAIM")
    return namespace, name


def explain(state: ClusterState, targets: Sequence[tuple[str, str]] = (), engine: CelEngine | None = None
            ) -> list[Outcome]:
    """The allocator's outcome for each claim in ``targets`` (an allocated claim says so), or for
    every unallocated claim when ``targets`` is empty; ``ClaimNotFound`` for a claim not there.
    ``engine`` runs the CEL (default: in this process)."""
    by_key = {(c.namespace, c.name): c for c in state.claims}
    if targets:
        missing = [f"{ns}/{name}" for ns, name in targets if (ns, name) not in by_key]
        if missing:
            raise ClaimNotFound(f"no ResourceClaim {', '.join(missing)} in the cluster")
        claims: list[ClaimInfo] = [by_key[t] for t in targets]
    else:
        claims = sorted((c for c in state.claims if not c.allocated), key=lambda c: (c.namespace, c.name))
    allocator = Allocator(state, AllocatorCache(engine))
    waited = waiting_since(state.pods)
    return [_allocated(c) if c.allocated else replace(allocator.allocate(c), pod_waits=(c.namespace, c.name) in waited)
            for c in claims]


def _allocated(claim: ClaimInfo) -> Outcome:
    return Outcome(claim.namespace, claim.name, False, error="already allocated")


def first_blocking(outcome: Outcome) -> tuple[str, str] | None:
    """(request, reason) of what keeps a claim from being allocated first; None when placeable."""
    if outcome.placeable or outcome.error == "already allocated":
        return None
    for r in outcome.requests:  # an error the allocator stops at, before any count
        if r.error:
            return r.request, r.blocked[0].reason if r.blocked else SELECTOR_ERROR
    for r in outcome.requests:
        if r.usable < r.count or (r.all_devices and r.matching == 0):
            return r.request, _reason(r)
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


def as_dict(outcome: Outcome) -> dict[str, Any]:
    blocking = first_blocking(outcome)
    return {
        "namespace": outcome.namespace, "claim": outcome.claim,
        "placeable": None if undecided(outcome) else outcome.placeable,
        "allocated": outcome.error == "already allocated",
        "node": outcome.node or None, "nodes_tried": outcome.nodes_tried, "pod_waits": outcome.pod_waits,
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


def render_json(outcomes: Sequence[Outcome], *, single: bool) -> str:
    items = [as_dict(o) for o in outcomes]
    return json.dumps(items[0] if single and items else items, indent=2)


def render_text(outcomes: Sequence[Outcome]) -> str:
    if not outcomes:
        return "no unallocated ResourceClaims in the cluster\n"
    return "\n".join(_text(o) for o in outcomes)


def _text(o: Outcome) -> str:
    name = f"{o.namespace}/{o.claim}"
    if o.error == "already allocated":
        return f"{name}: already allocated (nothing to explain)\n"
    if o.placeable:
        devices = ", ".join("/".join(p.device[1:]) for p in o.picks)
        return f"{name}: placeable now, on node {o.node or '(any)'}: {devices}{_waits(o)}\n"
    tried = f" ({o.nodes_tried} node{'s' if o.nodes_tried != 1 else ''} tried)" if o.nodes_tried else ""
    verdict = "placeable or not: NOT KNOWN" if undecided(o) else "NOT placeable"
    lines = [f"{name}: {verdict}{tried}{_waits(o)}"]
    blocking = first_blocking(o)
    if blocking is not None:
        request, reason = blocking
        lines.append(f"  blocked first by: request {request or '(none)'}: {_sentence(o, request, reason)}")
    if o.error and (blocking is None or blocking[1] != CLASS_MISSING):
        lines.append(f"  the allocator says: {o.error}")
    for r in o.requests:
        if any(b.reason == CLASS_MISSING for b in r.blocked):
            lines.append(f"  request {r.request}: device class {r.device_class or '(none)'} does not exist")
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
    return "\n".join(lines) + "\n"


def _waits(o: Outcome) -> str:
    return "" if o.pod_waits is not False else "; no pod waits for it (unused: the scheduler does not try it)"


def _sentence(o: Outcome, request: str, reason: str) -> str:
    r = next((r for r in o.requests if r.request == request), None)
    said = _SAYS.get(reason, reason)
    if reason == CLASS_MISSING and r is not None:
        return f"device class {r.device_class or '(none)'} does not exist [{reason}]"
    if r is None or reason in (NO_MATCH, TOO_FEW, CLASS_MISSING):
        return f"{said} [{reason}]"
    blocked = next((b for b in r.blocked if b.reason == reason), None)
    count = blocked.devices if blocked is not None else 0
    details = f" ({', '.join(blocked.details)})" if blocked is not None and blocked.details else ""
    return f"{count} of {r.matching} matching devices: {said}{details} [{reason}]"


# --- why pending claims wait, for the cluster mode's frames -------------------------------------------


ClaimKey = tuple[str, str]
"""(namespace, name)."""
#: Seconds a shape's reason is kept before it is asked again while the cluster changes.
REASON_REFRESH: Final = 60.0
#: Shapes the allocator is asked about per frame: one unplaceable claim over 5,000 nodes costs ~1 s
#: (every candidate node is tried), so a frame after a change pays for a few, never for all.
MAX_SHAPES_PER_FRAME: Final = 3


class PendingReasons:
    """The first blocking (request, reason) of each pending claim, asked of the allocator once per
    *shape* (what a claim asks: its requests and constraints; claims made from one template share
    it), kept ``REASON_REFRESH`` seconds of ``now``, at most ``MAX_SHAPES_PER_FRAME`` shapes asked
    per frame (the others keep their last reason; ``complete`` is False while a shape has no answer
    yet, so that the next frame asks again even when nothing changed)."""

    def __init__(self) -> None:
        self._known: dict[object, tuple[tuple[str, str] | None, float]] = {}
        self.complete = True

    def __call__(self, allocator: Allocator, pending: Sequence[ClaimInfo], now: float
                 ) -> dict[ClaimKey, tuple[str, str]]:
        shapes: dict[object, ClaimInfo] = {}
        for c in pending:
            shapes.setdefault((c.requests, c.constraints), c)
        asked = 0
        fresh: dict[object, tuple[tuple[str, str] | None, float]] = {}
        self.complete = True
        for shape, claim in shapes.items():
            known = self._known.get(shape)
            if known is None or now - known[1] >= REASON_REFRESH:
                if asked < MAX_SHAPES_PER_FRAME:
                    asked += 1
                    known = (first_blocking(allocator.allocate(claim)), now)
                elif known is None:
                    self.complete = False  # no answer yet: the next frame asks again; a stale one waits for a change
            if known is not None:
                fresh[shape] = known
        self._known = fresh
        out = {}
        for c in pending:
            found = fresh.get((c.requests, c.constraints))
            if found is not None and found[0] is not None:
                out[(c.namespace, c.name)] = found[0]
        return out
