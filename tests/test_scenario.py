"""Scenario loading: the built-in demo, validation messages, determinism, churn."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from dra_exporter import model
from dra_exporter_sim import builtin_scenarios, load_scenario
from dra_exporter_sim.scenario import Curve, Scenario, ScenarioError
from dra_exporter_sim.scenario_builder import parse_scenario

# A small valid scenario every malformed case below starts from.
BASE: dict[str, Any] = {
    "node": "n1",
    "seed": 7,
    "gpus": [
        {"index": 0},
        {"index": 1, "mig": [{"profile": "3g.71gb", "placement_start": 0},
                             {"profile": "1g.18gb", "placement_start": 4}]},
    ],
    "claims": [
        {"namespace": "ml", "name": "train", "devices": ["gpu-0"]},
        {"namespace": "ml", "name": "small", "devices": ["gpu-1-mig-3g71gb-9-0"]},
        {"namespace": "mon", "name": "all", "admin_access": True, "devices": ["gpu-0"]},
    ],
    "pods": [
        {"namespace": "ml", "name": "trainer", "containers": [
            {"name": "main", "claims": ["train"],
             "processes": [{"device": "gpu-0", "memory": "20Gi", "sm": {"base": 0.5, "noise": 0.1}}]}]},
        {"namespace": "ml", "name": "job", "start": 10, "end": 100, "containers": [
            {"name": "main", "claims": ["small"],
             "processes": [{"device": "gpu-1-mig-9-0-4", "memory": 1024, "sm": 0.3}]}]},
    ],
    "faults": [{"kind": "xid", "gpu": 0, "xid": 79, "at": 5}],
}


def write(tmp_path: Path, doc: Any, name: str = "case.yaml") -> Path:
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else yaml.safe_dump(doc))
    return path


def test_builtin_demo_is_listed_and_loads() -> None:
    assert "demo" in builtin_scenarios()
    s = load_scenario("demo")
    assert s.node_name == "sim-node-1"
    assert [g.index for g in s.gpus] == list(range(8))
    assert [m.profile for m in s.gpus[4].mig] == ["3g.71gb", "3g.71gb"]
    assert [m.placement_start for m in s.gpus[5].mig] == list(range(7))
    assert not any(g.mig for g in (s.gpus[i] for i in (0, 1, 2, 3, 6, 7)))
    assert s.exporter_pod is not None and (s.exporter_pod.namespace, s.exporter_pod.name) == (
        "monitoring", "dra-exporter-x7k2p")
    admin = s.claim("monitoring", "dra-exporter-gpus")
    assert admin is not None and admin.admin_access
    assert admin.devices == ("gpu-0", "gpu-1", "gpu-2", "gpu-3", "gpu-6", "gpu-7")
    assert s.claim("ml-training", "llama-train-gpus").request == "gpus"  # type: ignore[union-attr]
    assert [f.kind for f in s.faults] == ["xid"] and s.faults[0].gpu == 2 and s.faults[0].params["xid"] == 13


def test_demo_shared_claim_has_two_consumers() -> None:
    s = load_scenario("demo")
    shared = s.claim("research", "shared-notebook-gpu")
    assert shared is not None
    assert {p.name for p in s.consumers_at(shared, 0)} == {"notebook-alice", "notebook-bob"}


def test_load_from_path(tmp_path: Path) -> None:
    s = load_scenario(write(tmp_path, BASE))
    assert s.node_name == "n1"
    assert s.gpus[1].mig_enabled and not s.gpus[0].mig_enabled
    assert s.gpus[1].mig[0].gi_profile_id == 9 and s.gpus[1].mig[1].gi_profile_id == 19


def _set(doc: dict[str, Any], path: str, value: Any) -> None:
    """Set ``a.b[1].c`` in ``doc``; value ``DELETE`` removes the key."""
    parts = path.replace("]", "").replace("[", ".").split(".")
    node: Any = doc
    for part in parts[:-1]:
        node = node[int(part)] if part.isdigit() else node[part]
    last = parts[-1]
    if value is DELETE:
        del node[last]
    elif last.isdigit():
        node[int(last)] = value
    else:
        node[last] = value


DELETE = object()

MALFORMED = [
    ("unknown-top-key", "nodes", "x", "nodes: unknown key"),
    ("unknown-nested-key", "pods[0].containers[0].procs", [], "pods[0].containers[0].procs: unknown key"),
    ("missing-node", "node", DELETE, "node: required"),
    ("seed-wrong-type", "seed", "abc", "seed: expected an integer"),
    ("gpus-not-a-list", "gpus", {"index": 0}, "gpus: expected a list"),
    ("negative-pod-start", "pods[0].start", -5, "pods[0].start: must be >= 0"),
    ("negative-fault-time", "faults[0].at", -1, "faults[0].at: must be >= 0"),
    ("end-before-start", "pods[1].end", 5, "pods[1].end: the pod must end after it starts"),
    ("unknown-gpu-in-fault", "faults[0].gpu", 9, "faults[0].gpu: the node has no GPU with index 9"),
    ("unknown-gpu-in-claim", "claims[0].devices[0]", "gpu-9", "claims[0].devices[0]: 'gpu-9': the node has no GPU"),
    ("not-a-dra-name", "claims[0].devices[0]", "tpu-0", "claims[0].devices[0]: 'tpu-0' is not an NVIDIA DRA device"),
    ("unknown-mig-name", "claims[1].devices[0]", "gpu-1-mig-2g35gb-14-4", "no such MIG device on GPU 1"),
    ("whole-gpu-of-mig-gpu", "claims[0].devices[0]", "gpu-1", "GPU 1 is split into MIG devices"),
    ("undefined-claim", "pods[0].containers[0].claims[0]", "x",
     "pods[0].containers[0].claims[0]: claim 'x' not defined in namespace 'ml'"),
    ("claim-in-other-namespace", "pods[0].containers[0].claims[0]", "all", "claim 'all' not defined in namespace 'ml'"),
    ("mig-overlap", "gpus[1].mig[1].placement_start", 2,
     "gpus[1].mig[1]: 1g.18gb at slices 2-2 overlaps gpus[1].mig[0]"),
    ("mig-bad-start", "gpus[1].mig[0].placement_start", 2, "gpus[1].mig[0].placement_start: 3g.71gb cannot start at"),
    ("mig-unknown-profile", "gpus[1].mig[0].profile", "5g.99gb",
     "gpus[1].mig[0].profile: unknown MIG profile '5g.99gb'"),
    ("duplicate-gpu-index", "gpus[1].index", 0, "gpus[1].index: GPU index 0 is listed twice"),
    ("gpu-index-gap", "gpus[1].index", 2, "gpus: GPU indexes must be 0..1 without gaps"),
    ("duplicate-claim", "claims[1].name", "train", "claims[1].name: claim ml/train is defined twice"),
    ("duplicate-pod", "pods[1].name", "trainer", "pods[1].name: pod ml/trainer is defined twice"),
    ("duplicate-uuid", "gpus[1].uuid", "GPU-same", None),  # completed in the test: both GPUs share it
    ("device-in-two-claims", "claims[1].devices[0]", "gpu-0",
     "claims[1].devices[0]: device 'gpu-0' is already allocated"),
    ("unknown-fault-kind", "faults[0].kind", "meteor", "faults[0].kind: unknown fault kind 'meteor'"),
    ("xid-with-until", "faults[0].until", 9, "faults[0].until: an xid fault is one event"),
    ("bad-memory", "pods[0].containers[0].processes[0].memory", "20 gigs",
     "pods[0].containers[0].processes[0].memory: expected bytes"),
    ("sm-out-of-range", "pods[0].containers[0].processes[0].sm", 1.5,
     "pods[0].containers[0].processes[0].sm: must be between 0 and 1"),
    ("process-on-unknown-gpu", "pods[0].containers[0].processes[0].device", 7,
     "pods[0].containers[0].processes[0].device: the node has no GPU with index 7"),
    ("too-much-memory", "pods[0].containers[0].processes[0].memory", "200Gi",
     "pods[0].containers[0].processes[0].memory: at t=0 s the processes on gpu-0 need 214748364800 bytes"),
    ("unknown-gpu-model", "gpu_model", "a100", "gpu_model: unknown GPU model 'a100'"),
    ("bad-plugin-resource", "pods[0].containers[0].plugin_devices", [{"resource": "amd.com/gpu", "ids": ["0"]}],
     "pods[0].containers[0].plugin_devices[0].resource: 'amd.com/gpu' is not nvidia.com/gpu"),
    ("bad-pod-name", "pods[0].name", "Trainer_1", "pods[0].name: 'Trainer_1' is not a valid pod name (lowercase"),
    ("pod-labels-not-a-mapping", "pods[0].labels", ["team"], "pods[0].labels: expected a mapping of label keys"),
    ("bad-pod-label-key", "pods[0].labels", {"a team": "ml"}, "pods[0].labels: 'a team' is not a Kubernetes label key"),
    ("bad-pod-label-value", "pods[0].labels", {"team": "machine learning"},
     "pods[0].labels.team: expected a label value"),
    ("pod-label-value-not-text", "pods[0].labels", {"team": 7}, "pods[0].labels.team: expected a label value"),
]


@pytest.mark.parametrize(("case", "path", "value", "expected"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_scenarios_name_file_and_field(tmp_path: Path, case: str, path: str, value: Any,
                                                   expected: str | None) -> None:
    doc = copy.deepcopy(BASE)
    _set(doc, path, value)
    if case == "duplicate-uuid":
        doc["gpus"][0]["uuid"] = "GPU-same"
        expected = "gpus[1].uuid: UUID GPU-same is already used by gpus[0]"
    file = write(tmp_path, doc)
    with pytest.raises(ScenarioError) as err:
        load_scenario(file)
    message = str(err.value)
    assert message.startswith(f"{file}: "), message
    assert expected in message, message


FAULT_CASES = [
    ({"kind": "family_unsupported", "at": 0, "family": "fans"}, "faults[0].family: 'fans' is not one of"),
    ({"kind": "kubelet_slow", "at": 0}, "faults[0].delay: required"),
    ({"kind": "gpu_lost", "at": 0}, "faults[0].gpu: required"),
    ({"kind": "init_failure", "at": 5, "until": 5}, "faults[0].until: must be after 'at'"),
    ({"kind": "gpu_lost", "gpu": 0, "at": 0, "xid": 3}, "faults[0].xid: unknown key"),
    ({"at": 3}, "faults[0].kind: required"),
    ({"kind": "xid", "gpu": 0, "xid": 1, "at": 0, "mig_device": "gpu-1-mig-3g71gb-9-0"},
     "faults[0].mig_device: 'gpu-1-mig-3g71gb-9-0' is not a MIG device of GPU 0"),
]


@pytest.mark.parametrize(("fault", "expected"), FAULT_CASES, ids=[f[1].split(":")[0] + "-" + str(i)
                                                                   for i, f in enumerate(FAULT_CASES)])
def test_malformed_faults(fault: dict[str, Any], expected: str) -> None:
    doc = copy.deepcopy(BASE)
    doc["faults"] = [fault]
    with pytest.raises(ScenarioError) as err:
        parse_scenario(doc, "f.yaml")
    assert str(err.value).startswith("f.yaml: ") and expected in str(err.value), str(err.value)


@pytest.mark.parametrize(("text", "expected"), [
    ("node: [unclosed\n", "invalid YAML at line"),
    ("node: a\nnode: b\ngpus: [{index: 0}]\n", "duplicate key 'node'"),
    ("", "the file is empty"),
    ("- just\n- a list\n", "expected a mapping"),
])
def test_unparseable_files(tmp_path: Path, text: str, expected: str) -> None:
    file = write(tmp_path, text, "bad.yaml")
    with pytest.raises(ScenarioError) as err:
        load_scenario(file)
    assert str(err.value).startswith(f"{file}: ") and expected in str(err.value)


def test_unknown_source_lists_builtins(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="not a built-in scenario.*demo"):
        load_scenario(tmp_path / "nope.yaml")


def test_same_seed_same_scenario_and_values(tmp_path: Path) -> None:
    a, b = load_scenario(write(tmp_path, BASE, "a.yaml")), load_scenario(write(tmp_path, BASE, "b.yaml"))
    assert a.gpus == b.gpus and a.pods == b.pods and a.claims == b.claims
    proc = a.pods[0].containers[0].processes[0]
    assert [proc.sm.value(t, a.seed, proc.key) for t in (0, 1.5, 99.9)] == [
        proc.sm.value(t, b.seed, proc.key) for t in (0, 1.5, 99.9)]


def test_different_seed_changes_derived_ids() -> None:
    a = parse_scenario(BASE)
    b = parse_scenario({**BASE, "seed": 8})
    assert {g.uuid for g in a.gpus}.isdisjoint(g.uuid for g in b.gpus)
    assert a.gpus[1].mig[0].uuid != b.gpus[1].mig[0].uuid
    assert a.pods[0].uid != b.pods[0].uid
    assert a.claims[0].uid != b.claims[0].uid
    assert a.pods[0].containers[0].container_id != b.pods[0].containers[0].container_id
    assert a.pods[0].containers[0].processes[0].pid != b.pods[0].containers[0].processes[0].pid


def test_explicit_identifiers_are_kept() -> None:
    doc = copy.deepcopy(BASE)
    doc["gpus"][0]["uuid"] = "GPU-11111111-2222-3333-4444-555555555555"
    doc["pods"][0]["uid"] = "pod-uid-1"
    doc["pods"][0]["containers"][0]["container_id"] = "containerd://abc"
    doc["pods"][0]["containers"][0]["processes"][0]["pid"] = 4242
    doc["claims"][0]["uid"] = "claim-uid-1"
    s = parse_scenario(doc)
    assert s.gpus[0].uuid == "GPU-11111111-2222-3333-4444-555555555555"
    assert s.pods[0].uid == "pod-uid-1"
    assert s.pods[0].containers[0].container_id == "containerd://abc"
    assert s.pods[0].containers[0].processes[0].pid == 4242
    assert s.claims[0].uid == "claim-uid-1"


def test_curve_noise_is_deterministic_and_bounded() -> None:
    c = Curve(0.5, amplitude=0.1, period=60, noise=0.05)
    values = [c.value(t / 3, 1, "k") for t in range(600)]
    assert values == [c.value(t / 3, 1, "k") for t in range(600)]
    assert all(0.35 <= v <= 0.65 for v in values)
    assert len(set(values)) > 100
    # noise is a step per whole second and changes with the seed
    assert c.value(10.1, 1, "k") - c.value(10.9, 1, "k") == pytest.approx(
        c.value(10.1, 1, "k") - c.value(10.9, 1, "k"))
    assert [Curve(0.5, noise=0.1).value(t, 1, "k") for t in range(20)] != [
        Curve(0.5, noise=0.1).value(t, 2, "k") for t in range(20)]


def _pods(snapshot: model.PodResourcesSnapshot) -> dict[tuple[str, str], model.PodAllocation]:
    return {(p.namespace, p.name): p for p in snapshot.pods}


def test_scenario_pods_carry_labels_and_the_simulated_api_server_serves_them(tmp_path: Path) -> None:
    from dra_exporter_sim.k8s_objects import pod

    doc = copy.deepcopy(BASE)
    doc["pods"][0]["labels"] = {"team": "platform", "app.kubernetes.io/name": "trainer"}
    scenario = load_scenario(write(tmp_path, doc))
    trainer, job = scenario.pods
    assert trainer.labels == (("app.kubernetes.io/name", "trainer"), ("team", "platform")) and job.labels == ()
    assert pod(scenario, trainer)["metadata"]["labels"] == {"team": "platform", "app.kubernetes.io/name": "trainer"}
    assert "labels" not in pod(scenario, job)["metadata"], "a pod without labels has none, as the API server shows it"


def test_pod_allocations_follow_pod_lifetimes() -> None:
    s = load_scenario("demo")
    before, after = _pods(s.pod_allocations_at(899.9)), _pods(s.pod_allocations_at(900))
    assert ("batch", "tokenize-job-7") in before
    assert ("batch", "tokenize-job-7") not in after
    assert set(before) - set(after) == {("batch", "tokenize-job-7")}

    small = parse_scenario(BASE)
    assert set(_pods(small.pod_allocations_at(9.99))) == {("ml", "trainer")}
    assert set(_pods(small.pod_allocations_at(10))) == {("ml", "trainer"), ("ml", "job")}
    assert set(_pods(small.pod_allocations_at(100))) == {("ml", "trainer")}


def test_pod_allocations_carry_every_claim_device_with_cdi_names() -> None:
    s = load_scenario("demo")
    pods = _pods(s.pod_allocations_at(0))
    train = pods[("ml-training", "llama-train-0")]
    (container,) = train.containers
    assert container.name == "trainer"
    (use,) = container.claims
    claim = s.claim("ml-training", "llama-train-gpus")
    assert claim is not None
    assert (use.namespace, use.name) == ("ml-training", "llama-train-gpus")
    # As a real kubelet lists them: device k also carries the CDI names of the claim's devices before it.
    assert use.devices == tuple(
        model.ClaimDevice("gpu.nvidia.com", "sim-node-1", f"gpu-{i}",
                          tuple(f"k8s.gpu.nvidia.com/claim={claim.uid}-gpu-{j}" for j in range(i + 1)))
        for i in range(4))
    exporter = pods[("monitoring", "dra-exporter-x7k2p")].containers[0]
    assert exporter.name == "exporter" and exporter.claims[0].name == "dra-exporter-gpus"
    assert len(exporter.claims[0].devices) == 6
    for name in ("notebook-alice", "notebook-bob"):
        assert pods[("research", name)].containers[0].claims[0].devices[0].device == "gpu-6"
    assert pods[("batch", "tokenize-job-7")].containers[0].claims[0].devices[0].device == "gpu-5-mig-19-3-1"


def test_plugin_devices_are_reported_as_written() -> None:
    doc = copy.deepcopy(BASE)
    s0 = parse_scenario(doc)
    mig_uuid = s0.gpus[1].mig[1].uuid
    doc["pods"][0]["containers"][0]["plugin_devices"] = [
        {"resource": "nvidia.com/gpu", "ids": [0]},
        {"resource": "nvidia.com/mig-1g.18gb", "ids": [mig_uuid]},
    ]
    s = parse_scenario(doc)
    container = _pods(s.pod_allocations_at(0))[("ml", "trainer")].containers[0]
    assert container.plugin_devices == (model.PluginDevices("nvidia.com/gpu", ("0",)),
                                        model.PluginDevices("nvidia.com/mig-1g.18gb", (mig_uuid,)))
    doc["pods"][0]["containers"][0]["plugin_devices"][1]["resource"] = "nvidia.com/mig-3g.71gb"
    with pytest.raises(ScenarioError, match="is not a 3g.71gb MIG device UUID"):
        parse_scenario(doc)


def test_non_nvidia_driver_devices_pass_through() -> None:
    doc = copy.deepcopy(BASE)
    doc["claims"].append({"namespace": "ml", "name": "nic", "driver": "net.example.com", "devices": ["eth1"]})
    doc["pods"][0]["containers"][0]["claims"].append("nic")
    s = parse_scenario(doc)
    use = _pods(s.pod_allocations_at(0))[("ml", "trainer")].containers[0].claims[1]
    assert use.devices == (model.ClaimDevice("net.example.com", "n1", "eth1", ()),)


def test_active_faults_window_and_kind_filter() -> None:
    doc = copy.deepcopy(BASE)
    doc["faults"] = [
        {"kind": "kubelet_slow", "at": 10, "until": 20, "delay": 1.5},
        {"kind": "gpu_lost", "gpu": 1, "at": 15},
    ]
    s = parse_scenario(doc)
    assert s.active_faults(9.9) == ()
    assert [f.kind for f in s.active_faults(10)] == ["kubelet_slow"]
    assert s.active_faults(10, "kubelet_slow")[0].params["delay"] == 1.5
    assert [f.kind for f in s.active_faults(15)] == ["kubelet_slow", "gpu_lost"]
    assert [f.kind for f in s.active_faults(20)] == ["gpu_lost"]
    assert s.active_faults(1e6, "gpu_lost")[0].gpu == 1
    assert s.active_faults(15, "init_failure") == ()


def test_scenario_is_hashable_and_frozen() -> None:
    s = load_scenario("demo")
    hash(s)
    with pytest.raises(AttributeError):
        s.node_name = "x"  # type: ignore[misc]
    assert isinstance(s, Scenario)


def test_gpu_devices_and_names_round_trip() -> None:
    s = load_scenario("demo")
    devices = s.gpu_devices()
    assert len(devices) == 8 + 2 + 7
    assert len({d.pci_bus_id for d in devices if not d.is_mig}) == 8
    for d in devices:
        name = s.device_name(d.uuid)
        assert name is not None and s.nvml_uuid(name) == d.uuid
