"""The source registry: each source once, switches derived from it, and the runtime builds what
is enabled and puts each snapshot in its typed place."""

from __future__ import annotations

import dataclasses

import pytest
from simnode import simulated, values_of

from dra_exporter import catalog as cat
from dra_exporter.model import (
    CdiSnapshot,
    ClusterSnapshot,
    DeviceSample,
    DeviceSnapshot,
    GpuDevice,
    PodResourcesSnapshot,
    ProcessOwnersSnapshot,
    Reading,
)
from dra_exporter.sinks import otlp_mapping
from dra_exporter.sources import Snapshots, registry
from dra_exporter.sources.registry import Role, SourceSpec, without


def test_the_registered_sources_their_roles_and_defaults() -> None:
    specs = {s.name: s for s in registry.sources()}
    # cdi before kubeapi: the API server's claim census asks about the claim UIDs of the CDI specs.
    assert list(specs) == ["nvml", "cdi", "podresources", "kubeapi", "procs"]
    assert {n: s.role for n, s in specs.items()} == {
        "nvml": Role.PRIMARY, "cdi": Role.SIDE, "podresources": Role.SIDE, "kubeapi": Role.SIDE,
        "procs": Role.FOLLOWER}
    # The kubelet and the API server keep their last good view through an outage; NVML and /proc do not.
    assert {n for n, s in specs.items() if s.keep_last_good} == {"podresources", "kubeapi"}
    assert registry.default_enabled() == set(specs)
    assert [n for n, s in specs.items() if not s.switchable] == ["nvml"]


def test_a_source_is_registered_once() -> None:
    with pytest.raises(ValueError, match="registered twice"):
        registry.register(dataclasses.replace(registry.PROCS))
    assert [s.name for s in registry.sources()] == ["nvml", "cdi", "podresources", "kubeapi", "procs"]


def test_switches_apply_to_the_defaults_and_refuse_unknown_sources_and_nvml() -> None:
    assert registry.enabled({}) == registry.default_enabled()
    assert without("kubeapi", "procs") == {"nvml", "cdi", "podresources"}
    with pytest.raises(ValueError, match="unknown sources: gpus"):
        registry.enabled({"gpus": False})
    with pytest.raises(ValueError, match="nvml source cannot be turned off"):
        without("nvml")


NVML_SNAPSHOT = DeviceSnapshot((), (), "580", "13", "NVIDIA")


@pytest.mark.parametrize("spec, snapshot, field, placed", [
    (registry.NVML, NVML_SNAPSHOT, "devices", (NVML_SNAPSHOT,)),
    (registry.PODRESOURCES, PodResourcesSnapshot(()), "pods", None),
    (registry.KUBEAPI, ClusterSnapshot(node="n"), "cluster", None),
    (registry.PROCS, ProcessOwnersSnapshot((), ()), "owners", None),
    (registry.CDI, CdiSnapshot(), "cdi", None),
])
def test_each_source_places_its_snapshot_in_its_own_field(spec: SourceSpec[object], snapshot: object,
                                                          field: str, placed: object) -> None:
    # A device source's snapshot joins the other device sources' (``devices``); the others have a field each.
    assert spec.place(Snapshots(), snapshot) == dataclasses.replace(Snapshots(), **{field: placed or snapshot})


@pytest.mark.parametrize("off", [set(), {"kubeapi"}, {"procs"}, {"podresources", "kubeapi", "procs"}])
def test_the_runtime_builds_the_enabled_sources_and_the_frame_reports_those(off: set[str]) -> None:
    with simulated("demo", sources=without(*off)) as rt:
        frame = rt.agent.cycle(collect_side=True)
        built = {r.name for r in rt.agent.runners}
        assert built == {"nvml", "cdi", "podresources", "kubeapi", "procs"} - off
        up = frame.family(cat.SOURCE_UP.name)
        assert up is not None and {dict(s.labels)["source"] for s in up.samples} == built
        pods = {dict(s.labels)["pod"] for s in frame.family(cat.GPU_UP.name).samples}  # type: ignore[union-attr]
        # Attribution comes from the kubelet or the API server; with neither, no device has a pod.
        assert (pods == {""}) is (off >= {"podresources", "kubeapi"})


class AcmeSource:
    """A second device source, as another vendor's would be written: its devices and its vendor."""

    name = "acme"
    device = GpuDevice(uuid="ACME-0001", index=0, minor=0, model="Acme A1", pci_bus_id="0000:c1:00.0")

    def collect(self) -> DeviceSnapshot:
        readings = (Reading(cat.GPU_UTILIZATION.name, 0.25),)
        return DeviceSnapshot((DeviceSample(self.device, True, readings),), vendor="Acme")

    def close(self) -> None:
        pass


def test_a_second_device_source_is_one_register_call_and_its_devices_carry_its_vendor(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The registry's promise: a new source is one register call (and its module). The registration
    # ends with this test.
    monkeypatch.setattr(registry.NODE, "_specs", dict(registry.NODE._specs))
    registry.register(registry.device_source("acme", lambda ctx: AcmeSource(), help="Acme's accelerators."))

    with simulated("demo") as rt:
        frame = rt.agent.cycle(collect_side=True)
    up = values_of(frame, cat.SOURCE_UP.name, key="source")
    assert up["acme"] == 1.0 and up["nvml"] == 1.0
    utilization = values_of(frame, cat.GPU_UTILIZATION.name)
    assert utilization["ACME-0001"] == 0.25
    nvidia = {uuid for uuid in utilization if uuid != "ACME-0001"}
    assert nvidia, "the NVML devices are still there beside it"

    # OTLP names each device's vendor as its own source says it.
    inst = next(i for i in otlp_mapping.instruments() if i.name == "hw.gpu.utilization")
    vendors = {dict(attrs)["hw.id"]: (dict(attrs)["hw.vendor"], dict(attrs).get("hw.model"))
               for attrs, _ in otlp_mapping.observations(frame, inst)}
    assert vendors["ACME-0001"] == ("Acme", "Acme A1")
    assert {vendors[uuid][0] for uuid in nvidia} == {"NVIDIA"}

