"""The OTLP sink: what reaches a real collector endpoint, and how it copes when the collector is away."""

from __future__ import annotations

import ast
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from opentelemetry.proto.metrics.v1 import metrics_pb2
from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult, MetricsData
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from otlp_receiver import GrpcReceiver, HttpReceiver, Received, Receiver, running

from dra_exporter import catalog, model
from dra_exporter.sinks import otlp, otlp_mapping, otlp_settings
from dra_exporter.sinks.otlp import MetricsBuilder, OtlpConfigError, OtlpSettings, OtlpSink, parse_header

CUMULATIVE = metrics_pb2.AGGREGATION_TEMPORALITY_CUMULATIVE
DELTA = metrics_pb2.AGGREGATION_TEMPORALITY_DELTA
T0 = 1_700_000_000.0
INTERVAL = 0.2


@pytest.fixture(autouse=True)
def _clean_otel_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # A developer's shell (or CI) may export OTEL_* settings; each test sets what it needs.
    for name in list(os.environ):
        if name.startswith("OTEL_"):
            monkeypatch.delenv(name)


# --- a hand-built frame: GPU 0 whole and held by a training pod, GPU 1 split, one MIG device in use ---------


def labels(name: str, **values: str) -> model.Labels:
    """Labels of family ``name`` in catalogue order; unnamed labels are empty."""
    spec = catalog.spec(name)
    unknown = set(values) - set(spec.labels)
    assert not unknown, f"{name} has no labels {unknown}"
    return tuple((label, values.get(label, "")) for label in spec.labels)


TRAINER = dict(namespace="ml", pod="trainer-0", container="main", claim="train-gpus")
INFERENCE = dict(namespace="serve", pod="infer-0", container="server", claim="mig-small")
GPU0 = dict(uuid="GPU-aaaa", gpu="0")
GPU1 = dict(uuid="GPU-bbbb", gpu="1")
MIG = dict(uuid="MIG-cccc", gpu="1", profile="1g.18gb", parent_uuid="GPU-bbbb")


def fam(name: str, *samples: tuple[model.Labels, float]) -> model.Family:
    return model.Family(name, tuple(model.Sample(lbl, value) for lbl, value in samples))


def node_frame(timestamp: float = T0, *, trainer: bool = True, utilization: float = 0.75) -> model.Frame:
    holder = TRAINER if trainer else {}
    dev0 = labels(catalog.GPU_UTILIZATION.name, **GPU0, **holder)
    return model.Frame((
        fam(catalog.GPU_INFO.name,
            (labels(catalog.GPU_INFO.name, **GPU0, model="NVIDIA H200", mig_mode="disabled"), 1.0),
            (labels(catalog.GPU_INFO.name, **GPU1, model="NVIDIA H200", mig_mode="enabled"), 1.0),
            (labels(catalog.GPU_INFO.name, **MIG, model="NVIDIA H200 MIG 1g.18gb"), 1.0)),
        fam(catalog.GPU_UP.name, (dev0, 1.0), (labels(catalog.GPU_UP.name, **GPU1), 0.0)),
        fam(catalog.GPU_UTILIZATION.name, (dev0, utilization),
            (labels(catalog.GPU_UTILIZATION.name, **MIG, **INFERENCE), 0.5)),
        fam(catalog.GPU_ENCODER_UTILIZATION.name, (dev0, 0.125)),
        fam(catalog.GPU_MEMORY_USED.name, (dev0, 80e9),
            (labels(catalog.GPU_MEMORY_USED.name, **MIG, **INFERENCE), 9e9)),
        fam(catalog.GPU_MEMORY_TOTAL.name, (dev0, 150e9)),
        fam(catalog.GPU_ENERGY.name, (dev0, 123456.5)),
        fam(catalog.GPU_TEMPERATURE.name, (dev0, 61.0)),
        fam(catalog.GPU_MEMORY_TEMPERATURE.name, (dev0, 70.0)),
        fam(catalog.GPU_CLOCK.name, (labels(catalog.GPU_CLOCK.name, **GPU0, **holder, clock="sm"), 1.98e9)),
        fam(catalog.GPU_PCIE_BYTES.name,
            (labels(catalog.GPU_PCIE_BYTES.name, **GPU0, **holder, direction="rx"), 1000.0),
            (labels(catalog.GPU_PCIE_BYTES.name, **GPU0, **holder, direction="tx"), 2000.0)),
        fam(catalog.GPU_ECC_ERRORS.name, (labels(catalog.GPU_ECC_ERRORS.name, **GPU1, type="corrected"), 3.0)),
        fam(catalog.GPU_XID_ERRORS.name, (labels(catalog.GPU_XID_ERRORS.name, **GPU1, xid="79"), 1.0)),
        fam(catalog.CONTAINER_GPU_MEMORY_USED.name,
            *([(labels(catalog.CONTAINER_GPU_MEMORY_USED.name, uuid="GPU-aaaa", **TRAINER), 79e9)]
              if trainer else [])),
        fam(catalog.CLAIM_ALLOCATION_INFO.name,
            (labels(catalog.CLAIM_ALLOCATION_INFO.name, namespace="serve", claim="mig-small", claim_uid="uid-1",
                    request="gpu", driver="gpu.nvidia.com", pool="node-a", device="gpu-1-mig-1g18gb-0",
                    uuid="MIG-cccc", admin_access="false"), 1.0)),
        fam(catalog.CLAIM_CONSUMER_INFO.name,
            (labels(catalog.CLAIM_CONSUMER_INFO.name, namespace="serve", claim="mig-small", pod="infer-0",
                    pod_uid="pod-uid-2", container="server"), 1.0)),
        fam(catalog.BUILD_INFO.name, (labels(catalog.BUILD_INFO.name, version="9.9.9", python_version="3.11"), 1.0)),
    ), timestamp, tuple((d["uuid"], "NVIDIA") for d in (GPU0, GPU1, MIG)))  # as the NVML source's snapshot says


# --- decoding what the receiver got ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Point:
    attrs: dict[str, str]
    value: float
    time_ns: int
    start_ns: int


def _any(value: object) -> str:
    kind = value.WhichOneof("value")  # type: ignore[attr-defined]
    return getattr(value, kind) if kind else ""


def metrics_of(received: Received) -> dict[str, metrics_pb2.Metric]:
    out = {}
    for rm in received.request.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                assert metric.name not in out, f"{metric.name} sent twice in one export"
                out[metric.name] = metric
    return out


def points(metric: metrics_pb2.Metric) -> list[Point]:
    data = getattr(metric, metric.WhichOneof("data"))
    return [Point({a.key: _any(a.value) for a in p.attributes}, p.as_double, p.time_unix_nano,
                  p.start_time_unix_nano) for p in data.data_points]


def point(metric: metrics_pb2.Metric, **match: str) -> Point:
    found = [p for p in points(metric) if all(p.attrs.get(k) == v for k, v in match.items())]
    assert len(found) == 1, (f"{metric.name}: expected one point with {match}, "
                             f"got {[p.attrs for p in points(metric)]}")
    return found[0]


def resource_attrs(received: Received) -> dict[str, str]:
    return {a.key: _any(a.value) for a in received.request.resource_metrics[0].resource.attributes}


def carries_frame(timestamp: float):
    """Predicate: an export made from the frame collected at ``timestamp``."""
    def check(received: Received) -> bool:
        return any(p.time_ns == int(timestamp * 1e9) for p in all_points(received))
    return check


def all_points(received: Received) -> Iterator[Point]:
    for metric in metrics_of(received).values():
        yield from points(metric)


# --- fixtures --------------------------------------------------------------------------------------------


@pytest.fixture(params=["grpc", "http/protobuf"])
def receiver(request: pytest.FixtureRequest) -> Iterator[Receiver]:
    yield from running(GrpcReceiver() if request.param == "grpc" else HttpReceiver())


@pytest.fixture
def make_sink() -> Iterator:
    sinks: list[OtlpSink] = []

    def make(settings: OtlpSettings, **kwargs: object) -> OtlpSink:
        kwargs = {"node_name": "node-a", "host_name": "host-a", "version": "9.9.9-test", **kwargs}
        sink = OtlpSink(settings, **kwargs)  # type: ignore[arg-type]
        sinks.append(sink)
        return sink

    yield make
    for sink in sinks:
        sink.shutdown()


def settings_for(receiver: Receiver, **overrides: object) -> OtlpSettings:
    return OtlpSettings(**{"endpoint": receiver.endpoint, "protocol": receiver.protocol, "interval": INTERVAL,
                           "timeout": 1.0, **overrides})  # type: ignore[arg-type]


# --- end to end against real receivers ---------------------------------------------------------------------


def test_push_carries_catalogue_metrics_with_semantic_names_types_and_attributes(receiver: Receiver,
                                                                                 make_sink) -> None:
    sink = make_sink(settings_for(receiver))
    sink.publish(node_frame())
    got = receiver.wait_for(carries_frame(T0))
    metrics = metrics_of(got)

    assert resource_attrs(got).items() >= {"service.name": "dra-exporter", "service.version": "9.9.9-test",
                                        "k8s.node.name": "node-a", "host.name": "host-a"}.items()
    pushed = {s.otlp.name for s in catalog.CATALOG if s.otlp}
    assert set(metrics) <= pushed
    assert {"hw.gpu.utilization", "hw.gpu.memory.usage", "hw.gpu.memory.limit", "hw.energy", "hw.temperature",
            "hw.gpu.io", "hw.errors", "hw.status", "dra.claim.allocation", "dra.claim.consumer",
            "dra.container.gpu.memory.usage"} <= set(metrics)

    # Gauge; whole GPU held by one pod: full attribution, identity, vendor and model; empty labels omitted.
    util = metrics["hw.gpu.utilization"]
    assert util.WhichOneof("data") == "gauge" and util.unit == "1"
    whole = point(util, **{"hw.id": "GPU-aaaa", "hw.gpu.task": "general"})
    assert whole.attrs == {"hw.id": "GPU-aaaa", "dra.gpu": "0", "hw.type": "gpu", "hw.vendor": "NVIDIA",
                           "hw.model": "NVIDIA H200", "hw.gpu.task": "general", "k8s.namespace.name": "ml",
                           "k8s.pod.name": "trainer-0", "k8s.container.name": "main",
                           "k8s.resourceclaim.name": "train-gpus"}
    assert whole.value == 0.75
    assert whole.time_ns == int(T0 * 1e9)
    # The MIG device names its parent GPU and profile, and its own model.
    mig = point(util, **{"hw.id": "MIG-cccc"})
    assert mig.attrs["hw.parent"] == "GPU-bbbb" and mig.attrs["dra.profile"] == "1g.18gb"
    assert mig.attrs["hw.model"] == "NVIDIA H200 MIG 1g.18gb" and mig.attrs["k8s.pod.name"] == "infer-0"
    assert mig.value == 0.5
    # Encoder utilisation is the same metric, told apart by hw.gpu.task.
    assert point(util, **{"hw.id": "GPU-aaaa", "hw.gpu.task": "encoder"}).value == 0.125

    # Counters: cumulative monotonic sums.
    energy = metrics["hw.energy"]
    assert energy.unit == "J" and energy.sum.is_monotonic and energy.sum.aggregation_temporality == CUMULATIVE
    assert point(energy, **{"hw.id": "GPU-aaaa"}).value == 123456.5
    assert 0 < point(energy, **{"hw.id": "GPU-aaaa"}).start_ns <= int(T0 * 1e9)
    io = metrics["hw.gpu.io"]
    assert io.unit == "By" and io.sum.is_monotonic
    assert point(io, **{"network.io.direction": "receive"}).value == 1000.0
    assert point(io, **{"network.io.direction": "transmit"}).value == 2000.0
    errors = metrics["hw.errors"]
    assert errors.unit == "{error}" and errors.sum.is_monotonic
    assert point(errors, **{"error.type": "corrected"}).value == 3.0
    assert point(errors, **{"error.type": "xid"}).attrs["dra.xid"] == "79"

    # The conventions' UpDownCounters: non-monotonic cumulative sums.
    for name in ("hw.gpu.memory.usage", "hw.gpu.memory.limit", "hw.status"):
        assert metrics[name].WhichOneof("data") == "sum" and not metrics[name].sum.is_monotonic, name
        assert metrics[name].sum.aggregation_temporality == CUMULATIVE, name
    assert metrics["hw.gpu.memory.usage"].unit == "By"
    assert point(metrics["hw.gpu.memory.usage"], **{"hw.id": "MIG-cccc"}).value == 9e9
    assert point(metrics["hw.gpu.memory.limit"], **{"hw.id": "GPU-aaaa"}).value == 150e9
    status = metrics["hw.status"]
    assert point(status, **{"hw.id": "GPU-aaaa", "hw.state": "ok"}).value == 1.0
    assert point(status, **{"hw.id": "GPU-bbbb", "hw.state": "failed"}).value == 1.0
    assert point(status, **{"hw.id": "GPU-bbbb", "hw.state": "ok"}).value == 0.0

    temperature = metrics["hw.temperature"]
    assert temperature.unit == "Cel"
    assert point(temperature, **{"hw.sensor_location": "gpu"}).value == 61.0
    assert point(temperature, **{"hw.sensor_location": "memory"}).value == 70.0
    assert point(metrics["hw.gpu.clock.frequency"], **{"dra.clock": "sm"}).value == 1.98e9

    # DRA identity: resourceclaim and dra.* attributes; not a device series, so no vendor.
    allocation = point(metrics["dra.claim.allocation"])
    assert allocation.attrs == {"k8s.namespace.name": "serve", "k8s.resourceclaim.name": "mig-small",
                                "k8s.resourceclaim.uid": "uid-1", "k8s.resourceclaim.request": "gpu",
                                "dra.driver": "gpu.nvidia.com", "dra.pool": "node-a",
                                "dra.device": "gpu-1-mig-1g18gb-0", "hw.id": "MIG-cccc",
                                "dra.admin_access": "false"}
    assert point(metrics["dra.claim.consumer"]).attrs["k8s.pod.uid"] == "pod-uid-2"
    container = point(metrics["dra.container.gpu.memory.usage"])
    assert container.attrs["k8s.container.name"] == "main" and container.value == 79e9


def test_series_of_an_ended_pod_are_gone_from_the_next_export(receiver: Receiver, make_sink) -> None:
    sink = make_sink(settings_for(receiver))
    sink.publish(node_frame(T0))
    first = receiver.wait_for(carries_frame(T0))
    assert any(p.attrs.get("k8s.pod.name") == "trainer-0" for p in all_points(first))

    sink.publish(node_frame(T0 + 1, trainer=False))
    later = receiver.wait_for(carries_frame(T0 + 1))
    assert not [p.attrs for p in all_points(later) if p.attrs.get("k8s.pod.name") == "trainer-0"]
    assert "dra.container.gpu.memory.usage" not in metrics_of(later)
    # The GPU itself still reports, now unattributed (DESIGN §3 rule 1).
    gpu0 = point(metrics_of(later)["hw.gpu.utilization"], **{"hw.id": "GPU-aaaa", "hw.gpu.task": "general"})
    assert "k8s.pod.name" not in gpu0.attrs


def test_header_flags_and_otel_headers_environment_both_arrive(receiver: Receiver, make_sink,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer%20s3cret,x-tenant=from-env")
    flags = (parse_header("X-Scope-OrgID=team-a"), ("X-Tenant", "from-flag"))
    sink = make_sink(settings_for(receiver, headers=flags))
    sink.publish(node_frame())
    got = receiver.wait_for(carries_frame(T0))
    assert got.headers.get("x-scope-orgid") == "team-a"
    assert got.headers.get("authorization") == "Bearer s3cret"
    assert got.headers.get("x-tenant") == "from-flag"  # the explicit setting wins a clash


def test_otel_headers_environment_alone_is_honoured(receiver: Receiver, make_sink,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "x-tenant=blue")
    sink = make_sink(settings_for(receiver))
    sink.publish(node_frame())
    assert receiver.wait_for(carries_frame(T0)).headers.get("x-tenant") == "blue"


def test_endpoint_from_otel_environment_when_settings_leave_it_empty(receiver: Receiver, make_sink,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # The base endpoint: the HTTP exporter appends /v1/metrics itself.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
    sink = make_sink(settings_for(receiver, endpoint=""))
    sink.publish(node_frame())
    receiver.wait_for(carries_frame(T0))


def test_endpoint_in_settings_wins_over_the_environment(receiver: Receiver, make_sink,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://127.0.0.1:9")  # nothing listens there
    sink = make_sink(settings_for(receiver))
    sink.publish(node_frame())
    receiver.wait_for(carries_frame(T0))
    _wait(lambda: sink.health().up)


@pytest.mark.parametrize("outage", ["refusing", "stopped"])
def test_collector_outage_is_counted_never_blocks_and_push_resumes(receiver: Receiver, make_sink,
                                                                   outage: str) -> None:
    sink = make_sink(settings_for(receiver, timeout=0.5))
    sink.publish(node_frame(T0))
    receiver.wait_for(carries_frame(T0))
    _wait(lambda: sink.health().up)
    healthy = sink.health()
    assert healthy.errors_total == 0 and healthy.last_success_timestamp > 0

    if outage == "refusing":
        receiver.failing = True
    else:
        receiver.stop()
    # The agent keeps publishing every cycle while the collector is away.
    latest = T0
    for n in range(1, 200):
        latest = T0 + n
        sink.publish(node_frame(latest, utilization=n / 200))
    _wait(lambda: sink.health().errors_total >= 2)
    down = sink.health()
    assert not down.up
    assert down.last_success_timestamp == healthy.last_success_timestamp
    if outage == "refusing":
        assert receiver.refused >= 2

    accepted_before = len(receiver.received)
    if outage == "refusing":
        receiver.failing = False
    else:
        receiver.start()  # same port
    back = receiver.wait_for(carries_frame(latest), after=accepted_before)
    # Nothing was queued during the outage: no export after it carries an older frame.
    for got in receiver.received[accepted_before:]:
        assert all(p.time_ns == int(latest * 1e9) for p in all_points(got))
    assert point(metrics_of(back)["hw.gpu.utilization"], **{"hw.id": "GPU-aaaa",
                                                           "hw.gpu.task": "general"}).value == 199 / 200
    _wait(lambda: sink.health().up)
    assert sink.health().errors_total >= down.errors_total


class _StuckExporter(MetricExporter):
    """An exporter whose collector never answers until released."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.entered = threading.Event()

    def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
               **kwargs: object) -> MetricExportResult:
        self.entered.set()
        self.release.wait()
        return MetricExportResult.FAILURE

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: object) -> None:
        self.release.set()


def test_publish_and_health_return_while_an_export_hangs(make_sink) -> None:
    exporter = _StuckExporter()
    sink = make_sink(OtlpSettings("http://127.0.0.1:9", interval=INTERVAL), exporter=exporter)
    sink.publish(node_frame(T0))
    assert exporter.entered.wait(20), "the push thread never exported"

    def agent_cycles() -> None:
        for n in range(5000):
            sink.publish(node_frame(T0 + n))
            sink.health()

    agent = threading.Thread(target=agent_cycles, daemon=True)
    agent.start()
    agent.join(60)  # generous: only a publish() that waits for the exporter can hit it
    assert not agent.is_alive(), "publish() or health() waited for a hanging export"
    exporter.release.set()
    _wait(lambda: sink.health().errors_total >= 1)


def test_an_exporter_that_raises_is_counted_and_the_push_goes_on(make_sink,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    class Broken(_StuckExporter):
        def export(self, metrics_data: MetricsData, timeout_millis: float = 10_000,
                   **kwargs: object) -> MetricExportResult:
            raise ConnectionError("boom")

    logger = logging.getLogger("test_otlp.broken_exporter")
    sink = make_sink(OtlpSettings("http://127.0.0.1:9", interval=INTERVAL), exporter=Broken(), logger=logger)
    with caplog.at_level(logging.WARNING, logger=logger.name):
        sink.publish(node_frame())
        _wait(lambda: sink.health().errors_total >= 3)
    assert not sink.health().up
    # One warning for the outage, not one per failed push.
    warnings = [r for r in caplog.records if r.name == logger.name]
    assert len(warnings) == 1 and "boom" in warnings[0].getMessage()


def _wait(condition, timeout: float = 20.0) -> None:
    """Poll ``condition``; the deadline only catches a hang, it is no performance check."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.05)


# --- the pure mapping --------------------------------------------------------------------------------------


def _builder(**kwargs: object) -> MetricsBuilder:
    scope = InstrumentationScope("test")
    return MetricsBuilder(Resource.create({}), scope, **kwargs)  # type: ignore[arg-type]


def _built(data: MetricsData) -> dict[str, object]:
    return {m.name: m for m in data.resource_metrics[0].scope_metrics[0].metrics}


def test_every_otlp_name_in_the_catalogue_is_one_consistent_instrument() -> None:
    built = otlp.instruments()
    names = [i.name for i in built]
    assert len(names) == len(set(names))
    assert set(names) == {s.otlp.name for s in catalog.CATALOG if s.otlp}
    kinds = {i.name: i.kind for i in built}
    for name in ("hw.gpu.memory.usage", "hw.gpu.memory.limit", "hw.status"):
        assert kinds[name] == "updowncounter", name
    assert kinds["hw.energy"] == kinds["hw.gpu.io"] == kinds["hw.errors"] == "counter"
    assert kinds["hw.gpu.utilization"] == kinds["hw.power"] == kinds["hw.temperature"] == "gauge"
    units = {i.name: i.unit for i in built}
    assert units == {**units, "hw.gpu.utilization": "1", "hw.gpu.memory.usage": "By", "hw.power": "W",
                     "hw.energy": "J", "hw.temperature": "Cel", "hw.errors": "{error}", "hw.gpu.io": "By"}


def test_every_cluster_mode_family_is_pushed_from_a_cluster_frame() -> None:
    from dra_exporter.cluster.runtime import CLUSTER
    from dra_exporter.config import ClusterSettings
    from dra_exporter.runtime import snapshot

    frame = snapshot(ClusterSettings(simulate="cluster"), CLUSTER)
    cluster = [s for s in catalog.CATALOG if s.name.startswith("dra_cluster_")]
    assert all(s.otlp and s.otlp.name.startswith("dra.cluster.") for s in cluster)
    built = _built(_builder().build(frame, 1))
    assert {s.otlp.name for s in cluster if s.otlp} <= set(built)
    # Each sample is one point with its value; no label is pushed as error.type (a device's type is not).
    for spec in cluster:
        family = frame.family(spec.name)
        assert family is not None and spec.otlp is not None, spec.name
        pts = built[spec.otlp.name].data.data_points  # type: ignore[attr-defined]
        assert sorted(p.value for p in pts) == sorted(s.value for s in family.samples), spec.name
        assert not any("error.type" in p.attributes for p in pts), spec.name
    pool = next(p for p in built["dra.cluster.pool.info"].data.data_points  # type: ignore[attr-defined]
                if p.attributes.get("dra.placement") == "node")
    assert pool.attributes["k8s.node.name"] == pool.attributes["dra.pool"]


def test_families_sharing_a_name_must_agree_on_kind_and_unit() -> None:
    a = catalog.MetricSpec("dra_a_total", "counter", "A.", ("uuid",), otlp=catalog.OtlpForm("x.y", "By"))
    b = catalog.MetricSpec("dra_b", "gauge", "B.", ("uuid",), otlp=catalog.OtlpForm("x.y", "By"))
    with pytest.raises(ValueError, match="share the OTLP name 'x.y'"):
        otlp.instruments([a, b])


def test_values_are_scaled_by_otel_scale() -> None:
    spec = catalog.MetricSpec("dra_gpu_clock_megahertz", "gauge", "Clock.",
                              catalog.DEVICE_LABELS + ("clock",),
                              otlp=catalog.OtlpForm("hw.gpu.clock.frequency", "Hz", scale=1e6))
    sample_labels = tuple((n, "sm" if n == "clock" else "") for n in spec.labels)
    frame = model.Frame((fam(spec.name, (sample_labels, 1980.0)),))
    (inst,) = otlp.instruments([spec])
    assert [value for _, value in otlp.observations(frame, inst)] == [1980.0 * 1e6]


@pytest.mark.parametrize("module", [otlp, otlp_mapping, otlp_settings], ids=lambda m: m.__name__)
def test_no_metric_name_is_spelled_in_the_sink(module: object) -> None:
    source = Path(str(getattr(module, "__file__", ""))).read_text()
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and node.body
                  and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    literals = {node.value for node in ast.walk(tree)
                if isinstance(node, ast.Constant) and isinstance(node.value, str)
                and id(node) not in docstrings}
    names = {s.name for s in catalog.CATALOG} | {s.otlp.name for s in catalog.CATALOG if s.otlp}
    assert not literals & names


def test_memory_follows_live_series_however_many_pods_came_and_went() -> None:
    # The SDK's observable instruments keep every attribute set ever seen and fold series beyond 2000
    # into otel.metric.overflow; pod churn on a long-lived node must not do that here.
    builder = _builder()
    for n in range(2500):
        frame = model.Frame((fam(catalog.GPU_ENERGY.name, (labels(catalog.GPU_ENERGY.name, **GPU0, namespace="ci",
                                                             pod=f"job-{n}"), float(n))),), T0 + n)
        data = builder.build(frame, 0)
    assert builder.tracked_series == 1
    (energy,) = _built(data).values()
    (last,) = energy.data.data_points
    assert dict(last.attributes)["k8s.pod.name"] == "job-2499"
    assert last.start_time_unix_nano == last.time_unix_nano == int((T0 + 2499) * 1e9)


def test_cumulative_start_time_stays_put_while_the_series_lives() -> None:
    builder = _builder()
    starts = set()
    for n in range(3):
        data = builder.build(node_frame(T0 + n), 0)
        starts.add(_built(data)["hw.energy"].data.data_points[0].start_time_unix_nano)
    assert starts == {int(T0 * 1e9)}


def test_delta_counters_report_increments_after_a_baseline() -> None:
    builder = _builder(delta_counters=True)
    def frame(t: float, v: float) -> model.Frame:
        return model.Frame((fam(catalog.GPU_ENERGY.name, (labels(catalog.GPU_ENERGY.name, **GPU0), v)),), t)

    assert "hw.energy" not in _built(builder.build(frame(T0, 100.0), 0))  # no baseline yet
    assert "hw.energy" not in _built(builder.build(frame(T0, 100.0), 0))  # same frame again: nothing new
    energy = _built(builder.build(frame(T0 + 1, 130.0), 0))["hw.energy"]
    (p,) = energy.data.data_points
    assert energy.data.aggregation_temporality.name == "DELTA" and energy.data.is_monotonic
    assert (p.value, p.start_time_unix_nano, p.time_unix_nano) == (30.0, int(T0 * 1e9), int((T0 + 1) * 1e9))
    (reset,) = _built(builder.build(frame(T0 + 2, 5.0), 0))["hw.energy"].data.data_points
    assert reset.value == 5.0


def test_temporality_preference_environment_selects_delta(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE", "delta")
    assert otlp_settings.prefers_delta(otlp.build_exporter(OtlpSettings("http://127.0.0.1:9")))
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE")
    assert not otlp_settings.prefers_delta(otlp.build_exporter(OtlpSettings("http://127.0.0.1:9",
                                                                    protocol="http/protobuf")))


def test_http_endpoint_gets_the_metrics_path_only_when_it_has_none() -> None:
    assert otlp_settings._http_metrics_url("http://collector:4318") == "http://collector:4318/v1/metrics"
    assert otlp_settings._http_metrics_url("https://collector:4318/") == "https://collector:4318/v1/metrics"
    custom = "https://gw.example/otlp/v1/metrics"
    assert otlp_settings._http_metrics_url(custom) == custom


# --- operator input ----------------------------------------------------------------------------------------


def test_parse_header() -> None:
    assert parse_header("Authorization=Bearer a=b=c") == ("authorization", "Bearer a=b=c")
    assert parse_header(" x-tenant = blue ") == ("x-tenant", "blue")
    assert parse_header("x-empty=") == ("x-empty", "")


@pytest.mark.parametrize("text, message", [
    ("no-equals-sign", "KEY=VALUE"),
    ("=value", "KEY=VALUE"),
    ("bad name=x", "invalid OTLP header name"),
    ("x-token=abc\r\nInjected: 1", "control character"),
])
def test_bad_headers_are_clear_errors_that_do_not_echo_the_value(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message) as raised:
        parse_header(text)
    assert "abc" not in str(raised.value)


@pytest.mark.parametrize("kwargs, message", [
    (dict(endpoint="http://c:4317", protocol="thrift"), "protocol must be one of"),
    (dict(endpoint="http://c:4317", interval=0), "interval must be a positive"),
    (dict(endpoint="http://c:4317", timeout=float("nan")), "timeout must be a positive"),
    (dict(endpoint="ftp://c:4317"), "must look like http://host:port"),
    (dict(endpoint="collector:4318", protocol="http/protobuf"), "needs a scheme"),
    (dict(endpoint="https://c:4318", protocol="http/protobuf", insecure=True), "contradict"),
    (dict(endpoint="http://c:4317", client_certificate_file="/x.crt"), "both a client certificate"),
    (dict(endpoint="http://c:4317", insecure=True, certificate_file="/ca.crt"), "insecure"),
    (dict(endpoint="http://c:4317", headers=(("x", "a\nb"),)), "control character"),
])
def test_bad_settings_are_clear_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(OtlpConfigError, match=message):
        OtlpSettings(**kwargs)


def test_grpc_host_port_endpoint_is_accepted() -> None:
    assert OtlpSettings("collector:4317").endpoint == "collector:4317"


def test_unreadable_tls_file_is_a_clear_error(tmp_path: Path) -> None:
    settings = OtlpSettings("https://c:4317", certificate_file=str(tmp_path / "missing-ca.crt"))
    with pytest.raises(OtlpConfigError, match="cannot read OTLP TLS file"):
        otlp.build_exporter(settings)
    with pytest.raises(OtlpConfigError, match="cannot read OTLP TLS file"):
        otlp.build_exporter(replace(settings, protocol="http/protobuf"))


def test_allowlisted_pod_labels_are_pushed_as_k8s_pod_label_attributes_with_their_keys() -> None:
    allow = catalog.PodLabels(("team", "app.kubernetes.io/name"))
    spec = catalog.CLAIM_CONSUMER_INFO
    own = spec.series(namespace="serve", claim="mig-small", pod="infer-0", pod_uid="u", container="server")
    sample = model.Sample(spec.with_pod_labels(own, allow.pairs({"team": "serving"})), 1.0)
    frame = model.Frame((model.Family(spec.name, (sample,)),), T0, pod_label_attributes=allow.attributes())
    (instrument,) = [i for i in otlp_mapping.instruments() if spec in i.families]
    ((attrs, value),) = otlp_mapping.observations(frame, instrument)
    got = dict(attrs)
    assert got["k8s.pod.label.team"] == "serving" and got["k8s.pod.name"] == "infer-0" and value == 1.0
    assert "k8s.pod.label.app.kubernetes.io/name" not in got, "an empty value is omitted, as for every attribute"
    assert not [k for k in got if "label_" in k], "the sanitized Prometheus name never reaches OTLP"
