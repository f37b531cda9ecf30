"""Real OTLP metrics receivers for tests: gRPC ``MetricsService/Export`` and HTTP ``POST /v1/metrics``.

Both listen on 127.0.0.1 (a free port, kept across ``stop()``/``start()``), decode every
``ExportMetricsServiceRequest`` with the stubs of the installed ``opentelemetry-proto`` package, and
keep what they accepted together with the request headers. ``failing = True`` makes them refuse
exports the way a sick collector does (gRPC ``UNAVAILABLE``, HTTP 503); refused attempts are counted.
"""

from __future__ import annotations

import gzip
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2_grpc import (
    MetricsServiceServicer,
    add_MetricsServiceServicer_to_server,
)

#: Long enough for a push to arrive on a loaded 2-core machine; only a hang ever waits this long.
WAIT_SECONDS = 20.0


@dataclass(frozen=True, slots=True)
class Received:
    request: ExportMetricsServiceRequest
    headers: dict[str, str]
    """Lower-cased header (gRPC metadata) names."""


class _Inbox:
    """Accepted requests and refused attempts, shared by the server threads and the test."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._received: list[Received] = []
        self.refused = 0
        self.failing = False

    def accept(self, request: ExportMetricsServiceRequest, headers: dict[str, str]) -> bool:
        """Keep the request unless failing; False means the server must refuse it."""
        with self._changed:
            if self.failing:
                self.refused += 1
            else:
                self._received.append(Received(request, headers))
            self._changed.notify_all()
            return not self.failing

    @property
    def received(self) -> list[Received]:
        with self._changed:
            return list(self._received)

    def wait_for(self, predicate: Callable[[Received], bool], *, after: int = 0,
                 timeout: float = WAIT_SECONDS) -> Received:
        """The first request from index ``after`` on that satisfies ``predicate``."""
        deadline = time.monotonic() + timeout
        seen = after
        with self._changed:
            while True:
                for item in self._received[seen:]:
                    if predicate(item):
                        return item
                seen = max(seen, len(self._received))
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no matching OTLP export arrived within {timeout:.0f}s "
                                         f"({len(self._received)} accepted, {self.refused} refused)")
                self._changed.wait(left)

    def wait_refused(self, count: int, timeout: float = WAIT_SECONDS) -> None:
        deadline = time.monotonic() + timeout
        with self._changed:
            while self.refused < count:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"only {self.refused} of {count} exports were attempted")
                self._changed.wait(left)


class GrpcReceiver(_Inbox):
    """``opentelemetry.proto.collector.metrics.v1.MetricsService`` on a real gRPC server."""

    protocol = "grpc"

    def __init__(self) -> None:
        super().__init__()
        self.port = 0
        self._server: grpc.Server | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        inbox = self

        class Servicer(MetricsServiceServicer):
            def Export(self, request: ExportMetricsServiceRequest,  # noqa: N802 - the proto's name
                       context: Any) -> ExportMetricsServiceResponse:
                headers = {key.lower(): value for key, value in context.invocation_metadata()}
                if not inbox.accept(request, headers):
                    context.abort(grpc.StatusCode.UNAVAILABLE, "test receiver told to fail")
                return ExportMetricsServiceResponse()

        server = grpc.server(ThreadPoolExecutor(max_workers=4))
        add_MetricsServiceServicer_to_server(Servicer(), server)
        self.port = server.add_insecure_port(f"127.0.0.1:{self.port}")
        server.start()
        self._server = server

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(grace=None).wait()
            self._server = None


class HttpReceiver(_Inbox):
    """An OTLP/HTTP receiver: ``POST /v1/metrics`` with ``application/x-protobuf`` bodies."""

    protocol = "http/protobuf"

    def __init__(self) -> None:
        super().__init__()
        self.port = 0
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        inbox = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                if self.path != "/v1/metrics":
                    return self._reply(404)
                if self.headers.get("Content-Type", "").split(";")[0].strip() != "application/x-protobuf":
                    return self._reply(415)
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                encoding = self.headers.get("Content-Encoding", "").lower()
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                request = ExportMetricsServiceRequest()
                request.ParseFromString(body)
                headers = {key.lower(): value for key, value in self.headers.items()}
                if not inbox.accept(request, headers):
                    return self._reply(503)
                return self._reply(200, ExportMetricsServiceResponse().SerializeToString())

            def _reply(self, status: int, body: bytes = b"") -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - keep test output quiet
                pass

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._thread = threading.Thread(target=server.serve_forever, name="otlp-http-receiver", daemon=True)
        self._thread.start()
        self._server = server

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


Receiver = GrpcReceiver | HttpReceiver


def running(receiver: Receiver) -> Iterator[Receiver]:
    """Fixture body: start, hand over, stop."""
    receiver.start()
    try:
        yield receiver
    finally:
        receiver.stop()
