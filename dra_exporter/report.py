"""``dra-exporter report``: GPU-hours showback from a Prometheus-compatible HTTP API (DESIGN §7).

The edge of the report: HTTP (the standard library's urllib; POST form bodies, as the API allows,
because the raw-series queries are long), authentication, TLS, the price file, and bounded reads.
Everything it fetches goes to ``showback.build``; no figure is computed here. It speaks only
``/api/v1/query`` and ``/api/v1/query_range``, which Prometheus, Thanos, Mimir and VictoriaMetrics
all serve, so the same command reports on one cluster or, through a global view, on many.
"""

from __future__ import annotations

import base64
import codecs
import json
import math
import re
import ssl
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Final

import urllib3

from . import boundedio, outbound, showback, strict_yaml
from . import catalog as cat
from .showback import Prices, Report, Series, ShowbackError

MAX_ANSWER_BYTES: Final = 64 << 20
"""Largest answer read from the server: ~2.5 million points (a week of five-minute points for ~1,000
claims). An answer is parsed as it arrives (``_Stream``), each series handed to ``showback.Tally`` as
soon as it is whole, so neither the answer nor its series are ever held: the report's memory is
what it shows, whatever the answers' sizes (a single series is held whole while it is parsed)."""
MAX_PRICE_FILE_BYTES: Final = 1 << 20
#: A bearer token or a password: a service account's token is ~1 KiB.
MAX_SECRET_BYTES: Final = 64 << 10
#: Largest value taken from a series (devices held, a share, a count): past it a sum overflows to inf.
MAX_VALUE: Final = 1e9
#: Same-origin redirects followed per query (a path prefix added by a proxy); another origin is refused.
MAX_REDIRECTS: Final = 3


class ReportError(ShowbackError):
    """The server could not be asked, or answered with an error; the message says what to check."""


@dataclass(frozen=True, slots=True)
class Connection:
    url: str
    bearer_token: str | None = None
    basic_auth: tuple[str, str] | None = None
    ca_file: str | None = None
    timeout: float = 60.0
    """Seconds one query may take, its whole answer included."""


class PrometheusClient:
    """The two query endpoints of the Prometheus HTTP API.

    Answers are read by ``outbound.read_body`` (one deadline for the whole answer, a byte cap that
    bounds what is held). Redirects are followed only to the same scheme, host and port, as the
    same POST: credentials never go to a host the operator did not name, and a query is never
    silently turned into a GET. What the server returned is checked (``notes``: values that are not
    finite, negative or absurd, repeated timestamps — dropped, and said once)."""

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
        context = None
        if conn.ca_file:
            try:
                context = ssl.create_default_context(cafile=conn.ca_file)
            except (OSError, ssl.SSLError) as exc:
                raise ReportError(f"--ca-file {conn.ca_file}: {exc}") from None
        self._pool = urllib3.PoolManager(ssl_context=context, retries=False)
        outbound.bound_heads(self._pool)
        self.dropped: Counter[str] = Counter()
        """Points dropped as unusable, by why (``_Parsed``): the report says so once."""

    def _post(self, path: str, params: dict[str, str], each: Callable[[Series], None]) -> None:
        """Ask; hand each series of the answer's result to ``each`` as it is parsed."""
        address = f"{self._base}/api/v1/{path}"
        deadline = time.monotonic() + self._timeout
        body = urllib.parse.urlencode(params).encode()
        target = address
        for _ in range(MAX_REDIRECTS + 1):
            response = self._send(address, target, body, deadline)
            if response.status not in (301, 302, 303, 307, 308):
                break
            target = self._redirected(address, target, response)
        else:
            raise ReportError(f"{address}: more than {MAX_REDIRECTS} redirects; give --prometheus the final URL")
        failed = not 200 <= response.status <= 299
        try:
            if failed:
                doc: Any = outbound.read_body(response, MAX_ANSWER_BYTES, self._timeout, deadline)
            else:
                decoder = json.JSONDecoder(object_pairs_hook=_Parsed(self.dropped))
                doc = _walk(_Stream(outbound.bounded_chunks(response, MAX_ANSWER_BYTES, self._timeout, deadline)),
                            decoder, each)
        except outbound.AnswerTooLarge:
            raise ReportError(f"{address}: answer over {MAX_ANSWER_BYTES >> 20} MiB; ask for a shorter window "
                              "or a longer --step") from None
        except outbound.AnswerRefused as exc:
            raise ReportError(f"{address}: {exc} (--timeout)") from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ReportError(f"cannot reach {address}: {_transport_words(exc)}") from None
        except _NotAResult as exc:
            raise ReportError(f"{address}: {exc}") from None
        except (ValueError, RecursionError):
            raise ReportError(f"{address}: the answer is not JSON; is this a Prometheus API URL?") from None
        finally:
            response.release_conn()
        if failed:
            raise ReportError(_http_error(address, response.status, response.reason, doc))
        if not isinstance(doc, dict) or doc.get("status") != "success" or not isinstance(doc.get("data"), dict):
            raise ReportError(f"{address}: {_api_error(doc)}")
        if "result" not in doc["data"]:
            raise ReportError("the server's answer is not a vector or matrix result")

    def _send(self, address: str, target: str, body: bytes, deadline: float) -> Any:
        left = deadline - time.monotonic()
        if left <= 0:
            raise ReportError(f"{address}: no answer within {self._timeout:g} s (--timeout)")
        try:
            with outbound.answer_within(left):
                return self._pool.request("POST", target, body=body, headers=self._headers, redirect=False,
                                          preload_content=False, timeout=urllib3.Timeout(connect=left, read=left))
        except outbound.AnswerTooSlow:
            raise ReportError(f"{address}: no answer within {self._timeout:g} s (--timeout)") from None
        except (urllib3.exceptions.HTTPError, OSError) as exc:
            raise ReportError(f"cannot reach {address}: {_transport_words(exc)}") from None

    def _redirected(self, address: str, target: str, response: Any) -> str:
        """The same-origin URL a redirect names; another origin is refused (one line naming it)."""
        location = str(response.headers.get("Location", ""))
        response.drain_conn()
        response.release_conn()
        new = urllib.parse.urljoin(target, location)
        here, there = urllib.parse.urlsplit(target), urllib.parse.urlsplit(new)
        if (here.scheme, here.hostname, here.port) != (there.scheme, there.hostname, there.port):
            raise ReportError(f"{address}: the server redirects ({response.status}) to another host, "
                              f"{_one_line(new, 200)}; not followed (the credentials would go there): "
                              "give --prometheus that URL if it is the right server")
        return new

    def instant(self, expr: str, at: float, each: Callable[[Series], None] | None = None) -> list[Series]:
        """The series of ``expr`` at ``at``; with ``each``, handed to it one by one instead (none kept)."""
        kept: list[Series] = []
        self._post("query", {"query": expr, "time": _num(at)}, each or kept.append)
        return kept

    def range(self, expr: str, start: float, end: float, step: float,
              each: Callable[[Series], None] | None = None) -> list[Series]:
        """The series of ``expr`` from ``start`` to ``end``; with ``each``, as ``instant``."""
        kept: list[Series] = []
        self._post("query_range", {"query": expr, "start": _num(start), "end": _num(end), "step": _num(step)},
                   each or kept.append)
        return kept

    def notes(self) -> list[str]:
        """One line per kind of point dropped so far (``dropped``), and forget them."""
        lines = [f"dropped {n} point{'s' if n != 1 else ''} of the server's answers: {why}"
                 for why, n in sorted(self.dropped.items())]
        self.dropped.clear()
        return lines


class _NotAResult(ValueError):
    """The answer is JSON, but not a Prometheus vector or matrix result."""


class _Parsed:
    """``object_pairs_hook`` that turns each series of a vector or matrix result into a ``Series``
    as the parser finishes it, so an answer never exists as a JSON tree of points: the raw pairs of
    one series at a time, and the points kept. Points whose value is not finite or is negative (a
    GPU share, a count), and repeats of a timestamp, are dropped and counted in ``dropped``."""

    def __init__(self, dropped: Counter[str]) -> None:
        self.dropped = dropped

    def __call__(self, pairs: list[tuple[str, Any]]) -> Any:
        obj = dict(pairs)
        if not isinstance(obj.get("metric"), dict) or not ("values" in obj or "value" in obj):
            return obj  # the label set itself, or the answer's envelope
        labels = obj["metric"]
        if not all(isinstance(v, str) for v in labels.values()):
            bad = next(k for k, v in labels.items() if not isinstance(v, str))
            raise _NotAResult(f"the server's answer has a label {_one_line(str(bad), 80)!r} whose value is not a "
                              "string; is this a Prometheus API URL?")
        raw = obj["values"] if "values" in obj else [obj["value"]]
        points: list[tuple[float, float]] = []
        seen: set[float] = set()
        try:
            for t, v in raw:
                at, value = float(t), float(v)
                why = ("its time is not a finite number" if not math.isfinite(at) else
                       "not a finite number" if not math.isfinite(value) else
                       "negative" if value < 0 else
                       f"over {MAX_VALUE:g}, which no GPU count or share is" if value > MAX_VALUE else
                       "a timestamp given twice in one series" if at in seen else "")
                if why:
                    self.dropped[why] += 1
                    continue
                seen.add(at)
                points.append((at, value))
        except (TypeError, ValueError):
            raise _NotAResult("the server's answer is not a vector or matrix result") from None
        return Series(dict(labels), tuple(points))


def _num(x: float) -> str:
    return f"{x:.3f}".rstrip("0").rstrip(".")


def _one_line(text: str, limit: int = 300) -> str:
    """``text`` folded onto one line (a server's multi-line error would split the message), at most ``limit``."""
    folded = " ".join(text.split())
    return folded if len(folded) <= limit else folded[:limit] + "..."


#: urllib3 starts a connection error with its connection object's repr (an internal class name:
#: "_HTTPConnection(host='x', port=1): Failed to …"); the address is said already.
_CONNECTION_REPR = re.compile(r"^\w*Connection\w*\([^)]*\):\s*")


def _transport_words(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None) or exc
    return _one_line(_CONNECTION_REPR.sub("", str(reason)) or type(reason).__name__, 200)


def _api_error(doc: Any) -> str:
    if isinstance(doc, dict) and doc.get("error"):
        return f"{_one_line(str(doc.get('errorType', 'error')), 40)}: {_one_line(str(doc['error']))}"
    return "the answer is not a Prometheus API result"


def _http_error(address: str, status: int, reason: str | None, body: bytes | bytearray) -> str:
    if status in (401, 403):
        return (f"{address}: HTTP {status} {reason or ''}: check --bearer-token-file or "
                "--basic-auth-user/--basic-auth-password-file")
    try:
        doc = json.loads(body[:64 << 10])
    except (ValueError, RecursionError):
        doc = None
    if isinstance(doc, dict) and doc.get("error"):
        return f"{address}: HTTP {status}: {_api_error(doc)}"
    # No Prometheus API error document: something else answers there (an exporter answers POST with 501).
    return (f"{address}: HTTP {status}: {_one_line(str(reason or ''))}: not a Prometheus API; --prometheus is "
            "the Prometheus server's URL (e.g. http://prometheus:9090), not an exporter's")


_SPACE: Final = re.compile(r"[ \t\n\r]*")


class _Stream:
    """A JSON text read as it arrives: ``value`` decodes the next value with json's own decoder, fed
    more text until the value is whole; ``peek`` and ``take`` walk the envelope's punctuation. What is
    held is the unread text and the value being decoded, never the answer."""

    def __init__(self, pieces: Iterator[bytes]) -> None:
        self._pieces = pieces
        self._utf8 = codecs.getincrementaldecoder("utf-8")()
        self._text = ""
        self._pos = 0
        self._ended = False

    def _more(self) -> bool:
        """Read at least as much again as is unread (a value over many pieces is retried a logarithmic
        number of times, so parsing stays linear); False at the end of the answer."""
        if self._ended:
            return False
        want = max(len(self._text) - self._pos, outbound.CHUNK)
        parts = [self._text[self._pos:]]
        got = 0
        while got < want:
            piece = next(self._pieces, None)
            if piece is None:
                parts.append(self._utf8.decode(b"", final=True))
                self._ended = True
                break
            parts.append(self._utf8.decode(piece))
            got += len(piece)
        self._text, self._pos = "".join(parts), 0
        return True

    def peek(self) -> str:
        """The next character that is not white space, left unread; "" at the end."""
        while True:
            match = _SPACE.match(self._text, self._pos)
            self._pos = match.end() if match else self._pos
            if self._pos < len(self._text):
                return self._text[self._pos]
            if not self._more():
                return ""

    def take(self, expected: str) -> None:
        if self.peek() != expected:
            raise ValueError(f"expected {expected!r}")
        self._pos += 1

    def value(self, decoder: json.JSONDecoder) -> Any:
        self.peek()
        while True:
            try:
                found, end = decoder.raw_decode(self._text, self._pos)
            except json.JSONDecodeError:
                if self._more():
                    continue  # the value goes on in what has not arrived yet
                raise
            if end == len(self._text) and self._more():
                continue  # a number may go on in the next piece ("12" of "123")
            self._pos = end
            return found


def _members(stream: _Stream, decoder: json.JSONDecoder) -> Iterator[str]:
    """The keys of the object at the stream's position; the caller reads each key's value."""
    stream.take("{")
    if stream.peek() == "}":
        stream.take("}")
        return
    while True:
        key = stream.value(decoder)
        if not isinstance(key, str):
            raise ValueError("a key that is not a string")
        stream.take(":")
        yield key
        if stream.peek() != ",":
            stream.take("}")
            return
        stream.take(",")


def _walk(stream: _Stream, decoder: json.JSONDecoder, each: Callable[[Series], None]) -> Any:
    """The answer's envelope (status, error, data without its result), each series of
    ``data.result`` handed to ``each`` as soon as it is parsed (``_Parsed`` makes it a ``Series``)."""
    if stream.peek() != "{":
        return stream.value(decoder)  # not an API result: the caller says so
    doc: dict[str, Any] = {}
    for key in _members(stream, decoder):
        if key != "data" or stream.peek() != "{":
            doc[key] = stream.value(decoder)
            continue
        data: dict[str, Any] = {}
        for inner in _members(stream, decoder):
            if inner != "result" or stream.peek() != "[":
                data[inner] = stream.value(decoder)
                continue
            stream.take("[")
            more = stream.peek() != "]"
            while more:
                item = stream.value(decoder)
                if not isinstance(item, Series):
                    raise _NotAResult("the server's answer is not a vector or matrix result")
                each(item)
                more = stream.peek() == ","
                if more:
                    stream.take(",")
            stream.take("]")
            data["result"] = True
        doc["data"] = data
    if stream.peek():
        raise ValueError("more after the answer")
    return doc


# --- inputs -----------------------------------------------------------------------------------


def read_secret(path: str, what: str) -> str:
    """A token or password file, its whitespace stripped (Kubernetes secrets carry no newline, editors
    do); read through ``boundedio``: a FIFO or /dev/zero is refused, not waited on."""
    try:
        text = boundedio.read_bytes(path, MAX_SECRET_BYTES).decode("utf-8").strip()
    except boundedio.FileTooLargeError:
        raise ReportError(f"{what} {path}: larger than {MAX_SECRET_BYTES >> 10} KiB; not a token") from None
    except OSError as exc:
        raise ReportError(f"{what} {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ReportError(f"{what} {path}: not a UTF-8 text file") from None
    if not text:
        raise ReportError(f"{what} {path} is empty")
    return text


def read_prices(path: str) -> Prices:
    """A price file (``showback.prices_from_doc``), YAML or JSON, read bounded and strictly."""
    try:
        doc = strict_yaml.load(strict_yaml.read_text(path, MAX_PRICE_FILE_BYTES))
    except strict_yaml.YamlFileError as exc:
        raise ShowbackError(f"price file {path}: {exc}") from None
    return showback.prices_from_doc(doc, f"price file {path}")


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
    gap = _rules_gap(client, start, end, step) if recorded else ""
    if gap:
        recorded = False  # a report from rules that cover part of the window would say less than there is
        if warn is not None:
            warn(f"the recording rules cover only part of the window ({gap}); computing from the raw series, "
                 "which is slower")
    q = showback.queries(recorded=recorded, step=step)
    last = end - step  # each point stands for the step that starts at it: [t, t + step); so do
    # the devices and pods of the idle claims, taken at the last point
    # Each answer is taken in as it is parsed, in the order the tally needs (held before busy before
    # measured, then what the idle claims need): no answer is ever held whole.
    tally = showback.Tally(start=start, end=end, step=step, source="recording rules" if recorded else "raw series",
                           prices=prices, idle_below=idle_below, top=top, grouping=grouping)
    client.range(q.held, start, last, step, each=tally.held)
    client.range(q.busy, start, last, step, each=tally.busy)
    client.range(q.measured, start, last, step, each=tally.measured)
    client.instant(q.devices, last, each=tally.device)
    client.instant(q.pods, last, each=tally.pod)
    if grouping.startswith("label_"):
        client.instant(showback.claim_labels_query(grouping, end - start), end, each=tally.claim_label)
    report = tally.report()
    if grouping.startswith("label_") and not _has_label(report) and warn is not None:
        warn(f"no series carries {grouping} in the window (the exporters' --pod-labels, or kube-state-metrics' "
             "kube_pod_labels): every claim is under (none)")
    for note in client.notes():
        if warn is not None:
            warn(note)
    return report


def _has_label(report: Report) -> bool:
    """Whether some claim of ``report`` has a value of the pod label it is grouped by."""
    return any(u.namespace for u in report.groups)


def _rules_gap(client: PrometheusClient, start: float, end: float, step: float) -> str:
    """What of the window the recording rules miss and the raw series have: namespaces with held
    devices and no recorded figure (an exporter the rules never saw), or a later start (the rules
    were installed during the window); "" when they cover it."""
    window = f"[{_num(end - start)}s]"
    raw_held = f'{cat.GPU_UP.name}{{claim!=""}}'

    def namespaces(series: str) -> set[str]:
        return {s.labels.get("namespace", "") for s in client.instant(
            f"count by (namespace) (last_over_time({series}{window}))", end)}

    def first(series: str) -> float | None:
        # As seconds before the end: a timestamp itself is over the answers' plausible values.
        found = client.instant(f"{_num(end)} - min(min_over_time(timestamp({series})[{_num(end - start)}s:"
                               f"{_num(step)}s]))", end)
        return end - found[0].points[0][1] if found and found[0].points else None

    missing = sorted(namespaces(raw_held) - namespaces(showback.HELD_DEVICE))
    said = []
    rules_from, raw_from = first(showback.HELD_DEVICE), first(raw_held)
    if rules_from is not None and raw_from is not None and rules_from > raw_from + 2 * step + 60:
        said.append(f"they start at {showback.iso(rules_from)}, the raw series at {showback.iso(raw_from)}")
    if missing:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        said.append(f"no recorded figure for namespace{'s' if len(missing) > 1 else ''} {shown}")
    return "; ".join(said)
