"""Catalogue -> OTLP: which metrics a frame becomes, with which attributes (pure, no I/O).

Names, units, scales and instrument kinds come from each family's ``OtlpForm`` in the catalogue.
Families that share an OTLP name become one metric, told apart by their forms' constant
attributes (``hw.gpu.task``, ``hw.sensor_location``, ``error.type``). Gauges stay gauges,
counters become monotonic sums, and the families the semantic conventions model as
UpDownCounters (memory usage/limit, ``hw.status``) become non-monotonic sums.

Attributes follow the catalogue's ``OTEL_ATTRIBUTES`` (``uuid`` -> ``hw.id``; any other label
``x`` becomes ``dra.x``) unless a family's ``OtlpForm.attributes`` say otherwise; an allowlisted pod
label (``label_team``) becomes ``k8s.pod.label.<its key>`` (``Frame.pod_label_attributes``). Empty values
are omitted. Device series also carry ``hw.type=gpu``, ``hw.vendor`` (the vendor of the device
source that read that UUID: ``Frame.device_vendors``) and ``hw.model`` (from the same frame's GPU
info series of that UUID).

Why the frame is turned into OTLP points here instead of through SDK observable instruments:
the Python SDK (checked on 1.45) never forgets an attribute set an asynchronous instrument has
reported. Each pod that ever held a GPU would stay in memory for the life of the process, and
after 2000 distinct attribute sets per instrument every new series would be folded into one
``otel.metric.overflow=true`` point. A node with short-lived GPU pods reaches that in days.
Building the points from the latest frame keeps exactly the series that frame has (ended pods
disappear from the next export) and remembers only the start times of those series.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

from opentelemetry.sdk.metrics.export import (
    AggregationTemporality,
    Gauge,
    Metric,
    MetricsData,
    NumberDataPoint,
    ResourceMetrics,
    ScopeMetrics,
    Sum,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from .. import catalog, model
from .exposition import valid_text

InstrumentKind = Literal["gauge", "counter", "updowncounter"]
#: Attribute pairs sorted by key: hashable, and equal for equal attribute sets.
Attributes = tuple[tuple[str, str], ...]


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
    return "updowncounter" if spec.otlp is not None and spec.otlp.updown else "gauge"


def instruments(specs: Iterable[catalog.MetricSpec] = catalog.CATALOG) -> tuple[Instrument, ...]:
    """The OTLP metrics the catalogue declares, in catalogue order; families without an OTLP form are
    not pushed. Raises ``ValueError`` when families sharing a name disagree on kind or unit."""
    groups: dict[str, list[tuple[catalog.MetricSpec, catalog.OtlpForm]]] = {}
    for spec in specs:
        if spec.otlp is not None:
            groups.setdefault(spec.otlp.name, []).append((spec, spec.otlp))
    result = []
    for name, pairs in groups.items():
        members = [s for s, _ in pairs]
        kinds, units = {_kind(s) for s in members}, {form.unit for _, form in pairs}
        if len(kinds) > 1 or len(units) > 1:
            raise ValueError(f"catalogue families {[s.name for s in members]} share the OTLP name {name!r} "
                             f"but not one instrument kind and unit ({sorted(kinds)}, {sorted(units)})")
        result.append(Instrument(name, units.pop(), members[0].help, kinds.pop(), tuple(members)))
    return tuple(result)


def device_attributes(frame: model.Frame) -> dict[str, dict[str, str]]:
    """UUID -> the hardware attributes every series of that device carries: ``hw.vendor`` from its
    device source (``Frame.device_vendors``), ``hw.model`` from the frame's GPU info series."""
    devices: dict[str, dict[str, str]] = {uuid: {"hw.vendor": vendor} for uuid, vendor in frame.device_vendors}
    info = frame.family(catalog.GPU_INFO.name)
    for sample in info.samples if info else ():
        labels = dict(sample.labels)
        if labels.get("uuid") and labels.get("model"):
            devices.setdefault(labels["uuid"], {})["hw.model"] = labels["model"]
    return devices


def _attributes(labels: model.Labels, form: catalog.OtlpForm, device: bool,
                devices: Mapping[str, Mapping[str, str]], pod_labels: Mapping[str, str]) -> dict[str, str]:
    spelling = catalog.OTEL_VALUES
    naming = form.attribute if form.attributes else catalog.attribute_name
    attrs = {pod_labels.get(name) or naming(name): valid_text(spelling.get(name, {}).get(value, value))
             for name, value in labels if value}
    if device:
        attrs["hw.type"] = "gpu"
        attrs.update(devices.get(dict(labels).get("uuid", ""), {}))
    attrs.update(form.constant)
    return attrs


def observations(frame: model.Frame, instrument: Instrument,
                 devices: Mapping[str, Mapping[str, str]] | None = None) -> Iterator[tuple[Attributes, float]]:
    """Every (attributes, value) the frame holds for ``instrument``, values scaled to its unit."""
    devices = device_attributes(frame) if devices is None else devices
    for spec in instrument.families:
        family = frame.family(spec.name)
        form = spec.otlp
        if family is None or form is None:
            continue
        pod_labels = dict(frame.pod_label_attributes) if spec.pod_labels else {}
        for sample in family.samples:
            attrs = _attributes(sample.labels, form, spec.is_device, devices, pod_labels)
            value = sample.value * form.scale
            if form.stateset is None:
                yield tuple(sorted(attrs.items())), value
                continue
            when_true, when_false = form.stateset
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
        devices = device_attributes(frame)
        start: dict[tuple[str, Attributes], int] = {}
        last: dict[tuple[str, Attributes], tuple[float, int]] = {}
        metrics = []
        for inst in self._instruments:
            points = list(self._points(inst, observations(frame, inst, devices), time_ns, start, last))
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
