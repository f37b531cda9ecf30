"""Behaviours of kube-scheduler's structured allocator that differ between Kubernetes versions, and
which one a cluster's scheduler has: the one table the allocator asks (``Behaviours.of``). No I/O.

The scheduler is taken to run the API server's version (``/version``'s ``gitVersion``: control-plane
components are upgraded together); an unknown version gets the newest behaviour. Each behaviour is
listed in docs/operating.md ("The scheduler's version").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

#: The last minor version whose allocator keeps, for the rest of one allocation attempt (one pod on
#: one node), the counters of a device it rejected after they fitted: a tainted device not tolerated,
#: or one a claim's constraint refused (upstream ``allocateDevice`` checks counters, then taints and
#: constraints, and does not give the counters back). The test bed's v1.36.2 does; later versions do not.
COUNTERS_KEPT_BY_REJECTED_DEVICE_UNTIL: Final = (1, 36)

_VERSION = re.compile(r"v?(\d+)\.(\d+)")


def minor_version(git_version: str) -> tuple[int, int] | None:
    """``v1.36.2`` (or ``v1.36.2-gke.1``) → (1, 36); None when it cannot be read."""
    found = _VERSION.match(git_version.strip())
    return (int(found.group(1)), int(found.group(2))) if found else None


@dataclass(frozen=True, slots=True)
class Behaviours:
    """What the cluster's scheduler does where versions differ."""

    rejected_device_keeps_counters: bool = False

    @classmethod
    def of(cls, git_version: str) -> Behaviours:
        version = minor_version(git_version)
        if version is None:
            return NEWEST
        return cls(rejected_device_keeps_counters=version <= COUNTERS_KEPT_BY_REJECTED_DEVICE_UNTIL)


NEWEST: Final = Behaviours()
