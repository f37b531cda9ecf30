"""Claim states that mean what an operator means, from the cluster's claims and the pods that
reference them.

Contract: pure functions of their arguments; no I/O.

* ``pending``: not allocated, and some pod waits for it: a pod that references it (by name in
  ``spec.resourceClaims``, or through a template whose generated claim ``status.resourceClaimStatuses``
  names) and has not ended (Succeeded, Failed, or being deleted). Only such claims does the
  scheduler try to allocate.
* ``unused``: not allocated, and no pod waits: never referenced, or every pod that referenced it
  ended (Kubernetes deallocates a claim within a second of its last pod's end).
* ``allocated``: allocated, and reserved by no pod (its devices are held, nobody uses them).
* ``reserved``: allocated, and ``status.reservedFor`` names a consumer.
* ``unknown``: not allocated, and the pods could not be read (their list is forbidden): pending or
  unused cannot be told, and no verdict is given.

A pending claim is waited for since the earliest creation of a pod that waits for it, but not before
the claim itself exists (a pod may name a claim that is created later). Why it is pending is the
allocator's (``explain.PendingReasons``): the first blocking (request, reason) of each pending claim.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from .. import catalog as cat
from ..model import ClaimInfo, ClusterPod, Labels

PENDING: Final = "pending"
UNUSED: Final = "unused"
ALLOCATED: Final = "allocated"
RESERVED: Final = "reserved"
UNKNOWN: Final = "unknown"
STATES: Final = (PENDING, UNUSED, ALLOCATED, RESERVED)
"""Emitted for every namespace; ``UNKNOWN`` only while the pods are unread."""

ClaimKey = tuple[str, str]
"""(namespace, name)."""
Blocking = tuple[str, str]
"""(request or ``main/sub`` subrequest, reason)."""
Emit = Callable[[cat.MetricSpec, Labels, float], None]


@dataclass(frozen=True, slots=True)
class ClaimStatus:
    claim: ClaimInfo
    state: str
    waiting_since: float = 0.0
    """Pending claims only: Unix time since which a pod waits for it (0 when unknown)."""


def waiting_since(pods: Iterable[ClusterPod]) -> dict[ClaimKey, float]:
    """(namespace, claim) → the earliest creation of a pod that has not ended and references it."""
    since: dict[ClaimKey, float] = {}
    for pod in pods:
        if pod.ended:
            continue
        for name in pod.claims:
            key = (pod.namespace, name)
            known = since.get(key)
            since[key] = pod.created if known is None else min(known, pod.created)
    return since


def claim_statuses(claims: Iterable[ClaimInfo], pods: Iterable[ClusterPod], *,
                   pods_read: bool = True) -> tuple[ClaimStatus, ...]:
    """The state of every claim (see the module docstring), in the claims' order; ``pods_read``
    False: the pods could not be read, and an unallocated claim is ``unknown``."""
    since = waiting_since(pods)
    out = []
    for c in claims:
        if c.allocated:
            out.append(ClaimStatus(c, RESERVED if c.reserved_for else ALLOCATED))
        elif not pods_read:
            out.append(ClaimStatus(c, UNKNOWN))
        elif (pod_created := since.get((c.namespace, c.name))) is not None:
            out.append(ClaimStatus(c, PENDING, max(pod_created, c.created)))
        else:
            out.append(ClaimStatus(c, UNUSED))
    return tuple(out)


def claim_families(emit: Emit, statuses: Sequence[ClaimStatus], blocking: Mapping[ClaimKey, Blocking]) -> None:
    """The families that depend on the objects alone: claims by state, unreserved devices, the
    requests of pending claims with their classes, and why each pending claim waits."""
    by_state: Counter[tuple[str, str]] = Counter()
    for s in statuses:
        c = s.claim
        by_state[(c.namespace, s.state)] += 1
        claim = (("namespace", c.namespace), ("claim", c.name))
        if s.state == ALLOCATED:
            emit(cat.CLUSTER_CLAIM_UNRESERVED, claim, len({(r.driver, r.pool, r.device) for r in c.results}))
        elif s.state == PENDING:
            for r in c.requests:
                emit(cat.CLUSTER_CLAIM_PENDING_REQUEST, (*claim, ("request", r.name),
                                                         ("device_class", r.device_class)), 1)
            if (why := blocking.get((c.namespace, c.name))) is not None:
                emit(cat.CLUSTER_CLAIM_PENDING_REASON, (*claim, ("request", why[0]), ("reason", why[1])), 1)
    states = STATES + ((UNKNOWN,) if any(st == UNKNOWN for _, st in by_state) else ())
    for namespace in sorted({ns for ns, _ in by_state}):
        for st in states:
            emit(cat.CLUSTER_CLAIMS, (("namespace", namespace), ("state", st)), by_state[(namespace, st)])


def pending_ages(emit: Emit, pending: Iterable[ClaimStatus], now: float) -> None:
    """One series per pending claim: seconds since a pod began to wait for it."""
    for s in pending:
        age = max(0.0, now - s.waiting_since) if s.waiting_since else 0.0
        emit(cat.CLUSTER_CLAIM_PENDING, (("namespace", s.claim.namespace), ("claim", s.claim.name)), age)
