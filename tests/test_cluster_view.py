"""The cluster view end to end: the real ``kubernetes`` client against the simulated API server,
through the agent and the join.

What a real API server can answer — UUIDs through ResourceSlices of any driver, request names,
admin access, ``status.devices`` conditions, taints, health, pod UIDs in every served version — is
tested against kube-apiserver itself (tests/test_testbed_node_agent.py). Here: the node-local join
without an API server, an API outage (last good view kept, source down), changes after an injected
410, partitionable devices, the cluster dumps, and what pod churn costs the API server.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from simnode import device_labels, eventually, labels_of, simulated, source_up

from dra_exporter import catalog as cat
from dra_exporter.sources.kubeapi import KubeApiSource, Timeouts
from dra_exporter.sources.registry import without
from dra_exporter_sim.apiserver import GONE, GONE_410, SimulatedApiServer
from dra_exporter_sim.clock import SimClock
from dra_exporter_sim.scenario_builder import parse_scenario

DUMPS = Path(__file__).resolve().parent / "dumps"
VERSIONS = ("v1", "v1beta2", "v1beta1")
EXAMPLE_UUID = "GPU-55555555-5555-4555-8555-555555555555"

#: gpu-0/1: a prioritized-list claim (result request main/h200x2) with health and a condition;
#: gpu-2 and a MIG slice of gpu-3: one claim, two requests, one container each; an admin-access
#: claim of a pod that is not the exporter's; gpu-4 tainted; gpu-5 reached through another
#: driver's slice, whose `uuid` attribute is the only way to know it; `short-0` ends at t=100.
CLUSTER_VIEW = """
node: cv-node
seed: 11
api_version: {version}
gpus:
  - {{index: 0}}
  - {{index: 1}}
  - {{index: 2}}
  - index: 3
    mig:
      - {{profile: 3g.71gb, placement_start: 0}}
      - {{profile: 3g.71gb, placement_start: 4}}
  - index: 4
    taints: [{{key: example.com/maintenance, value: fan-check, effect: NoSchedule}}]
  - {{index: 5, uuid: {example_uuid}}}
slices:
  - driver: gpu.example.com
    devices:
      - name: accel-0
        attributes: {{uuid: {example_uuid}, model: Example}}
claims:
  - namespace: ml
    name: train
    requests:
      - name: main
        first_available:
          - {{name: h200x2, device_class: gpu.nvidia.com, count: 2}}
        allocated: h200x2
        devices: [gpu-0, gpu-1]
    device_status:
      - device: gpu-1
        conditions: [{{type: Ready, status: "True", reason: Prepared}}]
  - namespace: ml
    name: pair
    requests:
      - {{name: first, devices: [gpu-2]}}
      - {{name: second, devices: [gpu-3-mig-3g71gb-9-0]}}
  - namespace: ops
    name: dcgm-watch
    admin_access: true
    devices: [gpu-0, gpu-1, gpu-2]
  - namespace: ml
    name: alt
    driver: gpu.example.com
    devices: [accel-0]
  - namespace: batch
    name: short-0-gpu
    template: short-gpu
    devices: [gpu-3-mig-3g71gb-9-4]
pods:
  - namespace: ml
    name: train-0
    containers:
      - name: trainer
        claims: [{{claim: train, request: main}}]
        device_health: {{gpu-0: Healthy, gpu-1: Unhealthy}}
  - namespace: ml
    name: pair-0
    containers:
      - {{name: a, claims: [{{claim: pair, request: first}}]}}
      - {{name: b, claims: [{{claim: pair, request: second}}]}}
  - namespace: ops
    name: dcgm-0
    containers:
      - {{name: dcgm, claims: [dcgm-watch]}}
  - namespace: ml
    name: alt-0
    containers:
      - {{name: c, claims: [alt]}}
  - namespace: batch
    name: short-0
    end: 100
    containers:
      - {{name: job, claims: [short-0-gpu]}}
"""


@pytest.fixture(scope="module")
def scenario_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("cluster-view")
    files = {}
    for version in VERSIONS:
        path = folder / f"{version}.yaml"
        path.write_text(CLUSTER_VIEW.format(version=version, example_uuid=EXAMPLE_UUID))
        files[version] = str(path)
    return files


def attribution(labels: dict[str, str]) -> tuple[str, ...]:
    return tuple(labels[k] for k in cat.ATTRIBUTION_LABELS)


def pick(frame: Any, name: str, *keys: str) -> set[tuple[str, ...]]:
    return {tuple(lbl[k] for k in keys) for lbl in labels_of(frame, name)}


def test_node_local_join_without_the_api_server(scenario_files: dict[str, str]) -> None:
    with simulated(scenario_files["v1"], sources=without("kubeapi")) as rt:
        frame = rt.agent.cycle(collect_side=True)
        by_uuid = device_labels(frame)
        uuid = rt.sim.scenario.nvml_uuid
        assert "kubeapi" not in {lbl["source"] for lbl in labels_of(frame, cat.SOURCE_UP.name)}
        # Without adminAccess from the API server, the monitoring claim looks like a second consumer.
        assert attribution(by_uuid[uuid("gpu-0")]) == ("", "", "", "", "", "")
        # Pod UIDs and request names need the API server; so does knowing which of the pod's two
        # containers uses this device: the kubelet reports every device of the claim to both.
        assert attribution(by_uuid[uuid("gpu-3-mig-3g71gb-9-0")]) == ("ml", "pair-0", "", "", "pair", "")
        assert attribution(by_uuid[EXAMPLE_UUID]) == ("",) * 6, "no slice, no UUID for another driver"
        assert not labels_of(frame, cat.DEVICE_INFO.name)


def _unreachable_kubeconfig(path: Path) -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: connections are refused
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{port}"}}],
        "users": [{"name": "u", "user": {}}], "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    return str(path)


def test_no_api_server_keeps_the_node_local_join_and_says_so_once(
        scenario_files: dict[str, str], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    kubeconfig = _unreachable_kubeconfig(tmp_path / "kubeconfig")
    with caplog.at_level(logging.WARNING), simulated(scenario_files["v1"], kubeconfig=kubeconfig) as rt:
        assert rt.sim.apiserver is None, "an explicit kubeconfig replaces the simulated API server"
        for _ in range(5):
            frame = rt.agent.cycle(collect_side=True)
        assert source_up(frame, "kubeapi") == 0.0
        assert attribution(device_labels(frame)[rt.sim.scenario.nvml_uuid("gpu-3-mig-3g71gb-9-0")])[1] == "pair-0"
    warnings = [r.getMessage() for r in caplog.records if "kubeapi" in r.getMessage()]
    assert len(warnings) == 1 and "unreachable" in warnings[0]


def test_api_outage_keeps_the_last_good_view_and_marks_the_source_down(scenario_files: dict[str, str]) -> None:
    with simulated(scenario_files["v1"]) as rt:
        uuid = rt.sim.scenario.nvml_uuid("gpu-0")
        good = rt.agent.cycle(collect_side=True)
        rt.sim.apiserver.inject(GONE)

        def down() -> bool:
            return source_up(rt.agent.cycle(collect_side=True), "kubeapi") == 0.0

        eventually(down)
        frame = rt.agent.cycle(collect_side=True)
        assert device_labels(frame)[uuid] == device_labels(good)[uuid], "request and pod UID stay"
        assert labels_of(frame, cat.DEVICE_INFO.name) == labels_of(good, cat.DEVICE_INFO.name)
        rt.sim.apiserver.inject(None)
        eventually(lambda: not down(), timeout=30.0)


def test_changes_after_a_410_relist_leave_the_frame(scenario_files: dict[str, str]) -> None:
    with simulated(scenario_files["v1"]) as rt:
        api = rt.sim.apiserver
        mig = rt.sim.scenario.nvml_uuid("gpu-3-mig-3g71gb-9-4")
        frame = rt.agent.cycle(collect_side=True)
        assert attribution(device_labels(frame)[mig])[4:] == ("short-0-gpu", "gpu")
        lists = api.requests[("list", "pods")]
        api.inject(GONE_410)
        eventually(lambda: api.requests[("list", "pods")] > lists)
        rt.sim.clock.set(150.0)  # short-0 and its generated claim are gone
        api.inject(None)

        def gone() -> bool:
            frame = rt.agent.cycle(collect_side=True)
            return (attribution(device_labels(frame)[mig]) == ("",) * 6
                    and "short-0-gpu" not in {lbl["claim"] for lbl in labels_of(frame, cat.CLAIM_ALLOCATION_INFO.name)})

        eventually(gone)


DYNAMIC_MIG = """
node: dyn-node
seed: 2
dynamic_mig: true
gpus:
  - {index: 0}
  - index: 1
    mig:
      - {profile: 3g.71gb, placement_start: 0}
claims:
  - {namespace: ml, name: slice, devices: [gpu-1-mig-3g71gb-9-0]}
pods:
  - namespace: ml
    name: p
    containers: [{name: c, claims: [slice]}]
"""


def test_partitionable_devices_counters_and_uuid_less_mig(tmp_path: Path) -> None:
    path = tmp_path / "dynamic.yaml"
    path.write_text(DYNAMIC_MIG)
    with simulated(str(path)) as rt:
        frame = rt.agent.cycle(collect_side=True)
        mig = rt.sim.scenario.nvml_uuid("gpu-1-mig-3g71gb-9-0")
    info = {lbl["device"]: lbl for lbl in labels_of(frame, cat.DEVICE_INFO.name)}
    # Every possible placement is a device; the slice names none of them by UUID ...
    assert info["gpu-0-mig-1g18gb-19-0"]["uuid"] == "" and info["gpu-0-mig-1g18gb-19-0"]["type"] == "mig"
    # ... but the one that exists is found through NVML (parent, profile, placement).
    assert info["gpu-1-mig-3g71gb-9-0"]["uuid"] == mig
    assert attribution(device_labels(frame)[mig])[:2] == ("ml", "p")
    capacity = pick(frame, cat.DEVICE_SHARED_CAPACITY.name, "counter_set")
    assert capacity == {("gpu-0-counter-set",), ("gpu-1-counter-set",)}
    assert pick(frame, cat.DEVICE_SHARED_CONSUMPTION.name, "device", "counter_set") == {
        ("gpu-1-mig-3g71gb-9-0", "gpu-1-counter-set")}, "only the allocated placement consumes"


# --- cluster dumps --------------------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_cluster_dumps_give_the_same_series_in_every_version(version: str) -> None:
    with simulated(str(DUMPS / f"{version}.yaml"), node_name="gpu-node-a") as rt:
        frame = rt.agent.cycle(collect_side=True)
    gpu, mig = "GPU-aaaaaaaa-0000-4000-8000-00000000000", "MIG-bbbbbbbb-0000-4000-8000-0000000000"
    pod = "22222222-0000-4000-8000-00000000000"
    assert {lbl["uuid"]: attribution(lbl) for lbl in device_labels(frame).values()} == {
        f"{gpu}0": ("research", "", "", "", "shared-gpu", "gpu"),  # two notebooks share it
        f"{gpu}1": ("ml", "trainer-0", f"{pod}3", "trainer", "train", "gpus"),
        f"{gpu}2": ("",) * 6,  # the MIG parent
        f"{mig}20": ("inference", "vllm-0", f"{pod}4", "vllm", "vllm-0-gpu-x7k2p", "gpu/mig-3g"),
        # The job's pod is not in the dump: its UID comes from the claim's reservedFor.
        f"{mig}24": ("batch", "job-1", f"{pod}6", "unknown", "job-1-gpu", "gpu"),
    }
    example = "gpu-5d0c6a3e-1c1e-4a43-b1a9-8b2f6f0e0c11"
    assert pick(frame, cat.CLAIM_ALLOCATION_INFO.name, "namespace", "claim", "request", "uuid", "admin_access") == {
        ("research", "shared-gpu", "gpu", f"{gpu}0", "false"),
        ("ml", "train", "gpus", f"{gpu}1", "false"),
        ("inference", "vllm-0-gpu-x7k2p", "gpu/mig-3g", f"{mig}20", "false"),
        ("batch", "job-1-gpu", "gpu", f"{mig}24", "false"),
        ("demo", "example-claim", "gpu", example, "false"),
        *{("monitoring", "exporter-gpus", "all", u, "true") for u in (f"{gpu}0", f"{gpu}1", f"{mig}20", f"{mig}24")},
    }, "claims of other nodes and unallocated claims are not this node's"
    assert pick(frame, cat.DEVICE_INFO.name, "node", "driver", "uuid", "type", "profile", "parent_uuid") == {
        ("gpu-node-a", "gpu.nvidia.com", f"{gpu}0", "gpu", "", ""),
        ("gpu-node-a", "gpu.nvidia.com", f"{gpu}1", "gpu", "", ""),
        ("gpu-node-a", "gpu.nvidia.com", f"{mig}20", "mig", "3g.71gb", f"{gpu}2"),
        ("gpu-node-a", "gpu.nvidia.com", f"{mig}24", "mig", "1g.18gb", f"{gpu}2"),
        ("gpu-node-a", "gpu.example.com", example, "", "", ""),
    }
    assert ("monitoring", "dra-exporter-q8x2m") not in pick(frame, cat.CLAIM_CONSUMER_INFO.name, "namespace", "pod")
    assert pick(frame, cat.DEVICE_HEALTH.name, "pod", "claim", "health") == {
        ("notebook-alice", "shared-gpu", "Unhealthy")}
    assert pick(frame, cat.DEVICE_TAINT.name, "key", "effect") == {("example.com/maintenance", "NoSchedule")}
    assert pick(frame, cat.CLAIM_DEVICE_CONDITION.name, "claim", "type", "status") == {("train", "Ready", "True")}


# --- what churn costs the API server ---------------------------------------------------------------------

CHURN_PODS = 49  # 7 GPUs x 7 MIG slices, one short-lived pod (and generated claim) each
CHURN_LIFETIME = 600.0
CLAIM_REFRESH = 300.0


def churn_scenario() -> Any:
    gpus = [{"index": i, "mig": [{"profile": "1g.18gb", "placement_start": s} for s in range(7)]} for i in range(7)]
    gpus.append({"index": 7})
    claims = [{"namespace": "team", "name": "steady", "devices": ["gpu-7"]}]
    pods = [{"namespace": "team", "name": "steady-0", "containers": [{"name": "c", "claims": ["steady"]}]}]
    for i in range(CHURN_PODS):
        name, start = f"job-{i}", 10.0 + i * (3600.0 - CHURN_LIFETIME) / CHURN_PODS
        claims.append({"namespace": "team", "name": f"{name}-gpu", "template": "job-gpu",
                       "devices": [f"gpu-{i // 7}-mig-1g18gb-19-{i % 7}"]})
        pods.append({"namespace": "team", "name": name, "start": start, "end": start + CHURN_LIFETIME,
                     "containers": [{"name": "c", "claims": [f"{name}-gpu"]}]})
    return parse_scenario({"node": "churn-node", "seed": 5, "gpus": gpus, "claims": claims, "pods": pods}, "churn")


@pytest.fixture
def churn_server() -> Iterator[SimulatedApiServer]:
    with SimulatedApiServer(churn_scenario(), SimClock(0.0, frozen=True), poll_s=0.02) as server:
        yield server


@pytest.mark.slow  # ~7 s: 160 claim GETs, each ~40 ms on the simulated API server
def test_pod_churn_costs_requests_per_claim_not_per_cluster(churn_server: SimulatedApiServer) -> None:
    """One simulated hour of 49 pods (with generated claims) coming and going, a minute at a time."""
    clock, scenario = churn_server.clock, churn_server.scenario
    src = KubeApiSource("churn-node", kubeconfig=churn_server.kubeconfig_path, claim_refresh=CLAIM_REFRESH,
                        monotonic=clock.now, timeouts=Timeouts(backoff=(0.05, 0.2)))
    try:
        for minute in range(61):
            clock.set(minute * 60.0)
            alive = {p.name for p in scenario.pods_at(clock.now())}
            eventually(lambda alive=alive: {p.name for p in src.collect().pods} == alive, step=0.01)
            claims = {c.name for c in src.collect().claims}
            assert claims == {c.name for c in scenario.claims_at(clock.now())}
    finally:
        src.close()
    requests = churn_server.requests
    gets = requests[("get", "resourceclaims")]
    # Each claim is fetched when its pod appears, then every refresh period while in use.
    refreshes = CHURN_PODS * CHURN_LIFETIME / CLAIM_REFRESH + 3600.0 / CLAIM_REFRESH
    assert CHURN_PODS <= gets <= CHURN_PODS + 1 + refreshes
    assert requests[("list", "resourceclaims")] == requests[("watch", "resourceclaims")] == 0, \
        "never a cluster-wide claim list or watch"
    # One list each: pods, this node's slices, the slices that name no node.
    assert (requests[("list", "pods")], requests[("list", "resourceslices")]) == (1, 2)
    # The watches live for 5-10 minutes of wall time: ~24 reconnects per real hour for the three of them.
    per_hour = gets + 3 + 24 + 1
    print(f"\nchurn: {CHURN_PODS} pod starts/hour -> {gets} claim GETs, ~{per_hour} requests/node/hour "
          f"(server counted: {dict(requests)})")


# --- doctor ----------------------------------------------------------------------------------------------


def test_doctor_checks_discovery_version_and_access(scenario_files: dict[str, str], tmp_path: Path) -> None:
    from dra_exporter import doctor
    from dra_exporter.config import Settings

    findings = [f for f in doctor.run(Settings(simulate=scenario_files["v1beta2"])) if f.check == "apiserver"]
    assert all(f.level == "OK" for f in findings), findings
    text = " / ".join(f.message for f in findings)
    assert "serves resource.k8s.io v1beta2, v1beta1; reading v1beta2" in text
    assert "resourceslices with spec.nodeName=cv-node: 2" in text and "pods with spec.nodeName=cv-node: 5" in text

    unreachable = Settings(simulate=scenario_files["v1"], kubeconfig=_unreachable_kubeconfig(tmp_path / "k"))
    (finding,) = [f for f in doctor.run(unreachable) if f.check == "apiserver"]
    assert (finding.level, finding.message) == ("FAIL", "API server unreachable (cannot connect)")
    node_local = Settings(simulate=scenario_files["v1"], sources=without("kubeapi"))
    (off,) = [f for f in doctor.run(node_local) if f.check == "apiserver"]
    assert off.level == "WARN" and "--no-kubeapi" in off.message
