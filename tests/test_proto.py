"""The committed pod-resources modules: fresh from ``api.proto`` and wire-compatible with the kubelet.

A fresh clone needs no build step because the generated modules are committed; these tests
make sure nobody edits them by hand and that the field numbers match the kubelet's API
(a wrong number parses silently into nonsense, so it is checked explicitly).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import descriptor_pb2

from dra_exporter.proto import api_pb2, generate

PROTO_DIR = Path(generate.__file__).parent


def _generated_grpc_version(text: str) -> str:
    for line in text.splitlines():
        if line.startswith("GRPC_GENERATED_VERSION = "):
            return line.split("=", 1)[1].strip().strip("'\"")
    raise AssertionError("api_pb2_grpc.py has no GRPC_GENERATED_VERSION line")


def test_committed_modules_match_a_fresh_generation(tmp_path):
    grpc_version = pytest.importorskip("grpc_tools.grpc_version").VERSION
    committed = _generated_grpc_version((PROTO_DIR / "api_pb2_grpc.py").read_text())
    if committed != grpc_version:
        # Another grpcio-tools writes other (equally valid) code; compare only like with like.
        pytest.skip(f"modules were generated with grpcio-tools {committed}, this is {grpc_version}")
    written = generate.generate(tmp_path)
    assert [p.name for p in written] == list(generate.GENERATED)
    for path in written:
        assert path.read_bytes() == (PROTO_DIR / path.name).read_bytes(), (
            f"{path.name} differs from a fresh generation: run python -m dra_exporter.proto.generate"
        )


def test_grpc_module_imports_messages_package_relative():
    text = (PROTO_DIR / "api_pb2_grpc.py").read_text()
    assert "from . import api_pb2 as " in text
    assert "import dra_exporter" not in text and "from dra_exporter" not in text


def _fields(message) -> dict[str, int]:
    return {f.name: f.number for f in message.DESCRIPTOR.fields}


def test_field_numbers_match_the_kubelet_api():
    assert _fields(api_pb2.ListPodResourcesResponse) == {"pod_resources": 1}
    assert _fields(api_pb2.PodResources) == {
        "name": 1,
        "namespace": 2,
        "containers": 3,
        "cpu_ids": 4,
        "memory": 5,
    }
    assert _fields(api_pb2.ContainerResources) == {
        "name": 1,
        "devices": 2,
        "cpu_ids": 3,
        "memory": 4,
        "dynamic_resources": 5,
    }
    assert _fields(api_pb2.ContainerDevices) == {"resource_name": 1, "device_ids": 2, "topology": 3}
    assert _fields(api_pb2.DynamicResource) == {"claim_name": 2, "claim_namespace": 3, "claim_resources": 4}
    assert _fields(api_pb2.ClaimResource) == {
        "cdi_devices": 1,
        "driver_name": 2,
        "pool_name": 3,
        "device_name": 4,
        "share_id": 5,
    }
    assert _fields(api_pb2.CDIDevice) == {"name": 1}
    assert _fields(api_pb2.GetPodResourcesRequest) == {"pod_name": 1, "pod_namespace": 2}
    assert _fields(api_pb2.AllocatableResourcesResponse) == {"devices": 1, "cpu_ids": 2, "memory": 3}


def test_share_id_has_presence_and_class_name_is_tombstoned():
    assert api_pb2.ClaimResource.DESCRIPTOR.fields_by_name["share_id"].has_presence
    proto = descriptor_pb2.DescriptorProto()
    api_pb2.DynamicResource.DESCRIPTOR.CopyToProto(proto)
    assert [(r.start, r.end) for r in proto.reserved_range] == [(1, 2)]
    assert list(proto.reserved_name) == ["class_name"]


def test_service_paths_match_the_kubelet():
    service = api_pb2.DESCRIPTOR.services_by_name["PodResourcesLister"]
    assert api_pb2.DESCRIPTOR.package == "v1"
    assert service.full_name == "v1.PodResourcesLister"
    assert {m.name: (m.input_type.name, m.output_type.name) for m in service.methods} == {
        "List": ("ListPodResourcesRequest", "ListPodResourcesResponse"),
        "GetAllocatableResources": ("AllocatableResourcesRequest", "AllocatableResourcesResponse"),
        "Get": ("GetPodResourcesRequest", "GetPodResourcesResponse"),
    }


def test_bytes_from_a_kubelet_decode_into_the_right_fields():
    # Hand-encoded wire bytes as the Go kubelet writes them, independent of our generator:
    # ClaimResource{driver_name(2)="d", pool_name(3)="p", device_name(4)="x", share_id(5)="s"}
    wire = b"\x12\x01d\x1a\x01p\x22\x01x\x2a\x01s"
    res = api_pb2.ClaimResource.FromString(wire)
    assert (res.driver_name, res.pool_name, res.device_name, res.share_id) == ("d", "p", "x", "s")
    assert res.SerializeToString() == wire
