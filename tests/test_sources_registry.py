"""The source registry: each source once, switches derived from it, and the runtime builds what
is enabled and puts each snapshot in its typed place."""

from __future__ import annotations

import dataclasses

import pytest
from simnode import simulated

from dra_exporter import catalog as cat
from dra_exporter.model import ClusterSnapshot, NvmlSnapshot, PodResourcesSnapshot, ProcessOwnersSnapshot
from dra_exporter.sources import Snapshots, registry
from dra_exporter.sources.registry import Role, SourceSpec, without


def test_the_registered_sources_their_roles_and_defaults() -> None:
    specs = {s.name: s for s in registry.sources()}
    assert list(specs) == ["nvml", "podresources", "kubeapi", "procs"]
    assert {n: s.role for n, s in specs.items()} == {
        "nvml": Role.PRIMARY, "podresources": Role.SIDE, "kubeapi": Role.SIDE, "procs": Role.FOLLOWER}
    # The kubelet and the API server keep their last good view through an outage; NVML and /proc do not.
    assert {n for n, s in specs.items() if s.keep_last_good} == {"podresources", "kubeapi"}
    assert registry.default_enabled() == set(specs)
    assert [n for n, s in specs.items() if not s.switchable] == ["nvml"]


def test_a_source_is_registered_once() -> None:
    with pytest.raises(ValueError, match="registered twice"):
        registry.register(dataclasses.replace(registry.PROCS))
    assert [s.name for s in registry.sources()] == ["nvml", "podresources", "kubeapi", "procs"]


def test_switches_apply_to_the_defaults_and_refuse_unknown_sources_and_nvml() -> None:
    assert registry.enabled({}) == registry.default_enabled()
    assert without("kubeapi", "procs") == {"nvml", "podresources"}
    with pytest.raises(ValueError, match="unknown sources: gpus"):
        registry.enabled({"gpus": False})
    with pytest.raises(ValueError, match="nvml source cannot be turned off"):
        without("nvml")


@pytest.mark.parametrize("spec, snapshot, field", [
    (registry.NVML, NvmlSnapshot((), (), "580", "13"), "nvml"),
    (registry.PODRESOURCES, PodResourcesSnapshot(()), "pods"),
    (registry.KUBEAPI, ClusterSnapshot(node="n"), "cluster"),
    (registry.PROCS, ProcessOwnersSnapshot((), ()), "owners"),
])
def test_each_source_places_its_snapshot_in_its_own_field(spec: SourceSpec[object], snapshot: object,
                                                          field: str) -> None:
    placed = spec.place(Snapshots(), snapshot)
    assert {f.name: getattr(placed, f.name) for f in dataclasses.fields(Snapshots)} == {
        f.name: snapshot if f.name == field else None for f in dataclasses.fields(Snapshots)}


@pytest.mark.parametrize("off", [set(), {"kubeapi"}, {"procs"}, {"podresources", "kubeapi", "procs"}])
def test_the_runtime_builds_the_enabled_sources_and_the_frame_reports_those(off: set[str]) -> None:
    with simulated("demo", sources=without(*off)) as rt:
        frame = rt.agent.cycle(collect_side=True)
        built = {r.name for r in rt.agent.runners}
        assert built == {"nvml", "podresources", "kubeapi", "procs"} - off
        up = frame.family(cat.SOURCE_UP.name)
        assert up is not None and {dict(s.labels)["source"] for s in up.samples} == built
        pods = {dict(s.labels)["pod"] for s in frame.family(cat.GPU_UP.name).samples}  # type: ignore[union-attr]
        # Attribution comes from the kubelet or the API server; with neither, no device has a pod.
        assert (pods == {""}) is (off >= {"podresources", "kubeapi"})
