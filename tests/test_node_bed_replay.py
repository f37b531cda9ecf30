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


def test_the_simulated_driver_publishes_the_real_drivers_attribute_names_and_types() -> None:
    from dra_exporter_sim import k8s_objects
    from dra_exporter_sim.loader import load_scenario

    scenario = load_scenario("demo")
    gpu = next(g for g in scenario.gpus if not g.mig)  # a whole GPU
    device = k8s_objects.gpu_device(scenario, gpu)
    simulated_types = {k: next(iter(v)) for k, v in device["attributes"].items()}
    # addressingMode: NVIDIA's driver 25.12+ on real NVML; the bed's mock NVML has none to give.
    assert {k: v for k, v in simulated_types.items() if k != "addressingMode"} == REAL_GPU_ATTRIBUTES
    real = of_kind(dump("h100"), "ResourceSlice")[0]["spec"]["devices"][0]["attributes"]["driverVersion"]
    assert k8s_objects._semver("550.163.01") == real["version"] == "550.163.1"  # the H100 profile's driver


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
