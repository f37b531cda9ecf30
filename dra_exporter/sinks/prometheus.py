"""The Prometheus sink: render each frame once, serve the cached bytes on every scrape.

``render`` turns a ``model.Frame`` into the Prometheus text format (0.0.4) or OpenMetrics
1.0; the writing itself is ``sinks.exposition`` (byte-identical to prometheus_client, several
times faster). HELP and TYPE come from the metric catalogue; a family the catalogue does not
declare is a programming error and is reported as such rather than published with a made-up type.

``PrometheusSink.publish`` renders both formats at the end of a cycle and swaps them in
with one reference assignment, so a concurrent scrape sees either the old frame or the new
one, never a mix. Scrapes only read that reference (see ``sinks.http``).

Compression happens in ``publish`` too, for each format a scraper asked gzip of within
``GZIP_AHEAD_S``: Prometheus scrapes every 15-60 s while frames come every second, so every
one of its scrapes would otherwise be the first to ask for a new frame and pay the
compression itself (~3 ms at ``scale``, a lock other scrapers queue on). zlib releases the
GIL while it compresses, so the cycle thread doing it holds up no scrape.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from .. import model
from . import exposition
from .exposition import UnknownMetricError as UnknownMetricError  # re-exported: part of this API
from .http import MetricsServer, Payload
from .webconfig import WebConfig

TEXT_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
OPENMETRICS_CONTENT_TYPE = "application/openmetrics-text; version=1.0.0; charset=utf-8"
#: A format whose gzip form a scraper asked for within this many seconds is compressed at
#: publish time; longer than any sensible scrape interval (Prometheus: 1 min by default).
GZIP_AHEAD_S: Final = 300.0


def render(frame: model.Frame, *, openmetrics: bool = False) -> bytes:
    """The exposition of ``frame``: Prometheus text 0.0.4, or OpenMetrics 1.0 (with ``# EOF``)."""
    return exposition.render(frame, openmetrics=openmetrics)


@dataclass(frozen=True, slots=True)
class _Rendered:
    text: Payload
    openmetrics: Payload


class PrometheusSink:
    """Scrape endpoint for the latest frame. Ready once the first frame is published."""

    def __init__(self, listen: str = "0.0.0.0:9401", *, logger: logging.Logger | None = None,
                 request_timeout: float = 10.0, idle_timeout: float = 60.0, max_connections: int = 256,
                 max_connections_per_client: int | None = None, web_config: WebConfig | None = None,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        """``web_config`` (from ``sinks.webconfig.load_web_config``) turns on TLS, client
        certificates, basic auth and extra headers; the timeouts and the connection caps
        are explained in ``sinks.http``."""
        self._logger = logger or logging.getLogger(__name__)
        self._current: _Rendered | None = None
        self._monotonic = monotonic
        #: When a scrape last asked for the gzip form, by format (openmetrics?): see GZIP_AHEAD_S.
        self._gzip_asked = {False: float("-inf"), True: float("-inf")}
        self._loop_health: Callable[[], model.LoopHealth] | None = None
        self._server = MetricsServer(listen, self, logger=self._logger, request_timeout=request_timeout,
                                     idle_timeout=idle_timeout, max_connections=max_connections,
                                     max_connections_per_client=max_connections_per_client,
                                     web_config=web_config, health=self._health)
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

    def answer_probes_from(self, health: Callable[[], model.LoopHealth]) -> None:
        """Let /healthz and /readyz follow ``health`` (the agent's watchdog) from now on."""
        self._loop_health = health

    def _health(self) -> model.LoopHealth:
        loop_health = self._loop_health
        return loop_health() if loop_health is not None else model.LoopHealth(ready=True, live=True)

    def publish(self, frame: model.Frame) -> None:
        """Render ``frame`` in both formats and make it what the next scrape returns."""
        rendered = _Rendered(
            text=Payload(render(frame), TEXT_CONTENT_TYPE),
            openmetrics=Payload(render(frame, openmetrics=True), OPENMETRICS_CONTENT_TYPE),
        )
        now = self._monotonic()
        for openmetrics, payload in ((False, rendered.text), (True, rendered.openmetrics)):
            if now - self._gzip_asked[openmetrics] < GZIP_AHEAD_S:
                payload.gzipped()
        # A single reference swap: readers never see half of a publish.
        self._current = rendered
        self.renders += 1

    def payload(self, openmetrics: bool, gzip: bool = False) -> Payload | None:
        """``ExpositionSource`` for the HTTP server: a lookup, no work."""
        if gzip:
            self._gzip_asked[openmetrics] = self._monotonic()
        current = self._current
        if current is None:
            return None
        return current.openmetrics if openmetrics else current.text

    def stop(self) -> None:
        self._server.stop()
