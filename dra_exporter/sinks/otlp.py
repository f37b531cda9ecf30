"""The OTLP sink: push the latest frame to an OpenTelemetry collector, never blocking the agent.

Contract:

* ``OtlpSink.publish(frame)`` is one reference assignment. A daemon thread wakes every
  ``OtlpSettings.interval`` seconds, turns the latest frame into OTLP metrics and hands them to the
  SDK's OTLP exporter (gRPC or HTTP/protobuf), whose retries are bounded by ``OtlpSettings.timeout``.
  A collector that is down or slow therefore costs at most one export's timeout on that thread,
  and nothing is queued: while it is down the sink holds the latest frame and nothing else.
* ``health()`` says whether the last export succeeded, how many failed, and when one last worked
  (``source="otlp"``), so the agent can publish it like any other source's health.
* Names, units and instrument kinds come from the catalogue's OTLP columns (``otel_name``,
  ``otel_unit``, ``otel_scale``). Families that share an ``otel_name`` become one metric,
  told apart by the constant attributes in ``_ADAPTERS`` (``hw.gpu.task``, ``hw.sensor_location``,
  ``error.type``). Gauges stay gauges, counters become monotonic sums, and the families that the
  semantic conventions model as UpDownCounters (memory usage/limit, ``hw.status``) become
  non-monotonic sums.
* Attributes follow the semantic conventions where one exists (``_ATTRIBUTES``); any other label
  ``x`` becomes ``dra.x`` (``gpu`` -> ``dra.gpu``, the NVML index of the physical GPU). Empty
  values are omitted. Device series also carry ``hw.type=gpu``, ``hw.vendor=NVIDIA`` and
  ``hw.model`` (taken from the same frame's GPU info series of that UUID).

Why the frame is turned into OTLP points here instead of through SDK observable instruments:
the Python SDK (checked on 1.45) never forgets an attribute set an asynchronous instrument has
reported. Each pod that ever held a GPU would stay in memory for the life of the process, and
after 2000 distinct attribute sets per instrument every new series would be folded into one
``otel.metric.overflow=true`` point. A node with short-lived GPU pods reaches that in days.
Building the points from the latest frame keeps exactly the series that frame has (ended pods
disappear from the next export) and remembers only the start times of those series.

The standard ``OTEL_EXPORTER_OTLP_*`` variables (endpoint, headers, certificates, compression,
temporality preference, …) are read by the SDK exporters; the sink passes only what the settings
set explicitly, and an endpoint in the settings wins over the environment.
"""

from __future__ import annotations

import logging
import math
import os
import re
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Final, Literal
from urllib.parse import urlsplit, urlunsplit

from opentelemetry.sdk.metrics import ObservableCounter
from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Metric,
    MetricExporter,
    MetricExportResult,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.util.re import parse_env_headers

from .. import catalog, model
from ..boundedio import require_regular_file

Protocol = Literal["grpc", "http/protobuf"]
PROTOCOLS: Final = ("grpc", "http/protobuf")
#: The path of the metrics signal on an OTLP/HTTP receiver.
HTTP_METRICS_PATH: Final = "/v1/metrics"
SOURCE: Final = "otlp"
SERVICE_NAME: Final = "dra-exporter"
VENDOR: Final = "NVIDIA"

InstrumentKind = Literal["gauge", "counter", "updowncounter"]
#: Attribute pairs sorted by key: hashable, and equal for equal attribute sets.
Attributes = tuple[tuple[str, str], ...]


class OtlpConfigError(ValueError):
    """An OTLP setting an operator has to fix; the message says which and how."""


# --- settings ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OtlpSettings:
    """Where and how to push. Unset TLS fields fall back to the ``OTEL_EXPORTER_OTLP_*`` variables."""

    endpoint: str
    """``http(s)://host:port`` (gRPC also takes ``host:port``); ``""``: from the environment.
    For http/protobuf, ``/v1/metrics`` is appended when the URL has no path."""
    protocol: Protocol = "grpc"
    interval: float = 10.0
    """Seconds between pushes."""
    headers: tuple[tuple[str, str], ...] = ()
    """Sent with every export, on top of ``OTEL_EXPORTER_OTLP_(METRICS_)HEADERS``; on a clash these win."""
    insecure: bool | None = None
    """gRPC: plaintext if true, TLS if false; None: decided from the URL scheme (``http`` = plaintext).
    http/protobuf: the scheme decides; a contradicting value is an error."""
    certificate_file: str | None = None
    """CA bundle that signs the collector's certificate."""
    client_certificate_file: str | None = None
    """Client certificate for mTLS (needs ``client_key_file``)."""
    client_key_file: str | None = None
    timeout: float = 10.0
    """Seconds one export may take, retries included."""

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise OtlpConfigError(f"OTLP protocol must be one of {', '.join(PROTOCOLS)} "
                                  f"(got {self.protocol!r})")
        for name, value in (("interval", self.interval), ("timeout", self.timeout)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise OtlpConfigError(f"OTLP {name} must be a positive number of seconds (got {value!r})")
        _check_endpoint(self)
        if bool(self.client_certificate_file) != bool(self.client_key_file):
            raise OtlpConfigError("OTLP mTLS needs both a client certificate file and a client key file")
        if self.insecure and (self.certificate_file or self.client_certificate_file):
            raise OtlpConfigError("OTLP certificate files were given together with insecure (plaintext); "
                                  "drop one of them")
        for name, value in self.headers:
            _check_header(name, value)


def _check_endpoint(settings: OtlpSettings) -> None:
    endpoint = settings.endpoint
    if not endpoint:
        return
    if "://" not in endpoint:
        if settings.protocol == "http/protobuf":
            raise OtlpConfigError(f"OTLP endpoint {endpoint!r} needs a scheme for http/protobuf, "
                                  f"e.g. http://collector:4318 or https://collector:4318")
        return  # gRPC's host:port form; TLS unless insecure
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise OtlpConfigError(f"OTLP endpoint {endpoint!r} must look like http://host:port "
                              f"or https://host:port")
    if settings.protocol == "http/protobuf" and settings.insecure is not None:
        if settings.insecure != (parts.scheme == "http"):
            raise OtlpConfigError(f"OTLP endpoint {endpoint!r} and insecure={settings.insecure} contradict "
                                  f"each other; for http/protobuf the scheme decides "
                                  f"(http:// plaintext, https:// TLS)")


#: RFC 9110 token characters, the only ones allowed in a header name.
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
#: Control characters other than tab would split or corrupt the request.
_BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def _check_header(name: str, value: str) -> None:
    # Messages name the header but never echo its value: it is often a credential.
    if not _HEADER_NAME.fullmatch(name):
        raise OtlpConfigError(f"invalid OTLP header name {name!r}: use letters, digits and -_. only")
    if _BAD_VALUE.search(value):
        raise OtlpConfigError(f"invalid value for OTLP header {name!r}: it contains a line break or "
                              f"another control character")


def parse_header(text: str) -> tuple[str, str]:
    """``"KEY=VALUE"`` (as given to ``--otlp-header``) -> ``("key", "VALUE")``.

    The name is lower-cased because gRPC metadata keys must be lower case (HTTP does not care).
    Raises ``ValueError`` (``OtlpConfigError``) with a message an operator can act on.
    """
    name, sep, value = text.partition("=")
    name, value = name.strip(), value.strip()
    if not sep or not name:
        raise OtlpConfigError("OTLP header must look like KEY=VALUE, e.g. authorization=Bearer <token>")
    _check_header(name, value)
    return name.lower(), value


# --- exporters --------------------------------------------------------------------------------


def build_exporter(settings: OtlpSettings) -> MetricExporter:
    """The SDK's OTLP metric exporter for ``settings``; unset fields are left to the environment."""
    for path in (settings.certificate_file, settings.client_certificate_file, settings.client_key_file):
        if path and not os.access(path, os.R_OK):
            raise OtlpConfigError(f"cannot read OTLP TLS file {path!r}: check the path and its permissions")
        if path:
            try:
                require_regular_file(path)  # the SDK's own open would block on a FIFO for ever
            except OSError as exc:
                raise OtlpConfigError(f"cannot read OTLP TLS file {path!r}: {exc.strerror}") from None
    if settings.protocol == "grpc":
        return _grpc_exporter(settings)
    return _http_exporter(settings)


def _grpc_exporter(settings: OtlpSettings) -> MetricExporter:
    import grpc
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

    kwargs: dict[str, object] = {"timeout": settings.timeout}
    if settings.endpoint:
        kwargs["endpoint"] = settings.endpoint
    if settings.insecure is not None:
        kwargs["insecure"] = settings.insecure
    if settings.certificate_file or settings.client_certificate_file:
        kwargs["credentials"] = grpc.ssl_channel_credentials(
            root_certificates=_read(settings.certificate_file),
            private_key=_read(settings.client_key_file),
            certificate_chain=_read(settings.client_certificate_file),
        )
    if settings.headers:
        # The gRPC exporter drops the environment's headers as soon as any are passed, while the HTTP
        # one merges them under the explicit ones; merging here gives both protocols that behaviour.
        # gRPC metadata keys must be lower case.
        explicit = {name.lower(): value for name, value in settings.headers}
        kwargs["headers"] = tuple({**_environment_headers(), **explicit}.items())
    return OTLPMetricExporter(**kwargs)  # type: ignore[arg-type]


def _http_exporter(settings: OtlpSettings) -> MetricExporter:
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    kwargs: dict[str, object] = {"timeout": settings.timeout}
    if settings.endpoint:
        # An explicit endpoint is used verbatim by the SDK, so the signal path is ours to add.
        kwargs["endpoint"] = _http_metrics_url(settings.endpoint)
    if settings.certificate_file:
        kwargs["certificate_file"] = settings.certificate_file
    if settings.client_certificate_file:
        kwargs["client_certificate_file"] = settings.client_certificate_file
        kwargs["client_key_file"] = settings.client_key_file
    if settings.headers:
        kwargs["headers"] = dict(settings.headers)
    return OTLPMetricExporter(**kwargs)  # type: ignore[arg-type]


def _http_metrics_url(endpoint: str) -> str:
    parts = urlsplit(endpoint)
    if parts.path in ("", "/"):
        parts = parts._replace(path=HTTP_METRICS_PATH)
    return urlunsplit(parts)


def _environment_headers() -> dict[str, str]:
    text = (os.environ.get("OTEL_EXPORTER_OTLP_METRICS_HEADERS")
            or os.environ.get("OTEL_EXPORTER_OTLP_HEADERS", ""))
    return dict(parse_env_headers(text, liberal=True))


def _read(path: str | None) -> bytes | None:
    if not path:
        return None
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as exc:
        raise OtlpConfigError(f"cannot read OTLP TLS file {path!r}: {exc.strerror}") from None


def _prefers_delta(exporter: MetricExporter) -> bool:
    """Whether the exporter asks for delta counters
    (``OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE``)."""
    # The SDK's own readers consult this attribute of MetricExporter the same way.
    preferred = getattr(exporter, "_preferred_temporality", None) or {}
    return preferred.get(ObservableCounter) is AggregationTemporality.DELTA


# --- catalogue -> OTLP instruments (pure) -----------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Adapter:
    """What a family needs beyond its catalogue row to follow the semantic conventions."""

    updown: bool = False
    """The convention makes it an UpDownCounter (a non-monotonic sum), not a gauge."""
    constant: Attributes = ()
    """Attributes on every point, telling apart families that share one OTLP name."""
    stateset: tuple[str, str] | None = None
    """``(state if 1, state if 0)``: one point per state, valued 1 or 0 (``hw.status``)."""


_PLAIN: Final = _Adapter()
_ADAPTERS: Final[Mapping[str, _Adapter]] = {
    catalog.GPU_UP: _Adapter(updown=True, stateset=("ok", "failed")),
    catalog.GPU_UTILIZATION: _Adapter(constant=(("hw.gpu.task", "general"),)),
    catalog.GPU_ENCODER_UTILIZATION: _Adapter(constant=(("hw.gpu.task", "encoder"),)),
    catalog.GPU_DECODER_UTILIZATION: _Adapter(constant=(("hw.gpu.task", "decoder"),)),
    catalog.GPU_MEMORY_USED: _Adapter(updown=True),
    catalog.GPU_MEMORY_FREE: _Adapter(updown=True),
    catalog.GPU_MEMORY_TOTAL: _Adapter(updown=True),
    catalog.GPU_MEMORY_RESERVED: _Adapter(updown=True),
    catalog.CONTAINER_GPU_MEMORY_USED: _Adapter(updown=True),
    catalog.GPU_TEMPERATURE: _Adapter(constant=(("hw.sensor_location", "gpu"),)),
    catalog.GPU_MEMORY_TEMPERATURE: _Adapter(constant=(("hw.sensor_location", "memory"),)),
    catalog.GPU_XID_ERRORS: _Adapter(constant=(("error.type", "xid"),)),
}

#: Prometheus label -> OTel attribute, where a semantic convention (or DESIGN §4) names one.
_ATTRIBUTES: Final[Mapping[str, str]] = {
    "uuid": "hw.id",
    "parent_uuid": "hw.parent",
    "model": "hw.model",
    "namespace": "k8s.namespace.name",
    "pod": "k8s.pod.name",
    "pod_uid": "k8s.pod.uid",
    "container": "k8s.container.name",
    "claim": "k8s.resourceclaim.name",
    "claim_uid": "k8s.resourceclaim.uid",
    "request": "k8s.resourceclaim.request",
    "driver": "dra.driver",
    "pool": "dra.pool",
    "device": "dra.device",
    "direction": "network.io.direction",
    "type": "error.type",
}
#: Label values the convention spells differently.
_VALUES: Final[Mapping[str, Mapping[str, str]]] = {"direction": {"rx": "receive", "tx": "transmit"}}


def attribute_name(label: str) -> str:
    """The OTel attribute for a Prometheus label: the convention's name, else ``dra.<label>``."""
    return _ATTRIBUTES.get(label) or f"dra.{label}"


@dataclass(frozen=True, slots=True)
class Instrument:
    """One OTLP metric and the catalogue families whose samples it carries."""

    name: str
    unit: str
    description: str
    kind: InstrumentKind
    families: tuple[catalog.MetricSpec, ...]


def _kind(spec: catalog.MetricSpec) -> InstrumentKind:
    if spec.kind == "counter":
        return "counter"
    return "updowncounter" if _ADAPTERS.get(spec.name, _PLAIN).updown else "gauge"


def instruments(specs: Iterable[catalog.MetricSpec] = catalog.CATALOG) -> tuple[Instrument, ...]:
    """The OTLP metrics the catalogue declares, in catalogue order; families without ``otel_name`` are
    not pushed. Raises ``ValueError`` when families sharing a name disagree on kind or unit."""
    groups: dict[str, list[catalog.MetricSpec]] = {}
    for spec in specs:
        if spec.otel_name:
            groups.setdefault(spec.otel_name, []).append(spec)
    result = []
    for name, members in groups.items():
        kinds, units = {_kind(s) for s in members}, {s.otel_unit for s in members}
        if len(kinds) > 1 or len(units) > 1:
            raise ValueError(f"catalogue families {[s.name for s in members]} share the OTLP name {name!r} "
                             f"but not one instrument kind and unit ({sorted(kinds)}, {sorted(units)})")
        result.append(Instrument(name, units.pop(), members[0].help, kinds.pop(), tuple(members)))
    return tuple(result)


def gpu_models(frame: model.Frame) -> dict[str, str]:
    """UUID -> model name, from the frame's GPU info series."""
    info = frame.family(catalog.GPU_INFO)
    models: dict[str, str] = {}
    for sample in info.samples if info else ():
        labels = dict(sample.labels)
        if labels.get("uuid") and labels.get("model"):
            models[labels["uuid"]] = labels["model"]
    return models


def _is_device_family(spec: catalog.MetricSpec) -> bool:
    return spec.labels[:len(catalog.DEVICE_ID_LABELS)] == catalog.DEVICE_ID_LABELS


def _attributes(labels: model.Labels, adapter: _Adapter, device: bool,
                models: Mapping[str, str]) -> dict[str, str]:
    attrs = {attribute_name(name): _VALUES.get(name, {}).get(value, value) for name, value in labels if value}
    if device:
        attrs["hw.type"] = "gpu"
        attrs["hw.vendor"] = VENDOR
        if model_name := models.get(dict(labels).get("uuid", "")):
            attrs["hw.model"] = model_name
    attrs.update(adapter.constant)
    return attrs


def observations(frame: model.Frame, instrument: Instrument,
                 models: Mapping[str, str] | None = None) -> Iterator[tuple[Attributes, float]]:
    """Every (attributes, value) the frame holds for ``instrument``, values scaled to its unit."""
    models = gpu_models(frame) if models is None else models
    for spec in instrument.families:
        family = frame.family(spec.name)
        if family is None:
            continue
        adapter = _ADAPTERS.get(spec.name, _PLAIN)
        device = _is_device_family(spec)
        for sample in family.samples:
            attrs = _attributes(sample.labels, adapter, device, models)
            value = sample.value * spec.otel_scale
            if adapter.stateset is None:
                yield tuple(sorted(attrs.items())), value
                continue
            when_true, when_false = adapter.stateset
            for state, state_value in ((when_true, value), (when_false, 1.0 - value)):
                yield tuple(sorted({**attrs, "hw.state": state}.items())), state_value


class MetricsBuilder:
    """Latest frame -> ``MetricsData``. Remembers only what the last export's series need:
    their start times (and, for delta counters, their last values), so memory follows the
    live series and an ended pod is forgotten after one export."""

    def __init__(self, resource: Resource, scope: InstrumentationScope, *, delta_counters: bool = False,
                 specs: Iterable[catalog.MetricSpec] = catalog.CATALOG) -> None:
        self._resource = resource
        self._scope = scope
        self._delta = delta_counters
        self._instruments = instruments(specs)
        self._start: dict[tuple[str, Attributes], int] = {}
        self._last: dict[tuple[str, Attributes], tuple[float, int]] = {}

    @property
    def tracked_series(self) -> int:
        """How many series the builder remembers (bounded by the last frame's series)."""
        return len(self._start) + len(self._last)

    def build(self, frame: model.Frame, now_ns: int) -> MetricsData:
        # Points carry the time the frame was collected, not the push time: the data's age stays visible.
        time_ns = int(frame.timestamp * 1e9) if frame.timestamp > 0 else now_ns
        models = gpu_models(frame)
        start: dict[tuple[str, Attributes], int] = {}
        last: dict[tuple[str, Attributes], tuple[float, int]] = {}
        metrics = []
        for inst in self._instruments:
            points = list(self._points(inst, observations(frame, inst, models), time_ns, start, last))
            if points:
                metrics.append(Metric(inst.name, inst.description, inst.unit, self._data(inst, points)))
        # Swapping in fresh maps is what forgets the series this frame no longer has.
        self._start, self._last = start, last
        return MetricsData([ResourceMetrics(self._resource, [ScopeMetrics(self._scope, metrics, "")], "")])

    def _points(self, inst: Instrument, observed: Iterable[tuple[Attributes, float]], time_ns: int,
                start: dict[tuple[str, Attributes], int],
                last: dict[tuple[str, Attributes], tuple[float, int]]) -> Iterator[NumberDataPoint]:
        for attrs, value in observed:
            key = (inst.name, attrs)
            if inst.kind == "gauge":
                yield NumberDataPoint(dict(attrs), 0, time_ns, value)
            elif inst.kind == "counter" and self._delta:
                previous = self._last.get(key)
                last[key] = (value, time_ns) if previous is None or time_ns > previous[1] else previous
                if previous is None or time_ns <= previous[1]:
                    continue  # no baseline yet, or the same frame again: nothing new to report
                # A counter that went down was reset (driver reload); its new value is all new.
                delta = value - previous[0] if value >= previous[0] else value
                yield NumberDataPoint(dict(attrs), previous[1], time_ns, delta)
            else:
                # Cumulative: the series starts when this exporter first saw it.
                start[key] = self._start.get(key, time_ns)
                yield NumberDataPoint(dict(attrs), start[key], time_ns, value)

    def _data(self, inst: Instrument, points: list[NumberDataPoint]) -> Gauge | Sum:
        if inst.kind == "gauge":
            return Gauge(points)
        temporality = (AggregationTemporality.DELTA if inst.kind == "counter" and self._delta
                       else AggregationTemporality.CUMULATIVE)
        return Sum(points, temporality, is_monotonic=inst.kind == "counter")


# --- the sink ---------------------------------------------------------------------------------


def resource(*, node_name: str, host_name: str, version: str) -> Resource:
    """Resource attributes of every export; ``OTEL_RESOURCE_ATTRIBUTES`` adds to them (ours win)."""
    attrs = {"service.name": SERVICE_NAME, "service.version": version,
             "k8s.node.name": node_name, "host.name": host_name}
    return Resource.create({k: v for k, v in attrs.items() if v})


class OtlpSink:
    """Pushes the latest published frame every ``settings.interval`` seconds from a daemon thread."""

    def __init__(self, settings: OtlpSettings, *, node_name: str, host_name: str, version: str,
                 logger: logging.Logger | None = None, exporter: MetricExporter | None = None) -> None:
        self._settings = settings
        self._logger = logger or logging.getLogger(__name__)
        self._exporter = exporter if exporter is not None else build_exporter(settings)
        self._target = settings.endpoint or "the OTEL_EXPORTER_OTLP_* endpoint"
        self._builder = MetricsBuilder(resource(node_name=node_name, host_name=host_name, version=version),
                                       InstrumentationScope("dra_exporter", version),
                                       delta_counters=_prefers_delta(self._exporter))
        self._frame: model.Frame | None = None
        self._health = model.SourceHealth(SOURCE, up=False)
        self._export_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="otlp-push", daemon=True)
        self._thread.start()

    def publish(self, frame: model.Frame) -> None:
        """Make ``frame`` what the next push sends. One assignment: never waits for the collector."""
        self._frame = frame

    def health(self) -> model.SourceHealth:
        """``up``: the last export succeeded; ``errors_total``: failed exports since start."""
        return self._health

    def shutdown(self) -> None:
        """Stop pushing after one last export of the latest frame (bounded by the timeout)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=self._settings.timeout + self._settings.interval)
        if not self._thread.is_alive():
            self._export_once()
        self._exporter.shutdown(timeout_millis=self._settings.timeout * 1000)

    def _run(self) -> None:
        while not self._stop.wait(self._settings.interval):
            self._export_once()

    def _export_once(self) -> None:
        frame = self._frame
        if frame is None:
            return  # nothing collected yet: an empty push would only say "no GPUs"
        with self._export_lock:
            started = time.monotonic()
            try:
                data = self._builder.build(frame, time.time_ns())
                result = self._exporter.export(data, timeout_millis=self._settings.timeout * 1000)
                ok, reason = result is MetricExportResult.SUCCESS, "the collector did not accept the export"
            except Exception as exc:  # noqa: BLE001 - an exporter fault must not end the push thread
                ok, reason = False, f"{type(exc).__name__}: {exc}"
                self._logger.debug("OTLP export raised", exc_info=True)
            self._record(ok, time.monotonic() - started, reason)

    def _record(self, ok: bool, duration: float, reason: str) -> None:
        before = self._health
        errors = before.errors_total + (0 if ok else 1)
        last_success = time.time() if ok else before.last_success_timestamp
        self._health = model.SourceHealth(SOURCE, ok, duration, errors, last_success)
        # Log changes of state only: a collector that is down for an hour must not flood the log.
        if ok and not before.up and before.errors_total:
            self._logger.info("OTLP push to %s works again (%d failed exports so far)", self._target, errors)
        elif not ok and (before.up or before.errors_total == 0):
            self._logger.warning("OTLP push to %s failed (%s); retrying every %gs, dropping data meanwhile",
                                 self._target, reason, self._settings.interval)
