"""A collector down for a long time: `serve --simulate` pushing every 0.2 s to an OTLP receiver that
refuses everything, for hundreds of failed exports, while /metrics is scraped. (The short outage
with the push checked end to end is `tests/test_e2e_otlp.py`.)"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from otlp_receiver import GrpcReceiver, running
from prometheus_client.parser import text_string_to_metric_families
from simnode import ATTRIBUTION, scrape
from test_e2e_otlp import has_gpu_metrics, rss_kib, stop

from dra_exporter import catalog as cat

FAILURES = 120  # refused attempts: ~30 s of wall time
# An export's timeout under the SDK's first retry backoff (0.8-1.2 s), so each failed export is one
# attempt and the outage reaches its count in half the time; a longer timeout adds only retries.
TIMEOUT = "0.5"


@pytest.fixture
def receiver() -> Iterator[GrpcReceiver]:
    yield from running(GrpcReceiver())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def self_metrics(port: int) -> dict[tuple[str, str], float]:
    """(metric, source) → value of the self-metrics, from a real scrape."""
    found = {}
    for family in text_string_to_metric_families(scrape(port).decode()):
        for s in family.samples:
            if "source" in s.labels:
                found[(s.name, s.labels["source"])] = s.value
    return found


@pytest.mark.slow  # ~35 s: over a hundred refused exports at 0.2 s
def test_a_long_collector_outage_is_counted_bounded_and_heals(receiver: GrpcReceiver) -> None:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dra_exporter.cli", "serve", "--simulate", ATTRIBUTION, "--listen",
         f"127.0.0.1:{port}", "--interval", "0.2", "--otlp-endpoint", receiver.endpoint,
         "--otlp-protocol", receiver.protocol, "--otlp-interval", "0.2", "--otlp-timeout", TIMEOUT],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        receiver.wait_for(has_gpu_metrics)
        receiver.failing = True
        receiver.wait_refused(20)
        rss_early = rss_kib(proc.pid)
        errors_early = self_metrics(port)[(cat.COLLECT_ERRORS.name, "otlp")]
        seen_frames = set()
        deadline = time.monotonic() + 120
        while receiver.refused < FAILURES:
            assert proc.poll() is None, "the exporter died during the outage"
            metrics = self_metrics(port)  # /metrics keeps answering, with new frames
            seen_frames.add(metrics[(cat.LAST_SUCCESS.name, "nvml")])
            assert time.monotonic() < deadline, f"only {receiver.refused} exports in 120 s"
            time.sleep(0.2)
        rss_late = rss_kib(proc.pid)
        metrics = self_metrics(port)
        assert metrics[(cat.SOURCE_UP.name, "otlp")] == 0.0
        # Each failed export counts once; the receiver also sees the exporter's own retries.
        counted = metrics[(cat.COLLECT_ERRORS.name, "otlp")] - errors_early
        assert 50 <= counted <= receiver.refused, (counted, receiver.refused)
        assert len(seen_frames) >= 10, "fresh frames on /metrics throughout the outage"
        # Nothing is queued while the collector is away: memory does not grow with the failures.
        assert rss_late - rss_early < 16 * 1024, (rss_early, rss_late)
        receiver.failing = False
        receiver.wait_for(has_gpu_metrics, after=len(receiver.received))
        eventually_up = time.monotonic() + 20
        while self_metrics(port)[(cat.SOURCE_UP.name, "otlp")] != 1.0:
            assert time.monotonic() < eventually_up, "otlp never reported up again"
            time.sleep(0.2)
    finally:
        out = stop(proc)
    assert out.count("OTLP push") <= 4, "one line when it fails, one when it works again: " + out
