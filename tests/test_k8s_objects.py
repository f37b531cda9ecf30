"""Scenario → Kubernetes objects: shapes per resource.k8s.io version, as the real client reads them."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes import client as k8s

from dra_exporter.dra_versions import convert
from dra_exporter_sim import k8s_objects as ko
from dra_exporter_sim import load_scenario
from dra_exporter_sim.scenario import Scenario, ScenarioError
from dra_exporter_sim.scenario_builder import parse_scenario

# The client's model for each kind and version (37.x names; v1's claim is ResourceV1ResourceClaim).
MODELS = {
    "v1": {"ResourceSlice": "V1ResourceSlice", "ResourceClaim": "ResourceV1ResourceClaim"},
    "v1beta2": {"ResourceSlice": "V1beta2ResourceSlice", "ResourceClaim": "V1beta2ResourceClaim"},
    "v1beta1": {"ResourceSlice": "V1beta1ResourceSlice", "ResourceClaim": "V1beta1ResourceClaim"},
}

# A small node using every scenario feature the objects show.
FEATURES: dict[str, Any] = {
    "node": "n1",
    "seed": 3,
    "gpus": [
        {"index": 0, "taints": [{"key": "example.com/maintenance", "value": "fan", "effect": "NoSchedule"}]},
        {"index": 1},
        {
            "index": 2,
            "mig": [
                {"profile": "3g.71gb", "placement_start": 0},
                {
                    "profile": "1g.18gb",
                    "placement_start": 4,
                    "taints": [{"key": "example.com/ecc", "effect": "NoExecute"}],
                },
            ],
        },
    ],
    "slices": [
        {
            "driver": "gpu.example.com",
            "devices": [
                {
                    "name": "gpu-0",
                    "attributes": {
                        "index": 0,
                        "model": "LATEST-GPU-MODEL",
                        "healthy": True,
                        "driverVersion": {"version": "1.0.0"},
                    },
                    "capacity": {"memory": "80Gi", "compute": 100},
                }
            ],
        }
    ],
    "claims": [
        {
            "namespace": "ml",
            "name": "train",
            "requests": [{"name": "gpus", "devices": ["gpu-1"]}],
            "device_status": [
                {
                    "device": "gpu-1",
                    "conditions": [
                        {
                            "type": "Healthy",
                            "status": "False",
                            "reason": "XidError",
                            "message": "XID 79",
                            "at": 30,
                        }
                    ],
                }
            ],
        },
        {
            "namespace": "ml",
            "name": "infer",
            "requests": [
                {
                    "name": "gpu",
                    "allocated": "mig-3g",
                    "devices": ["gpu-2-mig-3g71gb-9-0"],
                    "first_available": [
                        {"name": "h200", "device_class": "gpu.nvidia.com"},
                        {"name": "mig-3g", "device_class": "mig.nvidia.com"},
                    ],
                }
            ],
        },
        {"namespace": "ml", "name": "job-gpu", "template": "job-tmpl", "devices": ["gpu-2-mig-1g18gb-19-4"]},
        {
            "namespace": "mon",
            "name": "all",
            "admin_access": True,
            "requests": [{"name": "all", "all": True, "devices": ["gpu-0", "gpu-1"]}],
        },
        {"namespace": "ml", "name": "ex", "driver": "gpu.example.com", "devices": ["gpu-0"]},
    ],
    "pods": [
        {
            "namespace": "ml",
            "name": "trainer",
            "containers": [
                {
                    "name": "main",
                    "claims": [{"claim": "train", "request": "gpus"}],
                    "device_health": {"gpu-1": "Unhealthy"},
                },
                {"name": "side"},
            ],
        },
        {"namespace": "ml", "name": "server", "containers": [{"name": "vllm", "claims": ["infer", "ex"]}]},
        {
            "namespace": "ml",
            "name": "job",
            "start": 10,
            "end": 100,
            "containers": [{"name": "job", "claims": ["job-gpu"]}],
        },
        {"namespace": "mon", "name": "exporter", "containers": [{"name": "exporter", "claims": ["all"]}]},
    ],
}


def features(**changes: Any) -> Scenario:
    return parse_scenario({**FEATURES, **changes}, "features.yaml")


def by_name(items: list[dict[str, Any]] | tuple[dict[str, Any], ...]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in items}


def nvidia_devices(objects: ko.ClusterObjects) -> dict[str, dict[str, Any]]:
    return {
        d["name"]: d
        for s in objects.resourceslices
        if s["spec"]["driver"] == "gpu.nvidia.com"
        for d in s["spec"].get("devices", [])
    }


def _normalise(value: Any) -> Any:
    # What the client serialises back: no None fields, datetimes as +00:00.
    if isinstance(value, dict):
        return {k: _normalise(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_normalise(v) for v in value]
    if isinstance(value, str) and value.endswith("+00:00"):
        return value[:-6] + "Z"
    return value


def round_trip(obj: dict[str, Any], model: str) -> Any:
    """Deserialise through the client's model and back; a field the model does not know is lost."""
    api = k8s.ApiClient()
    return _normalise(
        api.sanitize_for_serialization(api.deserialize(json.dumps(obj), model, "application/json"))
    )


# --- NVIDIA's slice ------------------------------------------------------------------------------


def test_demo_slice_is_nvidias_one_slice_per_node_with_nvml_uuids() -> None:
    s = load_scenario("demo")
    objects = ko.cluster_objects(s, 50)
    (nvidia,) = [x for x in objects.resourceslices if x["spec"]["driver"] == "gpu.nvidia.com"]
    spec = nvidia["spec"]
    assert spec["nodeName"] == "sim-node-1"
    assert spec["pool"] == {"name": "sim-node-1", "generation": 1, "resourceSliceCount": 1}
    assert nvidia["metadata"]["name"].startswith("sim-node-1-gpu.nvidia.com-")
    devices = nvidia_devices(objects)
    # MIG-enabled GPUs 4 and 5 are published as their MIG devices only, and a device is published
    # under the name the claims use (the batch job's claim uses the older format). The one made by
    # hand (placement 5, ``published: false``) is in NVML only.
    assert sorted(devices) == sorted(
        [f"gpu-{i}" for i in (0, 1, 2, 3, 6, 7)]
        + ["gpu-4-mig-3g71gb-9-0", "gpu-4-mig-3g71gb-9-4"]
        + [f"gpu-5-mig-1g18gb-19-{i}" for i in (0, 1, 2, 4, 6)]
        + ["gpu-5-mig-19-3-1"]
    )
    by_uuid = {d["attributes"]["uuid"]["string"]: d for d in devices.values()}
    unpublished = {m.uuid for g in s.gpus for m in g.mig if not m.published}
    assert len(unpublished) == 1
    for dev in s.gpu_devices():
        if dev.mig_mode == "enabled" or dev.uuid in unpublished:
            assert dev.uuid not in by_uuid
            continue
        attrs = by_uuid[dev.uuid]["attributes"]
        assert attrs["uuid"] == {"string": dev.uuid}
        assert attrs["type"] == {"string": "mig" if dev.is_mig else "gpu"}
        assert attrs["productName"] == {"string": "NVIDIA H200"}
        assert attrs["driverVersion"] == {"version": "580.159.4"}
        assert attrs["resource.kubernetes.io/pciBusID"] == {"string": dev.pci_bus_id[4:].lower()}
        if dev.is_mig:
            assert attrs["parentUUID"] == {"string": dev.parent_uuid}
            assert attrs["profile"] == {"string": dev.profile}
    assert devices["gpu-0"]["capacity"] == {"memory": {"value": "143771Mi"}}
    mig = devices["gpu-4-mig-3g71gb-9-4"]["capacity"]
    assert mig["multiprocessors"] == {"value": "60"}
    assert [k for k in mig if k.startswith("memorySlice")] == [f"memorySlice{i}" for i in (4, 5, 6, 7)]
    # The demo's idle gpu-7 is tainted.
    assert devices["gpu-7"]["taints"] == [
        {
            "key": "example.com/maintenance",
            "value": "fan-check",
            "effect": "NoSchedule",
            "timeAdded": ko.timestamp(0),
        }
    ]
    assert "taints" not in devices["gpu-6"]


def test_v1beta1_nests_device_fields_under_basic_and_v1_v1beta2_do_not() -> None:
    objects = ko.cluster_objects(features(), 50)
    nvidia = next(x for x in objects.resourceslices if x["spec"]["driver"] == "gpu.nvidia.com")
    for version in ("v1", "v1beta2"):
        converted = convert(nvidia, version)
        assert converted["apiVersion"] == f"resource.k8s.io/{version}"
        gpu0 = converted["spec"]["devices"][0]
        assert "basic" not in gpu0
        assert gpu0["capacity"]["memory"] == {"value": "143771Mi"}
        assert gpu0["taints"][0]["key"] == "example.com/maintenance"
    beta1 = convert(nvidia, "v1beta1")
    gpu0 = beta1["spec"]["devices"][0]
    assert set(gpu0) == {"name", "basic"}
    assert gpu0["basic"]["attributes"]["uuid"]["string"].startswith("GPU-")
    assert gpu0["basic"]["capacity"]["memory"] == {"value": "143771Mi"}
    assert gpu0["basic"]["taints"][0]["effect"] == "NoSchedule"
    assert convert(beta1, "v1") == nvidia  # lossless both ways


def test_other_drivers_slice_has_its_devices_without_nvml_attributes() -> None:
    objects = ko.cluster_objects(features(), 50)
    (example,) = [x for x in objects.resourceslices if x["spec"]["driver"] == "gpu.example.com"]
    assert example["spec"]["pool"]["name"] == "n1"
    assert example["spec"]["devices"] == [
        {
            "name": "gpu-0",
            "attributes": {
                "index": {"int": 0},
                "model": {"string": "LATEST-GPU-MODEL"},
                "healthy": {"bool": True},
                "driverVersion": {"version": "1.0.0"},
            },
            "capacity": {"memory": {"value": "80Gi"}, "compute": {"value": "100"}},
        }
    ]


# --- claims ---------------------------------------------------------------------------------------


def test_claim_requests_exactly_and_first_available_per_version() -> None:
    claims = by_name(ko.cluster_objects(features(), 50).resourceclaims)
    train, infer, admin = claims["train"], claims["infer"], claims["all"]
    assert train["spec"]["devices"]["requests"] == [
        {
            "name": "gpus",
            "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1},
        }
    ]
    assert infer["spec"]["devices"]["requests"] == [
        {
            "name": "gpu",
            "firstAvailable": [
                {
                    "name": "h200",
                    "deviceClassName": "gpu.nvidia.com",
                    "allocationMode": "ExactCount",
                    "count": 1,
                },
                {
                    "name": "mig-3g",
                    "deviceClassName": "mig.nvidia.com",
                    "allocationMode": "ExactCount",
                    "count": 1,
                },
            ],
        }
    ]
    assert infer["status"]["allocation"]["devices"]["results"] == [
        {"request": "gpu/mig-3g", "driver": "gpu.nvidia.com", "pool": "n1", "device": "gpu-2-mig-3g71gb-9-0"}
    ]
    assert admin["spec"]["devices"]["requests"] == [
        {
            "name": "all",
            "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "All", "adminAccess": True},
        }
    ]
    assert all(r["adminAccess"] is True for r in admin["status"]["allocation"]["devices"]["results"])
    # v1beta1 writes an exactly request flat, and keeps firstAvailable as it is.
    assert convert(train, "v1beta1")["spec"]["devices"]["requests"] == [
        {"name": "gpus", "deviceClassName": "gpu.nvidia.com", "allocationMode": "ExactCount", "count": 1}
    ]
    assert convert(infer, "v1beta1")["spec"]["devices"]["requests"] == infer["spec"]["devices"]["requests"]
    assert convert(convert(admin, "v1beta1"), "v1beta2")["spec"] == admin["spec"]


def test_claim_status_reserved_for_node_selector_and_conditions_follow_time() -> None:
    s = features()
    pods = {p.name: p for p in s.pods}
    train_early = by_name(ko.cluster_objects(s, 5).resourceclaims)["train"]
    train = by_name(ko.cluster_objects(s, 50).resourceclaims)["train"]
    assert train["status"]["reservedFor"] == [
        {"resource": "pods", "name": "trainer", "uid": pods["trainer"].uid}
    ]
    assert train["status"]["allocation"]["nodeSelector"] == {
        "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n1"]}]}]
    }
    assert "devices" not in train_early["status"]  # the condition appears at t=30
    assert train["status"]["devices"] == [
        {
            "driver": "gpu.nvidia.com",
            "pool": "n1",
            "device": "gpu-1",
            "conditions": [
                {
                    "type": "Healthy",
                    "status": "False",
                    "reason": "XidError",
                    "message": "XID 79",
                    "lastTransitionTime": ko.timestamp(30),
                }
            ],
        }
    ]


def test_generated_claim_exists_only_while_its_pod_does() -> None:
    s = features()
    job = next(p for p in s.pods if p.name == "job")
    assert "job-gpu" not in by_name(ko.cluster_objects(s, 5).resourceclaims)
    claim = by_name(ko.cluster_objects(s, 50).resourceclaims)["job-gpu"]
    assert claim["metadata"]["annotations"] == {"resource.kubernetes.io/pod-claim-name": "job-tmpl"}
    assert claim["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": "job",
            "uid": job.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert "job-gpu" not in by_name(ko.cluster_objects(s, 100).resourceclaims)
    # A standalone claim stays, with nobody in reservedFor once its pods are gone.
    s2 = features(pods=[], claims=[c for c in FEATURES["claims"] if "template" not in c])
    assert "reservedFor" not in by_name(ko.cluster_objects(s2, 0).resourceclaims)["train"]["status"]


def test_shared_demo_claim_is_reserved_for_both_notebooks() -> None:
    s = load_scenario("demo")
    shared = by_name(ko.cluster_objects(s, 50).resourceclaims)["shared-notebook-gpu"]
    assert [r["name"] for r in shared["status"]["reservedFor"]] == ["notebook-alice", "notebook-bob"]


# --- pods ----------------------------------------------------------------------------------------


def test_pods_carry_claim_references_container_ids_and_health() -> None:
    s = features()
    pods = by_name(ko.cluster_objects(s, 50).pods)
    trainer = pods["trainer"]
    assert trainer["spec"]["nodeName"] == "n1"
    assert trainer["spec"]["resourceClaims"] == [{"name": "train", "resourceClaimName": "train"}]
    assert trainer["spec"]["containers"][0]["resources"] == {"claims": [{"name": "train", "request": "gpus"}]}
    assert "resources" not in trainer["spec"]["containers"][1]
    statuses = trainer["status"]["containerStatuses"]
    want_ids = [c.container_id for c in next(p for p in s.pods if p.name == "trainer").containers]
    train_uid = next(c.uid for c in s.claims if c.name == "train")
    assert [c["containerID"] for c in statuses] == want_ids
    assert statuses[0]["allocatedResourcesStatus"] == [
        {
            "name": "claim:train/gpus",
            # The kubelet names a device by its first CDI ID when the driver returned one (NVIDIA does).
            "resources": [{"resourceID": f"k8s.gpu.nvidia.com/claim={train_uid}-gpu-1", "health": "Unhealthy"}],
        }
    ]
    assert "allocatedResourcesStatus" not in statuses[1]
    job = pods["job"]
    assert job["spec"]["resourceClaims"] == [{"name": "job-tmpl", "resourceClaimTemplateName": "job-tmpl"}]
    assert job["status"]["resourceClaimStatuses"] == [{"name": "job-tmpl", "resourceClaimName": "job-gpu"}]
    assert "resourceClaimStatuses" not in trainer["status"]
    assert set(pods) == {"trainer", "server", "job", "exporter"}
    assert "job" not in by_name(ko.cluster_objects(s, 100).pods)


# --- the client reads all of it -----------------------------------------------------------------


@pytest.mark.parametrize("version", ["v1", "v1beta2", "v1beta1"])
@pytest.mark.parametrize("scenario", ["demo", "features", "dynamic"])
def test_every_object_survives_the_clients_models(version: str, scenario: str) -> None:
    s = {
        "demo": lambda: load_scenario("demo"),
        "features": features,
        "dynamic": lambda: features(dynamic_mig=True, api_version="v1beta2" if version != "v1" else "v1"),
    }[scenario]()
    objects = ko.cluster_objects(s, 50)
    assert objects.resourceslices and objects.resourceclaims and objects.pods
    for obj in (*objects.resourceslices, *objects.resourceclaims):
        converted = convert(obj, version)
        assert round_trip(converted, MODELS[version][obj["kind"]]) == converted
    for pod in objects.pods:
        assert round_trip(pod, "V1Pod") == pod


def test_models_see_the_values_not_just_the_shape() -> None:
    s = load_scenario("demo")
    api = k8s.ApiClient()
    objects = ko.cluster_objects(s, 50)
    beta1 = api.deserialize(
        json.dumps(convert(objects.resourceslices[0], "v1beta1")),
        "V1beta1ResourceSlice",
        "application/json",
    )
    gpu0 = beta1.spec.devices[0]
    assert gpu0.basic.attributes["uuid"].string == s.gpus[0].uuid
    assert gpu0.basic.capacity["memory"].value == "143771Mi"
    claim = api.deserialize(
        json.dumps(by_name(objects.resourceclaims)["vllm-small-0-gpu"]),
        "ResourceV1ResourceClaim",
        "application/json",
    )
    assert claim.spec.devices.requests[0].first_available[1].name == "mig-3g"
    assert claim.status.allocation.devices.results[0].request == "gpu/mig-3g"


# --- DynamicMIG ---------------------------------------------------------------------------------


def test_dynamic_mig_v1_has_a_counters_only_slice_and_a_device_slice_per_gpu() -> None:
    s = features(dynamic_mig=True)
    slices = [x for x in ko.cluster_objects(s, 0).resourceslices if x["spec"]["driver"] == "gpu.nvidia.com"]
    assert len(slices) == 1 + len(s.gpus)
    assert {x["spec"]["pool"]["resourceSliceCount"] for x in slices} == {len(slices)}
    counters = [x for x in slices if "sharedCounters" in x["spec"]]
    assert len(counters) == 1 and "devices" not in counters[0]["spec"]
    sets = {c["name"]: c["counters"] for c in counters[0]["spec"]["sharedCounters"]}
    assert set(sets) == {f"gpu-{g.index}-counter-set" for g in s.gpus}
    devices = {d["name"]: d for x in slices for d in x["spec"].get("devices", [])}
    assert len(devices) == len(s.gpus) * 26  # the GPU and its 25 MIG placements
    for name, device in devices.items():
        (use,) = device["consumesCounters"]
        assert use["counterSet"] in sets
        assert set(use["counters"]) <= set(sets[use["counterSet"]]), name
    # Abstract MIG devices carry no UUID; the whole GPU does.
    assert "uuid" not in devices["gpu-2-mig-3g71gb-9-0"]["attributes"]
    assert devices["gpu-2"]["attributes"]["uuid"] == {"string": s.gpus[2].uuid}
    # NVIDIA's driver: every capacity a counter (engines too), and the placement's memory slices.
    assert set(devices["gpu-2-mig-1g18gb-19-4"]["consumesCounters"][0]["counters"]) == {
        "multiprocessors", "memory", "copy-engines", "decoders", "encoders", "jpeg-engines", "ofa-engines",
        "memory-slice-4",
    }
    assert sets["gpu-2-counter-set"]["ofa-engines"] == {"value": "1"}
    assert devices["gpu-2-mig-1g18gb-me-20-4"]["consumesCounters"][0]["counters"]["ofa-engines"] == {"value": "1"}


def test_dynamic_mig_v1beta2_keeps_counters_with_their_devices() -> None:
    s = features(dynamic_mig=True, api_version="v1beta2")
    slices = [x for x in ko.cluster_objects(s, 0).resourceslices if x["spec"]["driver"] == "gpu.nvidia.com"]
    assert len(slices) == len(s.gpus)
    for x in slices:
        (counter_set,) = x["spec"]["sharedCounters"]
        assert {d["consumesCounters"][0]["counterSet"] for d in x["spec"]["devices"]} == {counter_set["name"]}


def test_served_versions_and_cluster_versions() -> None:
    assert ko.served_versions("v1") == ("v1", "v1beta2", "v1beta1")
    assert ko.served_versions("v1beta2") == ("v1beta2", "v1beta1")
    assert ko.served_versions("v1beta1") == ("v1beta1",)
    with pytest.raises(ValueError):
        ko.served_versions("v1alpha3")
    assert ko.binary_quantity(150754820096) == "143771Mi"
    assert ko.binary_quantity(1000) == "1000"


# --- the scenario keys behind these objects: validation -------------------------------------------


def test_the_kubelet_reports_every_device_of_a_claim_whatever_request_a_container_names() -> None:
    """As the real kubelet does (no filtering by ``claims[].request``, dra-api.md §1); only the
    pod spec from the API server says which request a container uses."""
    s = features(
        claims=[
            {
                "namespace": "ml",
                "name": "two",
                "requests": [{"name": "a", "devices": ["gpu-0"]}, {"name": "b", "devices": ["gpu-1"]}],
            }
        ],
        pods=[
            {
                "namespace": "ml",
                "name": "p",
                "containers": [
                    {"name": "x", "claims": [{"claim": "two", "request": "b"}]},
                    {"name": "y", "claims": ["two"]},
                ],
            }
        ],
    )
    (pod,) = s.pod_allocations_at(0).pods
    assert [d.device for d in pod.containers[0].claims[0].devices] == ["gpu-0", "gpu-1"]
    assert [d.device for d in pod.containers[1].claims[0].devices] == ["gpu-0", "gpu-1"]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"api_version": "v1alpha3"}, "api_version: 'v1alpha3' is not a resource.k8s.io version"),
        ({"api_version": "v1beta1", "dynamic_mig": True}, "dynamic_mig: partitionable devices need"),
        (
            {
                "claims": [
                    {
                        "namespace": "a",
                        "name": "c",
                        "devices": ["gpu-0"],
                        "requests": [{"name": "r", "devices": []}],
                    }
                ]
            },
            "claims[0].devices: give either 'requests' or 'devices'",
        ),
        (
            {
                "claims": [
                    {
                        "namespace": "a",
                        "name": "c",
                        "requests": [{"name": "r", "devices": ["gpu-0"], "first_available": [{"name": "x"}]}],
                    }
                ]
            },
            "claims[0].requests[0].allocated: required with first_available",
        ),
        (
            {
                "claims": [
                    {
                        "namespace": "a",
                        "name": "c",
                        "requests": [
                            {
                                "name": "r",
                                "devices": ["gpu-0"],
                                "first_available": [{"name": "x"}],
                                "allocated": "y",
                            }
                        ],
                    }
                ]
            },
            "claims[0].requests[0].allocated: 'y' is not one of the subrequests (x)",
        ),
        (
            {
                "claims": [
                    {
                        "namespace": "a",
                        "name": "c",
                        "requests": [{"name": "r", "devices": ["gpu-0"], "allocated": "y"}],
                    }
                ]
            },
            "claims[0].requests[0].allocated: only a prioritized list",
        ),
        (
            {
                "claims": [
                    {
                        "namespace": "a",
                        "name": "c",
                        "requests": [
                            {"name": "r", "devices": ["gpu-0"]},
                            {"name": "r", "devices": ["gpu-1"]},
                        ],
                    }
                ]
            },
            "claims[0].requests[1].name: request 'r' is defined twice",
        ),
        (
            {
                "claims": [
                    {
                        "namespace": "a",
                        "name": "c",
                        "devices": ["gpu-0"],
                        "device_status": [{"device": "gpu-1", "conditions": []}],
                    }
                ]
            },
            "claims[0].device_status[0].device: 'gpu-1' is not a device",
        ),
        (
            {
                "claims": [
                    {
                        "namespace": "a",
                        "name": "c",
                        "devices": ["gpu-0"],
                        "device_status": [
                            {"device": "gpu-0", "conditions": [{"type": "Ready", "status": "maybe"}]}
                        ],
                    }
                ]
            },
            "conditions[0].status: 'maybe' is not one of True, False, Unknown",
        ),
        (
            {"claims": [{"namespace": "a", "name": "c", "driver": "gpu.example.com", "devices": ["gpu-9"]}]},
            "claims[0].devices[0]: 'gpu-9' is not a device of gpu.example.com pool 'n1' (gpu-0)",
        ),
        (
            {"gpus": [{"index": 0, "taints": [{"key": "k", "effect": "Sometimes"}]}]},
            "gpus[0].taints[0].effect: 'Sometimes' is not one of NoSchedule, NoExecute, None",
        ),
        (
            {
                "gpus": [
                    {
                        "index": 0,
                        "mig": [{"profile": "7g.141gb", "placement_start": 0}],
                        "taints": [{"key": "k", "effect": "NoSchedule"}],
                    }
                ]
            },
            "gpus[0].taints: a MIG-enabled GPU is published as its MIG devices",
        ),
        (
            {"slices": [{"driver": "gpu.nvidia.com", "devices": [{"name": "x"}]}]},
            "slices[0].driver: the NVIDIA slice is derived from gpus",
        ),
        (
            {"slices": [{"driver": "gpu.example.com", "devices": [{"name": "x", "attributes": {"a": [1]}}]}]},
            "slices[0].devices[0].attributes.a: expected a string",
        ),
        ({"faults": [{"kind": "apiserver_slow", "at": 0}]}, "faults[0].delay: required"),
    ],
)
def test_scenario_keys_of_the_cluster_view_are_validated(change: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError) as err:
        features(**{"claims": [], "pods": [], **change})
    assert message in str(err.value)


@pytest.mark.parametrize(
    ("pods", "message"),
    [
        (
            [
                {
                    "namespace": "ml",
                    "name": "p",
                    "containers": [{"name": "c", "claims": [{"claim": "train", "request": "x"}]}],
                }
            ],
            "claims[0].request: claim 'train' has no request 'x' (its requests: gpus)",
        ),
        (
            [
                {
                    "namespace": "ml",
                    "name": "p",
                    "containers": [
                        {"name": "c", "claims": ["train"], "device_health": {"gpu-0": "Unhealthy"}}
                    ],
                }
            ],
            "device_health.gpu-0: 'gpu-0' is not a device of this container's claims (gpu-1)",
        ),
        (
            [
                {
                    "namespace": "ml",
                    "name": "p",
                    "containers": [{"name": "c", "claims": ["train"], "device_health": {"gpu-1": "Sick"}}],
                }
            ],
            "device_health.gpu-1: 'Sick' is not one of Healthy, Unhealthy, Unknown",
        ),
        (
            [
                {"namespace": "ml", "name": f"p{i}", "containers": [{"name": "c", "claims": ["job-gpu"]}]}
                for i in (1, 2)
            ],
            "claims[2].template: a claim generated from a template belongs to exactly one pod; "
            "2 pods use ml/job-gpu",
        ),
    ],
)
def test_pod_keys_of_the_cluster_view_are_validated(pods: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(ScenarioError) as err:
        features(pods=pods)
    assert message in str(err.value)
