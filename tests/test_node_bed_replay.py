"""What the real node said, replayed without it: NVIDIA's real driver's ResourceSlices and the real
kubelet's pod-resources answers, recorded from the node test bed by ``tests/record_node_bed.py``
(``tests/dumps/node-bed-<board>.yaml``, ``tests/fixtures/node-bed/podresources-<board>.json``).

- The real kubelet's answer, decoded by the exporter and joined with the real objects, gives every
  GPU the labels the objects say (the same rule as the live tests, ``expected_from_objects``).
- The simulator follows the real node: its slices have the real driver's attribute names and types
  (semver ``driverVersion``, no ``pcieRoot`` without sysfs), and a dump of the real node replayed by
  the simulated kubelet answers what the real kubelet answered.
- The cluster mode and ``explain`` read the real slices: capacity, and the waiting claim explained.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from google.protobuf import json_format
from test_testbed_node import expected_from_objects

from dra_exporter import catalog as cat
from dra_exporter.join import JoinInput, join
from dra_exporter.model import ClusterSnapshot, DeviceSample, DeviceSnapshot, GpuDevice
from dra_exporter.proto import api_pb2
from dra_exporter.sources import kubeapi_normalize as norm
from dra_exporter.sources.podresources import snapshot_from_response
from dra_exporter_sim.profile import GPU_MODELS, load_profile
from dra_exporter_sim.scenario_builder import parse_scenario

HERE = Path(__file__).resolve().parent
BOARDS = ("h100", "gb200")
NODE = "bed-node"
#: Attributes of a whole GPU in NVIDIA's driver (the bed's v0.5.0-dev on the mock NVML): name → value type.
REAL_GPU_ATTRIBUTES = {"architecture": "string", "brand": "string", "cudaComputeCapability": "version",
                       "cudaDriverVersion": "version", "driverVersion": "version", "productName": "string",
                       "resource.kubernetes.io/pciBusID": "string", "type": "string", "uuid": "string"}


def dump(board: str) -> list[dict[str, Any]]:
    return list(yaml.safe_load((HERE / "dumps" / f"node-bed-{board}.yaml").read_text())["items"])


def of_kind(items: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [i for i in items if i["kind"] == kind]


def recorded_list(board: str) -> api_pb2.ListPodResourcesResponse:
    answers = json.loads((HERE / "fixtures" / "node-bed" / f"podresources-{board}.json").read_text())
    return json_format.ParseDict(answers["List"], api_pb2.ListPodResourcesResponse())


@pytest.mark.parametrize("board", BOARDS)
def test_the_real_drivers_gpu_attributes_are_what_the_simulator_and_the_exporter_know(board: str) -> None:
    for s in of_kind(dump(board), "ResourceSlice"):
        for d in s["spec"]["devices"]:
            assert {k: next(iter(v)) for k, v in d["attributes"].items()} == REAL_GPU_ATTRIBUTES
            # Semver, the driver's "550.163.01" / "580.65.06" without leading zeros; no pcieRoot without sysfs.
            assert re.fullmatch(r"\d+\.\d+\.\d+", d["attributes"]["driverVersion"]["version"])
            assert "resource.kubernetes.io/pcieRoot" not in d["attributes"]
            assert set(d["capacity"]) == {"memory"}


def attribute_types(device: dict[str, Any]) -> dict[str, str]:
    """A device's attributes as NVIDIA's driver types them, name → ``string``/``int``/``bool``/``version``;
    without ``addressingMode`` (driver 25.12+ on real NVML; the bed's mock NVML has none to give)."""
    return {k: next(iter(v)) for k, v in device["attributes"].items() if k != "addressingMode"}


def recorded_gpus() -> list[dict[str, Any]]:
    return [d for board in BOARDS for s in of_kind(dump(board), "ResourceSlice") for d in s["spec"]["devices"]]


def simulated_whole_gpus(source: str) -> list[dict[str, Any]]:
    """The whole GPUs the simulator's own slices publish: a node of ``source``'s GPU model, or (``cluster``)
    every ``type: gpu`` device of the built-in cluster (the demo's H200s and its hand-made A100s)."""
    from dra_exporter_sim import k8s_objects
    from dra_exporter_sim.cluster import builtin_cluster

    if source != "cluster":
        scenario = parse_scenario({"node": "node-a", "gpu_model": source, "gpus": [{"index": 0}]}, "test.yaml")
        return [k8s_objects.gpu_device(scenario, scenario.gpus[0])]
    return [d for s in builtin_cluster() if s["kind"] == "ResourceSlice" and s["spec"]["driver"] == "gpu.nvidia.com"
            for d in s["spec"].get("devices", ()) if d["attributes"].get("type") == {"string": "gpu"}]


@pytest.mark.parametrize("source", [*GPU_MODELS, "cluster"])
def test_the_simulators_whole_gpus_carry_the_real_drivers_attribute_names_and_types(source: str) -> None:
    real = recorded_gpus()
    # What the real driver says of a CUDA driver branch and of an architecture, from the recorded boards.
    cuda_by_driver = {d["attributes"]["driverVersion"]["version"].split(".")[0]:
                      d["attributes"]["cudaDriverVersion"]["version"].split(".")[0] for d in real}
    compute_by_architecture = {d["attributes"]["architecture"]["string"]:
                               d["attributes"]["cudaComputeCapability"]["version"] for d in real}
    # NVIDIA's CUDA GPU table for the architectures no recorded board has.
    compute_by_architecture.setdefault("Ampere", "8.0.0")
    devices = simulated_whole_gpus(source)
    assert devices
    for device in devices:
        assert attribute_types(device) == REAL_GPU_ATTRIBUTES, device["name"]
        if "consumesCounters" not in device:  # DynamicMIG's whole GPUs: no recorded board has them
            assert set(device["capacity"]) == {"memory"}, device["name"]
        attrs = device["attributes"]
        for name, value in attrs.items():
            if "version" in value:  # NVIDIA's driver publishes semver: no leading zeros, three parts
                assert re.fullmatch(r"(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)", value["version"]), (name, value)
        architecture = attrs["architecture"]["string"]
        assert attrs["cudaComputeCapability"]["version"] == compute_by_architecture[architecture], device["name"]
        driver_branch = attrs["driverVersion"]["version"].split(".")[0]
        assert attrs["cudaDriverVersion"]["version"].split(".")[0] == cuda_by_driver[driver_branch], device["name"]
    if source in GPU_MODELS:
        profile = load_profile(source)
        expected = {"h200": "Hopper", "h200-hgx": "Hopper", "gb200": "Blackwell"}[source]
        assert devices[0]["attributes"]["architecture"] == {"string": expected}
        # The CUDA driver version the simulated NVML reports (``<CUDA major>.<driver>``) is the slice's.
        cuda = devices[0]["attributes"]["cudaDriverVersion"]["version"]
        assert profile.nvml_version.split(".")[0] == cuda.split(".")[0]


@pytest.mark.parametrize("gpu_model", GPU_MODELS)
def test_the_simulators_mig_devices_carry_their_parents_attributes_as_nvidias_driver_does(gpu_model: str) -> None:
    """NVIDIA's driver gives a MIG device its parent GPU's attributes plus ``parentUUID`` and ``profile``."""
    from dra_exporter_sim import k8s_objects

    scenario = parse_scenario({"node": "node-a", "gpu_model": gpu_model, "gpus": [{"index": 0}]}, "test.yaml")
    gpu = scenario.gpus[0]
    mig_profile = scenario.profile.mig_profiles[0]
    mig = k8s_objects.mig_device(scenario, gpu, mig_profile, mig_profile.starts[0], uuid="MIG-0")
    whole = k8s_objects.gpu_device(scenario, gpu)
    assert attribute_types(mig) == {**attribute_types(whole), "parentUUID": "string", "profile": "string"}
    shared = set(REAL_GPU_ATTRIBUTES) - {"type", "uuid"}
    assert {k: mig["attributes"][k] for k in shared} == {k: whole["attributes"][k] for k in shared}


@pytest.mark.parametrize("board", BOARDS)
def test_the_simulator_publishes_a_replayed_real_gpu_as_the_real_driver_did(board: str) -> None:
    """The dump of the real node as a scenario: the simulator's own device for each GPU (from the profile it
    identified from the slices) is the real driver's, architecture and CUDA driver version included."""
    from dra_exporter_sim import k8s_objects
    from dra_exporter_sim.loader import load_scenario

    scenario = load_scenario(HERE / "dumps" / f"node-bed-{board}.yaml", NODE)
    real = {d["name"]: d for s in of_kind(dump(board), "ResourceSlice") for d in s["spec"]["devices"]}
    simulated = {f"gpu-{g.minor}": k8s_objects.gpu_device(scenario, g) for g in scenario.gpus}
    assert set(simulated) == set(real)
    for name, device in simulated.items():
        device["attributes"].pop("addressingMode")
        assert device == real[name]
    assert k8s_objects._semver("550.163.01") == "550.163.1"  # the H100 board's driver, as NVIDIA publishes it


@pytest.mark.parametrize("board", BOARDS)
def test_the_real_kubelets_answer_joined_with_the_real_objects_labels_every_gpu_as_they_say(board: str) -> None:
    items = dump(board)
    slices, claims, pods = of_kind(items, "ResourceSlice"), of_kind(items, "ResourceClaim"), of_kind(items, "Pod")
    gpus = [(d["name"], d["attributes"]) for s in slices for d in s["spec"]["devices"]]
    devices = DeviceSnapshot(tuple(
        DeviceSample(GpuDevice(a["uuid"]["string"], int(name.split("-")[1]), int(name.split("-")[1]),
                               a["productName"]["string"], a["resource.kubernetes.io/pciBusID"]["string"]), True, ())
        for name, a in gpus))
    cluster = ClusterSnapshot(NODE, "v1", tuple(norm.slice_from_dict(s, "v1") for s in slices),
                              tuple(norm.claim_from_dict(c, "v1") for c in claims),
                              tuple(norm.pod_from_dict(p) for p in pods))
    frame = join(JoinInput(devices=(devices,), pods=snapshot_from_response(recorded_list(board)), cluster=cluster))
    exported = {(lab := dict(s.labels))["uuid"]: {k: lab[k] for k in ("claim", "namespace", "request", "pod",
                                                                       "container")}
                for f in frame.families if f.name == cat.GPU_UP.name for s in f.samples}
    expected = expected_from_objects(slices, claims, [p for p in pods if p["status"].get("phase") == "Running"])
    assert len(expected) == 7  # the 8th GPU is free (gpu-waiting's claim asks for two)
    assert {u: v for u, v in exported.items() if v["claim"]} == expected
    not_prepared = [s for f in frame.families if f.name == cat.CLAIM_NOT_PREPARED.name for s in f.samples]
    assert not not_prepared


@pytest.mark.parametrize("board", BOARDS)
def test_the_simulated_kubelet_replaying_the_real_node_answers_what_the_real_kubelet_did(board: str) -> None:
    """The dump of the real node as the simulator's scenario: its kubelet lists each container with the
    claims and devices the real kubelet listed (a container that names one request gets all the claim's
    devices; a pod-level claim under no container; the extended resource's claim; the CDI ids of a
    claim's earlier devices on its later ones)."""
    from dra_exporter_sim.loader import load_scenario

    scenario = load_scenario(HERE / "dumps" / f"node-bed-{board}.yaml", NODE)

    def claims(snapshot: Any) -> set[tuple[str, str, str, tuple[tuple[str, tuple[str, ...]], ...]]]:
        # With each device its CDI ids: device k of a claim also carries those of devices 1..k-1.
        return {(p.name, c.name, u.name, tuple(sorted((d.device, d.cdi_devices) for d in u.devices)))
                for p in snapshot.pods for c in p.containers for u in c.claims}

    assert claims(scenario.pod_allocations_at(0.0)) == claims(snapshot_from_response(recorded_list(board)))


@pytest.mark.parametrize("board", BOARDS)
def test_the_cluster_mode_counts_the_real_drivers_gpus(board: str) -> None:
    done = subprocess.run([sys.executable, "-m", "dra_exporter.cli", "cluster", "--simulate",
                           str(HERE / "dumps" / f"node-bed-{board}.yaml"), "--once"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    devices = [line for line in done.stdout.splitlines() if line.startswith("dra_cluster_devices{")]
    assert devices, done.stdout[:2000]
    total = {tuple(sorted(re.findall(r'(\w+)="([^"]*)"', line))): float(line.rsplit(" ", 1)[1]) for line in devices}
    assert sum(v for k, v in total.items() if ("state", "allocated") in k) == 7, devices
    assert sum(v for k, v in total.items() if ("state", "free") in k) == 1, devices


@pytest.mark.parametrize("board", BOARDS)
def test_explain_says_why_the_waiting_claim_gets_no_gpu(board: str) -> None:
    done = subprocess.run([sys.executable, "-m", "dra_exporter.cli", "explain", "shapes/claim-waiting", "--simulate",
                           str(HERE / "dumps" / f"node-bed-{board}.yaml"), "--format", "json"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["placeable"] is False, answer
    assert "allocated" in json.dumps(answer), answer
