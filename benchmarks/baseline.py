"""The baselines the benchmarks measure dra-exporter against, built from prometheus_client.

- ``families(frame)`` / ``render_reference(frame)``: the frame as prometheus_client metric
  families and their exposition: how ``sinks/prometheus.py`` rendered before
  ``sinks/exposition.py`` existed. It is the render baseline of the cycle benchmark and the
  reference the hand-written renderer must match byte for byte (tests/test_benchmarks.py).
- ``PerScrapeCollector``: the peers' pattern (dcgm-exporter, nvitop-exporter): on every
  scrape, read NVML, join, build the families; served by prometheus_client's own HTTP server.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client.exposition import generate_latest as _text_exposition
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.openmetrics.exposition import generate_latest as _openmetrics_exposition
from prometheus_client.samples import Sample as _PromSample

from dra_exporter import catalog, model

_COUNTER_SUFFIX = "_total"


def _family(family: model.Family) -> Metric:
    spec = catalog.spec(family.name)
    if spec.kind == "counter":
        # prometheus_client names a counter by its base name and appends _total to samples.
        metric: Metric = CounterMetricFamily(spec.name, spec.help)
        sample_name = metric.name + _COUNTER_SUFFIX
    else:
        metric = GaugeMetricFamily(spec.name, spec.help)
        sample_name = metric.name
    for sample in family.samples:
        # Appended directly (not add_metric): own label names per sample, and no _created series.
        metric.samples.append(_PromSample(sample_name, dict(sample.labels), float(sample.value)))
    return metric


def families(frame: model.Frame) -> Iterator[Metric]:
    for family in frame.families:
        if family.samples:
            yield _family(family)


class _FrameCollector:
    def __init__(self, frame: model.Frame) -> None:
        self._frame = frame

    def collect(self) -> Iterator[Metric]:
        return families(self._frame)


def render_reference(frame: model.Frame, *, openmetrics: bool = False) -> bytes:
    """The exposition prometheus_client writes for ``frame``."""
    collector = _FrameCollector(frame)
    return _openmetrics_exposition(collector) if openmetrics else _text_exposition(collector)


class PerScrapeCollector:
    """A prometheus_client collector that does a whole cycle on every ``collect()``.

    ``cycle`` returns a fresh frame (NVML read, join); the lock serialises concurrent scrapes,
    as the peers must around their single NVML session.
    """

    def __init__(self, cycle: Callable[[], model.Frame]) -> None:
        self._cycle = cycle
        self._lock = threading.Lock()
        self.collections = 0

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            frame = self._cycle()
            self.collections += 1
        return families(frame)


def describe(_: Any = None) -> str:
    return "prometheus_client custom collector: NVML collect + join + families on every scrape"
