"""The Prometheus sink: render each frame once, serve the cached bytes on every scrape.

``render`` turns a ``model.Frame`` into the Prometheus text format (0.0.4) or OpenMetrics
1.0 through prometheus_client, which owns escaping of every UTF-8 label value. HELP and TYPE
come from the metric catalogue; a family the catalogue does not declare is a programming
error and is reported as such rather than published with a made-up type.

``PrometheusSink.publish`` renders both formats at the end of a cycle and swaps them in
with one reference assignment, so a concurrent scrape sees either the old frame or the new
one, never a mix. Scrapes only read that reference (see ``sinks.http``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass

from prometheus_client.exposition import generate_latest as _text_exposition
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.openmetrics.exposition import generate_latest as _openmetrics_exposition
from prometheus_client.samples import Sample as _PromSample

from .. import catalog, model
from .http import MetricsServer, Payload

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"

_COUNTER_SUFFIX = "_total"


class UnknownMetricError(ValueError):
    """A frame holds a family that is not in ``dra_exporter.catalog``."""


def _prometheus_family(family: model.Family) -> Metric:
    try:
        spec = catalog.spec(family.name)
    except KeyError:
        raise UnknownMetricError(
            f"metric family {family.name!r} is not declared in dra_exporter.catalog") from None
    if spec.kind == "counter":
        # prometheus_client names a counter family by its base name and appends _total to
        # the sample; giving it the base name yields "# TYPE <base>_total counter" in text
        # and "# TYPE <base> counter" with "<base>_total" samples in OpenMetrics.
        metric: Metric = CounterMetricFamily(spec.name, spec.help)
        sample_name = metric.name + _COUNTER_SUFFIX
    else:
        metric = GaugeMetricFamily(spec.name, spec.help)
        sample_name = metric.name
    for sample in family.samples:
        # Appending samples directly (instead of add_metric) keeps each sample's own label
        # names and never adds a _created series, which OpenMetrics would otherwise carry
        # for counters whose start time we do not know.
        metric.samples.append(_PromSample(sample_name, dict(sample.labels), float(sample.value)))
    return metric


@dataclass(frozen=True, slots=True)
class _FrameCollector:
    """The smallest prometheus_client collector: yields the families of one frame."""

    frame: model.Frame

    def collect(self) -> Iterator[Metric]:
        for family in self.frame.families:
            if family.samples:
                yield _prometheus_family(family)


def render(frame: model.Frame, *, openmetrics: bool = False) -> bytes:
    """The exposition of ``frame``: Prometheus text 0.0.4, or OpenMetrics 1.0 (with ``# EOF``)."""
    collector = _FrameCollector(frame)
    if openmetrics:
        return _openmetrics_exposition(collector)
    return _text_exposition(collector)


@dataclass(frozen=True, slots=True)
class _Rendered:
    text: Payload
    openmetrics: Payload


class PrometheusSink:
    """Scrape endpoint for the latest frame. Ready once the first frame is published."""

    def __init__(self, listen: str = "0.0.0.0:9401", *, logger: logging.Logger | None = None,
                 request_timeout: float = 10.0) -> None:
        self._logger = logger or logging.getLogger(__name__)
        self._current: _Rendered | None = None
        self._server = MetricsServer(listen, self, logger=self._logger, request_timeout=request_timeout)
        #: How many frames publish() has rendered; scrapes never change it.
        self.renders = 0

    def start(self) -> None:
        """Bind and serve in a daemon thread; raises ``ListenAddressError`` if it cannot bind."""
        self._server.start()

    @property
    def port(self) -> int:
        """The bound port (useful with ``:0``)."""
        return self._server.port

    @property
    def ready(self) -> bool:
        return self._current is not None

    def publish(self, frame: model.Frame) -> None:
        """Render ``frame`` in both formats and make it what the next scrape returns."""
        rendered = _Rendered(
            text=Payload(render(frame), TEXT_CONTENT_TYPE),
            openmetrics=Payload(render(frame, openmetrics=True), OPENMETRICS_CONTENT_TYPE),
        )
        # A single reference swap: readers never see half of a publish.
        self._current = rendered
        self.renders += 1

    def payload(self, openmetrics: bool) -> Payload | None:
        """``ExpositionSource`` for the HTTP server: a lookup, no work."""
        current = self._current
        if current is None:
            return None
        return current.openmetrics if openmetrics else current.text

    def stop(self) -> None:
        self._server.stop()
