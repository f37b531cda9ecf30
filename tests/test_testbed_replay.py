"""The simulator never serves what a real server refuses.

Every built-in scenario (``demo``, ``scale``, ``gb200-domain``: what the simulated API server serves at
simulated time 60 s; ``cluster``: the built-in cluster of ``cluster --simulate``) and every dump under
tests/dumps/ is replayed into the real kube-apiserver v1.36 (``kubereplay``): each object is created
(spec, then status through the status subresource, as controllers write it) and must be accepted, kept
as sent, and not garbage-collected. The dumps under tests/dumps/invalid/ exist to be refused: each by
the server with its message, and by the simulator's loaders with one line naming the object and field.

The replay's table (``pytest -s`` prints it) is in docs/reliability.md ("The real API server").
"""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import kubereplay
import pytest
from kubetestbed import ControlPlane

from dra_exporter_sim import SimClock, SimulatedApiServer, admission, k8s_objects
from dra_exporter_sim.cluster import builtin_cluster, load_cluster_dump
from dra_exporter_sim.loader import load_scenario
from dra_exporter_sim.scenario_builder import read_documents

DUMPS = Path(__file__).resolve().parent / "dumps"
SCENARIOS = ("demo", "scale", "gb200-domain", "cluster")
VALID_DUMPS = tuple(sorted(p.name for p in DUMPS.glob("*.yaml")))
#: Each refused dump → what the real server (v1.36.2) answers for the object it exists for.
INVALID: dict[str, tuple[str, ...]] = {
    "slice-without-driver-pool-node.yaml": (
        "spec.driver: Required value", "spec.pool.name: Required value",
        "spec.pool.resourceSliceCount: Invalid value: 0: must be greater than zero",
        "exactly one of `nodeName`, `nodeSelector`, `allNodes`, `perDeviceNodeSelection` is required"),
    "pod-without-image.yaml": ("422", "spec.containers[0].image: Required value"),
    "taint-rule-v1-on-1.36.yaml": ("404", "the server could not find the requested resource"),
    "admin-access-unlabelled-namespace.yaml": (
        "422", "spec.devices.requests[0].adminAccess: Forbidden: admin access to devices requires the "
               "`resource.kubernetes.io/admin-access: true` label on the containing namespace"),
    "owner-that-does-not-exist.yaml": ("deleted by the garbage collector", "Pod worker-1"),
    "claim-with-33-devices.yaml": ("422", "status.allocation.devices.results: Too many: 33: must have at most 32"),
}
#: Kinds the simulator serves (what a replay takes from a dump).
SERVED = ("ResourceSlice", "ResourceClaim", "Pod", "DeviceTaintRule", "Node", "DeviceClass", "Namespace",
          *k8s_objects.COMPUTE_DOMAIN_KINDS)


def scenario_objects(name: str, t: float = 60.0) -> list[dict[str, Any]]:
    """What the simulated API server serves for a built-in scenario at ``t``."""
    if name == "cluster":
        return list(builtin_cluster())
    objects = k8s_objects.cluster_objects(load_scenario(name), t)
    return [o for group in objects.by_resource().values() for o in group]


def file_objects(path: Path, kinds: tuple[str, ...] = SERVED) -> list[dict[str, Any]]:
    """Every object of a dump of one of ``kinds``, as the file has it."""
    _, docs = read_documents(path)
    out = []
    for doc in docs:
        if isinstance(doc, Mapping):
            items = doc.get("items") if str(doc.get("kind", "")).endswith("List") else [doc]
            out += [dict(i) for i in items or () if isinstance(i, Mapping) and i.get("kind") in kinds]
    return out


def dump_objects(path: Path) -> list[dict[str, Any]]:
    """What the simulator serves for a dump: the cluster loader's objects (with the defaults a server fills
    in) and the ComputeDomains the node loader serves as they are."""
    return [*load_cluster_dump(path), *file_objects(path, k8s_objects.COMPUTE_DOMAIN_KINDS)]


def sources() -> list[tuple[str, list[dict[str, Any]]]]:
    return ([(name, scenario_objects(name)) for name in SCENARIOS]
            + [(f"dumps/{name}", dump_objects(DUMPS / name)) for name in VALID_DUMPS]
            # The simulator refuses these (test_admission.py): the files themselves are replayed.
            + [(f"dumps/invalid/{name}", file_objects(DUMPS / "invalid" / name)) for name in INVALID])


@pytest.fixture(scope="module")
def replays(kube: ControlPlane) -> Iterator[dict[str, kubereplay.Replay]]:
    """Every source replayed once into the session's control plane; removed again afterwards."""
    done: dict[str, kubereplay.Replay] = {}
    prefixes = []
    try:
        for i, (label, objects) in enumerate(sources()):
            prefixes.append(kube.unique(f"rp{i}"))
            done[label] = kubereplay.replay(kube, label, objects, prefixes[-1])
        print("\n" + kubereplay.table(done.values()))
        yield done
    finally:
        for result in done.values():
            kubereplay.delete(kube, result)
    # Later tests list the whole cluster: nothing cluster-scoped of a replay is left.
    for path in ("/apis/resource.k8s.io/v1/resourceslices", "/apis/resource.k8s.io/v1/deviceclasses",
                 "/api/v1/nodes"):
        left = [i["metadata"]["name"] for i in kube.get(path)["items"] if i["metadata"]["name"].startswith(
            tuple(f"{p}-" for p in prefixes))]
        assert not left, f"{path}: left behind {left}"


@pytest.mark.parametrize("label", [*SCENARIOS, *(f"dumps/{n}" for n in VALID_DUMPS)])
def test_the_real_api_server_accepts_and_keeps_everything_the_simulator_serves(
        replays: dict[str, kubereplay.Replay], label: str) -> None:
    result = replays[label]
    assert result.of("accepted"), f"{label}: nothing replayed"
    assert not result.of("refused"), kubereplay.table([result])
    assert not result.dropped, f"{label}: fields the server did not keep: {result.dropped}"
    # What the server fills in on create (allocationMode, count, a taint's timeAdded) is served already.
    assert not result.defaulted, f"{label}: fields the server filled in: {result.defaulted}"
    # Only CRD-served kinds may be left out, and only while their CRDs are not installed.
    assert {o.kind for o in result.of("skipped")} <= set(k8s_objects.COMPUTE_DOMAIN_KINDS)


def test_only_claims_reserved_for_pods_missing_from_a_dump_are_trimmed(
        replays: dict[str, kubereplay.Replay]) -> None:
    # v1.yaml and v1beta1.yaml keep a claim reserved for a job pod that is not in the dump (the node agent
    # then knows the pod from the claim alone); a real cluster's resourceclaim controller drops such an
    # entry at once, so the replay leaves it out. Nothing of the simulator's own is trimmed.
    trimmed = {label: r.notes for label, r in replays.items() if r.notes}
    assert trimmed == {label: ["ResourceClaim batch/job-1-gpu: status.reservedFor pod job-1 is not in the source "
                               "(not replayed: the resourceclaim controller removes it)"]
                       for label in ("dumps/v1.yaml", "dumps/v1beta1.yaml", "dumps/v1beta2.yaml")}


@pytest.mark.parametrize("name", sorted(INVALID))
def test_the_real_api_server_refuses_each_invalid_dump_with_its_message(
        replays: dict[str, kubereplay.Replay], name: str) -> None:
    result = replays[f"dumps/invalid/{name}"]
    (refused,) = result.of("refused")
    for words in INVALID[name]:
        assert words in refused.reason, refused.reason
    assert not [o for o in result.outcomes if o.status == "skipped"]


def test_every_dump_is_replayed_and_every_invalid_dump_is_known() -> None:
    assert sorted(p.name for p in (DUMPS / "invalid").glob("*.yaml")) == sorted(INVALID)
    assert VALID_DUMPS, "no dumps under tests/dumps/"


# --- what the real server showed that the simulator did not, each now served as the server does -------------


def test_a_namespace_is_stored_as_the_simulator_serves_its_namespaces(kube: ControlPlane) -> None:
    name = kube.unique("plain")
    stored = kube.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    (served,) = k8s_objects.namespace_objects(0, [{"kind": "Pod", "metadata": {"namespace": name}}])
    # The server labels every namespace with its name and gives it its finalizer and phase.
    assert stored["metadata"]["labels"] == served["metadata"]["labels"] == {"kubernetes.io/metadata.name": name}
    assert stored["spec"] == served["spec"] and stored["status"] == served["status"]
    kube.delete(f"/api/v1/namespaces/{name}")


def test_the_defaults_the_server_fills_in_are_those_the_dump_loaders_fill_in(kube: ControlPlane) -> None:
    ns = kube.namespace("defaults")
    node = kube.ready_node()
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c", "namespace": ns},
             "spec": {"devices": {"requests": [
                 {"name": "one", "exactly": {"deviceClassName": "gpu"}},
                 {"name": "all", "exactly": {"deviceClassName": "gpu", "allocationMode": "All"}},
                 {"name": "either", "firstAvailable": [{"name": "a", "deviceClassName": "gpu"}]}]}}}
    pool = kube.unique("pool")
    slice_ = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": pool},
              "spec": {"driver": "gpu.example.com", "nodeName": node,
                       "pool": {"name": pool, "generation": 1, "resourceSliceCount": 1},
                       "devices": [{"name": "gpu-0", "taints": [{"key": "k", "effect": "NoSchedule"}]}]}}
    rule = {"apiVersion": "resource.k8s.io/v1beta2", "kind": "DeviceTaintRule", "metadata": {"name": pool},
            "spec": {"deviceSelector": {"driver": "gpu.example.com", "pool": pool, "device": "gpu-0"},
                     "taint": {"key": "k", "effect": "NoSchedule"}}}
    try:
        for obj in (claim, slice_, rule):
            stored = kube.create(obj)
            # The loaders put the object's creation time where the server puts its clock's.
            created = stored["metadata"]["creationTimestamp"]
            expected = admission.defaulted({**obj, "metadata": {**obj["metadata"], "creationTimestamp": created}})
            assert stored["spec"] == expected["spec"], obj["kind"]
    finally:
        for path in (f"/apis/resource.k8s.io/v1beta2/devicetaintrules/{pool}",
                     f"/apis/resource.k8s.io/v1/resourceslices/{pool}", f"/api/v1/nodes/{node}"):
            kube.delete(path)


def test_a_create_drops_the_status_the_replay_writes_through_the_status_subresource(kube: ControlPlane) -> None:
    ns = kube.namespace("status")
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c", "namespace": ns},
             "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "gpu"}}]}},
             "status": {"allocation": {"devices": {"results": [
                 {"request": "r", "driver": "gpu.example.com", "pool": "p", "device": "gpu-0"}]}}}}
    assert kube.create(claim)["status"] == {}
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "namespace": ns},
           "spec": {"containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}]},
           "status": {"phase": "Running"}}
    assert kube.create(pod)["status"]["phase"] == "Pending"
    kube.delete(f"/api/v1/namespaces/{ns}/pods/p?gracePeriodSeconds=0")


def list_version(get: Any, path: str) -> int:
    return int(get(path)["metadata"]["resourceVersion"])


def test_a_lists_resource_version_moves_with_any_kinds_change_on_both_servers(kube: ControlPlane) -> None:
    # One etcd revision for every kind: a new claim moves the slices' list resourceVersion too. The
    # simulated server keeps one counter for all kinds, so a client resuming a watch from a list of one
    # kind sees the same thing on both.
    slices = "/apis/resource.k8s.io/v1/resourceslices"
    before = list_version(kube.get, slices)
    ns = kube.namespace("rv")
    kube.create({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                 "metadata": {"name": "c", "namespace": ns},
                 "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "gpu"}}]}}})
    assert list_version(kube.get, slices) > before

    clock = SimClock(0.0, frozen=True)
    with SimulatedApiServer(load_scenario("scale"), clock) as server:
        def get(path: str) -> Any:
            with urllib.request.urlopen(server.url + path, timeout=10) as resp:
                return json.loads(resp.read())

        before = list_version(get, slices)
        clock.set(400.0)  # batch jobs have ended and started: pods and generated claims changed, no slice
        assert list_version(get, slices) > before
