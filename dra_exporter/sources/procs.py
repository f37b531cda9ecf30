"""Which pod and container a GPU process belongs to: ``/proc/<pid>/cgroup``.

The kubelet puts every container in a cgroup whose path names the pod UID and the
container ID. The path's shape depends on the cgroup version (v1: one line per
hierarchy; v2: one ``0::`` line), the kubelet's cgroup driver (systemd escapes the
pod UID's dashes as underscores inside ``.slice`` names; cgroupfs keeps them) and
the runtime (``cri-containerd-<id>.scope``, ``crio-<id>.scope``, ``docker-<id>.scope``,
or a bare ``<id>`` under cgroupfs). ``parse_cgroup`` handles all of them and is pure.

GPU PIDs come from NVML, which reports them in the host's PID namespace: the exporter
needs ``hostPID: true`` to find them under ``/proc``. PIDs it cannot resolve are
counted, never silently dropped.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

from ..model import ProcessOwner, ProcessOwnersSnapshot
from . import Source, SourceError

DEFAULT_PROCFS: Final = "/proc"
#: A cgroup file is a few hundred bytes; anything far larger is not one.
_MAX_CGROUP_BYTES: Final = 64 * 1024

_UUID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
# "pod<uid>" as a path element (cgroupfs) or inside a systemd slice name
# ("kubepods-burstable-pod<uid with underscores>.slice").
_POD = re.compile(rf"(?:^|[/-])pod(?P<uid>{_UUID})(?:\.slice)?(?=/|$)")
# The container's own cgroup: the last element, with or without a runtime's scope prefix.
# conmon (CRI-O's monitor) has its own scope and is not a container.
_CONTAINER = re.compile(r"/(?:cri-containerd-|crio-|docker-|containerd-)?(?P<id>[0-9a-f]{64})(?:\.scope)?$")


@dataclass(frozen=True, slots=True)
class CgroupOwner:
    """The Kubernetes identity a cgroup path carries."""

    pod_uid: str
    container_id: str
    """The bare runtime ID (64 hex), as in ``status.containerStatuses[].containerID`` after ``://``."""


def parse_cgroup(text: str) -> CgroupOwner | None:
    """The pod UID and container ID in a ``/proc/<pid>/cgroup`` file; None outside Kubernetes."""
    for line in text.splitlines():
        # "hierarchy-ID:controller-list:path"; the path itself may contain ':'.
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        owner = parse_cgroup_path(parts[2].strip())
        if owner is not None:
            return owner
    return None


def parse_cgroup_path(path: str) -> CgroupOwner | None:
    pod = _POD.search(path)
    container = _CONTAINER.search(path)
    if pod is None or container is None or container.start() < pod.end():
        return None
    return CgroupOwner(pod["uid"].replace("_", "-"), container["id"])


class ProcsSource(Source[ProcessOwnersSnapshot]):
    """Resolves the PIDs NVML reports to pods and containers through ``<procfs>/<pid>/cgroup``.

    ``pids`` returns the GPU PIDs of the latest NVML snapshot; the agent collects this source
    right after NVML in the same cycle. A PID's cgroup does not change while it lives, so
    answers are cached per (PID, start time) and the cache holds only the PIDs asked for last
    time: ended processes are forgotten and a reused PID is read again.
    """

    name = "procs"

    def __init__(self, pids: Callable[[], Iterable[int]], procfs: str = DEFAULT_PROCFS) -> None:
        self._pids = pids
        self.procfs = procfs
        self._cache: dict[tuple[int, str], CgroupOwner | None] = {}

    def collect(self) -> ProcessOwnersSnapshot:
        if not os.path.isdir(self.procfs):
            raise SourceError(f"procs: {self.procfs} is not a directory (set --procfs)")
        return self.lookup(self._pids())

    def lookup(self, pids: Iterable[int]) -> ProcessOwnersSnapshot:
        owners: list[ProcessOwner] = []
        unresolved: list[int] = []
        cache: dict[tuple[int, str], CgroupOwner | None] = {}
        for pid in sorted(set(pids)):
            key = (pid, self._start_time(pid))
            owner = self._cache[key] if key in self._cache else self._read(pid)
            cache[key] = owner
            if owner is None:
                unresolved.append(pid)
            else:
                owners.append(ProcessOwner(pid, owner.pod_uid, owner.container_id))
        self._cache = cache
        return ProcessOwnersSnapshot(tuple(owners), tuple(unresolved))

    def close(self) -> None:
        self._cache = {}

    def _start_time(self, pid: int) -> str:
        """Field 22 of ``/proc/<pid>/stat``: tells a reused PID from the old one; "" if unreadable."""
        try:
            with open(os.path.join(self.procfs, str(pid), "stat"), "rb") as f:
                stat = f.read(4096).decode(errors="replace")
        except OSError:
            return ""
        # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
        fields = stat.rpartition(")")[2].split()
        return fields[19] if len(fields) > 19 else ""

    def _read(self, pid: int) -> CgroupOwner | None:
        try:
            with open(os.path.join(self.procfs, str(pid), "cgroup"), "rb") as f:
                text = f.read(_MAX_CGROUP_BYTES).decode(errors="replace")
        except OSError:
            return None  # not in our PID namespace (no hostPID), or already gone
        return parse_cgroup(text)
