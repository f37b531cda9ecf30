"""The reflector: one kind of API object, listed once and then watched, kept in memory.

Public for every source that watches the API server (the node agent's ``kubeapi``, the cluster
mode's ``kubeapi_cluster``), with the request and answer helpers they share. As client-go's
reflector does:

* a list (paged with ``limit``/``continue`` when asked: each page is normalised before the next is
  read), then a watch from the list's ``resourceVersion`` on its own thread; a watch resumes from
  the last version it saw (bookmarks keep it fresh), and 410 Gone — as an HTTP status or as a watch
  ERROR event — lists again;
* errors, timeouts, connection refused: ``error`` is set and the watch is retried with exponential
  backoff (``Timeouts.backoff``), resuming from its version, so an outage costs no re-list;
* a watch that ends within ``HEALTHY_WATCH_S`` of its start (cut at once, or expired with 410
  right after a fresh list) waits with the same backoff before the next request: a load balancer
  that cuts every stream, or a server that expires every resourceVersion, costs a request per
  backoff period, never a request storm. After ``SHORT_WATCHES_ARE_AN_ERROR`` such watches in a
  row the reflector reports an error;
* answers are read with a bound (``outbound``): a list page over ``MAX_LIST_BYTES`` and an object or
  watch event over ``MAX_OBJECT_BYTES`` are refused (``SourceError`` naming the limit) without reading
  further, and a list page or get that has not arrived within the request timeout is refused however
  the server paces it;
* at most ``max_objects`` objects are held (``--max-objects``): a list (over all its pages) or a
  watch that brings more is refused (``TooManyObjects``), and the error stays until a watch has lived
  without passing the limit; a list whose continue token never ends stops after the pages the cap
  allows;
* one object costs that object: one its normaliser cannot read is skipped with one log line naming
  it (``readable``), an event that is not a JSON object is skipped, and the watch goes on.
"""

from __future__ import annotations

import json
import logging
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

import urllib3
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from .. import outbound
from ..backoff import Backoff
from ..outbound import AnswerRefused
from . import SourceError
from . import kubeapi_http as http

RBAC_HINT: Final = ("the exporter needs the chart's ClusterRole (the node agent: list/watch on resourceslices "
                    "and pods, get/list on resourceclaims; the cluster mode: list/watch on resourceslices, "
                    "resourceclaims and deviceclasses)")
#: One object (a claim GET, one watch event): the API server refuses to store objects over 3 MiB
#: (its request body limit; etcd's default is 1.5 MiB), so anything bigger is not a real object.
MAX_OBJECT_BYTES: Final = 4 * 2**20
#: One list (this node's slices or pods): room for 110 pods (the kubelet's default maximum) of
#: ~300 KiB each; real ones are ~10-50 KiB.
MAX_LIST_BYTES: Final = 32 * 2**20
#: A watch that ends sooner than this after its start (including its list) is "short": the next
#: one waits for the backoff instead of starting at once.
HEALTHY_WATCH_S: Final = 10.0
#: Short watches in a row after which the watch counts as failing (``source_up`` 0). Each resumed
#: watch (or re-list) brings the view up to date, so a few are routine; with the default backoff,
#: eight take about three minutes, and by then the view can be a backoff period (60 s) old.
SHORT_WATCHES_ARE_AN_ERROR: Final = 8

T = TypeVar("T")


class Gone(SourceError):
    """The watch's resourceVersion is too old (HTTP 410): list again."""

    def __init__(self) -> None:
        super().__init__("kubeapi: resourceVersion too old (410 Gone)")


#: Seconds a list page, a get or a discovery request may take, its whole answer included.
REQUEST_S: Final = 10.0
#: Objects one reflector holds (``--max-objects``): past it the list or the watch is refused with one
#: line and the source reports itself down, instead of growing without bound. The node agent's kinds
#: are one node's (110 pods by default); the cluster mode's default is its own (``kubeapi_cluster``).
MAX_OBJECTS: Final = 10_000


class TooManyObjects(SourceError):
    """A list or a watch brought more objects than the reflector may hold."""

    def __init__(self, kind: str, limit: int) -> None:
        super().__init__(f"kubeapi: {kind}: more than {limit} objects, the limit (--max-objects); the rest "
                         "are refused and the view is incomplete")


@dataclass(frozen=True, slots=True)
class Timeouts:
    request: float = REQUEST_S
    """Seconds a list page or a get may take, its whole answer included."""
    watch: tuple[int, int] = (300, 600)
    """Each watch asks the server to end it after a random number of seconds in this range."""
    backoff: tuple[float, float] = (1.0, 60.0)
    """Initial and maximum wait after a failure (doubling in between, ±20 % jitter: ``backoff.Backoff``)."""


class Reflector(Generic[T]):
    """Lists one kind, then watches it from the list's resourceVersion on its own thread.

    Keeps every object normalised by ``normalize``, keyed ``namespace/name``; an object it returns
    None for is not kept (as if absent: the source does not need it). A failure is kept in
    ``error`` (``""`` while healthy) and retried with backoff, resuming from the last
    resourceVersion; 410 Gone (as an HTTP status or as a watch ERROR event) lists again.
    ``changed(key, old, new)`` is called for every object that changes (None: absent).
    """

    def __init__(self, kind: str, api_client: k8s.ApiClient, path: str, field_selector: str | None,
                 normalize: Callable[[Mapping[str, Any]], T | None], timeouts: Timeouts, requests: Counter[str],
                 changed: Callable[[str, T | None, T | None], None] = lambda *_: None,
                 on_update: Callable[[], None] = lambda: None, page_size: int = 0,
                 label_selector: str | None = None, max_objects: int = MAX_OBJECTS,
                 rbac_hint: str = RBAC_HINT) -> None:
        self.kind = kind
        self.rbac_hint = rbac_hint
        """What a 403 says the program needs (the node agent's and the cluster mode's differ)."""
        self.max_objects = max_objects
        self._over_limit = False
        self._skipped_event = False
        self._bad: set[str] = set()
        """Keys of objects skipped as unreadable and logged (each once while it stays unreadable)."""
        self._page_size = page_size
        self._labels = label_selector
        self._client = api_client
        self._path = path
        self._selector = field_selector
        self._normalize = normalize
        self._timeouts = timeouts
        self._requests = requests
        self._changed = changed
        self._on_update = on_update
        self._lock = threading.Lock()
        self.items: dict[str, T] = {}
        self.resource_version: str | None = None
        self.error = ""
        self._response: Any = None
        self._thread: threading.Thread | None = None

    @property
    def over_limit(self) -> bool:
        """Whether the last list or watch passed ``max_objects`` (and no watch has lived since)."""
        return self._over_limit

    def snapshot(self) -> list[T]:
        with self._lock:
            return list(self.items.values())

    def _query(self) -> list[tuple[str, str | int | bool]]:
        # None: no selector (a cluster-scoped kind of which every object is wanted); "" is a real
        # selector: ``spec.nodeName=`` selects the slices that name no node.
        query: list[tuple[str, str | int | bool]] = [] if self._selector is None else [
            ("fieldSelector", self._selector)]
        return query + ([("labelSelector", self._labels)] if self._labels else [])

    # --- list -------------------------------------------------------------------------------------

    def list_once(self, stop: threading.Event | None = None) -> None:
        """One consistent list; replaces every object. Raises ``SourceError``.

        With ``page_size``, the list comes in pages (``limit`` and ``continue``, as client-go's
        pager does): each answer stays under ``MAX_LIST_BYTES`` and is normalised before the next
        is read, so a cluster-wide list costs the memory of one page plus what is kept. A continue
        token that expired (410) starts the list again, once. More than ``max_objects`` objects, or
        pages enough for them and a continue token still (a server whose list never ends), refuse
        the list (``TooManyObjects``); ``stop`` set between pages ends it (``SourceError``)."""
        items: dict[str, T] = {}
        token, version, restarted, pages = "", None, False, 0
        max_pages = 1 + (self.max_objects // self._page_size if self._page_size else 0)
        while True:
            if stop is not None and stop.is_set():
                raise SourceError(f"kubeapi: list {self.kind}: stopped")
            pages += 1
            self._requests[f"list {self.kind}"] += 1
            query = list(self._query())
            if self._page_size:
                query.append(("limit", self._page_size))
            if token:
                query.append(("continue", token))
            try:
                response = request(f"list {self.kind}", lambda q=query: http.get(  # type: ignore[misc]
                    self._client, self._path, q, timeout=self._timeouts.request), self.rbac_hint)
            except Gone:
                if not token or restarted:
                    raise
                items, token, version, restarted, pages = {}, "", None, True, 0  # the pages' snapshot is gone
                continue
            self._response = response
            try:
                body = read_json(response, f"list {self.kind}", MAX_LIST_BYTES, self._timeouts.request)
            finally:
                self._response = None
            for obj in body.get("items") or ():
                if isinstance(obj, Mapping):
                    key = object_key(obj)
                    normalized = self._normalized(key, obj)
                    if normalized is not None:
                        items[key] = normalized
                        if len(items) > self.max_objects:
                            raise TooManyObjects(self.kind, self.max_objects)
            meta = body.get("metadata")
            version = version or text_field(meta, "resourceVersion") or None
            token = text_field(meta, "continue")
            if not token or not self._page_size:
                break
            if pages >= max_pages:
                raise TooManyObjects(self.kind, self.max_objects)
        with self._lock:
            old, self.items = self.items, items
            self.resource_version = version
            if not self._over_limit:
                self.error = ""
        for key in old.keys() | items.keys():
            if old.get(key) != items.get(key):
                self._changed(key, old.get(key), items.get(key))
        self._on_update()

    def _normalized(self, key: str, obj: Mapping[str, Any]) -> T | None:
        return readable(self._normalize, obj, self.kind, key, self._bad, self.max_objects)

    # --- watch --------------------------------------------------------------------------------------

    def start(self, stop: threading.Event) -> None:
        self._thread = threading.Thread(target=self._run, args=(stop,), name=f"kubeapi-{self.kind}", daemon=True)
        self._thread.start()

    def _run(self, stop: threading.Event) -> None:
        backoff = Backoff(*self._timeouts.backoff, random=random.random)
        short = 0
        while not stop.is_set():
            started = time.monotonic()
            try:
                if self.resource_version is None:
                    self.list_once(stop)
                self._watch_once(stop)
                gone = False
            except Gone:
                self.resource_version = None  # too old to resume: list again
                gone = True
            except SourceError as exc:
                short = 0
                if isinstance(exc, TooManyObjects):
                    # What was refused is unknown: list again, after the backoff. The error stays
                    # until a watch has lived without passing the limit (no flapping, one log line).
                    self.resource_version, self._over_limit = None, True
                self.error = str(exc)
                self._on_update()
                stop.wait(backoff.failed())
                continue
            except Exception as exc:
                short = 0
                self.error = f"kubeapi: watching {self.kind} failed: {type(exc).__name__}: {exc}"
                logging.getLogger(__name__).debug("watch %s failed", self.kind, exc_info=True)
                stop.wait(backoff.failed())
                continue
            if stop.is_set():
                return
            if time.monotonic() - started >= HEALTHY_WATCH_S:
                short = 0  # a watch that lived: the next one starts at once
                self._over_limit = False
                backoff.succeeded()
                continue
            # Ended (cut, or 410) right after it started: a server or proxy that does this to every
            # watch must not get a request storm. Wait, as after a failure.
            short += 1
            if short >= SHORT_WATCHES_ARE_AN_ERROR:
                why = "expires every resourceVersion (410 Gone)" if gone else "cuts every watch at once"
                self.error = (f"kubeapi: watching {self.kind}: the API server {why} "
                              f"({short} times in a row); retrying with backoff")
                self._on_update()
            stop.wait(backoff.failed())

    def _watch_once(self, stop: threading.Event) -> None:
        low, high = self._timeouts.watch
        seconds = random.randint(low, high)
        what = f"watch {self.kind}"
        self._requests[what] += 1
        query: http.Query = [*self._query(), ("watch", True),
                             ("resourceVersion", self.resource_version or ""), ("allowWatchBookmarks", True),
                             ("timeoutSeconds", seconds)]
        # The server ends the watch after `seconds`; a read timeout catches a silently dead peer.
        response = request(what, lambda: http.get(self._client, self._path, query,
                                                    timeout=(self._timeouts.request, float(seconds + 30))),
                           self.rbac_hint)
        self._response = response
        self._skipped_event = False
        if self.error and not self._over_limit:
            self.error = ""
            self._on_update()
        try:
            for line in watch_lines(response, MAX_OBJECT_BYTES, what, seconds + self._timeouts.request):
                if stop.is_set():
                    return
                if line.strip():
                    self._event(line)
        except (urllib3.exceptions.HTTPError, OSError):
            # A dropped watch is routine (API server restart, load balancer); resume from our version.
            return
        finally:
            self._response = None
            response.release_conn()

    def _event(self, line: str) -> None:
        try:
            event = json.loads(line, parse_int=bounded_int)
        except (ValueError, RecursionError):
            event = None  # not JSON, or nested past the parser's depth: skipped, as any event that is not an object
        if not isinstance(event, Mapping):
            if not self._skipped_event:  # once per watch: a stream of them must not flood the log
                self._skipped_event = True
                logging.getLogger(__name__).warning("kubeapi: watch %s: skipped an event that is not a JSON object",
                                                    self.kind)
            return
        kind, obj = event.get("type"), event.get("object")
        if not isinstance(obj, Mapping):
            return
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Gone()
            raise SourceError(f"kubeapi: watching {self.kind} failed: "
                              f"{printable(str(obj.get('code')))} {printable(str(obj.get('message', '')))}")
        version = text_field(obj.get("metadata"), "resourceVersion")
        if kind in ("ADDED", "MODIFIED", "DELETED"):
            key = object_key(obj)
            new = self._normalized(key, obj) if kind != "DELETED" else None
            if new is None and kind != "DELETED":
                if version:
                    self.resource_version = version  # skipped: the watch goes on past it
                return
            self._bad.discard(key)
            with self._lock:
                old = self.items.pop(key, None) if new is None else self.items.get(key)
                if new is not None:
                    if old is None and len(self.items) >= self.max_objects:
                        raise TooManyObjects(self.kind, self.max_objects)
                    self.items[key] = new
            if old != new:
                self._changed(key, old, new)
                self._on_update()
        if version:
            self.resource_version = version

    def stop(self) -> None:
        response = self._response
        if response is not None:
            try:
                response.shutdown()  # unblocks the thread's read at once
            except Exception:  # closing anyway: a failure only means the watch thread ends later
                logging.getLogger(__name__).debug("shutting down the %s watch failed", self.kind, exc_info=True)

    def join(self, timeout: float) -> None:
        if self._thread:
            self._thread.join(timeout)


#: What a normaliser raises for an object it cannot read: a number that is not one (``"²"``, 5,000
#: digits), a field of the wrong type, nesting past the interpreter's depth.
UNREADABLE: Final = (ValueError, TypeError, KeyError, AttributeError, IndexError, OverflowError, RecursionError)


def readable(normalize: Callable[[Mapping[str, Any]], T | None], obj: Mapping[str, Any], kind: str, key: str,
             logged: set[str], most: int = MAX_OBJECTS) -> T | None:
    """``normalize(obj)`` (None: not kept), or None for an object that cannot be read, with one log line naming it
    (once while it stays unreadable: ``logged`` holds the keys, at most ``most``). One bad object
    costs that object, never the list, the watch or the view."""
    try:
        return normalize(obj)
    except UNREADABLE as exc:
        if key not in logged and len(logged) < most:
            logged.add(key)
            logging.getLogger(__name__).warning("kubeapi: skipped %s %s, which cannot be read: %s", kind,
                                                printable(key), printable(f"{type(exc).__name__}: {exc}"))
        return None


def close_watches(reflectors: Iterable[Reflector[Any] | None], client: k8s.ApiClient | None,
                  log: logging.Logger) -> None:
    """Stop every reflector (waiting up to 2 s for each), then close the API client."""
    for reflector in reflectors:
        if reflector is not None:
            reflector.stop()
            reflector.join(2.0)
    if client is not None:
        try:
            http.close_client(client)
        except Exception:  # noqa: BLE001 - shutting down anyway
            log.debug("closing the API client failed", exc_info=True)


def request(what: str, call: Callable[[], Any], hint: str = RBAC_HINT) -> Any:
    try:
        return call()
    except ApiException as exc:
        if exc.status == 410:
            raise Gone() from None
        raise api_error(exc, what, hint) from None
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        raise unreachable(exc) from None


def api_error(exc: ApiException, what: str, hint: str = RBAC_HINT) -> SourceError:
    """One line for an error status; ``what`` may name objects, whose names are escaped (a newline
    in one must not forge a log line)."""
    status, what = exc.status, printable(what)
    if status == 401:
        return SourceError(f"kubeapi: the API server rejected our credentials (401) on {what}")
    if status == 403:
        return SourceError(f"kubeapi: forbidden (403) to {what}: {hint}")
    return SourceError(f"kubeapi: {what} failed: HTTP {status} {printable(str(exc.reason or ''))}".rstrip())


def unreachable(exc: BaseException) -> SourceError:
    # The exception's own text names objects by memory address; a stable message is logged once.
    reason = getattr(exc, "reason", None) or exc
    for kind, words in _TRANSPORT_ERRORS:
        if isinstance(reason, kind):
            return SourceError(f"kubeapi: API server unreachable ({words})")
    return SourceError(f"kubeapi: API server unreachable ({type(reason).__name__})")


_TRANSPORT_ERRORS: Final = (
    # NewConnectionError is a ConnectTimeoutError subclass (urllib3 compatibility): test it first.
    (urllib3.exceptions.NewConnectionError, "cannot connect"),
    (urllib3.exceptions.ConnectTimeoutError, "connecting timed out"),
    (urllib3.exceptions.ReadTimeoutError, "no answer in time"),
    (urllib3.exceptions.SSLError, "TLS handshake failed"),
    (urllib3.exceptions.ProtocolError, "connection dropped"),
)


def read_json(response: Any, what: str, limit: int = MAX_OBJECT_BYTES,
              seconds: float = REQUEST_S) -> Mapping[str, Any]:
    """The answer's JSON object, read up to ``limit`` bytes within ``seconds``; a bigger or slower
    answer is refused (unread when its ``Content-Length`` says so)."""
    try:
        data = read_bounded(response, limit, what, seconds)
        body = json.loads(data, parse_int=bounded_int)
    except RecursionError:
        raise SourceError(f"kubeapi: {what}: the API server's answer is nested too deeply to read") from None
    except (ValueError, urllib3.exceptions.HTTPError, OSError) as exc:
        raise SourceError(f"kubeapi: {what}: the API server's answer is not JSON ({type(exc).__name__})") from None
    finally:
        response.release_conn()
    if not isinstance(body, Mapping):
        raise SourceError(f"kubeapi: {what}: the API server's answer is not a JSON object")
    return body


def refused(what: str, exc: AnswerRefused) -> SourceError:
    return SourceError(f"kubeapi: {what}: {exc}; refused (the last good view is kept)")


def read_bounded(response: Any, limit: int, what: str, seconds: float = REQUEST_S) -> bytes:
    """The whole answer, at most ``limit`` bytes and ``seconds`` (``outbound.read_body``)."""
    try:
        return bytes(outbound.read_body(response, limit, seconds))
    except AnswerRefused as exc:
        raise refused(what, exc) from None


def watch_lines(response: Any, limit: int, what: str, seconds: float) -> Iterator[str]:
    """The watch stream's lines, each at most ``limit`` bytes: a longer one is refused (and the
    stream closed) as soon as the buffer passes the limit, before it is complete. The stream ends
    (as a dropped watch does) after ``seconds``, however the server trickles it."""
    buffer = bytearray()
    try:
        for chunk in outbound.chunks(response, time.monotonic() + seconds, seconds):
            start = len(buffer)
            buffer += chunk
            end = buffer.find(b"\n", start)
            while end != -1:
                if end > limit:
                    break
                line = bytes(buffer[:end])
                del buffer[:end + 1]
                yield line.decode("utf-8", errors="replace")
                end = buffer.find(b"\n")
            if len(buffer) > limit:
                response.close()
                raise refused(what, outbound.AnswerTooLarge(limit))
    except outbound.AnswerTooSlow:
        return  # the server did not end the watch when it said it would: resume, as after a drop


def object_key(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata")
    return f"{text_field(meta, 'namespace')}/{text_field(meta, 'name')}"


def bounded_int(digits: str) -> int | str:
    """``json``'s ``parse_int``: an integer of at most 40 digits, else its text (which no normaliser
    reads as a number). A 5,000-digit literal would otherwise fail the whole answer's parse."""
    return int(digits) if len(digits) <= 40 else digits


def printable(text: str, limit: int = 200) -> str:
    """``text`` for a log line: control characters (a newline in an object's name would forge a
    line) and lone surrogates escaped, at most ``limit`` characters."""
    escaped = text.encode("unicode_escape", errors="backslashreplace").decode("ascii") if not (
        text.isprintable() and text.isascii()) else text
    return escaped if len(escaped) <= limit else escaped[:limit] + "..."


def text_field(obj: Any, key: str) -> str:
    value = obj.get(key) if isinstance(obj, Mapping) else None
    return value if isinstance(value, str) else ""
