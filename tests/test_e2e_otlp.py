"""`dra-exporter serve --simulate --otlp-endpoint …` pushing to real OTLP receivers (gRPC and
HTTP/protobuf), decoded and checked against the scenario; then a collector outage."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from otlp_receiver import GrpcReceiver, HttpReceiver, Received, running
from simnode import ATTRIBUTION

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
