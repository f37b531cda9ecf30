"""`dra-exporter serve --simulate --otlp-endpoint …` pushing to real OTLP receivers (gRPC and
HTTP/protobuf), decoded and checked against the scenario; then a collector outage. And the cluster
mode's push (`dra-exporter cluster --simulate --otlp-endpoint …`), checked against its own frame."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from otlp_receiver import GrpcReceiver, HttpReceiver, Received, running
from simnode import ATTRIBUTION

from dra_exporter import catalog
from dra_exporter.cluster.runtime import CLUSTER
from dra_exporter.config import ClusterSettings
from dra_exporter.runtime import snapshot
from dra_exporter_sim import load_scenario


@pytest.fixture(params=["grpc", "http/protobuf"])
def receiver(request: pytest.FixtureRequest) -> Iterator[GrpcReceiver | HttpReceiver]:
    yield from running(GrpcReceiver() if request.param == "grpc" else HttpReceiver())


def serve(receiver: GrpcReceiver | HttpReceiver, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "dra_exporter.cli", "serve", "--simulate", ATTRIBUTION, "--no-prometheus",
         "--interval", "0.2", "--otlp-endpoint", receiver.endpoint, "--otlp-protocol", receiver.protocol,
         "--otlp-interval", "0.3", "--otlp-timeout", "2", "--otlp-header", "x-tenant=gpu-team", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def stop(proc: subprocess.Popen[str]) -> str:
    proc.terminate()
    out, _ = proc.communicate(timeout=20)
    assert proc.returncode == 0, out
    assert "Traceback" not in out, out
    return out


def metrics(item: Received) -> dict[str, object]:
    found = {}
    for rm in item.request.resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                found[m.name] = m
    return found


def attrs(point: object) -> dict[str, str]:
    return {kv.key: kv.value.string_value for kv in point.attributes}  # type: ignore[attr-defined]


def has_gpu_metrics(item: Received) -> bool:
    return "hw.gpu.memory.usage" in metrics(item) and "hw.gpu.utilization" in metrics(item)


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def test_push_carries_semantic_names_units_attributes_and_values(receiver) -> None:  # type: ignore[no-untyped-def]
    scenario = load_scenario(ATTRIBUTION)
    proc = serve(receiver)
    try:
        item = receiver.wait_for(has_gpu_metrics)
    finally:
        stop(proc)
    assert item.headers.get("x-tenant") == "gpu-team"
    resource = {kv.key: kv.value.string_value for kv in item.request.resource_metrics[0].resource.attributes}
    assert resource["service.name"] == "dra-exporter" and resource["k8s.node.name"] == "test-node"
    found = metrics(item)
    usage = found["hw.gpu.memory.usage"]
    assert usage.unit == "By" and usage.sum.is_monotonic is False  # type: ignore[attr-defined]
    points = {attrs(p)["hw.id"]: (attrs(p), p.as_double) for p in usage.sum.data_points}  # type: ignore[attr-defined]
    solo, value = points[scenario.nvml_uuid("gpu-0")]
    assert (solo["k8s.namespace.name"], solo["k8s.pod.name"], solo["k8s.container.name"],
            solo["k8s.resourceclaim.name"]) == ("team-a", "solo-0", "main", "solo")
    assert solo["hw.vendor"] == "NVIDIA" and solo["hw.model"] == "NVIDIA H200"
    assert 10 * 2**30 <= value < 10.1 * 2**30  # 10Gi of process memory plus the context
    mig, _ = points[scenario.nvml_uuid("gpu-3-mig-9-4-4")]
    assert mig["hw.parent"] == scenario.nvml_uuid("gpu-3") and mig["k8s.pod.name"] == "mig-old-0"
    idle, _ = points[scenario.nvml_uuid("gpu-7")]
    assert "k8s.pod.name" not in idle, "empty attribution is omitted, not sent as empty strings"
    energy = found["hw.energy"]
    assert energy.unit == "J" and energy.sum.is_monotonic  # type: ignore[attr-defined]
    assert found["hw.gpu.utilization"].unit == "1"  # type: ignore[attr-defined]


@pytest.mark.slow  # ~9 s per protocol: the collector goes away and comes back
def test_collector_outage_never_crashes_and_data_flows_again(receiver) -> None:  # type: ignore[no-untyped-def]
    proc = serve(receiver)
    try:
        receiver.wait_for(has_gpu_metrics)
        receiver.failing = True
        receiver.wait_refused(3)
        rss_during = rss_kib(proc.pid)
        receiver.wait_refused(12)
        assert proc.poll() is None
        # Nothing is queued while the collector is away: memory does not grow with the outage.
        assert rss_kib(proc.pid) - rss_during < 16 * 1024
        receiver.failing = False
        seen = len(receiver.received)
        receiver.wait_for(has_gpu_metrics, after=seen)
    finally:
        out = stop(proc)
    assert "OTLP push" in out and "failed" in out and "works again" in out


#: dra_cluster_devices' labels and the attributes they are pushed as.
CLUSTER_DEVICE_ATTRIBUTES = {"driver": "dra.driver", "pool": "dra.pool", "node": "k8s.node.name",
                             "type": "dra.device.type", "model": "hw.model", "profile": "dra.profile",
                             "state": "dra.state"}


def test_cluster_mode_pushes_its_families_with_the_frames_values(receiver) -> None:  # type: ignore[no-untyped-def]
    family = snapshot(ClusterSettings(simulate="cluster"), CLUSTER).family(catalog.CLUSTER_DEVICES.name)
    assert family is not None and family.samples
    expected = {tuple(sorted((CLUSTER_DEVICE_ATTRIBUTES[k], v) for k, v in s.labels if v)): s.value
                for s in family.samples}
    proc = subprocess.Popen(
        [sys.executable, "-m", "dra_exporter.cli", "cluster", "--simulate", "--no-prometheus", "--interval", "1",
         "--otlp-endpoint", receiver.endpoint, "--otlp-protocol", receiver.protocol, "--otlp-interval", "0.3",
         "--otlp-timeout", "2"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        item = receiver.wait_for(lambda got: "dra.cluster.devices" in metrics(got))
    finally:
        out = stop(proc)
    assert "pushing OTLP" in out
    resource = {kv.key: kv.value.string_value for kv in item.request.resource_metrics[0].resource.attributes}
    assert resource["service.name"] == "dra-exporter" and "k8s.node.name" not in resource, \
        "the cluster's series are no node's"
    found = metrics(item)
    devices = found["dra.cluster.devices"]
    assert devices.unit == "{device}" and devices.WhichOneof("data") == "gauge"  # type: ignore[attr-defined]
    pushed = {tuple(sorted(attrs(p).items())): p.as_double for p in devices.gauge.data_points}  # type: ignore[attr-defined]
    assert pushed == expected
    a100 = {k: v for k, v in pushed.items() if ("k8s.node.name", "sim-a100-1") in k and ("dra.state", "tainted") in k}
    assert a100 and all(("dra.device.type", "gpu") in k for k in a100), "a device's type is no error.type"
    assert {"dra.cluster.claims", "dra.cluster.pool.complete", "dra.exporter.source.up"} <= set(found)
    # The frame's time is the host's, not the simulated objects' epoch.
    point = devices.gauge.data_points[0]  # type: ignore[attr-defined]
    assert abs(point.time_unix_nano / 1e9 - time.time()) < 60
