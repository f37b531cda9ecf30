"""The OTLP sink: push the latest frame to an OpenTelemetry collector, never blocking the agent.

Contract:

* ``OtlpSink.publish(frame)`` is one reference assignment. A daemon thread wakes every
  ``OtlpSettings.interval`` seconds, turns the latest frame into OTLP metrics (``otlp_mapping``)
  and hands them to the SDK's OTLP exporter (gRPC or HTTP/protobuf, ``otlp_settings``), whose
  retries are bounded by ``OtlpSettings.timeout``. A collector that is down or slow therefore
  costs at most one export's timeout on that thread, and nothing is queued: while it is down the
  sink holds the latest frame and nothing else.
* ``health()`` says whether the last export succeeded, how many failed, and when one last worked
  (``source="otlp"``), so the agent can publish it like any other source's health.

The settings, the exporter and the mapping are re-exported here: this module is the sink's API.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Final

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from .. import model
from .otlp_mapping import MetricsBuilder, instruments, observations
from .otlp_settings import OtlpConfigError, OtlpSettings, build_exporter, parse_header, prefers_delta, refusal

__all__ = ["SOURCE", "MetricsBuilder", "OtlpConfigError", "OtlpSettings", "OtlpSink", "build_exporter",
           "instruments", "observations", "parse_header", "resource"]

SOURCE: Final = "otlp"
SERVICE_NAME: Final = "dra-exporter"


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
                                       delta_counters=prefers_delta(self._exporter))
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
                ok = result is MetricExportResult.SUCCESS
                reason = refusal(self._exporter) or "the collector did not accept the export"
            except Exception as exc:  # an exporter fault must not end the push thread
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
