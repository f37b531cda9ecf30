"""The Prometheus sink: what it renders, and how its HTTP endpoint serves it."""

from __future__ import annotations

import gzip
import http.client
import math
import socket
import threading
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text
from promharness import promtool_check_metrics

from dra_exporter import catalog, model
from dra_exporter.printable import without_controls
from dra_exporter.sinks import prometheus as prometheus_sink
from dra_exporter.sinks.http import ListenAddressError, parse_listen
from dra_exporter.sinks.prometheus import (
    OPENMETRICS_CONTENT_TYPE,
    TEXT_CONTENT_TYPE,
    PrometheusSink,
    UnknownMetricError,
    render,
)

OPENMETRICS_ACCEPT = ("application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
                      "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1")

NASTY_VALUES = [
    "", 'say "hi"', "back\\slash", "trailing\\", "new\nline", "\\n literally", "tab\tand\rcr",
    "ünïcødé ✓ 日本語 🚀", "}{,=\"", "# EOF", "nul\x00byte", "x" * 2000,
]


# --- frame builders ------------------------------------------------------------------------

def device_labels(uuid: str, gpu: str = "0", *, namespace: str = "", pod: str = "", container: str = "",
                  claim: str = "", profile: str = "", parent_uuid: str = "",
                  extra: model.Labels = ()) -> model.Labels:
    values = {"uuid": uuid, "gpu": gpu, "profile": profile, "parent_uuid": parent_uuid,
              "namespace": namespace, "pod": pod, "container": container, "claim": claim}
    return tuple((name, values.get(name, "")) for name in catalog.DEVICE_LABELS) + extra


def family(name: str, *samples: tuple[model.Labels, float]) -> model.Family:
    return model.Family(name, tuple(model.Sample(labels, value) for labels, value in samples))


def sample_frame(utilization: float = 0.75) -> model.Frame:
    return model.Frame((
        family(catalog.GPU_UTILIZATION.name,
               (device_labels("GPU-aaaa", "0", namespace="ml", pod="trainer-0", container="main",
                              claim="train-gpus"), utilization),
               (device_labels("GPU-bbbb", "1"), 0.0)),
        family(catalog.GPU_MEMORY_USED.name, (device_labels("GPU-aaaa", "0"), 123_456_789_012.0)),
        family(catalog.GPU_ENERGY.name, (device_labels("GPU-aaaa", "0"), 98_765.5)),
        family(catalog.GPU_CLOCK.name,
               (device_labels("GPU-aaaa", extra=(("clock", "sm"),)), 1.98e9),
               (device_labels("GPU-aaaa", extra=(("clock", "memory"),)), 2.619e9)),
        family(catalog.GPU_XID_ERRORS.name),  # no samples: must not appear at all
        family(catalog.BUILD_INFO.name, ((("version", "0.1.0"), ("python_version", "3.11.2")), 1.0)),
    ), timestamp=1_700_000_000.0)


SeriesKey = tuple[str, frozenset[tuple[str, str]]]


def series_of(frame: model.Frame) -> dict[SeriesKey, float]:
    """What a scraper should see: sample name (counters with _total), label set (control characters
    replaced, ``printable.without_controls``), value."""
    out = {}
    for fam in frame.families:
        for sample in fam.samples:
            out[(fam.name, frozenset((k, without_controls(v)) for k, v in sample.labels))] = sample.value
    return out


def parsed_series(text: bytes, *, openmetrics: bool = False) -> tuple[dict[SeriesKey, float], dict[str, str]]:
    parse = parse_openmetrics if openmetrics else parse_text
    series: dict[SeriesKey, float] = {}
    types: dict[str, str] = {}
    for fam in parse(text.decode("utf-8")):
        types[fam.name] = fam.type
        for sample in fam.samples:
            series[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return series, types


# --- rendering -----------------------------------------------------------------------------

@pytest.mark.parametrize("openmetrics", [False, True], ids=["text", "openmetrics"])
def test_render_round_trips_names_labels_and_values(openmetrics: bool) -> None:
    frame = sample_frame()
    series, _ = parsed_series(render(frame, openmetrics=openmetrics), openmetrics=openmetrics)
    assert series == series_of(frame)


def test_text_render_uses_catalogue_help_and_types() -> None:
    text = render(sample_frame()).decode()
    util = catalog.GPU_UTILIZATION
    assert f"# HELP {util.name} {util.help}\n" in text
    assert f"# TYPE {util.name} gauge\n" in text
    # A counter keeps its catalogue name (with _total) on both the TYPE line and the sample.
    assert f"# TYPE {catalog.GPU_ENERGY.name} counter\n" in text
    assert f'\n{catalog.GPU_ENERGY.name}{{' in text
    _, types = parsed_series(render(sample_frame()))
    assert types[catalog.GPU_ENERGY.name.removesuffix("_total")] == "counter"
    assert types[catalog.GPU_MEMORY_USED.name] == "gauge"


def test_family_without_samples_is_omitted() -> None:
    text = render(sample_frame()).decode()
    assert catalog.GPU_XID_ERRORS.name not in text
    assert catalog.GPU_XID_ERRORS.name.removesuffix("_total") not in render(sample_frame(), openmetrics=True).decode()


def test_empty_frame_renders_empty_documents() -> None:
    assert render(model.Frame()) == b""
    assert render(model.Frame(), openmetrics=True) == b"# EOF\n"


def test_openmetrics_render_ends_with_eof_and_has_no_created_series() -> None:
    text = render(sample_frame(), openmetrics=True).decode()
    assert text.endswith("# EOF\n")
    assert "_created" not in text
    assert f"# TYPE {catalog.GPU_ENERGY.name.removesuffix('_total')} counter\n" in text
    _, types = parsed_series(text.encode(), openmetrics=True)
    assert types[catalog.GPU_ENERGY.name.removesuffix("_total")] == "counter"


def test_special_float_values_render() -> None:
    frame = model.Frame((family(catalog.GPU_POWER.name,
                                (device_labels("GPU-nan"), math.nan),
                                (device_labels("GPU-inf"), math.inf),
                                (device_labels("GPU-neg"), -math.inf)),))
    series, _ = parsed_series(render(frame))
    values = {dict(labels)["uuid"]: value for (_, labels), value in series.items()}
    assert math.isnan(values["GPU-nan"])
    assert values["GPU-inf"] == math.inf and values["GPU-neg"] == -math.inf


def test_family_missing_from_catalogue_is_a_clear_error() -> None:
    frame = model.Frame((family("made_up_metric", ((), 1.0)),))
    with pytest.raises(UnknownMetricError, match="made_up_metric.*catalog"):
        render(frame)


def nasty_frame(values: list[str]) -> model.Frame:
    return model.Frame((
        family(catalog.GPU_UTILIZATION.name,
               *((device_labels(f"GPU-{i}", namespace=value, pod=value, container=value, claim=value), 0.5)
                 for i, value in enumerate(values))),
        family(catalog.CLAIM_CONSUMER_INFO.name,
               *(((("namespace", value), ("claim", "c"), ("pod", f"p{i}"), ("pod_uid", value),
                   ("container", value)), 1.0) for i, value in enumerate(values))),
    ))


@pytest.mark.parametrize("openmetrics", [False, True], ids=["text", "openmetrics"])
def test_nasty_label_values_round_trip(openmetrics: bool) -> None:
    frame = nasty_frame(NASTY_VALUES)
    series, _ = parsed_series(render(frame, openmetrics=openmetrics), openmetrics=openmetrics)
    assert series == series_of(frame)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.lists(st.text(max_size=40), min_size=1, max_size=5),
       number=st.floats(allow_nan=False, width=64))
def test_any_utf8_label_value_and_float_round_trip(values: list[str], number: float) -> None:
    frame = model.Frame((
        family(catalog.GPU_MEMORY_USED.name,
               *((device_labels(f"GPU-{i}", pod=value, claim=value[::-1]), number)
                 for i, value in enumerate(values))),
        family(catalog.GPU_ENERGY.name, (device_labels("GPU-x", container=values[0]), abs(number))),
    ))
    expected = series_of(frame)
    for openmetrics in (False, True):
        series, _ = parsed_series(render(frame, openmetrics=openmetrics), openmetrics=openmetrics)
        assert series == expected


@pytest.mark.prometheus
def test_promtool_finds_every_catalogue_family_clean(promtool: str) -> None:
    """Every family the catalogue declares, rendered with hostile label values, lints clean."""
    frame = model.Frame(tuple(
        family(spec.name, *((tuple((label, value) for label in spec.labels), 1.0)
                            for value in ("", NASTY_VALUES[1], NASTY_VALUES[4], NASTY_VALUES[7])))
        for spec in catalog.CATALOG))
    ok, output = promtool_check_metrics(promtool, render(frame))
    assert ok, output


@pytest.mark.prometheus
def test_promtool_reports_problems(promtool: str) -> None:
    """The lint helper must not be vacuous: a counter without _total is flagged."""
    ok, output = promtool_check_metrics(promtool, b"# HELP bad_counter x\n# TYPE bad_counter counter\nbad_counter 1\n")
    assert not ok and "_total" in output


# --- listen addresses ----------------------------------------------------------------------

@pytest.mark.parametrize("listen, host, port", [
    ("0.0.0.0:9401", "0.0.0.0", 9401), (":9401", "0.0.0.0", 9401), ("[::]:9401", "::", 9401),
    ("127.0.0.1:0", "127.0.0.1", 0), ("localhost:80", "localhost", 80),
])
def test_parse_listen(listen: str, host: str, port: int) -> None:
    address = parse_listen(listen)
    assert (address.host, address.port) == (host, port)


@pytest.mark.parametrize("listen, message", [
    ("9401", "HOST:PORT"), ("host:", "HOST:PORT"), ("host:http", "HOST:PORT"),
    ("::1:9401", "brackets"), ("0.0.0.0:70000", "out of range"),
])
def test_bad_listen_address_is_a_clear_error(listen: str, message: str) -> None:
    with pytest.raises(ListenAddressError, match=message):
        PrometheusSink(listen)


def test_port_in_use_is_a_clear_error() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        sink = PrometheusSink(f"127.0.0.1:{busy.getsockname()[1]}")
        with pytest.raises(ListenAddressError, match="cannot listen on 127.0.0.1:"):
            sink.start()


# --- HTTP ----------------------------------------------------------------------------------

@pytest.fixture
def sink() -> Iterator[PrometheusSink]:
    sink = PrometheusSink("127.0.0.1:0")
    sink.start()
    yield sink
    sink.stop()


def request(sink: PrometheusSink, path: str = "/metrics", method: str = "GET",
            headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", sink.port, timeout=30)
    try:
        conn.request(method, path, headers=headers or {})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def test_not_ready_until_first_publish(sink: PrometheusSink) -> None:
    assert request(sink, "/healthz")[::2] == (200, b"ok\n")
    assert request(sink, "/readyz")[0] == 503
    status, headers, body = request(sink)
    assert status == 503 and b"no metrics yet" in body
    assert int(headers["content-length"]) == len(body)
    sink.publish(sample_frame())
    assert request(sink, "/readyz")[0] == 200
    assert request(sink)[0] == 200


def test_metrics_serves_text_format_by_default(sink: PrometheusSink) -> None:
    frame = sample_frame()
    sink.publish(frame)
    status, headers, body = request(sink)
    assert status == 200
    assert headers["content-type"] == TEXT_CONTENT_TYPE == "text/plain; version=0.0.4; charset=utf-8"
    assert int(headers["content-length"]) == len(body)
    assert body == render(frame)


def test_openmetrics_is_negotiated_by_accept_header(sink: PrometheusSink) -> None:
    frame = sample_frame()
    sink.publish(frame)
    status, headers, body = request(sink, headers={"Accept": OPENMETRICS_ACCEPT})
    assert status == 200
    assert headers["content-type"] == OPENMETRICS_CONTENT_TYPE
    assert body == render(frame, openmetrics=True)
    # Refusing OpenMetrics explicitly (q=0) falls back to text.
    _, headers, body = request(sink, headers={"Accept": "application/openmetrics-text;q=0, text/plain"})
    assert headers["content-type"] == TEXT_CONTENT_TYPE and body == render(frame)


@pytest.mark.parametrize("accept", [None, OPENMETRICS_ACCEPT])
def test_gzip_when_asked(sink: PrometheusSink, accept: str | None) -> None:
    sink.publish(sample_frame())
    plain_headers = {"Accept": accept} if accept else {}
    _, _, plain = request(sink, headers=plain_headers)
    status, headers, body = request(sink, headers={**plain_headers, "Accept-Encoding": "gzip, deflate"})
    assert status == 200
    assert headers["content-encoding"] == "gzip"
    assert int(headers["content-length"]) == len(body)
    assert gzip.decompress(body) == plain
    # Without gzip in Accept-Encoding (or with q=0) the body is plain.
    _, headers, body = request(sink, headers={**plain_headers, "Accept-Encoding": "gzip;q=0, identity"})
    assert "content-encoding" not in headers and body == plain


def test_formats_scraped_with_gzip_are_compressed_at_publish_not_on_the_scrape(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Prometheus scrapes every 15-60 s and frames come every second, so each of its scrapes is
    the first to want a new frame's gzip form: that work belongs in publish, not in the scrape."""
    now = [1000.0]
    compressed_by: list[str] = []
    real_compress = gzip.compress

    def counting_compress(data: bytes, **kw: object) -> bytes:
        compressed_by.append(threading.current_thread().name)
        return real_compress(data, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(gzip, "compress", counting_compress)
    sink = PrometheusSink("127.0.0.1:0", monotonic=lambda: now[0])
    sink.start()
    try:
        prometheus = {"Accept": OPENMETRICS_ACCEPT, "Accept-Encoding": "gzip"}
        sink.publish(sample_frame(0.1))
        assert compressed_by == [], "nobody asked for gzip yet: no compression"
        request(sink, headers=prometheus)
        assert len(compressed_by) == 1 and compressed_by[0] != threading.current_thread().name

        compressed_by.clear()
        now[0] += 15.0
        sink.publish(sample_frame(0.2))
        assert compressed_by == [threading.current_thread().name], "OpenMetrics only, in publish"
        status, headers, body = request(sink, headers=prometheus)
        assert status == 200 and headers["content-encoding"] == "gzip"
        assert gzip.decompress(body) == request(sink, headers={"Accept": OPENMETRICS_ACCEPT})[2]
        assert b"0.2" in gzip.decompress(body)
        assert len(compressed_by) == 1, "the scrape reused the bytes compressed at publish"

        compressed_by.clear()
        now[0] += prometheus_sink.GZIP_AHEAD_S
        sink.publish(sample_frame(0.3))
        assert compressed_by == [], "no gzip scrape for GZIP_AHEAD_S: publishing compresses nothing"
    finally:
        sink.stop()


def test_head_sends_headers_without_body(sink: PrometheusSink) -> None:
    sink.publish(sample_frame())
    _, get_headers, get_body = request(sink)
    status, headers, body = request(sink, method="HEAD")
    assert status == 200 and body == b""
    assert headers["content-length"] == get_headers["content-length"] == str(len(get_body))
    assert headers["content-type"] == TEXT_CONTENT_TYPE


def test_index_page_links_metrics_and_unknown_paths_are_404(sink: PrometheusSink) -> None:
    status, headers, body = request(sink, "/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    assert b'href="/metrics"' in body
    assert request(sink, "/metricz")[0] == 404
    assert request(sink, "/metrics/extra")[0] == 404
    sink.publish(sample_frame())
    assert request(sink, "/metrics?name[]=x")[0] == 200


def test_scrapes_serve_cached_bytes_and_never_render(sink: PrometheusSink,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[bool] = []

    def counting_render(frame: model.Frame, *, openmetrics: bool = False) -> bytes:
        calls.append(openmetrics)
        return render(frame, openmetrics=openmetrics)

    monkeypatch.setattr(prometheus_sink, "render", counting_render)
    sink.publish(sample_frame(0.25))
    assert sink.renders == 1
    rendered = len(calls)
    bodies = {request(sink, headers=h)[2] for h in ({}, {"Accept": OPENMETRICS_ACCEPT},
                                                    {"Accept-Encoding": "gzip"}) for _ in range(10)}
    assert len(bodies) == 3  # one text, one OpenMetrics, one gzip: identical on every scrape
    assert sink.renders == 1 and len(calls) == rendered
    sink.publish(sample_frame(0.5))
    assert sink.renders == 2
    series, _ = parsed_series(request(sink)[2])
    utilizations = {dict(labels)["uuid"]: v for (name, labels), v in series.items()
                    if name == catalog.GPU_UTILIZATION.name}
    assert utilizations["GPU-aaaa"] == 0.5


def test_keep_alive_connection_serves_several_scrapes(sink: PrometheusSink) -> None:
    sink.publish(sample_frame())
    conn = http.client.HTTPConnection("127.0.0.1", sink.port, timeout=30)
    try:
        for _ in range(3):
            conn.request("GET", "/metrics")
            response = conn.getresponse()
            assert response.status == 200 and response.read() == render(sample_frame())
    finally:
        conn.close()


def test_concurrent_scrapes_get_complete_bodies_during_publishes(sink: PrometheusSink) -> None:
    frames = [sample_frame(i / 10) for i in range(5)]
    valid = {render(f) for f in frames} | {render(f, openmetrics=True) for f in frames}
    sink.publish(frames[0])
    failures: list[str] = []

    def scraper(index: int) -> None:
        headers = {"Accept": OPENMETRICS_ACCEPT} if index % 2 else {}
        if index % 3 == 0:
            headers["Accept-Encoding"] = "gzip"
        for _ in range(15):
            status, response_headers, body = request(sink, headers=headers)
            if response_headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            if status != 200 or body not in valid:
                failures.append(f"scraper {index}: status {status}, {len(body)} bytes")

    threads = [threading.Thread(target=scraper, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for frame in frames[1:] * 4:
        sink.publish(frame)  # swaps happen while scrapes are in flight
    for thread in threads:
        thread.join()
    assert not failures


def test_stalled_clients_do_not_block_other_scrapes() -> None:
    sink = PrometheusSink("127.0.0.1:0", request_timeout=60)
    sink.start()
    stalled = [socket.create_connection(("127.0.0.1", sink.port)) for _ in range(3)]
    try:
        stalled[1].sendall(b"GET /metr")  # half a request line, then silence
        stalled[2].sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")  # headers never end
        sink.publish(sample_frame())
        for _ in range(3):
            status, _, body = request(sink)
            assert status == 200 and body == render(sample_frame())
    finally:
        for conn in stalled:
            conn.close()
        sink.stop()


def test_stalled_client_is_disconnected_after_request_timeout() -> None:
    sink = PrometheusSink("127.0.0.1:0", request_timeout=0.3)
    sink.start()
    try:
        with socket.create_connection(("127.0.0.1", sink.port)) as stalled:
            stalled.settimeout(30)  # guard only: the server must hang up long before this
            try:
                data = stalled.recv(1024)
            except ConnectionResetError:
                data = b""
            assert data == b""
    finally:
        sink.stop()


def test_stop_closes_the_port() -> None:
    sink = PrometheusSink("127.0.0.1:0")
    sink.start()
    port = sink.port
    sink.stop()
    sink.stop()  # idempotent
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=5).close()


def _ipv6_loopback_available() -> bool:
    if not socket.has_ipv6:
        return False
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.skipif(not _ipv6_loopback_available(), reason="no IPv6 loopback on this machine")
def test_ipv6_listen_address() -> None:
    sink = PrometheusSink("[::1]:0")
    sink.start()
    try:
        sink.publish(sample_frame())
        conn = http.client.HTTPConnection("::1", sink.port, timeout=30)
        conn.request("GET", "/metrics")
        response = conn.getresponse()
        assert response.status == 200 and response.read() == render(sample_frame())
        conn.close()
    finally:
        sink.stop()


# --- the harness itself -------------------------------------------------------------------

@pytest.mark.parametrize("ci, outcome", [("true", pytest.fail.Exception), ("", pytest.skip.Exception)])
def test_missing_prometheus_fails_in_ci_and_skips_elsewhere(monkeypatch: pytest.MonkeyPatch, ci: str,
                                                            outcome: type[BaseException]) -> None:
    import conftest

    monkeypatch.setattr(conftest, "find_tool", lambda name: None)
    monkeypatch.setenv("CI", ci)
    with pytest.raises(outcome, match="apt-get install -y prometheus"):
        conftest._require("prometheus")
