"""Hardening III: the peers the exporter talks to — an OTLP collector, the API server, Prometheus —
answer like attackers (``hostile``: endless, huge, a byte a second, redirects, watches that never stop
adding, lists that never end, objects nothing can read). Each attack is bounded in time and memory,
says so in one line, and costs what it attacks, never the rest.

Before the fixes every test here failed: the reads had no total deadline (a trickle held them for as
long as it lasted), no byte cap on what the OTLP exporter read, no cap on the objects a watch held.
"""

from __future__ import annotations

import json
import logging
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hostile import (
    ApiServer,
    HostileServer,
    Reply,
    Request,
    api_client,
    empty_list,
    forever,
    idle_watch,
    kubeconfig,
    object_list,
    resource_slice,
    trickle,
    watch_event,
)
from opentelemetry.sdk.metrics.export import MetricExportResult, MetricsData

from dra_exporter import report
from dra_exporter.sinks.otlp_settings import MAX_REPLY_BYTES, OtlpSettings, build_exporter, refusal
from dra_exporter.sources import PartialSnapshot, SourceError
from dra_exporter.sources.kubeapi_cluster import ClusterSource
from dra_exporter.sources.kubeapi_normalize import slice_from_dict
from dra_exporter.sources.reflector import Reflector, Timeouts, TooManyObjects

FAST = Timeouts(request=1.0, backoff=(0.05, 0.2))


def within(seconds: float, call: Callable[[], Any]) -> Any:
    """``call()``'s result, failing the test (instead of hanging it) if it takes over ``seconds``."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = call()
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            box["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    assert not thread.is_alive(), f"still running after {seconds} s"
    if "error" in box:
        raise box["error"]
    return box.get("result")


# --- the OTLP collector ------------------------------------------------------------------------------


def push(url: str, timeout: float = 2.0) -> tuple[MetricExportResult, str]:
    exporter = build_exporter(OtlpSettings(endpoint=url, protocol="http/protobuf", timeout=timeout))
    try:
        return exporter.export(MetricsData(resource_metrics=[]), timeout_millis=timeout * 1000), refusal(exporter)
    finally:
        exporter.shutdown()


@pytest.mark.parametrize("attack, words", [
    (lambda req, reply: reply.chunked(forever(b"x" * 65536)), "64 KiB limit"),
    (lambda req, reply: (reply.head(200, {"Content-Length": "4000000000"}), reply.body(b"x" * 10**6)),
     "announced 4000000000 bytes"),
    (lambda req, reply: reply.chunked(trickle(b"y" * 100, 0.1)), "within 2 s"),
], ids=["endless", "content-length-4GB", "a-byte-every-0.1s"])
def test_a_collector_reply_is_read_within_the_timeout_and_the_byte_cap(attack: Any, words: str) -> None:
    with HostileServer(attack) as collector:
        started = time.monotonic()
        result, why = within(8, lambda: push(collector.url))
        took = time.monotonic() - started
    assert result is MetricExportResult.FAILURE, "an answer that was refused is no success"
    assert words in why, why
    assert took < 4, f"the timeout is 2 s, the export took {took:.1f} s"
    assert collector.sent < MAX_REPLY_BYTES + 8 * 2**20, "what the collector could push is bounded"


def test_a_small_collector_reply_is_still_a_success() -> None:
    with HostileServer(lambda req, reply: reply.whole(200, b"", "application/x-protobuf")) as collector:
        result, why = push(collector.url)
    assert result is MetricExportResult.SUCCESS and why == ""


# --- the API server: one reflector -----------------------------------------------------------------


def reflector(url: str, kind: str = "resourceslices", **kw: Any) -> Reflector[Any]:
    return Reflector(kind, api_client(url), f"/apis/resource.k8s.io/v1/{kind}", None,
                     lambda obj: slice_from_dict(obj, "v1"), FAST, Counter(), **kw)


def test_a_list_at_a_byte_a_second_ends_at_the_request_deadline() -> None:
    body = b'{"kind":"List","metadata":{"resourceVersion":"1"},"items":[]}'

    def slow(req: Request, reply: Reply) -> None:
        reply.chunked(trickle(body, 0.1))  # 6 s in all; the deadline is 1 s

    with HostileServer(ApiServer(lists={"resourceslices": slow})) as api:
        started = time.monotonic()
        with pytest.raises(SourceError, match="did not arrive within 1 s"):
            within(5, reflector(api.url).list_once)
        assert time.monotonic() - started < 3


def test_a_watch_that_never_stops_adding_objects_is_capped() -> None:
    def flood(req: Request, reply: Reply) -> None:
        reply.chunked(watch_event("ADDED", resource_slice(f"s{i}")) for i in range(2000))

    with HostileServer(ApiServer(lists={"resourceslices": empty_list}, watches={"resourceslices": flood})) as api:
        r = reflector(api.url, max_objects=50)
        r.list_once()
        stop = threading.Event()
        r.start(stop)
        try:
            deadline = time.monotonic() + 10
            while "more than 50 objects" not in r.error:
                assert time.monotonic() < deadline, f"no error after 10 s; holding {len(r.items)}"
                time.sleep(0.05)
            assert len(r.items) <= 50
        finally:
            stop.set()
            r.stop()


def test_a_list_of_more_objects_than_the_cap_is_refused() -> None:
    many = object_list([resource_slice(f"s{i}") for i in range(60)])
    with HostileServer(ApiServer(lists={"resourceslices": lambda req, reply: reply.json(many)})) as api:
        with pytest.raises(TooManyObjects, match="more than 50 objects"):
            reflector(api.url, max_objects=50).list_once()


def test_the_cluster_modes_default_caps_hold_a_5000_node_cluster_and_a_given_cap_holds_for_every_kind() -> None:
    # benchmarks/bench_cluster.py at 5,000 nodes: 10,000 slices, 60,000 claims, 85,000 pods (60,000 kept).
    # A flat cap of 50,000 refused its claims ("more than 50000 objects"): the view was never complete.
    default = ClusterSource(kubeconfig="unused")
    assert default._cap("resourceslices") >= 4 * 10_000
    assert default._cap("resourceclaims") >= 2 * 85_000 and default._cap("pods") >= 2 * 85_000
    given = ClusterSource(kubeconfig="unused", max_objects=1_000)
    assert {given._cap(k) for k in ("resourceslices", "resourceclaims", "pods", "deviceclasses")} == {1_000}


def test_a_continue_token_that_never_ends_stops_after_the_pages_the_cap_allows() -> None:
    def pages(req: Request, reply: Reply) -> None:
        n = int(req.query.get("continue") or 0)
        reply.json(object_list([resource_slice(f"p{n}-{i}") for i in range(2)], token=str(n + 1)))

    with HostileServer(ApiServer(lists={"resourceslices": pages})) as api:
        r = reflector(api.url, max_objects=20, page_size=5)
        with pytest.raises(TooManyObjects):
            within(10, r.list_once)
        assert len(api.requests) <= 20 // 5 + 2, "bounded pages, not a request storm"


def test_unreadable_objects_and_events_cost_only_themselves(caplog: pytest.LogCaptureFixture) -> None:
    """``generation: "²"`` (a digit to str.isdigit, not to int), a 5,000-digit number, a watch line
    ``[]``, a line that is not JSON: each skipped (or read with its number replaced), the watch goes on."""
    huge = "9" * 5000

    def list_(req: Request, reply: Reply) -> None:
        body = object_list([resource_slice("good"), resource_slice("sup", generation="²"),
                            resource_slice("huge", generation=12345)])
        reply.whole(200, json.dumps(body).replace("12345", huge).encode())

    def watch(req: Request, reply: Reply) -> None:
        reply.chunked([b"[]\n", b"{not json\n", watch_event("ADDED", resource_slice("later")),
                       watch_event("ADDED", {"metadata": {"name": "bad"}, "spec": []})])
        time.sleep(30)

    with HostileServer(ApiServer(lists={"resourceslices": list_}, watches={"resourceslices": watch})) as api:
        r = reflector(api.url)
        r.list_once()
        assert {k.split("/")[1] for k in r.items} == {"good", "sup", "huge"}, "numbers replaced, objects kept"
        stop = threading.Event()
        with caplog.at_level(logging.WARNING):
            r.start(stop)
            try:
                deadline = time.monotonic() + 10
                while "/later" not in r.items:
                    assert time.monotonic() < deadline, (r.error, list(r.items))
                    time.sleep(0.05)
                assert r.error == ""
            finally:
                stop.set()
                r.stop()
    assert any("skipped an event that is not a JSON object" in m for m in caplog.messages), caplog.messages


# --- the cluster mode's source ---------------------------------------------------------------------


def cluster_source(url: str, **kw: Any) -> ClusterSource:
    return ClusterSource(client_factory=lambda: api_client(url), timeouts=FAST, **kw)


@pytest.fixture
def closing() -> Iterator[list[ClusterSource]]:
    sources: list[ClusterSource] = []
    yield sources
    for s in sources:
        s.close()


def test_a_403_on_one_kind_leaves_the_others_and_is_retried_with_backoff(closing: list[ClusterSource]) -> None:
    slices = object_list([resource_slice("s1", devices=2)])

    def forbidden(req: Request, reply: Reply) -> None:
        reply.json({"kind": "Status", "code": 403}, status=403)

    with HostileServer(ApiServer(lists={"resourceslices": lambda req, reply: reply.json(slices),
                                        "resourceclaims": forbidden, "deviceclasses": empty_list},
                                 watches={k: idle_watch for k in ("resourceslices", "deviceclasses")})) as api:
        source = cluster_source(api.url)
        closing.append(source)
        with pytest.raises(PartialSnapshot, match="forbidden") as caught:
            source.collect()
        state = caught.value.snapshot
        assert [s.name for s in state.slices] == ["s1"], "the slices are there"  # type: ignore[attr-defined]
        claim_lists = sum(1 for r in api.requests if r.path.endswith("resourceclaims"))
        for _ in range(5):
            with pytest.raises(PartialSnapshot):
                source.collect()
        again = sum(1 for r in api.requests if r.path.endswith("resourceclaims"))
        assert again - claim_lists <= 1, "the failing kind waits for its backoff, not a list per cycle"


# --- Prometheus, for `report` ------------------------------------------------------------------------


def vector(*series: tuple[dict[str, Any], list[list[Any]]]) -> dict[str, Any]:
    return {"status": "success", "data": {"resultType": "matrix",
                                          "result": [{"metric": m, "values": v} for m, v in series]}}


def client(url: str, **kw: Any) -> report.PrometheusClient:
    return report.PrometheusClient(report.Connection(url, bearer_token="s3cret", **kw))


def test_a_redirect_to_another_host_is_refused_and_gets_no_credentials() -> None:
    with HostileServer(lambda req, reply: reply.json(vector())) as elsewhere:
        def redirect(req: Request, reply: Reply) -> None:
            reply.whole(302, b"", headers={"Location": f"{elsewhere.url}/api/v1/query"})

        with HostileServer(redirect) as prometheus:
            with pytest.raises(report.ReportError, match="redirects .* to another host") as caught:
                client(prometheus.url).instant("up", 0)
    assert elsewhere.requests == [], "nothing, least of all the token, went to the other host"
    assert "\n" not in str(caught.value)


def test_a_same_origin_redirect_is_followed_as_the_same_post() -> None:
    def behaviour(req: Request, reply: Reply) -> None:
        if req.path.startswith("/prom/"):
            reply.json(vector(({"a": "b"}, [[1, "2"]])))
        else:
            reply.whole(301, b"", headers={"Location": "/prom" + req.path})

    with HostileServer(behaviour) as prometheus:
        series = client(prometheus.url).range("up", 0, 10, 1)
    assert [s.points for s in series] == [((1.0, 2.0),)]
    followed = prometheus.requests[-1]
    assert (followed.method, followed.query.get("query"), followed.headers["authorization"]) == \
        ("POST", "up", "Bearer s3cret")


def test_a_prometheus_at_a_byte_every_tenth_of_a_second_ends_at_the_timeout() -> None:
    body = json.dumps(vector()).encode()
    with HostileServer(lambda req, reply: reply.chunked(trickle(body, 0.1))) as prometheus:
        started = time.monotonic()
        with pytest.raises(report.ReportError, match="within 1 s"):
            within(5, lambda: client(prometheus.url, timeout=1.0).instant("up", 0))
        assert time.monotonic() - started < 3


def test_an_endless_answer_is_refused_at_the_cap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(report, "MAX_ANSWER_BYTES", 1 << 20)
    with HostileServer(lambda req, reply: reply.chunked(forever(b" " * 65536))) as prometheus:
        with pytest.raises(report.ReportError, match="answer over 1 MiB"):
            within(10, lambda: client(prometheus.url).instant("up", 0))
        assert prometheus.sent < 16 << 20


def test_values_that_are_not_usable_are_dropped_and_said() -> None:
    answer = vector(({"claim": "a"}, [[1, "1e308"], [2, "NaN"], [3, "+Inf"], [4, "-5"], [4, "1"], [5, "0.5"],
                                        [5, "0.7"]]))
    with HostileServer(lambda req, reply: reply.json(answer)) as prometheus:
        c = client(prometheus.url)
        series = c.range("x", 0, 10, 1)
    assert series[0].points == ((4.0, 1.0), (5.0, 0.5))
    notes = c.notes()
    assert notes == ["dropped 1 point of the server's answers: a timestamp given twice in one series",
                     "dropped 1 point of the server's answers: negative",
                     "dropped 2 points of the server's answers: not a finite number",
                     "dropped 1 point of the server's answers: over 1e+09, which no GPU count or share is"]


def test_a_label_that_is_not_a_string_is_one_line(tmp_path: Any) -> None:
    answer = vector(({"claim": ["a", "b"]}, [[1, "1"]]))
    with HostileServer(lambda req, reply: reply.json(answer)) as prometheus:
        result = subprocess.run([sys.executable, "-m", "dra_exporter.cli", "report", "--prometheus", prometheus.url,
                                 "--start", "1000000", "--end", "1003600", "--step", "60s"],
                                capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert "'claim'" in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


# --- the cluster mode, whole -------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow  # ~15 s: one list's deadline (10 s) and a shutdown
def test_the_cluster_mode_bounds_a_list_at_a_byte_a_second_and_honours_sigterm_during_it(tmp_path: Any) -> None:
    """The first list trickles for ever: it fails at its deadline with one line naming it, and the
    next one (after its backoff) is cut by SIGTERM, which ends the process."""
    def crawl(req: Request, reply: Reply) -> None:
        reply.chunked(trickle(b" " * 10_000, 0.5))

    with HostileServer(ApiServer(lists={"resourceslices": crawl, "resourceclaims": crawl,
                                        "deviceclasses": crawl})) as api:
        config = tmp_path / "kubeconfig"
        config.write_text(kubeconfig(api.url))
        proc = subprocess.Popen([sys.executable, "-m", "dra_exporter.cli", "cluster", "--kubeconfig", str(config),
                                 "--listen", f"127.0.0.1:{free_port()}", "--interval", "1"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            lines: list[str] = []
            assert proc.stdout is not None
            deadline = time.monotonic() + 30
            while not any("did not arrive within 10 s" in line for line in lines):
                assert time.monotonic() < deadline and proc.poll() is None, lines
                lines.append(proc.stdout.readline())
            time.sleep(1.5)  # the next list is in flight
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=10)
        finally:
            proc.kill()
        assert proc.returncode == 0, out
    assert sum("did not arrive" in line for line in lines) == 1, lines


def test_capacities_counters_and_consumption_that_are_not_amounts_are_left_out() -> None:
    from dra_exporter.sources.kubeapi_normalize import claim_from_dict

    obj = resource_slice("s")
    device = obj["spec"]["devices"][0]
    device["capacity"] = {"memory": {"value": "NaN"}, "cores": {"value": "-4"}, "slots": {"value": "1e400"},
                          "ok": {"value": "2Gi"}}
    obj["spec"]["sharedCounters"] = [{"name": "set", "counters": {"mem": {"value": "-1"}, "nan": {"value": "nan"},
                                                                  "good": {"value": "1"}}}]
    sl = slice_from_dict(obj, "v1")
    assert sl.devices[0].capacity == (("ok", 2.0 * 2**30),)
    assert sl.shared_counters[0].counters == (("good", 1.0),)
    claim = claim_from_dict({"metadata": {"name": "c", "namespace": "n"}, "status": {"allocation": {"devices": {
        "results": [{"request": "r", "driver": "d", "pool": "p", "device": "x",
                     "consumedCapacity": {"memory": "-1Gi", "cores": "Infinity", "ok": "1"}}]}}}}, "v1")
    assert claim.results[0].consumed_capacity == (("ok", 1.0),)


def test_a_403_in_the_cluster_mode_names_what_it_needs_and_names_cannot_forge_lines() -> None:
    from kubernetes.client.exceptions import ApiException

    from dra_exporter.sources.reflector import api_error

    lists = {"resourceslices": empty_list, "resourceclaims": empty_list,
             "deviceclasses": lambda req, reply: reply.json({}, status=403)}
    watches = {"resourceslices": idle_watch, "resourceclaims": idle_watch}
    with HostileServer(ApiServer(lists=lists, watches=watches)) as api:
        source = cluster_source(api.url)
        try:
            with pytest.raises(PartialSnapshot) as caught:
                source.collect()
        finally:
            source.close()
    message = str(caught.value)
    # The cluster mode's kinds, which include pods (claim states), not the node agent's hint.
    assert "deviceclasses and devicetaintrules (resource.k8s.io) and on pods" in message, message
    forged = str(api_error(ApiException(status=404, reason="x\nERROR forged"), "get resourceclaims a/b\nc"))
    assert "\n" not in forged and "a/b\\nc" in forged, forged


def test_an_answer_nested_past_the_parsers_depth_names_what_it_was() -> None:
    nested = b'{"items": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
    with HostileServer(ApiServer(lists={"resourceslices": lambda req, reply: reply.whole(200, nested)})) as api:
        with pytest.raises(SourceError, match="list resourceslices: .* nested too deeply"):
            reflector(api.url).list_once()


# --- demo ------------------------------------------------------------------------------------------


def children(pid: int) -> list[int]:
    return [int(c) for c in open(f"/proc/{pid}/task/{pid}/children").read().split()]


@pytest.mark.slow  # ~10 s: four exporters start
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_demo_killed_outright_takes_its_exporters_with_it() -> None:
    port = free_port()
    demo = subprocess.Popen([sys.executable, "-m", "dra_exporter.cli", "demo", "--base-port", str(port)],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        assert demo.stdout is not None and demo.stdout.readline(), "the demo printed its scrape config"
        exporters = children(demo.pid)
        assert len(exporters) == 4
        demo.kill()
        demo.wait()
        deadline = time.monotonic() + 15
        alive = exporters
        while alive:
            assert time.monotonic() < deadline, f"still running after the demo died: {alive}"
            time.sleep(0.2)
            alive = [pid for pid in exporters if _running(pid)]
    finally:
        demo.kill()


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


# --- one bad string costs that string ----------------------------------------------------------------


def test_a_lone_surrogate_in_a_label_is_replaced_at_exposition_and_in_otlp() -> None:
    from dra_exporter import catalog, model
    from dra_exporter.sinks.exposition import render
    from dra_exporter.sinks.otlp_mapping import instruments, observations

    values = {"uuid": "GPU-1", "gpu": "0", "pod": "p\ud800"}
    labels = tuple((name, values.get(name, "")) for name in catalog.DEVICE_LABELS)
    frame = model.Frame((model.Family(catalog.GPU_POWER.name, (model.Sample(labels, 1.0),)),))
    for openmetrics in (False, True):
        text = render(frame, openmetrics=openmetrics).decode("utf-8")
        assert 'pod="p?"' in text
    inst = next(i for i in instruments() if catalog.GPU_POWER in i.families)
    observed = list(observations(frame, inst))
    assert observed
    for attrs, _ in observed:
        values = dict(attrs).values()
        assert all("\ud800" not in str(v) for v in values) and "p?" in values, attrs


# --- a trickled status line and headers ----------------------------------------------------------------


def trickled_head(req: Request, reply: Reply) -> None:
    """``200`` at once, then a header a byte every 0.1 s (about 30 s of them)."""
    reply.raw(b"HTTP/1.1 200 OK\r\n")
    for byte in trickle(b"X-Slow: " + b"y" * 300 + b"\r\n", 0.1):
        reply.raw(byte)


def test_a_trickled_head_ends_at_the_deadline_for_every_peer() -> None:
    with HostileServer(trickled_head) as peer:
        started = time.monotonic()
        with pytest.raises(report.ReportError, match="no answer within 1 s"):
            within(5, lambda: client(peer.url, timeout=1.0).instant("up", 0))
        with pytest.raises(SourceError, match="no answer in time"):
            within(5, reflector(peer.url).list_once)
        result, why = within(8, lambda: push(peer.url, timeout=1.0))
        assert result is MetricExportResult.FAILURE and "did not arrive within 1 s" in why, why
        assert time.monotonic() - started < 8, "each one second, not thirty"
