"""OTLP settings and the SDK exporter they build: where and how the sink pushes.

``OtlpSettings`` checks what an operator gave (``--otlp-*`` flags) and says what to fix
(``OtlpConfigError``); ``build_exporter`` turns them into the SDK's gRPC or HTTP/protobuf
exporter. The standard ``OTEL_EXPORTER_OTLP_*`` variables (endpoint, headers, certificates,
compression, temporality preference, …) are read by the SDK exporters; only what the settings
set explicitly is passed, and an endpoint in the settings wins over the environment.
"""

from __future__ import annotations

import math
import os
import re
import time
import weakref
from dataclasses import dataclass
from typing import Any, Final, Literal
from urllib.parse import urlsplit, urlunsplit

from opentelemetry.sdk.metrics import ObservableCounter
from opentelemetry.sdk.metrics.export import AggregationTemporality, MetricExporter
from opentelemetry.util.re import parse_env_headers

from .. import outbound
from ..boundedio import require_regular_file

Protocol = Literal["grpc", "http/protobuf"]
PROTOCOLS: Final = ("grpc", "http/protobuf")
#: The path of the metrics signal on an OTLP/HTTP receiver.
HTTP_METRICS_PATH: Final = "/v1/metrics"


class OtlpConfigError(ValueError):
    """An OTLP setting an operator has to fix; the message says which and how."""


@dataclass(frozen=True, slots=True)
class OtlpSettings:
    """Where and how to push. Unset TLS fields fall back to the ``OTEL_EXPORTER_OTLP_*`` variables."""

    endpoint: str
    """``http(s)://host:port`` (gRPC also takes ``host:port``); ``""``: from the environment.
    For http/protobuf, ``/v1/metrics`` is appended when the URL has no path."""
    protocol: Protocol = "grpc"
    interval: float = 10.0
    """Seconds between pushes."""
    headers: tuple[tuple[str, str], ...] = ()
    """Sent with every export, on top of ``OTEL_EXPORTER_OTLP_(METRICS_)HEADERS``; on a clash these win."""
    insecure: bool | None = None
    """gRPC: plaintext if true, TLS if false; None: decided from the URL scheme (``http`` = plaintext).
    http/protobuf: the scheme decides; a contradicting value is an error."""
    certificate_file: str | None = None
    """CA bundle that signs the collector's certificate."""
    client_certificate_file: str | None = None
    """Client certificate for mTLS (needs ``client_key_file``)."""
    client_key_file: str | None = None
    timeout: float = 10.0
    """Seconds one export may take, retries included."""

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise OtlpConfigError(f"OTLP protocol must be one of {', '.join(PROTOCOLS)} "
                                  f"(got {self.protocol!r})")
        for what, seconds in (("interval", self.interval), ("timeout", self.timeout)):
            if not (isinstance(seconds, (int, float)) and math.isfinite(seconds) and seconds > 0):
                raise OtlpConfigError(f"OTLP {what} must be a positive number of seconds (got {seconds!r})")
        _check_endpoint(self)
        if bool(self.client_certificate_file) != bool(self.client_key_file):
            raise OtlpConfigError("OTLP mTLS needs both a client certificate file and a client key file")
        if self.insecure and (self.certificate_file or self.client_certificate_file):
            raise OtlpConfigError("OTLP certificate files were given together with insecure (plaintext); "
                                  "drop one of them")
        for name, value in self.headers:
            _check_header(name, value)


#: gRPC's scheme-less target: a host name or address (IPv6 in brackets) and a port.
_GRPC_TARGET: Final = re.compile(r"(?:[A-Za-z0-9._-]+|\[[0-9A-Fa-f:.]+\]):[0-9]{1,5}")


def _check_endpoint(settings: OtlpSettings) -> None:
    endpoint = settings.endpoint
    if not endpoint:
        return
    if "://" not in endpoint:
        if settings.protocol == "http/protobuf":
            raise OtlpConfigError(f"OTLP endpoint {endpoint!r} needs a scheme for http/protobuf, "
                                  f"e.g. http://collector:4318 or https://collector:4318")
        if not _GRPC_TARGET.fullmatch(endpoint):
            raise OtlpConfigError(f"OTLP endpoint {endpoint!r} must look like host:port (gRPC, e.g. "
                                  f"collector:4317) or http://host:port or https://host:port")
        return  # gRPC's host:port form; TLS unless insecure
    parts = urlsplit(endpoint)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise OtlpConfigError(f"OTLP endpoint {endpoint!r} must look like http://host:port "
                              f"or https://host:port")
    if (settings.protocol == "http/protobuf" and settings.insecure is not None
            and settings.insecure != (parts.scheme == "http")):
        raise OtlpConfigError(f"OTLP endpoint {endpoint!r} and insecure={settings.insecure} contradict "
                              f"each other; for http/protobuf the scheme decides "
                              f"(http:// plaintext, https:// TLS)")


#: RFC 9110 token characters, the only ones allowed in a header name.
_HEADER_NAME = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
#: Control characters other than tab would split or corrupt the request.
_BAD_VALUE = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")


def _check_header(name: str, value: str) -> None:
    # Messages name the header but never echo its value: it is often a credential.
    if not _HEADER_NAME.fullmatch(name):
        raise OtlpConfigError(f"invalid OTLP header name {name!r}: use letters, digits and -_. only")
    if _BAD_VALUE.search(value):
        raise OtlpConfigError(f"invalid value for OTLP header {name!r}: it contains a line break or "
                              f"another control character")


def parse_header(text: str) -> tuple[str, str]:
    """``"KEY=VALUE"`` (as given to ``--otlp-header``) -> ``("key", "VALUE")``.

    The name is lower-cased because gRPC metadata keys must be lower case (HTTP does not care).
    Raises ``ValueError`` (``OtlpConfigError``) with a message an operator can act on.
    """
    name, sep, value = text.partition("=")
    name, value = name.strip(), value.strip()
    if not sep or not name:
        raise OtlpConfigError("OTLP header must look like KEY=VALUE, e.g. authorization=Bearer <token>")
    _check_header(name, value)
    return name.lower(), value


# --- exporters --------------------------------------------------------------------------------


def build_exporter(settings: OtlpSettings) -> MetricExporter:
    """The SDK's OTLP metric exporter for ``settings``; unset fields are left to the environment."""
    for path in (settings.certificate_file, settings.client_certificate_file, settings.client_key_file):
        if path and not os.access(path, os.R_OK):
            raise OtlpConfigError(f"cannot read OTLP TLS file {path!r}: check the path and its permissions")
        if path:
            try:
                require_regular_file(path)  # the SDK's own open would block on a FIFO for ever
            except OSError as exc:
                raise OtlpConfigError(f"cannot read OTLP TLS file {path!r}: {exc.strerror}") from None
    if settings.protocol == "grpc":
        return _grpc_exporter(settings)
    return _http_exporter(settings)


def _grpc_exporter(settings: OtlpSettings) -> MetricExporter:
    import grpc
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter

    kwargs: dict[str, Any] = {"timeout": settings.timeout}
    if settings.endpoint:
        kwargs["endpoint"] = settings.endpoint
    if settings.insecure is not None:
        kwargs["insecure"] = settings.insecure
    if settings.certificate_file or settings.client_certificate_file:
        kwargs["credentials"] = grpc.ssl_channel_credentials(
            root_certificates=_read(settings.certificate_file),
            private_key=_read(settings.client_key_file),
            certificate_chain=_read(settings.client_certificate_file),
        )
    if settings.headers:
        # The gRPC exporter drops the environment's headers as soon as any are passed, while the HTTP
        # one merges them under the explicit ones; merging here gives both protocols that behaviour.
        # gRPC metadata keys must be lower case.
        explicit = {name.lower(): value for name, value in settings.headers}
        kwargs["headers"] = tuple({**_environment_headers(), **explicit}.items())
    return OTLPMetricExporter(**kwargs)


def _http_exporter(settings: OtlpSettings) -> MetricExporter:
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    kwargs: dict[str, Any] = {"timeout": settings.timeout}
    if settings.endpoint:
        # An explicit endpoint is used verbatim by the SDK, so the signal path is ours to add.
        kwargs["endpoint"] = _http_metrics_url(settings.endpoint)
    if settings.certificate_file:
        kwargs["certificate_file"] = settings.certificate_file
    if settings.client_certificate_file:
        kwargs["client_certificate_file"] = settings.client_certificate_file
        kwargs["client_key_file"] = settings.client_key_file
    if settings.headers:
        kwargs["headers"] = dict(settings.headers)
    session = _bounded_session()
    exporter = OTLPMetricExporter(session=session, **kwargs)
    _sessions[exporter] = session
    return exporter


#: Largest collector reply read: an ``ExportMetricsServiceResponse`` is a partial-success count and
#: a message, a few bytes; whatever else a collector sends is refused, not held.
MAX_REPLY_BYTES: Final = 64 << 10
_sessions: weakref.WeakKeyDictionary[MetricExporter, Any] = weakref.WeakKeyDictionary()


def _bounded_session() -> Any:
    """A ``requests`` session whose replies are read by ``outbound.read_body``: at most
    ``MAX_REPLY_BYTES``, within the export's timeout for the whole reply (the SDK's exporter reads
    the body whole, however big or slow it is). A refusal fails the export; ``refusal`` says why."""
    import requests

    class BoundedSession(requests.Session):
        refusal = ""

        def request(self, method: str, url: str | bytes, *args: Any, **kw: Any) -> requests.Response:
            timeout = kw.get("timeout")
            seconds = float(timeout) if isinstance(timeout, (int, float)) and timeout > 0 else 10.0
            deadline = time.monotonic() + seconds  # the connection and the reply together
            kw["stream"] = True
            try:
                with outbound.answer_within(seconds):
                    response = super().request(method, url, *args, **kw)
            except outbound.AnswerRefused as exc:
                self.refusal = f"the collector's reply was refused: {exc}"
                raise
            try:
                body = outbound.read_body(response.raw, MAX_REPLY_BYTES, seconds, deadline)
            except outbound.AnswerRefused as exc:
                self.refusal = f"the collector's reply was refused: {exc}"
                response.close()
                raise
            response._content, response._content_consumed = bytes(body), True
            response.raw.release_conn()
            return response

    session = BoundedSession()
    for adapter in session.adapters.values():
        outbound.bound_heads(adapter.poolmanager)  # type: ignore[attr-defined]  # requests' HTTPAdapter
    return session


def refusal(exporter: MetricExporter) -> str:
    """Why the exporter's last reply was refused (``""``: it was not), and forget it."""
    session = _sessions.get(exporter)
    if session is None or not session.refusal:
        return ""
    why, session.refusal = session.refusal, ""
    return str(why)


def _http_metrics_url(endpoint: str) -> str:
    parts = urlsplit(endpoint)
    if parts.path in ("", "/"):
        parts = parts._replace(path=HTTP_METRICS_PATH)
    return urlunsplit(parts)


def _environment_headers() -> dict[str, str]:
    text = (os.environ.get("OTEL_EXPORTER_OTLP_METRICS_HEADERS")
            or os.environ.get("OTEL_EXPORTER_OTLP_HEADERS", ""))
    return dict(parse_env_headers(text, liberal=True))


def _read(path: str | None) -> bytes | None:
    if not path:
        return None
    try:
        with open(path, "rb") as file:
            return file.read()
    except OSError as exc:
        raise OtlpConfigError(f"cannot read OTLP TLS file {path!r}: {exc.strerror}") from None


def prefers_delta(exporter: MetricExporter) -> bool:
    """Whether the exporter asks for delta counters
    (``OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE``)."""
    # The SDK's own readers consult this attribute of MetricExporter the same way.
    preferred = getattr(exporter, "_preferred_temporality", None) or {}
    return preferred.get(ObservableCounter) is AggregationTemporality.DELTA
