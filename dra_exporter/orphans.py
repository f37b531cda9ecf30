"""What the node holds that no claim accounts for: the pure decision, and since when.

Three kinds, each a family whose value is the Unix time it was first seen (kept across cycles by
``OrphanMemory``, which the node agent's core holds):

* **prepared devices** (``dra_orphan_prepared_device_since_timestamp_seconds``): a device a DRA
  driver prepared for a claim (its CDI spec under the CDI root, ``sources.cdi``) whose claim the API
  server no longer has (``reason="claim_deleted"``) or has deallocated, or allocated elsewhere
  (``claim_deallocated``). A claim counts as gone only when the API server's last good list of claims
  (the census, ``ClaimCensus``) was asked about its UID and lacks it, never because it has not been
  read yet; while the kubeapi source is down nothing is decided, and what was found stays found.
  A claim a local pod still uses (the API server's claim with this device allocated, or the
  kubelet's devices listing the CDI name) accounts for it.
* **MIG devices** (``dra_orphan_mig_device_since_timestamp_seconds``): a MIG device in NVML on a GPU
  a DRA driver publishes (the GPU, or its other MIG devices), that no allocated claim and no
  device-plugin allocation names, and that is not itself published (a statically partitioned GPU's
  idle MIG devices are allocatable, not orphans). Dynamic MIG creates the device at prepare and
  destroys it at unprepare: one left is a leak; one made by hand on a GPU the driver manages is
  capacity no claim can get. Needs the kubelet's answer and the API server's view, both up.
* **processes** (``dra_orphan_gpu_process_since_timestamp_seconds``): a process on a GPU (or MIG
  device) that no claim, device-plugin allocation or allocated claim covers — on the device, its
  parent GPU or one of its MIG devices. Needs the kubelet's answer, up.

No I/O, no clock: the caller gives the time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from . import catalog as cat
from .model import CdiSnapshot, ClaimCensus, ClaimInfo, GpuDevice, Labels, ProcessSample

#: Why a prepared device is an orphan.
CLAIM_DELETED = "claim_deleted"
CLAIM_DEALLOCATED = "claim_deallocated"

Key = tuple[str, ...]
"""An orphan's identity within its kind, stable across cycles (the reason may change)."""


@dataclass(frozen=True, slots=True)
class Found:
    """The orphans of one kind this cycle, and what could not be decided.

    ``undecided`` None: nothing of this kind could be looked at (a source down): every remembered
    orphan of the kind is kept. Otherwise the keys that could not be decided this cycle keep
    their first-seen time; the others are forgotten."""

    spec: cat.MetricSpec
    orphans: Mapping[Key, Labels] = field(default_factory=dict)
    undecided: frozenset[Key] | None = frozenset()


@dataclass(slots=True)
class OrphanMemory:
    """When each orphan was first seen, per family, across cycles (the node agent's core holds one)."""

    first_seen: dict[str, dict[Key, float]] = field(default_factory=dict)

    def since(self, found: Found, now: float) -> dict[Key, float]:
        """The first-seen time of each orphan of ``found``; forgets those no longer orphans."""
        before = self.first_seen.get(found.spec.name, {})
        if found.undecided is None:
            kept = dict(before)
        else:
            kept = {k: t for k, t in before.items() if k in found.undecided}
        for key in found.orphans:
            kept[key] = before.get(key, now)
        self.first_seen[found.spec.name] = kept
        return {key: kept[key] for key in found.orphans}


def prepared(cdi: CdiSnapshot | None, local_claims: Iterable[ClaimInfo], census: ClaimCensus | None,
             in_use_cdi_names: frozenset[str], uuid_of: Mapping[tuple[str, str], str], kube_up: bool) -> Found:
    """Prepared devices whose claim is gone or deallocated.

    ``local_claims``: the API server's claims of the local pods; ``in_use_cdi_names``: the CDI
    names the kubelet lists for running pods (``<uid>-<device>``, without the vendor/class part);
    ``uuid_of``: (driver, device) → NVML UUID, where the slices say; ``kube_up``: whether the
    kubeapi source is up now."""
    spec = cat.ORPHAN_PREPARED_DEVICE
    if cdi is None:
        return Found(spec, undecided=None)
    allocated = {(c.uid, r.driver, r.device) for c in local_claims for r in c.results}
    by_uid = {c.uid: c for c in census.found} if census is not None else {}
    orphans: dict[Key, Labels] = {}
    undecided = set()
    for dev in cdi.devices:
        key = (dev.driver, dev.device, dev.claim_uid)
        if (dev.claim_uid, dev.driver, dev.device) in allocated or f"{dev.claim_uid}-{dev.device}" in in_use_cdi_names:
            continue
        if not kube_up or census is None or dev.claim_uid not in census.asked:
            undecided.add(key)
            continue
        claim = by_uid.get(dev.claim_uid)
        if claim is not None and any((r.driver, r.device) == (dev.driver, dev.device) for r in claim.results):
            continue  # allocated (to a pod not on this node's list yet): accounted for
        reason = CLAIM_DELETED if claim is None else CLAIM_DEALLOCATED
        orphans[key] = spec.series(driver=dev.driver, device=dev.device, uuid=uuid_of.get((dev.driver, dev.device), ""),
                                   claim_uid=dev.claim_uid, reason=reason)
    return Found(spec, orphans, frozenset(undecided))


def mig_devices(devices: Iterable[GpuDevice], held: frozenset[str], published: frozenset[str],
                decidable: bool) -> Found:
    """MIG devices no allocation names, on GPUs a DRA driver publishes, not published themselves.

    A GPU a DRA driver manages: its slices name it (dynamic MIG publishes the whole GPU and
    placements without UUIDs) or one of its MIG devices (a static layout publishes each MIG device).
    ``held``: UUIDs any claim (allocated, or listed by the kubelet) or device-plugin allocation
    names; ``published``: UUIDs the ResourceSlices name; ``decidable``: the kubelet and the API
    server are both up."""
    spec = cat.ORPHAN_MIG_DEVICE
    devices = tuple(devices)
    managed = published | {d.parent_uuid for d in devices if d.is_mig and d.uuid in published}
    migs = [d for d in devices if d.is_mig and d.parent_uuid in managed]
    if not decidable:
        return Found(spec, undecided=frozenset((d.uuid,) for d in migs))
    orphans: dict[Key, Labels] = {
        (d.uuid,): spec.series(uuid=d.uuid, gpu=str(d.index), parent_uuid=d.parent_uuid, profile=d.profile)
        for d in migs if d.uuid not in held and d.uuid not in published}
    return Found(spec, orphans)


def processes(procs: Iterable[ProcessSample], devices: Iterable[GpuDevice], held: frozenset[str],
              decidable: bool) -> Found:
    """Processes on a device that nothing covers: not it, its parent GPU, nor one of its MIG devices.

    ``decidable``: the kubelet's answer is there and up."""
    spec = cat.ORPHAN_GPU_PROCESS
    by_uuid = {d.uuid: d for d in devices}
    covered = set(held)
    for d in by_uuid.values():
        if d.is_mig and (d.uuid in held or d.parent_uuid in held):
            covered.update((d.uuid, d.parent_uuid))
    procs = [p for p in procs if p.uuid in by_uuid]
    if not decidable:
        return Found(spec, undecided=frozenset((p.uuid, str(p.pid)) for p in procs))
    orphans: dict[Key, Labels] = {
        (p.uuid, str(p.pid)): spec.series(uuid=p.uuid, gpu=str(by_uuid[p.uuid].index), pid=str(p.pid))
        for p in procs if p.uuid not in covered}
    return Found(spec, orphans)
