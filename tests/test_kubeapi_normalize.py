"""API objects of every served resource.k8s.io version normalise into one model (plain dicts in).

The dicts are written the way the API server sends them (camelCase JSON), after the shapes in
reference/dra-api.md §2.2-2.4: v1/v1beta2 flat devices, v1beta1 devices nested under ``basic``.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from dra_exporter import model
from dra_exporter.quantity import quantity
from dra_exporter.sources.kubeapi_normalize import (
    attribute_value,
    choose_version,
    claim_from_dict,
    claim_requests,
    current_slices,
    pod_from_dict,
    resource_id,
    served_versions,
    slice_from_dict,
    slices_for_node,
    taint_rule_from_dict,
)

NODE = "gpu-node-1"
DRV = "gpu.nvidia.com"
GPU_UUID = "GPU-4b3c8f0e-1d2a-4c5b-9e8f-7a6b5c4d3e2f"
MIG_UUID = "MIG-0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b"


def flat_devices() -> list[dict[str, Any]]:
    """Devices as v1 and v1beta2 write them."""
    return [
        {"name": "gpu-0",
         "attributes": {"uuid": {"string": GPU_UUID}, "type": {"string": "gpu"},
                        "productName": {"string": "NVIDIA H200"}, "cudaComputeCapability": {"version": "9.0.0"},
                        "resource.kubernetes.io/pciBusID": {"string": "0000:18:00.0"},
                        "gpu.nvidia.com/brand": {"string": "Nvidia"}, "index": {"int": 0},
                        "multiInstance": {"bool": True}},
         "capacity": {"memory": {"value": "143771Mi"}},
         "consumesCounters": [{"counterSet": "gpu-0-counter-set",
                               "counters": {"memory": {"value": "141Gi"}, "multiprocessors": {"value": "132"}}}],
         "taints": [{"key": "gpu.nvidia.com/unhealthy", "value": "xid-79", "effect": "NoExecute",
                     "timeAdded": "2026-01-02T03:04:05Z"}]},
        {"name": "gpu-1-mig-1g18gb-19-0",
         "attributes": {"uuid": {"string": MIG_UUID}, "type": {"string": "mig"}, "profile": {"string": "1g.18gb"},
                        "parentUUID": {"string": GPU_UUID}},
         "capacity": {"memory": {"value": "16Gi"}, "multiprocessors": {"value": "16"}}},
    ]


def nested_devices() -> list[dict[str, Any]]:
    """The same devices as v1beta1 writes them: every field under ``basic``."""
    return [{"name": d["name"], "basic": {k: v for k, v in d.items() if k != "name"}} for d in flat_devices()]


def resource_slice(version: str, *, generation: int = 3) -> dict[str, Any]:
    devices = nested_devices() if version == "v1beta1" else flat_devices()
    spec: dict[str, Any] = {
        "driver": DRV, "pool": {"name": NODE, "generation": generation, "resourceSliceCount": 1},
        "nodeName": NODE, "devices": devices,
        "sharedCounters": [{"name": "gpu-0-counter-set",
                            "counters": {"memory": {"value": "141Gi"}, "multiprocessors": {"value": "132"}}}],
    }
    if version == "v1beta1":
        spec["allNodes"] = False  # plain values in v1beta1, omitted pointers in v1beta2/v1
    return {"apiVersion": f"resource.k8s.io/{version}", "kind": "ResourceSlice",
            "metadata": {"name": f"{NODE}-gpu.nvidia.com-abcde", "resourceVersion": "17"}, "spec": spec}


@pytest.mark.parametrize("version", ["v1", "v1beta2", "v1beta1"])
def test_every_version_normalises_to_the_same_slice(version: str) -> None:
    sl = slice_from_dict(resource_slice(version), version)
    assert (sl.driver, sl.pool, sl.generation, sl.resource_slice_count, sl.node_name) == (DRV, NODE, 3, 1, NODE)
    gpu, mig = sl.devices
    assert gpu.name == "gpu-0"
    assert dict(gpu.attributes) == {
        "uuid": GPU_UUID, "type": "gpu", "productName": "NVIDIA H200", "cudaComputeCapability": "9.0.0",
        "resource.kubernetes.io/pciBusID": "0000:18:00.0", "brand": "Nvidia", "index": "0", "multiInstance": "true"}
    assert dict(gpu.capacity) == {"memory": 143771 * 2**20}
    assert gpu.consumes_counters == (model.CounterConsumption(
        "gpu-0-counter-set", (("memory", 141 * 2.0**30), ("multiprocessors", 132.0))),)
    assert gpu.taints == (model.DeviceTaint("gpu.nvidia.com/unhealthy", "xid-79", "NoExecute"),)
    assert (mig.attribute("uuid"), mig.attribute("profile"), mig.attribute("parentUUID")) == (
        MIG_UUID, "1g.18gb", GPU_UUID)
    assert sl.shared_counters == (model.CounterSet(
        "gpu-0-counter-set", (("memory", 141 * 2.0**30), ("multiprocessors", 132.0))),)
    others = {v: slice_from_dict(resource_slice(v), v) for v in ("v1", "v1beta2", "v1beta1")}
    assert len(set(others.values())) == 1, "one model whatever the version"


def test_v1alpha3_bare_quantities_and_v1beta1_nesting() -> None:
    raw = resource_slice("v1beta1")
    raw["spec"]["devices"][0]["basic"]["capacity"] = {"memory": "80Gi"}  # 1.31's bare quantity
    sl = slice_from_dict(raw, "v1alpha3")
    assert dict(sl.devices[0].capacity) == {"memory": 80 * 2.0**30}
    # A v1 reader does not look under ``basic``: no attributes leak in from a wrong version.
    assert slice_from_dict(resource_slice("v1beta1"), "v1").devices[0].attributes == ()


def test_attribute_unions_and_lists() -> None:
    assert attribute_value({"int": 7}) == "7"
    assert attribute_value({"bool": False}) == "false"
    assert attribute_value({"version": "1.2.3"}) == "1.2.3"
    assert attribute_value({"strings": ["a", "b"]}) == "a,b"
    assert attribute_value({"ints": [1, 2]}) == "1,2"
    assert attribute_value({}) is None


def test_quantities_in_base_units() -> None:
    assert quantity("80Gi") == 80 * 2**30
    assert quantity("1500m") == 1.5
    assert quantity("12") == 12.0
    assert quantity(4) == 4.0
    assert quantity("1e3") == 1000.0
    for bad in ("lots", "", None, True, [1]):
        assert quantity(bad) is None


def test_highest_pool_generation_wins_per_pool() -> None:
    old = slice_from_dict(resource_slice("v1", generation=2), "v1")
    new = slice_from_dict(resource_slice("v1", generation=3), "v1")
    other = model.ResourceSliceInfo("x", "nic.example.com", NODE, 1)
    assert set(current_slices([old, new, other])) == {new, other}


def test_hostile_objects_read_as_empty_not_as_errors() -> None:
    raw = resource_slice("v1")
    raw["spec"]["pool"] = {"name": NODE, "generation": "9"}  # int64 may arrive as a string
    raw["spec"]["devices"] += ["not-a-device", {"name": 5}, {"name": "d", "attributes": "x",
                                                              "capacity": {"memory": {"value": "lots"}},
                                                              "taints": [{"effect": "NoSchedule"}]}]
    sl = slice_from_dict(raw, "v1")
    assert sl.generation == 9
    # In the slice's order, which is the order the scheduler tries them in.
    assert [d.name for d in sl.devices] == ["gpu-0", "gpu-1-mig-1g18gb-19-0", "d"]
    assert sl.devices[-1] == model.SliceDevice("d")
    assert slice_from_dict({"spec": None, "metadata": []}, "v1") == model.ResourceSliceInfo("", "", "")
    assert claim_from_dict({"status": {"allocation": {"devices": {"results": [None, {}]}}}}, "v1").results == ()
    assert pod_from_dict({"spec": {"containers": [{"name": "c", "resources": {"claims": "x"}}]}}).containers == (
        model.ContainerInfo("c"),)


def test_api_versions_from_discovery() -> None:
    group = {"kind": "APIGroup", "name": "resource.k8s.io",
             "versions": [{"groupVersion": "resource.k8s.io/v1beta2", "version": "v1beta2"},
                          {"groupVersion": "resource.k8s.io/v1beta1", "version": "v1beta1"},
                          {"groupVersion": "resource.k8s.io/v1alpha3", "version": "v1alpha3"}]}
    assert served_versions(group) == ("v1beta2", "v1beta1", "v1alpha3")
    assert choose_version(served_versions(group)) == "v1beta2"
    assert choose_version(["v1beta1", "v1", "v1beta2"]) == "v1"
    assert choose_version(["v1", "v1beta1"], usable=["v1beta1", "v1beta2"]) == "v1beta1", "an older client"
    assert choose_version(["v1alpha3"]) is None


# --- ResourceClaim ----------------------------------------------------------------------------


def resource_claim(version: str) -> dict[str, Any]:
    if version == "v1beta1":
        requests = [{"name": "gpus", "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 2},
                    {"name": "watch", "deviceClassName": "gpu.nvidia.com", "adminAccess": True}]
    else:
        requests = [{"name": "gpus", "firstAvailable": [
            {"name": "h200", "deviceClassName": "gpu.nvidia.com", "count": 2},
            {"name": "any", "deviceClassName": "gpu.nvidia.com"}]},
            {"name": "watch", "exactly": {"deviceClassName": "gpu.nvidia.com", "adminAccess": True}}]
    return {
        "apiVersion": f"resource.k8s.io/{version}", "kind": "ResourceClaim",
        "metadata": {"namespace": "ml", "name": "train-0-gpus-x7k2p", "uid": "c1a1m-uid",
                     "annotations": {"resource.kubernetes.io/pod-claim-name": "gpus"}},
        "spec": {"devices": {"requests": requests}},
        "status": {
            "allocation": {"devices": {"results": [
                {"request": "gpus/h200", "driver": DRV, "pool": NODE, "device": "gpu-0"},
                {"request": "gpus/h200", "driver": DRV, "pool": NODE, "device": "gpu-1", "adminAccess": False},
                {"request": "watch", "driver": DRV, "pool": NODE, "device": "gpu-2", "adminAccess": True},
                {"request": "gpus/h200", "driver": DRV, "pool": NODE, "device": "gpu-3", "shareID": "share-1"},
            ]}, "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]}},
            "reservedFor": [{"resource": "pods", "name": "train-0", "uid": "pod-uid-0"}],
            "devices": [{"driver": DRV, "pool": NODE, "device": "gpu-0",
                         "conditions": [{"type": "Ready", "status": "True", "reason": "Prepared",
                                         "lastTransitionTime": "2026-01-02T03:04:05Z"}],
                         "data": {"anything": 1}}],
        },
    }


@pytest.mark.parametrize("version", ["v1", "v1beta2", "v1beta1"])
def test_claims_normalise_with_request_names_admin_access_consumers_and_conditions(version: str) -> None:
    claim = claim_from_dict(resource_claim(version), version)
    assert (claim.namespace, claim.name, claim.uid) == ("ml", "train-0-gpus-x7k2p", "c1a1m-uid")
    assert claim.results == (
        model.AllocationResult("gpus/h200", DRV, NODE, "gpu-0"),
        model.AllocationResult("gpus/h200", DRV, NODE, "gpu-1"),
        model.AllocationResult("watch", DRV, NODE, "gpu-2", admin_access=True),
        model.AllocationResult("gpus/h200", DRV, NODE, "gpu-3", share_id="share-1"),
    )
    assert claim.reserved_for == (model.ConsumerRef("pods", "train-0", "pod-uid-0"),)
    assert claim.devices == (model.ClaimDeviceStatus(DRV, NODE, "gpu-0", conditions=(
        model.DeviceCondition("Ready", "True", "Prepared"),)),)
    assert claim.results[0].serves("gpus") and claim.results[0].serves("gpus/h200") and claim.results[0].serves("")
    assert not claim.results[0].serves("gpu") and not claim.results[2].serves("gpus")


@pytest.mark.parametrize("version", ["v1", "v1beta2", "v1beta1"])
def test_claim_requests_read_alike_in_every_version(version: str) -> None:
    # v1beta1 writes an exactly request flat on the request; v1 and v1beta2 under `exactly`.
    exact = {"deviceClassName": "mig.nvidia.com", "allocationMode": "All"}
    requests: list[dict[str, Any]] = [
        {"name": "gpus", **exact} if version == "v1beta1" else {"name": "gpus", "exactly": exact},
        {"name": "pick", "firstAvailable": [{"name": "big", "deviceClassName": "gpu.nvidia.com", "count": 1},
                                            {"name": "small", "deviceClassName": "mig.nvidia.com"}]},
        {"name": "one", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1}}
        if version != "v1beta1" else {"name": "one", "deviceClassName": "gpu.nvidia.com", "count": 1},
        {"exactly": {"deviceClassName": "nameless"}},
    ]
    assert claim_requests({"requests": requests}, version) == (
        model.DeviceRequestInfo("gpus", "mig.nvidia.com", all_devices=True),
        model.DeviceRequestInfo("pick/big", "gpu.nvidia.com"),
        model.DeviceRequestInfo("pick/small", "mig.nvidia.com"),
        model.DeviceRequestInfo("one", "gpu.nvidia.com"),
    )
    assert claim_requests({"requests": "x"}, version) == ()


def test_unallocated_claim_has_no_results() -> None:
    raw = resource_claim("v1")
    raw["status"] = {}
    assert claim_from_dict(raw, "v1").results == ()


# --- Pod ---------------------------------------------------------------------------------------------


def pod() -> dict[str, Any]:
    return {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"namespace": "ml", "name": "train-0", "uid": "pod-uid-0"},
        "spec": {
            "nodeName": NODE,
            "resourceClaims": [{"name": "gpus", "resourceClaimTemplateName": "train-gpus"},
                               {"name": "shared", "resourceClaimName": "team-shared"},
                               {"name": "optional", "resourceClaimTemplateName": "maybe"}],
            "initContainers": [{"name": "sidecar", "restartPolicy": "Always",
                                "resources": {"claims": [{"name": "shared"}]}}],
            "containers": [
                {"name": "trainer", "resources": {"claims": [{"name": "gpus", "request": "gpus"},
                                                             {"name": "shared"}]}},
                {"name": "logger", "resources": {}},
            ],
        },
        "status": {
            "phase": "Running",
            "resourceClaimStatuses": [{"name": "gpus", "resourceClaimName": "train-0-gpus-x7k2p"},
                                      {"name": "optional"}],
            "initContainerStatuses": [{"name": "sidecar", "containerID": "containerd://aaa"}],
            "containerStatuses": [
                {"name": "trainer", "containerID": "containerd://bbb", "allocatedResourcesStatus": [
                    {"name": "claim:gpus/gpus", "resources": [
                        {"resourceID": f"{DRV}/{NODE}/gpu-0", "health": "Healthy"},
                        {"resourceID": f"{DRV}/{NODE}/gpu-1", "health": "Unhealthy"}]},
                    {"name": "claim:shared", "resources": [
                        {"resourceID": "nic.example.com/rack-1/pool-a/eth-3"}]},
                    {"name": "nvidia.com/gpu", "resources": [{"resourceID": "GPU-abc", "health": "Healthy"}]},
                ]},
                {"name": "logger"},
            ],
        },
    }


def test_pod_claims_requests_container_ids_and_health() -> None:
    info = pod_from_dict(pod())
    assert (info.namespace, info.name, info.uid, info.phase) == ("ml", "train-0", "pod-uid-0", "Running")
    assert info.claims == ("team-shared", "train-0-gpus-x7k2p"), "the optional claim was not needed"
    assert [c.name for c in info.containers] == ["logger", "sidecar", "trainer"]
    trainer = info.container("trainer")
    assert trainer is not None and trainer.container_id == "containerd://bbb"
    assert trainer.claims == (model.ContainerClaim("gpus", "train-0-gpus-x7k2p", "gpus"),
                              model.ContainerClaim("shared", "team-shared", ""))
    assert trainer.health == (
        model.DeviceHealth("team-shared", "", "nic.example.com", "rack-1/pool-a", "eth-3", "Unknown"),
        model.DeviceHealth("train-0-gpus-x7k2p", "gpus", DRV, NODE, "gpu-0", "Healthy"),
        model.DeviceHealth("train-0-gpus-x7k2p", "gpus", DRV, NODE, "gpu-1", "Unhealthy"),
    ), "pool names may hold '/'; device-plugin entries are not DRA health"
    assert info.container("sidecar") == model.ContainerInfo(
        "sidecar", "containerd://aaa", (model.ContainerClaim("shared", "team-shared", ""),))
    assert not info.terminal


def test_template_claim_not_yet_generated_has_no_object_name() -> None:
    raw = pod()
    del raw["status"]["resourceClaimStatuses"]
    info = pod_from_dict(raw)
    assert info.claims == ("team-shared",)
    trainer = info.container("trainer")
    assert trainer is not None and model.ContainerClaim("gpus", "", "gpus") in trainer.claims


def test_extended_resource_claims_count_for_their_containers() -> None:
    raw = copy.deepcopy(pod())
    raw["status"]["extendedResourceClaimStatus"] = {
        "resourceClaimName": "train-0-extended-resources-q9z",
        "requestMappings": [{"containerName": "logger", "resourceName": "nvidia.com/gpu",
                             "requestName": "container-1-request-0"}]}
    info = pod_from_dict(raw)
    assert "train-0-extended-resources-q9z" in info.claims
    logger = info.container("logger")
    assert logger is not None and logger.claims == (
        model.ContainerClaim("", "train-0-extended-resources-q9z", "container-1-request-0"),)


def test_finished_pods_are_terminal() -> None:
    raw = pod()
    raw["status"]["phase"] = "Succeeded"
    assert pod_from_dict(raw).terminal


def test_resource_ids() -> None:
    assert resource_id("gpu.nvidia.com/node-1/gpu-0") == ("gpu.nvidia.com", "node-1", "gpu-0")
    assert resource_id("d/a/b/c") == ("d", "a/b", "c")
    for bad in ("", "gpu-0", "d/p", "/p/d", "d//x", "d/p/"):
        assert resource_id(bad) is None, bad


def test_health_named_by_cdi_id_keeps_the_id_and_the_bounded_message() -> None:
    # The kubelet names a device by its first CDI device ID when the driver returned one (NVIDIA
    # always does), else by driver/pool/device; 1.36 adds a free-text message.
    obj = pod()
    obj["status"]["containerStatuses"][0]["allocatedResourcesStatus"] = [
        {"name": "claim:gpus/gpus", "resources": [
            {"resourceID": "k8s.gpu.nvidia.com/claim=claim-uid-1-gpu-0", "health": "Unhealthy",
             "message": "XID 79\non the bus " + "x" * 5000},
            {"resourceID": f"{DRV}/{NODE}/gpu-1", "health": "Healthy"}]}]
    trainer = pod_from_dict(obj).container("trainer")
    assert trainer is not None
    by_cdi = {h.cdi_id: h for h in trainer.health}
    cdi = by_cdi["k8s.gpu.nvidia.com/claim=claim-uid-1-gpu-0"]
    assert (cdi.claim, cdi.request, cdi.driver, cdi.pool, cdi.device, cdi.health) == (
        "train-0-gpus-x7k2p", "gpus", "", "", "", "Unhealthy"), "resolved later, in the join"
    assert cdi.message.startswith("XID 79 on the bus x") and len(cdi.message) <= 256, "one line, bounded"
    triplet = by_cdi[""]
    assert (triplet.driver, triplet.pool, triplet.device, triplet.message) == (DRV, NODE, "gpu-1", "")


# --- slices that select nodes, DeviceTaintRules, 1.34+ allocation and device-status fields ----------


def placed_slice(name: str, version: str = "v1", **spec: Any) -> model.ResourceSliceInfo:
    body = {"driver": "nic.example.com", "pool": {"name": "fabric", "generation": 1}, **spec}
    return slice_from_dict({"metadata": {"name": name}, "spec": body}, version)


def rack(value: str, op: str = "In") -> dict[str, Any]:
    return {"nodeSelectorTerms": [{"matchExpressions": [{"key": "rack", "operator": op, "values": [value]}]}]}


def test_slices_that_name_no_node_cover_this_node_by_all_nodes_selector_or_per_device() -> None:
    slices = [
        placed_slice("everywhere", allNodes=True),
        placed_slice("rack-1", nodeSelector=rack("r1"), devices=[{"name": "a"}]),
        placed_slice("rack-2", nodeSelector=rack("r2"), devices=[{"name": "b"}]),
        placed_slice("by-name", nodeSelector={"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [NODE]}]}]}, devices=[{"name": "c"}]),
        placed_slice("per-device", perDeviceNodeSelection=True, devices=[
            {"name": "mine", "nodeName": NODE}, {"name": "theirs", "nodeName": "other"},
            {"name": "shared", "allNodes": True}, {"name": "rack-1-only", "nodeSelector": rack("r1")}]),
        placed_slice("beta1-unset", "v1beta1", nodeName="", allNodes=False, devices=[{"name": "d", "basic": {}}]),
        placed_slice("counters", sharedCounters=[{"name": "cs", "counters": {"bw": {"value": "100"}}}]),
    ]
    covered = {s.name: [d.name for d in s.devices] for s in slices_for_node(slices, NODE, {"rack": "r1"})}
    assert covered == {"everywhere": [], "rack-1": ["a"], "by-name": ["c"],
                       "per-device": ["mine", "shared", "rack-1-only"], "counters": []}, \
        "a counters-only slice without a node stays with the device slices of its pool"
    # Without the node's labels (no RBAC for nodes), a label selector is not taken as matching.
    unknown = {s.name: [d.name for d in s.devices] for s in slices_for_node(slices, NODE, None)}
    assert unknown == {"everywhere": [], "by-name": ["c"], "per-device": ["mine", "shared"], "counters": []}
    assert not slices_for_node([placed_slice("x", nodeSelector=rack("r1", "NotIn"))], NODE, {"rack": "r1"})


def test_device_taint_rules_in_every_version_and_the_old_cel_selector() -> None:
    rule = taint_rule_from_dict({"metadata": {"name": "drain-gpu-1"}, "spec": {
        "deviceSelector": {"driver": DRV, "pool": NODE, "device": "gpu-1"},
        "taint": {"key": "example.com/drain", "value": "yes", "effect": "NoExecute",
                  "timeAdded": "2026-01-01T00:00:00Z"}}})
    assert rule == model.DeviceTaintRule("drain-gpu-1", model.DeviceTaint("example.com/drain", "yes", "NoExecute"),
                                         DRV, NODE, "gpu-1")
    assert rule.selects(DRV, NODE, "gpu-1") and not rule.selects(DRV, NODE, "gpu-0")
    old = taint_rule_from_dict({"metadata": {"name": "cel"}, "spec": {
        "deviceSelector": {"selectors": [{"cel": {"expression": "true"}}]},
        "taint": {"key": "k", "effect": "NoSchedule"}}})
    assert old.unsupported_selector and not old.selects(DRV, NODE, "gpu-0")
    assert taint_rule_from_dict({"spec": "garbage"}).taint == model.DeviceTaint("")


def test_allocation_tolerations_consumed_capacity_share_and_device_status_identity() -> None:
    info = claim_from_dict({"metadata": {"namespace": "ml", "name": "g", "uid": "u"}, "status": {
        "allocation": {"devices": {"results": [{
            "request": "gpu", "driver": DRV, "pool": NODE, "device": "gpu-0", "shareID": "share-1",
            "consumedCapacity": {"memory": "16Gi", "bad": "lots"},
            "tolerations": [{"key": "gpu.nvidia.com/xid", "operator": "Exists", "effect": "NoExecute"},
                            {"operator": "Exists"}, {"value": "keyless Equal: invalid"}]}]}},
        "devices": [
            {"driver": DRV, "pool": NODE, "device": "gpu-0", "data": {"UUID": "MIG-1234", "profile": "1g.18gb"}},
            {"driver": "nic.example.com", "pool": "rack", "device": "eth-0", "data": ["not", "a", "map"],
             "networkData": {"interfaceName": "net1", "hardwareAddress": "aa:bb", "ips": ["10.0.0.2/24", 7]}}]}},
        "v1")
    (r,) = info.results
    assert (r.share_id, r.consumed_capacity) == ("share-1", (("memory", 16.0 * 2**30),))
    assert r.tolerations == (model.DeviceToleration("", "Exists"),
                             model.DeviceToleration("gpu.nvidia.com/xid", "Exists", "", "NoExecute"))
    gpu_status, nic = info.devices
    assert (gpu_status.uuid, gpu_status.network) == ("MIG-1234", None)
    assert (nic.uuid, nic.network) == ("", model.NetworkDeviceData("net1", "aa:bb", ("10.0.0.2/24",)))


def test_a_pod_keeps_only_the_allowlisted_labels_and_each_value_bounded() -> None:
    raw = {"metadata": {"namespace": "ml", "name": "p", "uid": "u",
                        "labels": {"team": "platform", "secret-ish": "x", "cost-center": "c" * 5000, "n": 7}}}
    assert pod_from_dict(raw).labels == (), "nothing is kept without an allowlist"
    kept = pod_from_dict(raw, ("team", "cost-center", "n", "absent")).labels
    assert kept == (("cost-center", "c" * 63), ("team", "platform")), "a non-string value reads as absent"
    assert pod_from_dict({"metadata": {"labels": ["team"]}}, ("team",)).labels == ()
