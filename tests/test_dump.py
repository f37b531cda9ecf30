"""Cluster dumps (``kubectl get resourceslices,resourceclaims,pods -A -o yaml``) as scenarios."""

from __future__ import annotations

import copy
import resource
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from simnode import values_of

from dra_exporter import catalog as cat
from dra_exporter import model, runtime
from dra_exporter.config import Settings
from dra_exporter.dra_versions import convert
from dra_exporter.sources.kubeapi_normalize import noting_wrong_types, pod_from_dict
from dra_exporter_sim import k8s_objects as ko
from dra_exporter_sim import load_scenario
from dra_exporter_sim.dump import is_dump, parse_dump
from dra_exporter_sim.scenario import Scenario, ScenarioError
from dra_exporter_sim.scenario_builder import parse_scenario

DUMPS = Path(__file__).resolve().parent / "dumps"
VERSIONS = ["v1", "v1beta2", "v1beta1"]
NODE = "gpu-node-a"
GPU = "GPU-aaaaaaaa-0000-4000-8000-00000000000"
MIG = "MIG-bbbbbbbb-0000-4000-8000-0000000000"


def load(version: str, node: str | None = NODE) -> Scenario:
    return load_scenario(DUMPS / f"{version}.yaml", node)


def kubelet_view(s: Scenario) -> dict[tuple[str, str, str], set[tuple[str, str, str]]]:
    """(namespace, pod, container) → {(claim, driver, device)} as the kubelet lists it."""
    return {
        (p.namespace, p.name, c.name): {(u.name, d.driver, d.device) for u in c.claims for d in u.devices}
        for p in s.pod_allocations_at(0).pods
        for c in p.containers
    }


def items(version: str) -> list[dict[str, Any]]:
    text = (DUMPS / f"{version}.yaml").read_text()
    docs = [d for d in yaml.safe_load_all(text) if d]
    return [i for d in docs for i in (d["items"] if d.get("kind") == "List" else [d])]


def dump_of(objects: list[dict[str, Any]]) -> list[Any]:
    return [{"apiVersion": "v1", "kind": "List", "items": objects}]


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)


# --- the three fixtures ----------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_gpus_and_mig_devices_come_from_the_nodes_nvidia_slice(version: str) -> None:
    s = load(version)
    assert s.node_name == NODE and s.api_version == version
    assert [(g.index, g.uuid) for g in s.gpus] == [(0, GPU + "0"), (1, GPU + "1"), (2, GPU + "2")]
    assert not s.gpus[0].mig and not s.gpus[1].mig
    assert [(m.profile, m.placement_start, m.uuid) for m in s.gpus[2].mig] == [
        ("3g.71gb", 0, MIG + "20"),
        ("1g.18gb", 4, MIG + "24"),
    ]
    assert all(not p.containers[0].processes for p in s.pods)  # idle GPUs
    assert len(s.raw_objects) == 20  # 19 DRA objects and pods, and the labelled monitoring Namespace


@pytest.mark.parametrize("version", VERSIONS)
def test_claims_on_the_node_and_their_requests(version: str) -> None:
    s = load(version)
    claims = {(c.namespace, c.name): c for c in s.claims}
    assert set(claims) == {
        ("research", "shared-gpu"),
        ("ml", "train"),
        ("inference", "vllm-0-gpu-x7k2p"),
        ("monitoring", "exporter-gpus"),
        ("batch", "job-1-gpu"),
        ("demo", "example-claim"),
    }
    assert claims[("monitoring", "exporter-gpus")].admin_access
    assert not claims[("research", "shared-gpu")].admin_access
    assert claims[("research", "shared-gpu")].uid == "11111111-0000-4000-8000-000000000001"
    (prio,) = claims[("inference", "vllm-0-gpu-x7k2p")].all_requests()
    assert prio.result_name == "gpu/mig-3g"
    assert [x.name for x in prio.first_available] == ["h200", "mig-3g"]
    assert claims[("ml", "train")].request == "gpus"
    example = claims[("demo", "example-claim")]
    assert (example.driver, example.pool, example.devices) == ("gpu.example.com", NODE, ("gpu-0",))
    (status,) = claims[("ml", "train")].device_status
    assert (status.device, status.conditions[0].condition.type, status.conditions[0].condition.status) == (
        "gpu-1",
        "Ready",
        "True",
    )


@pytest.mark.parametrize("version", VERSIONS)
def test_kubelet_view_of_the_dumped_node(version: str) -> None:
    s = load(version)
    mig3g = "gpu-2-mig-3g71gb-9-0" if version != "v1beta1" else "gpu-2-mig-9-0-4"
    nv = "gpu.nvidia.com"
    assert kubelet_view(s) == {
        ("research", "notebook-alice", "notebook"): {("shared-gpu", nv, "gpu-0")},
        ("research", "notebook-bob", "notebook"): {("shared-gpu", nv, "gpu-0")},
        ("research", "notebook-bob", "sidecar"): set(),
        ("ml", "trainer-0", "trainer"): {("train", nv, "gpu-1")},
        # Generated claim: found through status.resourceClaimStatuses.
        ("inference", "vllm-0", "vllm"): {("vllm-0-gpu-x7k2p", nv, mig3g)},
        ("monitoring", "dra-exporter-q8x2m", "exporter"): {
            ("exporter-gpus", nv, d) for d in ("gpu-0", "gpu-1", mig3g, "gpu-2-mig-19-4-1")
        },
        ("demo", "example-0", "app"): {("example-claim", "gpu.example.com", "gpu-0")},
        # Not in the dump: known from the claim's reservedFor.
        ("batch", "job-1", "unknown"): {("job-1-gpu", nv, "gpu-2-mig-19-4-1")},
    }
    pods = {p.name: p for p in s.pods}
    assert pods["job-1"].uid == "22222222-0000-4000-8000-000000000006"
    assert pods["notebook-alice"].containers[0].container_id.endswith("0001")
    assert pods["notebook-alice"].containers[0].device_health == (("gpu-0", "Unhealthy"),)
    assert pods["trainer-0"].containers[0].claim_requests == (("train", "gpus"),)
    shared = s.claim("research", "shared-gpu")
    assert shared is not None
    assert {p.name for p in s.consumers_at(shared, 0)} == {"notebook-alice", "notebook-bob"}
    # Finished pods and pods of other nodes are not the kubelet's.
    assert not {"finished-0", "other-node-pod"} & set(pods)


@pytest.mark.parametrize("version", VERSIONS)
def test_every_nvidia_device_resolves_to_an_nvml_uuid(version: str) -> None:
    s = load(version)
    for claim in s.claims:
        if claim.driver == "gpu.nvidia.com":
            assert all(s.nvml_uuid(d) for d in claim.devices), claim.name


def test_the_other_node_of_the_dump() -> None:
    s = load("v1", "gpu-node-b")
    assert [g.uuid for g in s.gpus] == ["GPU-cccccccc-0000-4000-8000-000000000000"]
    assert [c.name for c in s.claims] == ["elsewhere"]
    assert kubelet_view(s) == {("ml", "other-node-pod", "main"): {("elsewhere", "gpu.nvidia.com", "gpu-0")}}


def test_node_must_be_named_when_the_dump_has_several() -> None:
    with pytest.raises(ScenarioError, match=r"several nodes \(gpu-node-a, gpu-node-b\); name one"):
        load("v1", None)
    with pytest.raises(
        ScenarioError,
        match="no ResourceSlice with spec.nodeName 'gpu-node-z' "
        r"\(nodes with one: gpu-node-a, gpu-node-b\)",
    ):
        load("v1", "gpu-node-z")
    one_node = [o for o in items("v1") if o["spec"].get("nodeName") != "gpu-node-b"]
    assert parse_dump(dump_of(one_node), "d.yaml").node_name == NODE


def test_a_dump_is_told_from_a_scenario() -> None:
    assert is_dump(items("v1")) and not is_dump([{"node": "n", "gpus": []}])


# --- partial dumps --------------------------------------------------------------------------------


def test_slices_only_give_idle_gpus() -> None:
    slices = [o for o in items("v1") if o["kind"] == "ResourceSlice"]
    s = parse_dump(dump_of(slices), "slices.yaml", NODE)
    assert len(s.gpus) == 3 and s.claims == () and s.pods == ()
    assert s.pod_allocations_at(0) == model.PodResourcesSnapshot()


def test_claims_without_pods_take_their_consumers_from_reserved_for() -> None:
    no_pods = [o for o in items("v1beta1") if o["kind"] != "Pod"]
    s = parse_dump(dump_of(no_pods), "nopods.yaml", NODE)
    view = kubelet_view(s)
    assert view[("research", "notebook-alice", "unknown")] == {("shared-gpu", "gpu.nvidia.com", "gpu-0")}
    assert view[("research", "notebook-bob", "unknown")] == {("shared-gpu", "gpu.nvidia.com", "gpu-0")}
    assert {p.uid for p in s.pods if p.name == "notebook-bob"} == {"22222222-0000-4000-8000-000000000002"}


def test_null_fields_and_other_kinds_are_tolerated() -> None:
    objects = items("v1")
    find(objects, "ResourceClaim", "train")["status"]["devices"] = None
    find(objects, "ResourceClaim", "shared-gpu")["spec"] = None
    find(objects, "ResourceClaim", "job-1-gpu")["status"]["reservedFor"] = None
    find(objects, "Pod", "notebook-bob")["status"] = None
    find(objects, "Pod", "trainer-0")["spec"]["containers"][0]["resources"] = None
    find(objects, "ResourceSlice", "gpu-node-a-gpu.example.com-p9w2d")["spec"]["devices"][0]["attributes"] = (
        None
    )
    objects.append(
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu.nvidia.com"}}
    )
    s = parse_dump(dump_of(objects), "nulls.yaml", NODE)
    view = kubelet_view(s)
    assert view[("research", "notebook-bob", "notebook")] == {("shared-gpu", "gpu.nvidia.com", "gpu-0")}
    assert view[("ml", "trainer-0", "trainer")] == set()
    assert ("batch", "job-1", "unknown") not in view
    assert s.claim("ml", "train").device_status == ()  # type: ignore[union-attr]


def test_multi_document_yaml_with_unquoted_timestamps(tmp_path: Path) -> None:
    path = tmp_path / "dump.yaml"
    path.write_text((DUMPS / "v1beta1.yaml").read_text())
    s = load_scenario(path, NODE)
    slice_ = next(o for o in s.raw_objects if o["kind"] == "ResourceSlice")
    assert slice_["metadata"]["creationTimestamp"] == "2026-03-02T09:15:00Z"  # back to a string


def test_unpublished_minors_become_plain_gpus() -> None:
    objects = items("v1")
    nvidia = find(objects, "ResourceSlice", "gpu-node-a-gpu.nvidia.com-7xkqz")
    nvidia["spec"]["devices"] = [d for d in nvidia["spec"]["devices"] if d["name"] != "gpu-1"]
    for claim in (o for o in objects if o["kind"] == "ResourceClaim"):
        results = ((claim.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results", [])
        results[:] = [r for r in results if r["device"] != "gpu-1"]
    s = parse_dump(dump_of(objects), "gap.yaml", NODE)
    assert [g.index for g in s.gpus] == [0, 1, 2]
    assert s.gpus[1].uuid.startswith("GPU-") and s.gpus[1].uuid != GPU + "1"


# --- DynamicMIG: abstract MIG devices exist once allocated ----------------------------------------


def test_dynamic_mig_dump_round_trips_through_the_api_objects() -> None:
    scenario = parse_scenario(
        {
            "node": "n1",
            "seed": 9,
            "api_version": "v1",
            "dynamic_mig": True,
            "gpus": [{"index": 0}, {"index": 1, "mig": [{"profile": "2g.35gb", "placement_start": 2}]}],
            "claims": [{"namespace": "ml", "name": "c", "devices": ["gpu-1-mig-2g35gb-14-2"]}],
            "pods": [{"namespace": "ml", "name": "p", "containers": [{"name": "m", "claims": ["c"]}]}],
        }
    )
    objects = ko.cluster_objects(scenario, 0)
    dumped = parse_dump(
        dump_of([*objects.resourceslices, *objects.resourceclaims, *objects.pods]), "dyn.yaml"
    )
    assert [(g.uuid, [(m.profile, m.placement_start) for m in g.mig]) for g in dumped.gpus] == [
        (scenario.gpus[0].uuid, []),
        (scenario.gpus[1].uuid, [("2g.35gb", 2)]),
    ]
    assert dumped.pod_allocations_at(0) == scenario.pod_allocations_at(0)


def test_demo_round_trips_through_the_api_objects() -> None:
    # The demo as the API server shows it, dumped and loaded back: the same node for the kubelet, but
    # for the MIG device made by hand, which no slice publishes (so no dump can know it).
    demo = load_scenario("demo")
    objects = ko.cluster_objects(demo, 50)
    unpublished = {m.uuid for g in demo.gpus for m in g.mig if not m.published}
    for version in VERSIONS:
        converted = [convert(o, version) for o in (*objects.resourceslices, *objects.resourceclaims)]
        dumped = parse_dump(dump_of([*converted, *objects.pods]), f"demo-{version}.yaml")
        assert dumped.gpu_devices() == tuple(d for d in demo.gpu_devices() if d.uuid not in unpublished)
        assert sorted(dumped.pod_allocations_at(0).pods, key=lambda p: p.name) == sorted(
            demo.pod_allocations_at(50).pods, key=lambda p: p.name
        )


# --- unusable dumps: one clear line naming the object and the field ------------------------------


def broken(change: Any, version: str = "v1") -> str:
    objects = copy.deepcopy(items(version))
    change(objects)
    with pytest.raises(ScenarioError) as err:
        parse_dump(dump_of(objects), "bad.yaml", NODE)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_gpu_device_without_uuid() -> None:
    def change(o: list[dict[str, Any]]) -> None:
        del find(o, "ResourceSlice", "gpu-node-a-gpu.nvidia.com-7xkqz")["spec"]["devices"][1]["attributes"][
            "uuid"
        ]

    assert broken(change) == (
        "bad.yaml: ResourceSlice/gpu-node-a-gpu.nvidia.com-7xkqz: "
        "spec.devices[name=gpu-1].attributes.uuid: required for the gpu device 'gpu-1'"
    )


def test_v1beta1_paths_name_basic() -> None:
    def change(o: list[dict[str, Any]]) -> None:
        device = find(o, "ResourceSlice", "gpu-node-a-gpu.nvidia.com-7xkqz")["spec"]["devices"][3]
        del device["basic"]["attributes"]["parentUUID"]

    assert broken(change, "v1beta1") == (
        "bad.yaml: ResourceSlice/gpu-node-a-gpu.nvidia.com-7xkqz: "
        "spec.devices[name=gpu-2-mig-19-4-1].basic.attributes.parentUUID: "
        "required for the MIG device 'gpu-2-mig-19-4-1'"
    )


def test_unsupported_api_version() -> None:
    def change(o: list[dict[str, Any]]) -> None:
        find(o, "ResourceClaim", "train")["apiVersion"] = "resource.k8s.io/v1alpha3"

    assert broken(change) == (
        "bad.yaml: ResourceClaim/ml/train: apiVersion: 'resource.k8s.io/v1alpha3' is not "
        "supported (supported: resource.k8s.io/v1, resource.k8s.io/v1beta2, "
        "resource.k8s.io/v1beta1)"
    )


def test_allocated_device_that_the_node_does_not_have() -> None:
    def change(o: list[dict[str, Any]]) -> None:
        find(o, "ResourceClaim", "train")["status"]["allocation"]["devices"]["results"][0]["device"] = "gpu-9"

    assert broken(change) == (
        "bad.yaml: ResourceClaim/ml/train: status.allocation.devices.results[device=gpu-9].device: "
        "'gpu-9' is not a device of the gpu.nvidia.com slices of node gpu-node-a"
    )


def test_device_allocated_to_two_claims() -> None:
    def change(o: list[dict[str, Any]]) -> None:
        find(o, "ResourceClaim", "train")["status"]["allocation"]["devices"]["results"][0]["device"] = "gpu-0"

    message = broken(change)
    assert "ResourceClaim/" in message and "'gpu-0' is also allocated to claim" in message


def test_mig_profile_the_simulated_h200_lacks() -> None:
    def change(o: list[dict[str, Any]]) -> None:
        device = find(o, "ResourceSlice", "gpu-node-a-gpu.nvidia.com-7xkqz")["spec"]["devices"][3]
        device["attributes"]["profile"] = {"string": "1g.10gb"}

    message = broken(change)
    assert message.startswith(
        "bad.yaml: ResourceSlice/gpu-node-a-gpu.nvidia.com-7xkqz: "
        "spec.devices[name=gpu-2-mig-19-4-1].attributes.profile: '1g.10gb' is not a MIG profile"
    )


def test_mig_name_and_profile_disagree() -> None:
    def change(o: list[dict[str, Any]]) -> None:
        device = find(o, "ResourceSlice", "gpu-node-a-gpu.nvidia.com-7xkqz")["spec"]["devices"][2]
        device["attributes"]["profile"] = {"string": "4g.71gb"}

    assert broken(change).endswith(
        "spec.devices[name=gpu-2-mig-3g71gb-9-0].name: 'gpu-2-mig-3g71gb-9-0' does not name profile '4g.71gb'"
    )


def test_two_uuids_for_one_gpu() -> None:
    def change(o: list[dict[str, Any]]) -> None:
        device = find(o, "ResourceSlice", "gpu-node-a-gpu.nvidia.com-7xkqz")["spec"]["devices"][3]
        device["attributes"]["parentUUID"] = {"string": GPU + "9"}

    # Devices are read in the slice's order (as the exporter and the scheduler read a slice): the
    # device with the other parent comes second and names the conflict.
    message = broken(change)
    assert "gpu-2-mig-19-4-1].attributes.parentUUID: GPU minor 2 is " + GPU + "2 in ResourceSlice" in message
    assert message.endswith("not " + GPU + "9")


def test_a_result_without_a_device_is_dropped_as_the_exporter_drops_it() -> None:
    objects = items("v1")
    find(objects, "ResourceClaim", "train")["status"]["allocation"]["devices"]["results"][0]["device"] = None
    scenario = parse_dump(dump_of(objects), "dump.yaml", NODE)
    # train's only result is gone: the claim is not allocated on the node; the others stay.
    assert {c.name for c in scenario.claims} == {c.name for c in load("v1").claims} - {"train"}


def test_a_result_without_a_request_is_named() -> None:
    def change(o: list[dict[str, Any]]) -> None:
        del find(o, "ResourceClaim", "train")["status"]["allocation"]["devices"]["results"][0]["request"]

    assert broken(change) == (
        "bad.yaml: ResourceClaim/ml/train: status.allocation.devices.results[device=gpu-1].request: required"
    )


def test_not_kubernetes_objects() -> None:
    with pytest.raises(ScenarioError, match=r"bad.yaml: items\[0\]: expected a Kubernetes object"):
        parse_dump([{"apiVersion": "v1", "kind": "List", "items": ["x"]}], "bad.yaml", NODE)
    with pytest.raises(ScenarioError, match="no ResourceSlice with a spec.nodeName"):
        parse_dump([{"apiVersion": "v1", "kind": "List", "items": []}], "bad.yaml")
    with pytest.raises(ScenarioError, match=r"document 2: expected a Kubernetes object"):
        parse_dump([items("v1")[0], "text"], "bad.yaml", NODE)


def test_several_documents_that_are_not_a_dump(tmp_path: Path) -> None:
    path = tmp_path / "two.yaml"
    path.write_text("node: a\ngpus: [{index: 0}]\n---\nnode: b\ngpus: [{index: 0}]\n")
    with pytest.raises(ScenarioError, match="2 YAML documents; a scenario is one document"):
        load_scenario(path)


# --- hostile dumps via the CLI: exit 2, one line, bounded time and memory -----------------------

#: Address-space cap for the CLI under test: an expanded alias bomb (1.4 GB) cannot fit, the exporter
#: itself (~200 MB) does.
_CLI_MEMORY_LIMIT = 1 << 30


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (_CLI_MEMORY_LIMIT, _CLI_MEMORY_LIMIT))


def run_snapshot(path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dra_exporter.cli", "snapshot", "--simulate", str(path), *extra],
        capture_output=True, text=True, timeout=120, check=False, preexec_fn=_limit_memory,
    )


def one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("dra-exporter: error: "), line
    return line


def _config_map_alias_bomb() -> str:
    # 449 bytes: nine levels of nine aliases inside a ConfigMap of a kind: List. Its kind is only
    # known once the item is read, and reading a dump copies each item: 1.4 GB if anything expands it.
    lines = ["apiVersion: v1", "kind: List", "items:", "- apiVersion: v1", "  kind: ConfigMap",
             "  metadata: {name: bomb}", "  data:", "    a: &a [x, x, x, x, x, x, x, x, x]"]
    lines += [f"    {chr(98 + i)}: &{chr(98 + i)} [" + ", ".join([f"*{chr(97 + i)}"] * 9) + "]" for i in range(8)]
    return "\n".join(lines) + "\n"


def test_alias_bomb_in_a_dump_is_refused_without_expanding(tmp_path: Path) -> None:
    path = tmp_path / "dump.yaml"
    path.write_text(_config_map_alias_bomb())
    line = one_line_error(run_snapshot(path))
    assert str(path) in line and "alias" in line


def test_recursive_alias_in_a_dump_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "dump.yaml"
    path.write_text("apiVersion: v1\nkind: List\nitems:\n"
                    "- &a {apiVersion: v1, kind: ConfigMap, metadata: {name: x}, data: [*a]}\n")
    line = one_line_error(run_snapshot(path))
    assert "recursive alias" in line and "line 4" in line


def test_anchors_that_repeat_a_little_still_load(tmp_path: Path) -> None:
    # kubectl never writes aliases, but a hand-edited dump may share a value; that is fine.
    objects = items("v1")
    text = yaml.safe_dump(dump_of(objects)[0])
    text = text.replace("productName:\n", "productName: &product\n", 1)
    assert "&product" in text
    path = tmp_path / "dump.yaml"
    path.write_text(text)
    assert load_scenario(path, NODE).gpus == load("v1").gpus


def _set(objects: list[dict[str, Any]], kind: str, name: str, path: tuple[str | int, ...], value: Any) -> None:
    target: Any = find(objects, kind, name)
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value


@pytest.mark.parametrize("kind, name, path, field", [
    ("Pod", "notebook-alice", ("status", "containerStatuses", 0, "name"), "name"),
    ("Pod", "vllm-0", ("status", "resourceClaimStatuses", 0, "resourceClaimName"), "resourceClaimName"),
    ("Pod", "notebook-alice", ("status", "containerStatuses", 0, "allocatedResourcesStatus", 0, "resources", 0,
                               "resourceID"), "resourceID"),
    ("ResourceClaim", "train", ("status", "devices", 0, "device"), "device"),
], ids=["container-status-name", "generated-claim-name", "health-resource-id", "device-status-device"])
def test_wrong_types_where_the_dump_reader_builds_sets_exit_2_naming_the_object_and_field(
        tmp_path: Path, kind: str, name: str, path: tuple[str | int, ...], field: str) -> None:
    # A mapping where a string belongs. These fields were `TypeError: unhashable` tracebacks; the
    # exporter's reader takes such a field as absent (an API server validated it), but a dump is a
    # file a person gave: it is refused with one line naming the object and the field.
    objects = items("v1")
    _set(objects, kind, name, path, {})
    dump = tmp_path / "dump.yaml"
    dump.write_text(yaml.safe_dump(dump_of(objects)[0]))
    result = run_snapshot(dump, "--node-name", NODE)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert f"{kind}/" in line and f"/{name}: {field}: a mapping, not a string" in line, line


def test_the_api_servers_answer_with_a_wrong_type_reads_the_field_as_absent() -> None:
    # The same reader, outside noting_wrong_types: one odd field never costs the node its view.
    pod = find(items("v1"), "Pod", "notebook-alice")
    pod["status"]["containerStatuses"][0]["name"] = {}
    info = pod_from_dict(pod)
    assert info.name == "notebook-alice"
    assert {c.name for c in info.containers} == {c["name"] for c in pod["spec"]["containers"]}
    with noting_wrong_types() as wrong:
        assert pod_from_dict(pod) == info
    assert wrong == ["name: a mapping, not a string"]


def _paths(value: Any, path: tuple[str | int, ...] = ()) -> Iterator[tuple[str | int, ...]]:
    yield path
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in children:
        yield from _paths(child, (*path, key))


def test_any_field_of_a_dump_with_a_wrong_type_loads_or_is_a_scenario_error() -> None:
    # Every field of the v1 fixture in turn replaced by a mapping or a list of one: the reader
    # either ignores it or names it, never a TypeError (or any other exception) from inside.
    base = dump_of(items("v1"))[0]
    tried = 0
    for path in list(_paths(base))[1:]:
        for value in ({}, [1]):
            doc = copy.deepcopy(base)
            target: Any = doc
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = value
            try:
                parse_dump([doc], "fuzz.yaml", NODE)
            except ScenarioError as e:
                assert "\n" not in str(e)
            tried += 1
    assert tried > 1000


# --- a dump replays as the node it came from: its GPUs, other drivers, no NVIDIA at all ----------


def replay(dump: str, node: str, naming: str = "native") -> model.Frame:
    """One snapshot of a dumped node, as `snapshot --simulate <dump> --node-name <node>` takes it."""
    settings = Settings(simulate=str(DUMPS / dump), node_name=node, naming=naming)
    return runtime.snapshot(settings, renamed=naming != "native")


def series(frame: model.Frame, name: str) -> list[dict[str, str]]:
    family = frame.family(name)
    return [dict(s.labels) for s in family.samples] if family else []


def test_an_a100_dump_replays_as_an_a100_not_an_h200() -> None:
    s = load_scenario(DUMPS / "a100.yaml", "a100-node")
    p = s.profile
    assert (p.model, p.memory_total, p.driver_version) == ("NVIDIA A100-SXM4-40GB", 40 << 30, "550.54.15")
    assert p.nvml_version == "12.550.54.15" and not p.gpm_supported  # Ampere: no GPM
    assert [m.name for m in p.mig_profiles] == [
        "1g.5gb", "1g.5gb+me", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"]
    assert [g.pci_bus_id for g in s.gpus] == ["00000000:07:00.0", "00000000:0F:00.0"]
    assert [(m.profile, m.placement_start, m.memory_total) for m in s.gpus[1].mig] == [
        ("3g.20gb", 0, 20 << 30), ("1g.5gb", 6, 5 << 30)]
    frame = replay("a100.yaml", "a100-node")
    info = {d["uuid"]: d for d in series(frame, cat.GPU_INFO.name)}
    assert {d["model"] for d in info.values()} == {"NVIDIA A100-SXM4-40GB"}
    assert info["GPU-a1000000-0000-4000-8000-000000000000"]["pci_bus_id"] == "00000000:07:00.0"
    assert {d["driver_version"] for d in info.values()} == {"550.54.15"}
    assert not series(frame, cat.GPU_SM_ACTIVE.name)  # no GPM series on an A100
    claimed = {d["uuid"]: d["claim"] for d in series(frame, cat.GPU_MEMORY_TOTAL.name)}
    assert claimed["MIG-a1000000-0000-4000-8000-000000000110"] == "notebook-mig"


def test_an_h200_dump_keeps_gpm_and_its_slices_identity() -> None:
    frame = replay("v1.yaml", NODE)
    assert series(frame, cat.GPU_SM_ACTIVE.name)  # Hopper has GPM
    info = {d["gpu"]: d for d in series(frame, cat.GPU_INFO.name) if not d["parent_uuid"]}
    assert info["1"]["pci_bus_id"] == "00000000:2A:00.0" and info["1"]["model"] == "NVIDIA H200"
    assert info["1"]["driver_version"] == "580.159.04"  # the slice's semver 580.159.4, as NVML writes it


def test_dcgm_naming_on_a_replayed_node_carries_that_nodes_identity() -> None:
    frame = replay("a100.yaml", "a100-node", naming="dcgm")
    util = [d for d in series(frame, "DCGM_FI_DEV_FB_USED") if d["gpu"] == "0"]
    assert util, [f.name for f in frame.families]
    assert {(d["modelName"], d["pci_bus_id"], d["DCGM_FI_DRIVER_VERSION"]) for d in util} == {
        ("NVIDIA A100-SXM4-40GB", "00000000:07:00.0", "550.54.15")}


def test_a_dump_of_the_example_driver_replays_with_nvml_absent() -> None:
    s = load_scenario(DUMPS / "example-driver.yaml", "example-node")
    assert s.gpus == () and [f.kind for f in s.faults] == ["init_failure"]
    frame = replay("example-driver.yaml", "example-node")
    assert values_of(frame, cat.SOURCE_UP.name, "source")["nvml"] == 0  # as on a node without NVIDIA's driver
    assert values_of(frame, cat.SOURCE_UP.name, "source")["kubeapi"] == 1
    assert not series(frame, cat.GPU_UP.name)  # no NVML series for another driver's devices
    assert {d["device"] for d in series(frame, cat.DEVICE_INFO.name)} == {"gpu-0", "gpu-1", "gpu-2", "gpu-3"}
    assert {(d["claim"], d["device"], d["driver"]) for d in series(frame, cat.CLAIM_ALLOCATION_INFO.name)} == {
        ("two-gpus", "gpu-0", "gpu.example.com"), ("two-gpus", "gpu-1", "gpu.example.com")}
    assert {(d["claim"], d["pod"], d["container"]) for d in series(frame, cat.CLAIM_CONSUMER_INFO.name)} == {
        ("two-gpus", "pod0", "ctr0")}
    assert {(d["device"], d["key"], d["effect"]) for d in series(frame, cat.DEVICE_TAINT.name)} == {
        ("gpu-3", "example.com/unhealthy", "NoSchedule")}
    assert {(d["device"], d["health"]) for d in series(frame, cat.DEVICE_HEALTH.name)} == {
        ("gpu-0", "Healthy"), ("gpu-1", "Unhealthy")}


def test_a_nic_only_node_replays_too() -> None:
    frame = replay("example-driver.yaml", "nic-node")
    assert values_of(frame, cat.SOURCE_UP.name, "source")["nvml"] == 0
    assert [(d["driver"], d["device"]) for d in series(frame, cat.DEVICE_INFO.name)] == [("dra.net", "eth1")]
    assert [(d["claim"], d["pod"]) for d in series(frame, cat.CLAIM_CONSUMER_INFO.name)] == [("nic", "router-0")]


def test_a_node_with_gpus_of_two_models_is_refused_naming_both() -> None:
    def change(o: list[dict[str, Any]]) -> None:
        device = find(o, "ResourceSlice", "gpu-node-a-gpu.nvidia.com-7xkqz")["spec"]["devices"][1]
        device["attributes"]["productName"] = {"string": "NVIDIA H100 80GB HBM3"}

    assert broken(change).endswith(
        "spec.devices[name=gpu-1].attributes.productName: 'NVIDIA H100 80GB HBM3' on gpu-1, 'NVIDIA H200' on gpu-0: "
        "the simulator runs one GPU model per node")


def test_a_malformed_pci_bus_id_is_named() -> None:
    def change(o: list[dict[str, Any]]) -> None:
        device = find(o, "ResourceSlice", "gpu-node-a-gpu.nvidia.com-7xkqz")["spec"]["devices"][0]
        device["attributes"]["resource.kubernetes.io/pciBusID"] = {"string": "slot 3"}

    assert broken(change).endswith(
        "spec.devices[name=gpu-0].attributes.resource.kubernetes.io/pciBusID: 'slot 3' is not a PCI address "
        "(domain:bus:device.function)")


def test_mig_profiles_of_an_unknown_model_come_from_its_slice() -> None:
    # An A30 (24 GB, 4 memory slices) is not in the table: its profiles are what its MIG devices show.
    objects = [o for o in items("v1") if o["metadata"]["name"] == "gpu-node-a-gpu.nvidia.com-7xkqz"]
    devices = objects[0]["spec"]["devices"]
    for d in devices:
        d["attributes"]["productName"] = {"string": "NVIDIA A30"}
        d["attributes"]["architecture"] = {"string": "Ampere"}
        if "memory" in d.get("capacity", {}):
            d["capacity"]["memory"] = {"value": "24Gi"}
    devices[2]["name"], devices[2]["attributes"]["profile"] = "gpu-2-mig-2g12gb-14-0", {"string": "2g.12gb"}
    devices[3]["name"], devices[3]["attributes"]["profile"] = "gpu-2-mig-1g6gb-19-4", {"string": "1g.6gb"}
    s = parse_dump(dump_of(objects), "a30.yaml", NODE)
    assert s.profile.model == "NVIDIA A30" and not s.profile.gpm_supported
    assert {(p.name, p.gi_profile_id, p.memory_slices, p.starts) for p in s.profile.mig_profiles} == {
        ("2g.12gb", 14, 4, (0,)), ("1g.6gb", 19, 1, (4,))}
    assert [(m.profile, m.placement_start) for m in s.gpus[2].mig] == [("2g.12gb", 0), ("1g.6gb", 4)]
