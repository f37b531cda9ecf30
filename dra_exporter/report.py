"""``dra-exporter report``: GPU-hours showback from a Prometheus-compatible HTTP API (DESIGN §7).

The edge of the report: HTTP (the standard library's urllib; POST form bodies, as the API allows,
because the raw-series queries are long), authentication, TLS, the price file, and bounded reads.
Everything it fetches goes to ``showback.build``; no figure is computed here. It speaks only
``/api/v1/query`` and ``/api/v1/query_range``, which Prometheus, Thanos, Mimir and VictoriaMetrics
all serve, so the same command reports on one cluster or, through a global view, on many.
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from . import catalog as cat
from . import showback
from .showback import Prices, Report, Series, ShowbackError

MAX_ANSWER_BYTES: Final = 256 << 20
"""Largest answer read from the server: a week of one-minute points for ~4000 claims."""
MAX_PRICE_FILE_BYTES: Final = 1 << 20


class ReportError(ShowbackError):
    """The server could not be asked, or answered with an error; the message says what to check."""


@dataclass(frozen=True, slots=True)
class Connection:
    url: str
    bearer_token: str | None = None
    basic_auth: tuple[str, str] | None = None
    ca_file: str | None = None
    timeout: float = 60.0


class PrometheusClient:
    """The two query endpoints of the Prometheus HTTP API."""

    def __init__(self, conn: Connection) -> None:
        parsed = urllib.parse.urlsplit(conn.url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ReportError(f"--prometheus {conn.url!r} is not an http:// or https:// URL")
        self._base = conn.url.rstrip("/")
        self._timeout = conn.timeout
        self._headers = {"Accept": "application/json", "Content-Type": "application/x-www-form-urlencoded"}
        if conn.bearer_token:
            self._headers["Authorization"] = f"Bearer {conn.bearer_token}"
        elif conn.basic_auth:
            pair = base64.b64encode(":".join(conn.basic_auth).encode()).decode()
            self._headers["Authorization"] = f"Basic {pair}"
        self._context = None
        if conn.ca_file:
            try:
                self._context = ssl.create_default_context(cafile=conn.ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise ReportError(f"--ca-file {conn.ca_file}: {exc}") from None

    def _post(self, path: str, params: dict[str, str]) -> Any:
        address = f"{self._base}/api/v1/{path}"
        request = urllib.request.Request(address, urllib.parse.urlencode(params).encode(), self._headers)
        try:
            with urllib.request.urlopen(request, timeout=self._timeout, context=self._context) as response:
                body = response.read(MAX_ANSWER_BYTES + 1)
        except urllib.error.HTTPError as exc:
            raise ReportError(_http_error(address, exc)) from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise ReportError(f"cannot reach {address}: {reason}") from None
        if len(body) > MAX_ANSWER_BYTES:
            raise ReportError(f"{address}: answer over {MAX_ANSWER_BYTES} bytes; ask for a shorter window "
                              "or a longer --step")
        try:
            doc = json.loads(body)
        except ValueError:
            raise ReportError(f"{address}: the answer is not JSON; is this a Prometheus API URL?") from None
        if not isinstance(doc, dict) or doc.get("status") != "success" or not isinstance(doc.get("data"), dict):
            raise ReportError(f"{address}: {_api_error(doc)}")
        return doc["data"]

    def instant(self, expr: str, at: float) -> list[Series]:
        return _series(self._post("query", {"query": expr, "time": _num(at)}), range_=False)

    def range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        data = self._post("query_range", {"query": expr, "start": _num(start), "end": _num(end),
                                          "step": _num(step)})
        return _series(data, range_=True)


def _num(x: float) -> str:
    return f"{x:.3f}".rstrip("0").rstrip(".")


def _api_error(doc: Any) -> str:
    if isinstance(doc, dict) and doc.get("error"):
        return f"{doc.get('errorType', 'error')}: {str(doc['error'])[:300]}"
    return "the answer is not a Prometheus API result"


def _http_error(address: str, exc: urllib.error.HTTPError) -> str:
    if exc.code in (401, 403):
        return (f"{address}: HTTP {exc.code} {exc.reason}: check --bearer-token-file or "
                "--basic-auth-user/--basic-auth-password-file")
    try:
        detail = _api_error(json.loads(exc.read(64 << 10)))
    except ValueError:
        detail = str(exc.reason)
    return f"{address}: HTTP {exc.code}: {detail}"


def _series(data: dict[str, Any], *, range_: bool) -> list[Series]:
    try:
        out = []
        for item in data["result"]:
            pairs = item["values"] if range_ else [item["value"]]
            out.append(Series(dict(item["metric"]), tuple((float(t), float(v)) for t, v in pairs)))
        return out
    except (KeyError, TypeError, ValueError):
        raise ReportError("the server's answer is not a vector or matrix result") from None


# --- inputs -----------------------------------------------------------------------------------


def read_secret(path: str, what: str) -> str:
    """A token or password file (its first line; Kubernetes secrets carry no newline, editors do)."""
    try:
        with open(path, "rb") as f:
            text = f.read(64 << 10).decode("utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"{what} {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if not text:
        raise ReportError(f"{what} {path} is empty")
    return text


def read_prices(path: str) -> Prices:
    """A price file: ``{model: price per GPU-hour of a whole GPU}``, optionally ``default``; YAML or JSON."""
    import yaml

    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_PRICE_FILE_BYTES + 1)
    except OSError as exc:
        raise ShowbackError(f"price file {path}: {exc.strerror or exc}") from None
    if len(raw) > MAX_PRICE_FILE_BYTES:
        raise ShowbackError(f"price file {path} is over {MAX_PRICE_FILE_BYTES >> 20} MiB")
    try:
        doc = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark else ""
        raise ShowbackError(f"price file {path} is not YAML or JSON{where}") from None
    if not isinstance(doc, dict) or not doc:
        raise ShowbackError(f"price file {path}: expected a mapping of GPU model to price per GPU-hour, "
                            'e.g. {"NVIDIA H200": 4.5, "default": 3.0}')
    prices: dict[str, float] = {}
    for model, price in doc.items():
        if isinstance(price, bool) or not isinstance(price, (int, float)) or not price >= 0:
            raise ShowbackError(f"price file {path}: the price of {str(model)!r} must be a number >= 0, "
                                f"not {price!r}")
        prices[str(model)] = float(price)
    default = prices.pop("default", None)
    return Prices(prices, default)


# --- the report -------------------------------------------------------------------------------


def run(
    client: PrometheusClient,
    *,
    start: float,
    end: float,
    step: float,
    prices: Prices | None,
    idle_below: float,
    top: int,
    use_rules: bool = True,
    warn: Callable[[str], None] | None = None,
    grouping: str = "namespace",
) -> Report:
    """Ask the server for the window's figures and build the report; ``warn`` gets one-line notes."""
    if end <= start:
        raise ShowbackError("the window is empty: --start must be before --end")
    points = int((end - start) // step)
    if points < 1:
        raise ShowbackError(f"--step {_num(step)}s is longer than the window")
    if points > showback.MAX_POINTS:
        raise ShowbackError(f"--step {_num(step)}s gives more than {showback.MAX_POINTS} points over the window "
                            "(Prometheus's limit); use a longer step")
    start = end - points * step  # whole steps, ending at --end
    recorded = use_rules and bool(client.instant(f"count(last_over_time({showback.SHARE}[{_num(end - start)}s]))",
                                                 end))
    if not recorded and not client.instant(f"count(last_over_time({cat.GPU_INFO.name}[{_num(end - start)}s]))", end):
        raise showback.NothingToReport(
            f"no dra-exporter series from {showback.iso(start)} to {showback.iso(end)} ({cat.GPU_INFO.name} has no "
            "sample): is this the Prometheus that scrapes the exporters, and were they running then?")
    if not recorded and warn is not None:
        warn("--raw: computing from the raw series, which is slower" if not use_rules else
             f"the recording rules are not installed ({showback.SHARE} has no sample in the window); "
             "computing from the raw series, which is slower (install deploy/recording-rules.yaml)")
    q = showback.queries(recorded=recorded, step=step)
    last = end - step  # each point stands for the step that starts at it: [t, t + step); so do
    # the devices and pods of the idle claims, taken at the last point
    return showback.build(
        start=start, end=end, step=step,
        source="recording rules" if recorded else "raw series",
        held=client.range(q.held, start, last, step),
        busy=client.range(q.busy, start, last, step),
        measured=client.range(q.measured, start, last, step),
        devices=client.instant(q.devices, last),
        pods=client.instant(q.pods, last),
        prices=prices, idle_below=idle_below, top=top, grouping=grouping,
        claim_labels=client.instant(showback.claim_labels_query(grouping, end - start), end)
        if grouping.startswith("label_") else (),
    )
