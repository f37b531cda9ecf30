"""Sources: adapters to the systems the exporter reads (NVML, kubelet, API server, /proc).

The only layer that does I/O on the node's systems. Each source returns frozen
snapshots from ``model`` and knows nothing of Prometheus or OpenTelemetry; tests
point them at the simulated node. Sources never import sinks.

``Source[T]`` is what the agent runs: ``collect()`` returns one snapshot of type ``T``
(or raises), ``close()`` releases what the source holds. ``Snapshots`` is the latest
snapshot of each source, typed, as the join reads them. Which sources exist, and how
each is built, is ``sources.registry``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, TypeVar

from ..model import (
    CdiSnapshot,
    ClusterSnapshot,
    ClusterState,
    DeviceSnapshot,
    PodResourcesSnapshot,
    ProcessOwnersSnapshot,
)

T_co = TypeVar("T_co", covariant=True)


class SourceError(Exception):
    """A source could not produce a snapshot this cycle; the message says why, for operators."""


class PartialSnapshot(SourceError):
    """Part of the source failed, the rest answered: ``snapshot`` is what it read. The source
    counts as down (the message says what is missing) while the snapshot is used, so one kind the
    exporter may not read (a 403) does not blank the kinds it may."""

    def __init__(self, message: str, snapshot: object) -> None:
        super().__init__(message)
        self.snapshot = snapshot


class Source(Protocol[T_co]):
    """One system the exporter reads, collected once per cycle (or on its own thread)."""

    @property
    def name(self) -> str:
        """The ``source`` label of its self-metrics (``dra_exporter_source_up{source}``)."""
        ...

    def collect(self) -> T_co:
        """One snapshot; raises (``SourceError`` with an operator's message) when it cannot."""
        ...

    def close(self) -> None:
        """Release threads, sockets and handles; safe to call twice."""
        ...


@dataclass(frozen=True, slots=True)
class Snapshots:
    """The latest snapshot of every source; None where a source is off, failing or not yet collected."""

    devices: tuple[DeviceSnapshot, ...] = ()
    """One snapshot per device source that answered (``registry.device_source``: NVML today)."""
    pods: PodResourcesSnapshot | None = None
    """The kubelet's pod-resources answer (source ``podresources``)."""
    cluster: ClusterSnapshot | None = None
    """The API server's view of this node (source ``kubeapi``)."""
    owners: ProcessOwnersSnapshot | None = None
    """Pod and container of each GPU process, from /proc (source ``procs``)."""
    cdi: CdiSnapshot | None = None
    """The per-claim CDI specs under the CDI root (source ``cdi``)."""
    state: ClusterState | None = None
    """The DRA objects of the whole cluster (the cluster mode's source ``kubeapi``)."""
