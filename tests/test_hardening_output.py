"""Hardening IV: output no peer can forge, and a server that a failed thread start cannot stop.

- A price file's model names reach ``recording-rules`` as YAML that any YAML reader takes back
  exactly (characters outside the BMP, controls, quotes), and promtool accepts the file; a name
  that is not Unicode (a lone surrogate) is one line and exit 2.
- Label values with control characters (CR, NUL, TAB, NEL, U+2028) are replaced at exposition, so
  every parser reads the page: prometheus_client's through a text stream (universal newlines: a
  raw CR used to split a sample, and the whole page was refused), its OpenMetrics parser, promtool.
- What came from a peer (a Prometheus series, an API object) is shown, never obeyed, by the
  terminal: ``report``'s table and CSV, ``explain``'s text and ``snapshot``'s table escape
  controls, bidi overrides and line separators, and a CSV cell never starts a formula.
- ``report`` holds the aggregates, not the answers: peak memory within 2 x the answer cap.
- A connection whose thread cannot start is served by a reserve thread started with the server;
  scrapes and probes keep being answered, and the failure is logged at most once a minute.

Every test here failed before the fix.
"""

from __future__ import annotations

import collections
import csv
import io
import json
import logging
import re
import socket
import subprocess
import threading
import time
import tracemalloc
import unicodedata
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner
from hostile import HostileServer, ManySeries
from prometheus_client.openmetrics.parser import text_fd_to_metric_families as parse_openmetrics_fd
from prometheus_client.parser import text_fd_to_metric_families as parse_text_fd
from promharness import promtool_check_metrics

from dra_exporter import catalog as cat
from dra_exporter import cli, model, printable, report, showback
from dra_exporter.cluster.allocator import Outcome, RequestOutcome
from dra_exporter.cluster.explain import render_text
from dra_exporter.sinks import text as snapshot_text
from dra_exporter.sinks.exposition import render
from dra_exporter.sinks.http import MetricsServer, Payload

# --- item 3: the price file's names in the rules file ----------------------------------------------

MODELS = ["NVIDIA H100 🚀", "tab\there", "nel\x85line\u2028sep", 'say "hi" \\ back', "key: value # not a comment",
          "del\x7fc1\x9bbom\ufeff", "\ufffe\uffff end"]


def rules_for(tmp_path: Path, doc: str) -> Any:
    path = tmp_path / "prices.yaml"
    path.write_text(doc, encoding="utf-8")
    return CliRunner().invoke(cli.main, ["recording-rules", "--price-file", str(path)])


@pytest.mark.prometheus
def test_any_unicode_model_name_round_trips_through_the_rules_yaml_and_promtool_accepts_it(
        tmp_path: Path, promtool: str) -> None:
    # The JSON form of a price file writes a character outside the BMP as a surrogate pair: one character.
    doc = json.dumps({**{m: 1.5 for m in MODELS}, "default": 1.0}) + "\n"
    assert "\\ud83d\\ude80" in doc
    result = rules_for(tmp_path, doc)
    assert result.exit_code == 0, result.output
    rules = yaml.safe_load(result.output)["groups"][1]["rules"]
    assert sorted(r["labels"]["model"] for r in rules if "labels" in r) == sorted(MODELS)
    (tmp_path / "rules.yaml").write_text(result.output, encoding="utf-8")
    checked = subprocess.run([promtool, "check", "rules", str(tmp_path / "rules.yaml")], capture_output=True,
                             text=True, timeout=60, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize("name", ["\\ud83d", "x\\ude80y", "\\ude80\\ud83d"])
def test_a_lone_surrogate_in_a_price_file_is_one_line_and_exit_2(tmp_path: Path, name: str) -> None:
    result = rules_for(tmp_path, f'{{"{name}": 2.0}}\n')
    assert result.exit_code == 2, result.output
    assert "surrogate" in result.output and len(result.output.strip().splitlines()) == 1, result.output


# --- item 4: control characters in label values ----------------------------------------------------

CONTROLS = ["cr\rhere", "nul\x00here", "tab\there", "vt\x0bff\x0c", "esc\x1b[2J", "nel\x85", "ls\u2028ps\u2029",
            "del\x7f", "lf\nstays", 'quote"and\\back']


def hostile_frame() -> model.Frame:
    samples = []
    for i, value in enumerate(CONTROLS):
        values = {"uuid": f"GPU-{i}", "gpu": str(i), "pod": value, "namespace": value}
        samples.append(model.Sample(tuple((name, values.get(name, "")) for name in cat.DEVICE_LABELS), float(i)))
    return model.Frame((model.Family(cat.GPU_POWER.name, tuple(samples)),))


def read_pages(page: bytes, openmetrics: bool) -> list[str]:
    """The ``pod`` values, read the way a client reads a response: a text stream (universal newlines)."""
    stream = io.TextIOWrapper(io.BytesIO(page), encoding="utf-8")
    parse = parse_openmetrics_fd if openmetrics else parse_text_fd
    return [s.labels["pod"] for fam in parse(stream) for s in fam.samples]


@pytest.mark.prometheus
def test_control_characters_in_label_values_leave_every_parser_reading_the_page(promtool: str) -> None:
    frame = hostile_frame()
    for openmetrics in (False, True):
        page = render(frame, openmetrics=openmetrics)
        pods = read_pages(page, openmetrics)
        assert pods == [printable.without_controls(v) for v in CONTROLS]
        assert pods[0] == "cr\ufffdhere" and pods[-2] == "lf\nstays" and pods[-1] == 'quote"and\\back'
        for pod in pods:
            assert not any(unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in pod.replace("\n", "")), pod
        ok, output = promtool_check_metrics(promtool, page)
        assert ok, output


# --- item 5: terminal and CSV output ------------------------------------------------------------------

FORGED = ["\x1b[2J\x1b[H", "\x1b]0;pwned\x07", "ns\nforged row  999.00", "cr\roverwrite", "\u202eevil",
          "c1\x9b31m", "=HYPERLINK(\"http://x\")", "+1", "-2", "@SUM(A1)", "\tlead", "\rlead", "ls\u2028x"]
UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def hostile_report() -> showback.Report:
    held = [showback.Series({"namespace": v, "claim": v, "model": "m"}, ((0.0, 1.0), (60.0, 1.0)))
            for v in FORGED]
    devices = [showback.Series({"namespace": v, "claim": v, "profile": v}, ((60.0, 1.0),)) for v in FORGED]
    pods = [showback.Series({"namespace": v, "claim": v, "pod": v}, ((60.0, 1.0),)) for v in FORGED]
    return showback.build(start=0, end=120, step=60, source="raw series", held=held, busy=[], devices=devices,
                          pods=pods, top=100, prices=showback.Prices(default=1.0))


def test_report_table_shows_peer_strings_without_obeying_them() -> None:
    text = showback.render_table(hostile_report())
    assert not UNSAFE.search(text), [m.group() for m in UNSAFE.finditer(text)]
    # One line per claim in each table: a peer's newline forges no row.
    assert sum(1 for line in text.splitlines() if "forged row" in line) == 3  # namespaces, claims, idle claims
    assert "\\x1b[2J" in text and "\\u202eevil" in text


def test_report_csv_has_one_row_per_claim_no_raw_controls_and_no_formula() -> None:
    text = showback.render_csv(hostile_report())
    assert not UNSAFE.search(text.replace("\n", ""))
    rows = list(csv.reader(io.StringIO(text)))
    assert len(rows) == 1 + len(FORGED)
    for row in rows[1:]:
        for cell in (row[0], row[1], row[-2], row[-1]):  # namespace, claim, pods, devices: from the peer
            assert not cell.startswith(("=", "+", "-", "@", "\t", "\r")), row
    assert "'=HYPERLINK(\"http://x\")" in [row[0] for row in rows]


def test_explain_text_shows_peer_strings_without_obeying_them() -> None:
    outcomes = [Outcome(v, v, False, requests=(RequestOutcome(v, v, 1, False, 0, 0, error=v),), error=v)
                for v in FORGED]
    text = render_text(outcomes)
    assert not UNSAFE.search(text)
    benign = render_text([Outcome("a", "b", False, requests=(RequestOutcome("r", "c", 1, False, 0, 0, error="e"),),
                                  error="e")])
    assert text.count("\n") == len(FORGED) * benign.count("\n") + len(FORGED) - 1


def test_snapshot_table_shows_peer_strings_without_obeying_them() -> None:
    samples = []
    for i, v in enumerate(FORGED):
        values = {"uuid": f"GPU-{i}", "gpu": str(i), "pod": v, "namespace": v, "container": v, "claim": v,
                  "profile": v, "parent_uuid": ""}
        samples.append(model.Sample(tuple((n, values.get(n, "")) for n in cat.DEVICE_LABELS), 1.0))
    text = snapshot_text.render_table(model.Frame((model.Family(cat.GPU_UP.name, tuple(samples)),)))
    assert not UNSAFE.search(text)
    assert len(text.splitlines()) == 1 + len(FORGED)


# --- item 6: report's memory -------------------------------------------------------------------------


def test_report_holds_what_it_shows_not_the_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    """2,000 claims, each answer just under an 850 KiB cap (the default is 64 MiB, for ~150,000 claims):
    the report's peak Python memory is within 2 x the cap over all six queries (it was ~30 x)."""
    cap = 850 << 10
    monkeypatch.setattr(report, "MAX_ANSWER_BYTES", cap)
    end = 1_700_000_000.0
    with HostileServer(ManySeries(2_000)) as prometheus:
        client = report.PrometheusClient(report.Connection(prometheus.url))

        def run() -> showback.Report:
            return report.run(client, start=end - 3600, end=end, step=240, prices=showback.Prices(default=2.0),
                              idle_below=0.05, top=10)
        run()  # the server builds its answers once; they are not the report's
        largest = max(len(answer) for answer in prometheus.behaviour._cache.values())
        assert cap * 0.8 < largest < cap
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            result = run()
            peak = tracemalloc.get_traced_memory()[1] - before
        finally:
            tracemalloc.stop()
    assert len(result.claims) == 2_000 and result.total.held_hours == pytest.approx(2_000 * 15 * 0.5 * 240 / 3600)
    assert peak < 2 * cap, f"{peak / 2**20:.1f} MiB"


@pytest.mark.parametrize("answer", [
    '{"status":"success","data":{"resultType":"matrix","result":[]}}',
    ' { "data" : { "result" : [ { "metric" : { "claim" : "a\\u00e9\\ud83d\\ude80" } , "values" : [ [ 1 , "2" ] , '
    '[ 2.5 , "12345" ] ] } , {"metric":{},"value":[3,"4"]} ] , "resultType" : "matrix" } , '
    '"warnings" : [ "x" ] , "status" : "success" } \n',
    '{"status":"success","data":{"result":[{"metric":{"pod":"é🚀"},"values":[[1,"1e3"]]}]},"infos":{"a":[1,2]}}',
])
def test_an_answer_parsed_as_it_arrives_is_the_answer_parsed_whole(answer: str) -> None:
    whole = json.loads(answer)
    expected = [(r["metric"], [(float(t), float(v)) for t, v in r.get("values", [r.get("value")])])
                for r in whole["data"]["result"]]
    data = answer.encode()
    for size in (1, 2, 7, len(data)):
        got: list[showback.Series] = []
        stream = report._Stream(iter([data[i:i + size] for i in range(0, len(data), size)]))
        doc = report._walk(stream, json.JSONDecoder(object_pairs_hook=report._Parsed(collections.Counter())),
                           got.append)
        assert doc["status"] == "success" and "result" in doc["data"]
        assert [(dict(s.labels), list(s.points)) for s in got] == expected


@pytest.mark.parametrize("answer", ['{"status":"success","data":{"result":[1]}}', '{"data":{"result":[{"metric":{},'
                                    '"values":[[1,"2"]]}', '{"status":"success"} x', '{"a" 1}', '[1, 2'])
def test_an_answer_that_is_cut_or_not_a_result_is_refused(answer: str) -> None:
    with pytest.raises(ValueError):
        report._walk(report._Stream(iter([answer.encode()])), json.JSONDecoder(
            object_pairs_hook=report._Parsed(collections.Counter())), lambda s: None)


def test_report_out_of_memory_is_one_line_and_exit_1(monkeypatch: pytest.MonkeyPatch) -> None:
    def exhausted(*_: Any, **__: Any) -> Any:
        raise MemoryError()

    monkeypatch.setattr(report.PrometheusClient, "range", exhausted)
    with HostileServer(ManySeries(10)) as prometheus:
        result = CliRunner().invoke(cli.main, ["report", "--prometheus", prometheus.url, "--since", "1h"])
    assert result.exit_code == 1 and not isinstance(result.exception, MemoryError), result.exception
    assert "out of memory" in result.output and len(result.output.strip().splitlines()) == 1, result.output


# --- item 7: a thread that cannot start ------------------------------------------------------------


class _Static:
    def payload(self, openmetrics: bool, gzip: bool = False) -> Payload | None:
        return Payload(b"up 1\n", "text/plain; version=0.0.4; charset=utf-8")


def _get(port: int, path: str) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        head = s.recv(4096)
    return int(head.split(b" ")[1]) if head else 0


def test_when_no_thread_can_start_scrapes_and_probes_are_still_answered_and_it_is_logged_once(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    server = MetricsServer("127.0.0.1:0", _Static(), logger=logging.getLogger("test.threads"))
    server.start()
    try:
        real_start = threading.Thread.start

        def refuse(self: threading.Thread) -> None:
            if self.name == "metrics-http-conn":
                raise RuntimeError("can't start new thread")
            real_start(self)

        monkeypatch.setattr(threading.Thread, "start", refuse)
        with caplog.at_level(logging.WARNING, logger="test.threads"):
            answers = [_get(server.port, path) for path in ["/metrics", "/healthz", "/readyz"] * 20]
        assert answers == [200] * 60, answers
        lines = [r.getMessage() for r in caplog.records if "thread" in r.getMessage()]
        assert len(lines) == 1, lines
    finally:
        monkeypatch.undo()
        server.stop()


def test_a_slow_client_on_the_reserve_costs_only_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    server = MetricsServer("127.0.0.1:0", _Static(), logger=logging.getLogger("test.threads"))
    server.start()
    try:
        real_start = threading.Thread.start

        def refuse(self: threading.Thread) -> None:
            if self.name == "metrics-http-conn":
                raise RuntimeError("can't start new thread")
            real_start(self)

        monkeypatch.setattr(threading.Thread, "start", refuse)
        idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(20)]  # say nothing
        try:
            time.sleep(0.2)
            started = time.monotonic()
            assert _get(server.port, "/metrics") == 200
            assert time.monotonic() - started < 1
        finally:
            for s in idle:
                s.close()
    finally:
        monkeypatch.undo()
        server.stop()
