"""What the node holds that no claim accounts for: prepared devices of gone claims (CDI specs), MIG
devices nobody names, GPU processes nobody covers — decided only from sources that are up, and
valued since when they were first seen."""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from dra_exporter import catalog as cat
from dra_exporter.join import JoinInput, join
from dra_exporter.model import (
    AllocationResult,
    CdiSnapshot,
    ClaimCensus,
    ClaimDevice,
    ClaimInfo,
    ClaimUse,
    ClusterSnapshot,
    ContainerAllocation,
    DeviceSample,
    DeviceSnapshot,
    Frame,
    GpuDevice,
    PluginDevices,
    PodAllocation,
    PodResourcesSnapshot,
    PreparedDevice,
    ProcessSample,
    ResourceSliceInfo,
    SliceDevice,
    SourceHealth,
)
from dra_exporter.orphans import OrphanMemory
from dra_exporter.sources.cdi import CdiSource

DRIVER = "gpu.nvidia.com"
NODE = "node"
GONE = "0b1e5c2a-7d4f-4e8a-9c61-3f2a8d9e7b10"
LIVE = "11111111-2222-4333-8444-555555555555"
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "cdi"
T0 = 1_800_000_000.0

GPUS = tuple(GpuDevice(f"GPU-{i}", i, i, "NVIDIA H100", f"00000000:0{i}:00.0",
                       mig_mode="enabled" if i == 2 else "disabled") for i in range(3))
MIG = GpuDevice("MIG-2a", 2, 2, "NVIDIA H100", GPUS[2].pci_bus_id, mig_mode="", parent_uuid="GPU-2",
                profile="1g.10gb", gi_id=9, ci_id=0, gi_profile_id=19, placement_start=0, placement_size=1)
SLICE = ResourceSliceInfo("s", DRIVER, NODE, node_name=NODE, devices=tuple(
    SliceDevice(f"gpu-{i}", attributes=(("uuid", f"GPU-{i}"), ("type", "gpu"))) for i in range(3)))
NOTHING_PREPARED = CdiSnapshot()
UP = tuple(SourceHealth(s, True) for s in ("cdi", "kubeapi", "nvml", "podresources"))


def claim(uid: str, name: str, *devices: str) -> ClaimInfo:
    return ClaimInfo("ml", name, uid, tuple(AllocationResult("gpu", DRIVER, NODE, d) for d in devices))


def pod_using(name: str, *devices: str) -> PodAllocation:
    use = ClaimUse("ml", name, tuple(ClaimDevice(DRIVER, NODE, d) for d in devices))
    return PodAllocation("ml", f"{name}-pod", (ContainerAllocation("main", (use,)),))


def frame(memory: OrphanMemory, *, t: float = T0, cdi: CdiSnapshot | None = NOTHING_PREPARED,
          claims: tuple[ClaimInfo, ...] = (), census: ClaimCensus | None = None,
          pods: tuple[PodAllocation, ...] = (), processes: tuple[ProcessSample, ...] = (),
          devices: tuple[GpuDevice, ...] = GPUS, health: tuple[SourceHealth, ...] = UP) -> Frame:
    snapshot = DeviceSnapshot(tuple(DeviceSample(d, True) for d in devices), processes)
    cluster = ClusterSnapshot(NODE, "v1", (SLICE,), claims, claim_census=census)
    return join(JoinInput(devices=(snapshot,), pods=PodResourcesSnapshot(pods), cluster=cluster, cdi=cdi,
                          orphan_memory=memory, health=health, timestamp=t))


def orphans(f: Frame, spec: cat.MetricSpec) -> dict[tuple[tuple[str, str], ...], float]:
    family = f.family(spec.name)
    return {s.labels: s.value for s in family.samples} if family else {}


def prepared(*devices: tuple[str, str]) -> CdiSnapshot:
    return CdiSnapshot(tuple(PreparedDevice(uid, dev, DRIVER, f"k8s.gpu.nvidia.com-claim_{uid}.yaml")
                             for uid, dev in devices))


# --- prepared devices (CDI specs) --------------------------------------------------------------


def test_a_spec_of_a_claim_the_census_lacks_is_deleted_and_keeps_its_first_seen_time() -> None:
    memory = OrphanMemory()
    cdi = prepared((GONE, "gpu-1"))
    census = ClaimCensus(frozenset({GONE}))
    first = orphans(frame(memory, cdi=cdi, census=census), cat.ORPHAN_PREPARED_DEVICE)
    later = orphans(frame(memory, cdi=cdi, census=census, t=T0 + 700), cat.ORPHAN_PREPARED_DEVICE)
    labels = cat.ORPHAN_PREPARED_DEVICE.series(driver=DRIVER, device="gpu-1", uuid="GPU-1", claim_uid=GONE,
                                               reason="claim_deleted")
    assert first == later == {labels: T0}


def test_a_spec_of_a_deallocated_claim_says_so() -> None:
    cdi = prepared((GONE, "gpu-1"))
    census = ClaimCensus(frozenset({GONE}), (claim(GONE, "old"),))
    found = orphans(frame(OrphanMemory(), cdi=cdi, census=census), cat.ORPHAN_PREPARED_DEVICE)
    assert [dict(k)["reason"] for k in found] == ["claim_deallocated"]


def test_specs_of_claims_in_use_or_allocated_are_no_orphans() -> None:
    cdi = prepared((LIVE, "gpu-0"), (GONE, "gpu-1"))
    # LIVE: a local pod's claim with gpu-0 allocated; GONE: the census finds it allocated (its pod not here yet).
    census = ClaimCensus(frozenset({GONE}), (claim(GONE, "other", "gpu-1"),))
    f = frame(OrphanMemory(), cdi=cdi, claims=(claim(LIVE, "live", "gpu-0"),), census=census)
    assert orphans(f, cat.ORPHAN_PREPARED_DEVICE) == {}
    # The kubelet still lists the CDI name for a running pod: in use, whatever the API server says.
    use = ClaimUse("ml", "x", (ClaimDevice(DRIVER, NODE, "gpu-1", (f"k8s.gpu.nvidia.com/claim={GONE}-gpu-1",)),))
    pod = PodAllocation("ml", "p", (ContainerAllocation("c", (use,)),))
    f = frame(OrphanMemory(), cdi=prepared((GONE, "gpu-1")), census=ClaimCensus(frozenset({GONE})), pods=(pod,))
    assert orphans(f, cat.ORPHAN_PREPARED_DEVICE) == {}


def test_never_an_orphan_while_the_claim_is_not_known_absent() -> None:
    memory = OrphanMemory()
    cdi = prepared((GONE, "gpu-1"))
    # Not asked yet (a spec newer than the census), and no census at all: unknown, not orphaned.
    assert orphans(frame(memory, cdi=cdi, census=ClaimCensus(frozenset({LIVE}))), cat.ORPHAN_PREPARED_DEVICE) == {}
    assert orphans(frame(memory, cdi=cdi), cat.ORPHAN_PREPARED_DEVICE) == {}
    # The kubeapi source down: its last good census says absent, but nothing is decided while it is down.
    down = tuple(replace(h, up=False) if h.source == "kubeapi" else h for h in UP)
    census = ClaimCensus(frozenset({GONE}))
    assert orphans(frame(memory, cdi=cdi, census=census, health=down), cat.ORPHAN_PREPARED_DEVICE) == {}


def test_an_orphan_found_stays_found_through_an_outage_then_goes_with_its_spec() -> None:
    memory = OrphanMemory()
    cdi = prepared((GONE, "gpu-1"))
    census = ClaimCensus(frozenset({GONE}))
    frame(memory, cdi=cdi, census=census)
    down = tuple(replace(h, up=False) if h.source == "kubeapi" else h for h in UP)
    frame(memory, cdi=cdi, census=census, health=down, t=T0 + 100)  # undecided: its first-seen time is kept
    frame(memory, cdi=None, census=census, t=T0 + 200)  # the CDI root unreadable: kept too
    assert set(orphans(frame(memory, cdi=cdi, census=census, t=T0 + 300),
                       cat.ORPHAN_PREPARED_DEVICE).values()) == {T0}
    frame(memory, cdi=CdiSnapshot(), census=census, t=T0 + 400)  # the driver removed the spec
    assert set(orphans(frame(memory, cdi=cdi, census=census, t=T0 + 500),
                       cat.ORPHAN_PREPARED_DEVICE).values()) == {T0 + 500}


# --- MIG devices ----------------------------------------------------------------------------------


def test_a_mig_device_no_claim_names_on_a_published_gpu_is_an_orphan_until_a_claim_names_it() -> None:
    """The mock NVML of the node bed has no MIG devices: this is the simulator's (the model's) MIG device."""
    devices = (*GPUS, MIG)
    memory = OrphanMemory()
    found = orphans(frame(memory, devices=devices), cat.ORPHAN_MIG_DEVICE)
    assert found == {cat.ORPHAN_MIG_DEVICE.series(uuid="MIG-2a", gpu="2", parent_uuid="GPU-2", profile="1g.10gb"): T0}
    # A claim the kubelet lists it for, through NVIDIA's dynamic MIG name: accounted for.
    named = pod_using("mig", "gpu-2-mig-1g10gb-19-0")
    assert orphans(frame(memory, devices=devices, pods=(named,)), cat.ORPHAN_MIG_DEVICE) == {}
    # The kubelet down: not decided.
    down = tuple(replace(h, up=False) if h.source == "podresources" else h for h in UP)
    assert orphans(frame(OrphanMemory(), devices=devices, health=down), cat.ORPHAN_MIG_DEVICE) == {}


def test_a_published_mig_device_or_one_on_an_unpublished_gpu_is_no_orphan() -> None:
    static = replace(SLICE, devices=(*SLICE.devices, SliceDevice("gpu-2-mig-9-0", (("uuid", "MIG-2a"),))))
    f = join(JoinInput(devices=(DeviceSnapshot((*(DeviceSample(d, True) for d in GPUS), DeviceSample(MIG, True))),),
                       pods=PodResourcesSnapshot(), cluster=ClusterSnapshot(NODE, "v1", (static,)),
                       orphan_memory=OrphanMemory(), health=UP, timestamp=T0))
    assert orphans(f, cat.ORPHAN_MIG_DEVICE) == {}
    unpublished = replace(MIG, parent_uuid="GPU-9")
    assert orphans(frame(OrphanMemory(), devices=(*GPUS, unpublished)), cat.ORPHAN_MIG_DEVICE) == {}


def test_a_mig_device_made_by_hand_on_a_statically_partitioned_gpu_is_an_orphan() -> None:
    """A static layout publishes each MIG device (not the GPU): one NVML has and no slice does is no
    claim's, and no claim can get it."""
    sibling = replace(MIG, uuid="MIG-2b", placement_start=1, gi_id=10)
    static = replace(SLICE, devices=(*SLICE.devices[:2], SliceDevice("gpu-2-mig-19-1-1", (("uuid", "MIG-2b"),))))
    snapshot = DeviceSnapshot(tuple(DeviceSample(d, True) for d in (*GPUS, MIG, sibling)))
    f = join(JoinInput(devices=(snapshot,), pods=PodResourcesSnapshot(), cluster=ClusterSnapshot(NODE, "v1", (static,)),
                       orphan_memory=OrphanMemory(), health=UP, timestamp=T0))
    assert [dict(k)["uuid"] for k in orphans(f, cat.ORPHAN_MIG_DEVICE)] == ["MIG-2a"]


# --- processes ----------------------------------------------------------------------------------


def test_a_process_on_a_gpu_nothing_holds_is_an_orphan_one_on_a_held_gpu_is_not() -> None:
    procs = (ProcessSample("GPU-0", 4242), ProcessSample("GPU-1", 77))
    f = frame(OrphanMemory(), processes=procs, claims=(claim(LIVE, "live", "gpu-1"),),
              pods=(pod_using("live", "gpu-1"),))
    assert orphans(f, cat.ORPHAN_GPU_PROCESS) == {cat.ORPHAN_GPU_PROCESS.series(uuid="GPU-0", gpu="0", pid="4242"): T0}
    # A device-plugin allocation covers it as well.
    plugin = PodAllocation("ml", "dp", (ContainerAllocation("c", plugin_devices=(PluginDevices("nvidia.com/gpu",
                                                                                               ("GPU-0",)),)),))
    assert orphans(frame(OrphanMemory(), processes=procs[:1], pods=(plugin,)), cat.ORPHAN_GPU_PROCESS) == {}


def test_a_process_on_the_parent_of_a_held_mig_device_is_covered_and_none_is_decided_without_the_kubelet() -> None:
    procs = (ProcessSample("GPU-2", 5),)
    held = pod_using("mig", "gpu-2-mig-1g10gb-19-0")
    assert orphans(frame(OrphanMemory(), devices=(*GPUS, MIG), processes=procs, pods=(held,)),
                   cat.ORPHAN_GPU_PROCESS) == {}
    down = tuple(replace(h, up=False) if h.source == "podresources" else h for h in UP)
    assert orphans(frame(OrphanMemory(), processes=procs, health=down), cat.ORPHAN_GPU_PROCESS) == {}


def orphan_frame() -> Frame:
    """A frame with every orphan family (for the catalogue's check of every family's labels)."""
    return frame(OrphanMemory(), devices=(*GPUS, MIG), cdi=prepared((GONE, "gpu-1")),
                 census=ClaimCensus(frozenset({GONE})), processes=(ProcessSample("GPU-0", 4242),))


# --- the CDI source -----------------------------------------------------------------------------


def test_the_cdi_source_reads_nvidias_real_spec(tmp_path: Path) -> None:
    shutil.copy(next(FIXTURE.glob("*.yaml")), tmp_path)
    snapshot = CdiSource(str(tmp_path)).collect()
    uid = "56f4dff9-04cd-45a3-b559-d4b201030ca7"
    name = f"k8s.gpu.nvidia.com-claim_{uid}.yaml"
    assert snapshot == CdiSnapshot((PreparedDevice(uid, "gpu-2", DRIVER, name),
                                    PreparedDevice(uid, "gpu-3", DRIVER, name)))


def test_bad_spec_files_cost_one_line_each_and_the_rest_is_read(tmp_path: Path,
                                                                caplog: pytest.LogCaptureFixture) -> None:
    shutil.copy(next(FIXTURE.glob("*.yaml")), tmp_path)
    (tmp_path / "broken.yaml").write_text("kind: [unclosed\n")
    (tmp_path / "nokind.json").write_text('{"devices": []}')
    (tmp_path / "huge.yaml").write_text("x" * 8192)
    os.mkfifo(tmp_path / "fifo.yaml")  # would block an open() for ever
    # A static spec (not per claim) is no error and no prepared device.
    (tmp_path / "nvidia.yaml").write_text("cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: all\n")
    (tmp_path / "notes.txt").write_text("not a spec")
    source = CdiSource(str(tmp_path), max_bytes=4096)
    with caplog.at_level(logging.WARNING, logger="dra_exporter.sources.cdi"):
        first = source.collect()
        second = source.collect()
    assert first == second
    assert [d.device for d in first.devices] == ["gpu-2", "gpu-3"]
    assert first.skipped == 4
    skipped = [r.getMessage() for r in caplog.records]
    assert len(skipped) == 4, skipped  # once per file, not once per cycle
    assert all(m.startswith("cdi: skipping ") and "\n" not in m for m in skipped)


def test_a_missing_cdi_root_is_nothing_prepared_and_too_many_files_are_bounded(tmp_path: Path) -> None:
    assert CdiSource(str(tmp_path / "absent")).collect() == CdiSnapshot()
    for i in range(5):
        (tmp_path / f"k8s.gpu.nvidia.com-claim_{i}.yaml").write_text(
            f"kind: k8s.gpu.nvidia.com/claim\ndevices:\n- name: {LIVE[:-1]}{i}-gpu-{i}\n")
    assert len(CdiSource(str(tmp_path), max_files=3).collect().devices) == 3
