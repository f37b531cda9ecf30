"""Showback without a Prometheus: the rules file, the report's arithmetic, its inputs and its errors.

The figures against real data are in ``test_showback_prometheus.py``; here a small HTTP server
plays the Prometheus API so the client's authentication, fallback and failures can be seen.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml
from deploy_tools import REPO

from dra_exporter import catalog as cat
from dra_exporter import showback
from dra_exporter.showback import Prices, Series, ShowbackError

RULES_FILE = REPO / "deploy" / "recording-rules.yaml"
RULE_TESTS = REPO / "deploy" / "recording-rules.test.yaml"


# --- the rules file ---------------------------------------------------------------------------


def test_the_rules_file_is_generated_from_the_module() -> None:
    assert RULES_FILE.read_text() == showback.rules_yaml(), \
        "regenerate with: python -m dra_exporter.showback > deploy/recording-rules.yaml"


def test_promtool_accepts_and_unit_tests_the_recording_rules(promtool: str) -> None:
    check = subprocess.run([promtool, "check", "rules", str(RULES_FILE)], capture_output=True, text=True,
                           timeout=60, check=False)
    assert check.returncode == 0 and f"SUCCESS: {len(showback.RULES)} rules found" in check.stdout, check.stdout
    unit = subprocess.run([promtool, "test", "rules", RULE_TESTS.name], capture_output=True, text=True,
                          timeout=120, cwd=RULE_TESTS.parent, check=False)
    assert unit.returncode == 0, unit.stdout + unit.stderr


def test_every_rule_is_unit_tested_named_by_convention_and_reads_only_catalogue_metrics() -> None:
    tested = {case["expr"] for t in yaml.safe_load(RULE_TESTS.read_text())["tests"]
              for case in t.get("promql_expr_test", [])}
    for rule in showback.RULES:
        assert rule.record in tested, f"{rule.record} has no promtool case"
        assert re.fullmatch(r"[a-z_]+:dra_[a-z_]+:[a-z_]+", rule.record), "level:metric:operations"
        for metric in re.findall(r"(?<![\w:])dra_[a-z0-9_]+(?![\w:])", rule.expr):
            assert metric in cat.BY_NAME, f"{rule.record}: {metric} is not in the catalogue"


def test_inlining_leaves_no_recorded_series_in_the_raw_queries() -> None:
    raw = showback.queries(recorded=False)
    for expr in (raw.held, raw.busy, raw.devices):
        assert not re.search(r"[a-z_]+:[a-z_]+:[a-z_]+", expr), expr
        assert cat.GPU_INFO.name in expr and cat.GPU_UP.name in expr or cat.GPU_UTILIZATION.name in expr


# --- durations and windows --------------------------------------------------------------------


@pytest.mark.parametrize("text, seconds", [("90s", 90), ("30m", 1800), ("1h30m", 5400), ("7d", 604800),
                                           ("2w", 1209600)])
def test_durations_are_prometheus_durations(text: str, seconds: float) -> None:
    assert showback.parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "7", "7 days", "-1h", "0s", "1h-"])
def test_a_bad_duration_is_a_clear_error(text: str) -> None:
    with pytest.raises(ShowbackError, match="duration"):
        showback.parse_duration(text)


def test_times_are_rfc3339_or_unix_seconds() -> None:
    assert showback.parse_time("2025-06-01T00:00:00Z") == 1748736000
    assert showback.parse_time("2025-06-01") == 1748736000
    assert showback.parse_time("1748736000.5") == 1748736000.5
    with pytest.raises(ShowbackError, match="RFC 3339"):
        showback.parse_time("yesterday")


def test_the_default_step_is_the_rules_minute_finer_for_short_windows_and_within_the_point_limit() -> None:
    assert showback.default_step(7 * 86400) == 60
    assert showback.default_step(60) == 1
    assert showback.default_step(30 * 86400) * showback.MAX_POINTS >= 30 * 86400


# --- the arithmetic ---------------------------------------------------------------------------

T0, STEP = 1_000_000.0, 60.0


def series(points: list[float], **labels: str) -> Series:
    return Series(labels, tuple((T0 + i * STEP, v) for i, v in enumerate(points) if v is not None))


def test_hours_held_and_busy_per_claim_and_namespace_with_cost_by_model() -> None:
    held = [
        series([2.0] * 60, namespace="ml", claim="train", model="H200"),  # 2 GPUs for an hour
        series([3 / 7] * 30, namespace="inf", claim="vllm", model="H100"),  # a 3g device for half an hour
    ]
    busy = [series([1.0] * 60, namespace="ml", claim="train"), series([0.0] * 30, namespace="inf", claim="vllm")]
    r = showback.build(start=T0, end=T0 + 3600, step=STEP, source="test", held=held, busy=busy,
                       prices=Prices({"H200": 4.0, "H100": 7.0}))
    claims = {(u.namespace, u.claim): u for u in r.claims}
    assert claims[("ml", "train")].held_hours == pytest.approx(2.0)
    assert claims[("ml", "train")].busy_hours == pytest.approx(1.0)
    assert claims[("ml", "train")].idle_share == pytest.approx(0.5)
    assert claims[("ml", "train")].cost == pytest.approx(8.0)
    assert claims[("inf", "vllm")].held_hours == pytest.approx(3 / 14)
    assert claims[("inf", "vllm")].cost == pytest.approx(3 / 14 * 7.0)
    assert r.total.held_hours == pytest.approx(2 + 3 / 14)
    assert [n.namespace for n in r.namespaces] == ["ml", "inf"], "most held first"


def test_an_unpriced_model_is_an_error_not_a_free_gpu() -> None:
    with pytest.raises(ShowbackError, match="NVIDIA B200"):
        showback.build(start=T0, end=T0 + 60, step=STEP, source="t", held=[series([1.0], model="NVIDIA B200")],
                       busy=[], prices=Prices({"NVIDIA H200": 1.0}))
    flat = showback.build(start=T0, end=T0 + 60, step=STEP, source="t", held=[series([1.0], model="X")],
                          busy=[], prices=Prices(default=2.0))
    assert flat.total.cost == pytest.approx(2.0 / 60)


def test_idle_since_is_the_start_of_the_idle_run_that_lasts_to_the_end() -> None:
    held = [series([1.0] * 10, namespace="a", claim="idle-late"), series([1.0] * 10, namespace="a", claim="busy"),
            series([1.0] * 10, namespace="a", claim="idle-always"),
            series([1.0] * 5, namespace="a", claim="ended-idle")]
    busy = [series([0.5] * 4 + [0.0] * 6, namespace="a", claim="idle-late"),
            series([0.0] * 9 + [0.5], namespace="a", claim="busy"),
            series([0.005] * 10, namespace="a", claim="idle-always"),  # under 1 %
            series([0.0] * 5, namespace="a", claim="ended-idle")]
    pods = [Series({"namespace": "a", "claim": "idle-late", "pod": p}, ((T0, 1.0),)) for p in ("y", "x")]
    devices = [Series({"namespace": "a", "claim": "idle-late", "profile": prof}, ((T0, share),))
               for prof, share in (("1g.18gb", 1 / 7), ("", 1.0), ("1g.18gb", 1 / 7))]
    r = showback.build(start=T0, end=T0 + 600, step=STEP, source="t", held=held, busy=busy, pods=pods,
                       devices=devices)
    assert [c.claim for c in r.idle] == ["idle-always", "idle-late"], "longest first; busy now and ended: out"
    always, late = r.idle
    assert always.idle_since == T0 and always.idle_since_before_window
    assert late.idle_since == T0 + 4 * STEP and not late.idle_since_before_window
    assert late.pods == ("x", "y") and late.devices == "1 × GPU, 2 × 1g.18gb"
    assert late.gpu_equivalents == pytest.approx(1 + 2 / 7)


def test_the_three_formats_carry_the_same_figures() -> None:
    r = showback.build(start=T0, end=T0 + 3600, step=STEP, source="recording rules",
                       held=[series([1.0] * 60, namespace="ml", claim="train", model="m")],
                       busy=[series([0.0] * 60, namespace="ml", claim="train")], prices=Prices(default=3.0))
    doc = json.loads(showback.render_json(r))
    assert doc["claims"] == [{"namespace": "ml", "claim": "train", "gpu_hours_held": 1.0, "gpu_hours_busy": 0.0,
                              "idle_share": 1.0, "gpu_hours_without_busy_signal": 0.0, "cost": 3.0}]
    assert doc["idle_claims"][0]["idle_since_before_window"] is True
    rows = list(__import__("csv").DictReader(showback.render_csv(r).splitlines()))
    assert rows == [{"namespace": "ml", "claim": "train", "gpu_hours_held": "1.000000", "gpu_hours_busy": "0.000000",
                     "idle_share": "1.000000", "gpu_hours_without_busy_signal": "0.000000", "cost": "3.000000",
                     "idle_since": "1970-01-12T13:46:40Z",
                     "pods": "", "devices": "?"}]
    table = showback.render_table(r)
    assert re.search(r"^ml\s+train\s+1\.00\s+0\.00\s+100%\s+3\.00$", table, re.MULTILINE), table
    assert "before 1970-01-12T13:46:40Z" in table


def test_a_claim_without_busy_signal_is_unknown_not_idle() -> None:
    """A100 and A30 MIG devices have neither utilisation nor GPM: their busy share is unknown (JSON
    null, "unknown" in the table and CSV), they are never listed idle, and a claim holding one with a
    measured GPU is judged on the measured part only."""
    held = [series([1 / 7] * 60, namespace="inf", claim="a100-mig", model="A100"),
            series([1.0] * 60, namespace="ml", claim="mixed", model="H100"),
            series([1 / 4] * 60, namespace="ml", claim="mixed", model="A30")]
    busy = [series([0.5] * 60, namespace="ml", claim="mixed")]
    measured = [series([1.0] * 60, namespace="ml", claim="mixed")]
    r = showback.build(start=T0, end=T0 + 3600, step=STEP, source="raw series", held=held, busy=busy,
                       measured=measured)
    claims = {(u.namespace, u.claim): u for u in r.claims}
    unknown, mixed = claims[("inf", "a100-mig")], claims[("ml", "mixed")]
    assert not unknown.busy_known and unknown.idle_share is None
    assert unknown.unmeasured_hours == pytest.approx(1 / 7)
    assert mixed.idle_share == pytest.approx(0.5), "idle share of the measured GPU-hours only"
    assert mixed.unmeasured_hours == pytest.approx(0.25)
    assert r.idle == (), "unknown is not idle"
    doc = json.loads(showback.render_json(r))
    row = next(c for c in doc["claims"] if c["claim"] == "a100-mig")
    assert row["gpu_hours_busy"] is None and row["idle_share"] is None
    assert row["gpu_hours_without_busy_signal"] == pytest.approx(1 / 7, abs=1e-6)
    namespace = next(n for n in doc["namespaces"] if n["namespace"] == "inf")
    assert namespace["idle_share"] is None
    table = showback.render_table(r)
    assert re.search(r"^inf\s+a100-mig\s+0\.14\s+unknown\s+unknown\s+0\.14$", table, re.MULTILINE), table
    assert "NO SIGNAL" in table and "A100 and A30 MIG" in table
    rows = {row["claim"]: row for row in __import__("csv").DictReader(showback.render_csv(r).splitlines())}
    assert rows["a100-mig"]["gpu_hours_busy"] == "unknown" and rows["a100-mig"]["idle_share"] == "unknown"
    # Idle though it holds an A30 MIG device of unknown use: not known to be idle.
    still = showback.build(start=T0, end=T0 + 3600, step=STEP, source="t", held=held[1:],
                           busy=[series([0.0] * 60, namespace="ml", claim="mixed")], measured=measured)
    assert still.idle == ()


@pytest.mark.parametrize("text, label", [("namespace", "namespace"), ("claim", "claim"),
                                         ("label:team", "label_team"), ("label:cost-center", "label_cost_center"),
                                         ("label:app.kubernetes.io/name", "label_app_kubernetes_io_name")])
def test_group_by_takes_namespace_claim_or_a_pod_label(text: str, label: str) -> None:
    assert showback.group_by(text) == label


@pytest.mark.parametrize("text", ["team", "label:", "pod", "label:a b"])
def test_a_bad_group_by_is_a_clear_error(text: str) -> None:
    with pytest.raises(ShowbackError, match="--group-by"):
        showback.group_by(text)


def test_grouped_by_a_pod_label_each_value_sums_its_claims() -> None:
    held = [series([1.0] * 60, namespace="ml", claim="a", model="m"),
            series([2.0] * 60, namespace="ml", claim="b", model="m"),
            series([1.0] * 60, namespace="web", claim="c", model="m"),
            series([1.0] * 60, namespace="batch", claim="d", model="m")]
    busy = [series([0.5] * 60, namespace=h.labels["namespace"], claim=h.labels["claim"]) for h in held]
    labels = [Series({"namespace": ns, "claim": claim, "label_team": team}, ((T0 + 3540, 1.0),))
              for ns, claim, team in (("ml", "a", "platform"), ("ml", "b", "platform"), ("web", "c", "serving"))]
    r = showback.build(start=T0, end=T0 + 3600, step=STEP, source="t", held=held, busy=busy,
                       grouping="label_team", claim_labels=labels)
    assert [(u.namespace, u.held_hours) for u in r.groups] == [("platform", 3.0), ("", 1.0), ("serving", 1.0)]
    table = showback.render_table(r)
    assert re.search(r"^TEAM\s+GPU-H HELD", table, re.MULTILINE) and "NAMESPACE  GPU-H" not in table, table
    assert re.search(r"^\(none\)\s+1\.00", table, re.MULTILINE), "claims whose pods lack the label"
    assert re.search(r"^ml\s+b\s+platform\s+2\.00", table, re.MULTILINE), table
    doc = json.loads(showback.render_json(r))
    assert doc["groups"]["label"] == "label_team"
    assert {g["value"]: g["gpu_hours_held"] for g in doc["groups"]["values"]} == {"platform": 3.0, "serving": 1.0,
                                                                                 "": 1.0}
    assert {c["claim"]: c["label_team"] for c in doc["claims"]} == {"a": "platform", "b": "platform",
                                                                     "c": "serving", "d": ""}
    rows = list(__import__("csv").DictReader(showback.render_csv(r).splitlines()))
    assert {row["claim"]: row["label_team"] for row in rows}["c"] == "serving"
    by_claim = showback.render_table(showback.build(start=T0, end=T0 + 3600, step=STEP, source="t", held=held,
                                                    busy=busy, grouping="claim"))
    assert "NAMESPACE  GPU-H" not in by_claim and re.search(r"^\(all\)\s+5\.00", by_claim, re.MULTILINE)


# --- the price file ---------------------------------------------------------------------------


def test_a_price_file_in_yaml_or_json(tmp_path: Path) -> None:
    from dra_exporter.report import read_prices

    (tmp_path / "p.yaml").write_text('"NVIDIA H200": 4.5\ndefault: 3\n')
    (tmp_path / "p.json").write_text('{"NVIDIA H200": 4.5}')
    assert read_prices(str(tmp_path / "p.yaml")) == Prices({"NVIDIA H200": 4.5}, 3.0)
    assert read_prices(str(tmp_path / "p.json")) == Prices({"NVIDIA H200": 4.5}, None)


@pytest.mark.parametrize("text, needle", [
    ("[1, 2]", "mapping"), ("H200: cheap", "number"), ("H200: -1", "number"), ("{: [", "invalid YAML at line 1"),
    ("H200: true", "number"),
    # PyYAML's own loader kept the last price without a word; the strict loader refuses the file.
    ("H200: 4.5\ndefault: 3\nH200: 0.5\n", "duplicate key 'H200'"),
])
def test_a_bad_price_file_is_a_clear_error(tmp_path: Path, text: str, needle: str) -> None:
    from dra_exporter.report import read_prices

    path = tmp_path / "prices.yaml"
    path.write_text(text)
    with pytest.raises(ShowbackError, match=needle):
        read_prices(str(path))


@pytest.mark.parametrize("text, needle", [
    ("currency: eur\nH200: 1", "ISO 4217"), ("currency: 978\nH200: 1", "ISO 4217"),
    ("currency: EUR\n", "no price"), ("H200: .inf", "number"),
])
def test_a_bad_currency_or_a_file_without_prices_is_a_clear_error(tmp_path: Path, text: str, needle: str) -> None:
    from dra_exporter.report import read_prices

    path = tmp_path / "prices.yaml"
    path.write_text(text)
    with pytest.raises(ShowbackError, match=needle):
        read_prices(str(path))


def test_the_price_files_currency_and_reports_currency_agree_or_it_is_an_error(tmp_path: Path) -> None:
    from dra_exporter.report import read_prices

    (tmp_path / "p.yaml").write_text('"NVIDIA H200": 4.5\ndefault: 3\ncurrency: EUR\n')
    prices = read_prices(str(tmp_path / "p.yaml"))
    assert prices == Prices({"NVIDIA H200": 4.5}, 3.0, "EUR"), "currency is not a GPU model"
    assert prices.in_currency("EUR") == prices and prices.in_currency(None) == prices
    assert Prices(default=2.0).in_currency("USD") == Prices(default=2.0, currency="USD")
    with pytest.raises(ShowbackError, match="--currency USD: the price file says its prices are in EUR"):
        prices.in_currency("USD")
    with pytest.raises(ShowbackError, match="ISO 4217"):
        Prices(default=2.0).in_currency("euro")


def test_the_report_names_its_currency_in_every_format() -> None:
    held = [series([1.0] * 60, namespace="ml", claim="train", model="m")]
    r = showback.build(start=T0, end=T0 + 3600, step=STEP, source="recording rules", held=held,
                       busy=[series([0.5] * 60, namespace="ml", claim="train")],
                       prices=Prices(default=3.0, currency="EUR"))
    assert json.loads(showback.render_json(r))["currency"] == "EUR"
    (row,) = __import__("csv").DictReader(showback.render_csv(r).splitlines())
    assert (row["cost"], row["currency"]) == ("3.000000", "EUR")
    assert re.search(r"^NAMESPACE\s+CLAIM\s+.*COST \(EUR\)$", showback.render_table(r), re.MULTILINE)
    plain = showback.build(start=T0, end=T0 + 3600, step=STEP, source="t", held=held, busy=[],
                           prices=Prices(default=3.0))
    assert "currency" not in json.loads(showback.render_json(plain)), "no currency said, none named"
    assert "currency" not in showback.render_csv(plain).splitlines()[0]
    assert "COST (" not in showback.render_table(plain) and "COST" in showback.render_table(plain)


# --- the prices as recording rules (the showback dashboard's cost) ------------------------------


PRICES = Prices({"NVIDIA H200": 4.5, 'odd: "model"': 2.0}, 3.0, "EUR")


def test_the_price_rules_record_each_model_then_the_default_in_the_currency() -> None:
    doc = yaml.safe_load(showback.rules_yaml(prices=PRICES))
    assert [g["name"] for g in doc["groups"]] == [showback.RULE_GROUP, showback.PRICE_GROUP]
    assert doc["groups"][0] == yaml.safe_load(showback.rules_yaml())["groups"][0], "the showback rules unchanged"
    assert doc["groups"][1]["rules"] == [
        {"record": showback.PRICE, "expr": "vector(4.5)", "labels": {"model": "NVIDIA H200", "currency": "EUR"}},
        {"record": showback.PRICE, "expr": "vector(2)", "labels": {"model": 'odd: "model"', "currency": "EUR"}},
        {"record": showback.PRICE, "expr": "vector(3)", "labels": {"currency": "EUR"}},
    ]
    bare = yaml.safe_load(showback.rules_yaml(prices=Prices({"m": 1.5})))["groups"][1]["rules"]
    assert bare == [{"record": showback.PRICE, "expr": "vector(1.5)", "labels": {"model": "m"}}], "no currency"


def test_promtool_evaluates_the_price_rules_to_one_series_a_price(promtool: str, tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(showback.rules_yaml(prices=PRICES))
    (tmp_path / "test.yaml").write_text(yaml.safe_dump({"rule_files": ["rules.yaml"], "evaluation_interval": "1m",
                                                        "tests": [{"interval": "1m", "input_series": [],
                                                                   "promql_expr_test": [{
        "expr": showback.PRICE, "eval_time": "5m", "exp_samples": [
            {"labels": f'{showback.PRICE}{{model="NVIDIA H200", currency="EUR"}}', "value": 4.5},
            {"labels": f'{showback.PRICE}{{model="odd: \\"model\\"", currency="EUR"}}', "value": 2},
            {"labels": f'{showback.PRICE}{{currency="EUR"}}', "value": 3}]}]}]}))
    check = subprocess.run([promtool, "check", "rules", "rules.yaml"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=60, check=False)
    assert check.returncode == 0 and f"SUCCESS: {len(showback.RULES) + 3} rules found" in check.stdout, check.stdout
    unit = subprocess.run([promtool, "test", "rules", "test.yaml"], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, check=False)
    assert unit.returncode == 0, unit.stdout + unit.stderr


def run_rules(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dra_exporter.cli", "recording-rules", *args],
                          capture_output=True, text=True, timeout=60, check=False)


def test_the_recording_rules_command_writes_the_rules_for_pod_labels_and_a_price_file(tmp_path: Path) -> None:
    (tmp_path / "p.yaml").write_text('"NVIDIA H200": 4.5\n\'odd: "model"\': 2\ndefault: 3\n')
    done = run_rules("--pod-labels", "team", "--price-file", str(tmp_path / "p.yaml"), "--currency", "EUR")
    assert done.returncode == 0, done.stderr
    assert done.stdout == showback.rules_yaml(cat.PodLabels(("team",)), PRICES)
    assert run_rules().stdout == RULES_FILE.read_text(), "without options: the rules file of deploy/"


@pytest.mark.parametrize("text, args, needle", [
    ("H200: 1\ncurrency: EUR\n", ["--currency", "USD"], "prices are in EUR"),
    ("H200: cheap\n", [], "number"),
    ("H200: 1\n", ["--currency", "eur"], "ISO 4217"),
    (None, ["--currency", "EUR"], "give --price-file too"),
    (None, ["--pod-labels", "a team"], "--pod-labels"),
])
def test_bad_recording_rules_input_exits_2_with_one_line(tmp_path: Path, text: str | None, args: list[str],
                                                         needle: str) -> None:
    if text is not None:
        (tmp_path / "p.yaml").write_text(text)
        args = ["--price-file", str(tmp_path / "p.yaml"), *args]
    done = run_rules(*args)
    assert done.returncode == 2 and needle in done.stderr and done.stdout == "", done.stderr
    assert "Traceback" not in done.stderr


def test_a_huge_price_file_is_refused_after_a_bounded_read(tmp_path: Path) -> None:
    from dra_exporter.report import MAX_PRICE_FILE_BYTES, read_prices

    path = tmp_path / "huge.yaml"
    path.write_bytes(b"#" * (MAX_PRICE_FILE_BYTES + 10))
    with pytest.raises(ShowbackError, match="larger than 1 MiB"):
        read_prices(str(path))


# --- the client against a fake Prometheus API -------------------------------------------------


class FakePrometheus(BaseHTTPRequestHandler):
    """Answers /api/v1/query[_range]; records each request's query and Authorization header."""

    answers: ClassVar[dict[str, Any]] = {}
    seen: ClassVar[list[tuple[str, str, str]]] = []
    status = 200
    body: bytes | None = None

    def do_POST(self) -> None:
        form = urllib.parse.parse_qs(self.rfile.read(int(self.headers["Content-Length"])).decode())
        query = form["query"][0]
        type(self).seen.append((self.path, query, self.headers.get("Authorization", "")))
        if self.body is not None:
            payload = self.body
        else:
            matrix = self.path.endswith("query_range")
            result = next((v for k, v in self.answers.items() if k in query), [])
            payload = json.dumps({"status": "success", "data": {
                "resultType": "matrix" if matrix else "vector",
                "result": [{"metric": m, ("values" if matrix else "value"): pts if matrix else pts[0]}
                           for m, pts in result]}}).encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def fake() -> Iterator[tuple[str, type[FakePrometheus]]]:
    handler = type("Handler", (FakePrometheus,), {"answers": {}, "seen": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def run_report(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dra_exporter.cli", "report", *args], capture_output=True,
                          text=True, timeout=60, check=False)


WINDOW = ["--start", "1000000", "--end", "1003600", "--step", "60s", "--format", "json"]
DRA_SERIES_SEEN = {f"count(last_over_time({cat.GPU_INFO.name}": [({}, [[1003600, "1"]])]}
"""The report's probe answered: the exporters' series exist in the window."""


def test_without_rules_the_report_says_so_and_asks_the_raw_series(fake: tuple[str, Any]) -> None:
    url, handler = fake
    handler.answers = {**DRA_SERIES_SEEN,
                       cat.GPU_UP.name: [({"namespace": "ml", "claim": "t", "model": "m"},
                                          [[1000000 + 60 * i, "1"] for i in range(60)])]}
    result = run_report("--prometheus", url, *WINDOW)
    assert result.returncode == 0, result.stderr
    assert "recording rules are not installed" in result.stderr and len(result.stderr.splitlines()) == 1
    doc = json.loads(result.stdout)
    assert doc["source"] == "raw series" and doc["claims"][0]["gpu_hours_held"] == 1.0
    ranges = [q for path, q, _ in handler.seen if path.endswith("query_range")]
    assert ranges and all(":" not in re.sub(r"\[[^\]]*\]", "", q) for q in ranges), "raw queries only"


def test_a_prometheus_without_dra_series_is_nothing_to_report_exit_1(fake: tuple[str, Any]) -> None:
    """Not a table of zeros and "IDLE 0%": why on stderr, exit 1 (ran, found nothing usable)."""
    url, _ = fake  # answers every query with an empty result
    result = run_report("--prometheus", url, *WINDOW)
    assert result.returncode == 1 and result.stdout == "", result.stdout
    assert "no dra-exporter series" in result.stderr and "1970-01-12T13:46:40Z" in result.stderr
    assert "Traceback" not in result.stderr


def test_with_rules_the_report_reads_the_recorded_series(fake: tuple[str, Any]) -> None:
    url, handler = fake
    handler.answers = {"count(last_over_time": [({}, [[1003540, "3"]])],
                       showback.HELD_DEVICE: [({"namespace": "ml", "claim": "t", "model": "m"},
                                               [[1000000 + 60 * i, "0.5"] for i in range(60)])]}
    result = run_report("--prometheus", url, *WINDOW)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert json.loads(result.stdout)["claims"][0]["gpu_hours_held"] == 0.5
    assert all(cat.GPU_INFO.name not in q for path, q, _ in handler.seen if path.endswith("query_range"))


def test_bearer_token_and_basic_auth_are_sent(fake: tuple[str, Any], tmp_path: Path) -> None:
    url, handler = fake
    handler.answers = dict(DRA_SERIES_SEEN)
    (tmp_path / "token").write_text("s3cret-token\n")
    (tmp_path / "password").write_text("pa55")
    assert run_report("--prometheus", url, *WINDOW, "--bearer-token-file", str(tmp_path / "token")).returncode == 0
    assert {auth for *_, auth in handler.seen} == {"Bearer s3cret-token"}
    handler.seen.clear()
    assert run_report("--prometheus", url, *WINDOW, "--basic-auth-user", "finops",
                      "--basic-auth-password-file", str(tmp_path / "password")).returncode == 0
    assert {auth for *_, auth in handler.seen} == {"Basic " + base64.b64encode(b"finops:pa55").decode()}


@pytest.mark.parametrize("status, body, needle", [
    (401, b"", "HTTP 401"),
    (400, b'{"status":"error","errorType":"bad_data","error":"parse error"}', "bad_data: parse error"),
    (200, b"<html>login</html>", "not JSON"),
    (200, b'{"status":"success","data":{"result":[{"metric":{}}]}}', "not a vector or matrix"),
])
def test_server_errors_are_one_line_exit_2(fake: tuple[str, Any], status: int, body: bytes, needle: str) -> None:
    url, handler = fake
    handler.status, handler.body = status, body
    result = run_report("--prometheus", url, *WINDOW)
    assert result.returncode == 2 and needle in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


@pytest.mark.parametrize("args, needle", [
    (["--prometheus", "ftp://x"], "http://"),
    (["--prometheus", "http://127.0.0.1:1"], "cannot reach"),
    (["--prometheus", "http://x", "--since", "7x"], "duration"),
    (["--prometheus", "http://x", "--since", "1d", "--start", "0"], "--since and --start"),
    (["--prometheus", "http://x", "--start", "2025-06-02", "--end", "2025-06-01"], "before --end"),
    (["--prometheus", "http://x", "--since", "30d", "--step", "1s"], "11000"),
    (["--prometheus", "http://x", "--price-per-gpu-hour", "-1"], "--price-per-gpu-hour"),
    (["--prometheus", "http://x", "--price-per-gpu-hour", "1", "--price-file", __file__], "give one"),
    (["--prometheus", "http://x", "--price-file", "/nonexistent/prices.yaml"], "prices.yaml"),
    (["--prometheus", "http://x", "--currency", "EUR"], "give --price-per-gpu-hour or --price-file too"),
    (["--prometheus", "http://x", "--price-per-gpu-hour", "1", "--currency", "Euro"], "ISO 4217"),
    (["--prometheus", "http://x", "--basic-auth-user", "u"], "--basic-auth-password-file"),
    (["--prometheus", "http://x", "--bearer-token-file", "/nonexistent/token"], "token"),
    (["--prometheus", "https://x", "--ca-file", "/nonexistent/ca.pem"], "--ca-file"),
    (["--since", "1d"], "--prometheus"),
])
def test_bad_report_flags_exit_2_with_one_line(args: list[str], needle: str) -> None:
    result = run_report(*args)
    assert result.returncode == 2, result.stderr
    assert needle in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_an_oversize_answer_is_refused_after_a_bounded_read(fake: tuple[str, Any],
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from dra_exporter import report

    url, handler = fake
    handler.body = b'{"status":"success","data":{"resultType":"vector","result":[]}}' + b" " * 1000
    monkeypatch.setattr(report, "MAX_ANSWER_BYTES", 512)
    with pytest.raises(report.ReportError, match="answer over"):
        report.PrometheusClient(report.Connection(url)).instant("up", 0)


def test_an_unreachable_prometheus_is_said_without_internal_class_names() -> None:
    result = run_report("--prometheus", "http://127.0.0.1:1", *WINDOW)
    assert result.returncode == 2 and "cannot reach http://127.0.0.1:1/" in result.stderr, result.stderr
    assert "Connection refused" in result.stderr and "Connection(" not in result.stderr, result.stderr


def test_pointed_at_an_exporter_it_says_that_is_not_a_prometheus_api() -> None:
    from http.server import BaseHTTPRequestHandler

    class Exporter(BaseHTTPRequestHandler):  # GET /metrics only, as exporters serve: POST is a 501
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Exporter)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        result = run_report("--prometheus", f"http://127.0.0.1:{server.server_address[1]}", *WINDOW)
    finally:
        server.shutdown()
        server.server_close()
    assert result.returncode == 2 and "HTTP 501" in result.stderr, result.stderr
    assert "not a Prometheus API" in result.stderr and len(result.stderr.strip().splitlines()) == 1


RULES_SEEN = {"count(last_over_time": [({}, [[1003540, "3"]])]}
RAW_HELD = 'dra_gpu_up{claim!=""}'


def test_rules_that_miss_an_exporters_namespaces_are_not_the_report_the_raw_series_are(
        fake: tuple[str, Any]) -> None:
    url, handler = fake
    handler.answers = {**RULES_SEEN,
                       f"count by (namespace) (last_over_time({showback.HELD_DEVICE}": [
                           ({"namespace": "ml"}, [[0, "1"]])],
                       f"count by (namespace) (last_over_time({RAW_HELD}": [
                           ({"namespace": ns}, [[0, "1"]]) for ns in ("ml", "research", "web", "batch", "infra")]}
    result = run_report("--prometheus", url, *WINDOW)
    assert result.returncode == 0, result.stderr
    assert "recording rules cover only part of the window" in result.stderr, result.stderr
    assert "namespaces batch, infra, research, web" in result.stderr
    assert json.loads(result.stdout)["source"] == "raw series"


def test_rules_installed_during_the_window_are_not_the_report(fake: tuple[str, Any]) -> None:
    url, handler = fake
    handler.answers = {**RULES_SEEN,
                       f"min(min_over_time(timestamp({showback.HELD_DEVICE})": [({}, [[1003600, "1600"]])],
                       f"min(min_over_time(timestamp({RAW_HELD})": [({}, [[1003600, "3600"]])]}
    result = run_report("--prometheus", url, *WINDOW)
    assert result.returncode == 0, result.stderr
    assert "they start at 1970-01-12T14:20:00Z, the raw series at 1970-01-12T13:46:40Z" in result.stderr
    assert json.loads(result.stdout)["source"] == "raw series"


def test_grouping_by_a_label_no_series_carries_says_so(fake: tuple[str, Any]) -> None:
    url, handler = fake
    handler.answers = {**RULES_SEEN,
                       showback.HELD_DEVICE: [({"namespace": "ml", "claim": "t", "model": "m"},
                                               [[1000000 + 60 * i, "0.5"] for i in range(60)])]}
    result = run_report("--prometheus", url, *WINDOW, "--group-by", "label:team")
    assert result.returncode == 0, result.stderr
    assert "no series carries label_team in the window" in result.stderr and "(none)" in result.stderr
