"""Simulated kubelet: a real gRPC server for ``v1.PodResourcesLister`` on a unix socket.

Serves ``List`` (the provider's snapshot, asked afresh on every call so pods come and go
with simulated time), ``Get`` (one pod, ``NOT_FOUND`` otherwise) and
``GetAllocatableResources`` (every device-plugin device the provider mentions). Like a real
kubelet it rate-limits the API (token bucket, 100 QPS, burst 10 → ``RESOURCE_EXHAUSTED``).

Faults, by the scenario's fault kind names, come from ``fault_provider`` (polled every
~0.1 s by a watcher thread) or from ``inject`` (a test hook, applied at once):

* ``kubelet_socket_gone``: server stopped and socket removed until the fault ends;
* ``kubelet_resource_exhausted``: every call aborts with ``RESOURCE_EXHAUSTED``;
* ``kubelet_slow``: answers wait ``slow_delay`` seconds (past any sane client deadline);
* ``kubelet_malformed``: answers are bytes that do not parse as the response message.

``restart`` is a real kubelet's restart as the node test bed shows it (kubelet 1.36): the socket
goes, a new one (a new inode) comes, and for ``RESTART_UNSYNCED_S`` the new socket lists no pods
(the kubelet has not got its pods back from the API server yet); then everything as before.

``response_from_snapshot`` is the encoder: a ``model.PodResourcesSnapshot`` as the kubelet's
answer (the inverse of the exporter's ``sources.podresources.snapshot_from_response``).
"""

from __future__ import annotations

import logging
import os
import shutil
import stat
import tempfile
import threading
import time
from collections.abc import Callable, Collection
from concurrent import futures
from typing import Any

import grpc

from dra_exporter import model
from dra_exporter.proto import api_pb2

SERVICE = "v1.PodResourcesLister"

SOCKET_GONE = "kubelet_socket_gone"
RESOURCE_EXHAUSTED = "kubelet_resource_exhausted"
SLOW = "kubelet_slow"
MALFORMED = "kubelet_malformed"
FAULTS = frozenset({SOCKET_GONE, RESOURCE_EXHAUSTED, SLOW, MALFORMED})

#: A length-delimited field 1 announcing 5 bytes but carrying 3: never parses.
MALFORMED_BYTES = b"\x0a\x05abc"

#: How long a restarted real kubelet 1.36 answers List with no pods (the node test bed: ~0.9 s).
RESTART_UNSYNCED_S = 1.0

#: sun_path is 108 bytes on Linux, including the terminating NUL.
_MAX_SOCKET_PATH = 107
_POLL_SECONDS = 0.1
_log = logging.getLogger(__name__)


# --- the answer: a snapshot as the kubelet's messages (pure) ------------------------------------


def response_from_snapshot(snap: model.PodResourcesSnapshot) -> api_pb2.ListPodResourcesResponse:
    """The ``List`` answer a kubelet would give for ``snap`` (pure; order kept as given).

    ``share_id`` is set only when non-empty, as a kubelet does for devices that are not
    shares of consumable capacity.
    """
    return api_pb2.ListPodResourcesResponse(pod_resources=[pod_resources_message(pod) for pod in snap.pods])


def pod_resources_message(pod: model.PodAllocation) -> api_pb2.PodResources:
    """One pod as a ``PodResources`` message (used for ``List`` and ``Get`` answers)."""
    return api_pb2.PodResources(
        name=pod.name,
        namespace=pod.namespace,
        containers=[
            api_pb2.ContainerResources(
                name=ctr.name,
                devices=[
                    api_pb2.ContainerDevices(resource_name=p.resource_name, device_ids=list(p.device_ids))
                    for p in ctr.plugin_devices
                ],
                dynamic_resources=[_dynamic_resource(claim) for claim in ctr.claims],
            )
            for ctr in pod.containers
        ],
    )


def _dynamic_resource(claim: model.ClaimUse) -> api_pb2.DynamicResource:
    resources = []
    for dev in claim.devices:
        res = api_pb2.ClaimResource(
            cdi_devices=[api_pb2.CDIDevice(name=name) for name in dev.cdi_devices],
            driver_name=dev.driver,
            pool_name=dev.pool,
            device_name=dev.device,
        )
        if dev.share_id:
            res.share_id = dev.share_id
        resources.append(res)
    return api_pb2.DynamicResource(
        claim_name=claim.name, claim_namespace=claim.namespace, claim_resources=resources
    )


# --- the server ----------------------------------------------------------------------------------


class TokenBucket:
    """The kubelet's pod-resources rate limiter: ``rate`` tokens/s, at most ``burst`` stored."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._rate = rate
        self._burst = float(burst)
        self._clock = clock
        self._tokens = float(burst)
        self._last = clock()
        self._lock = threading.Lock()

    def allow(self) -> bool:
        with self._lock:
            now = self._clock()
            self._tokens = min(self._burst, self._tokens + (now - self._last) * self._rate)
            self._last = now
            if self._tokens >= 1.0:
                self._tokens -= 1.0
                return True
            return False


class _Abort(Exception):
    """Raised by answer builders to end the call with a gRPC status."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


def _serialize(message: Any) -> bytes:
    # Handlers return raw bytes to send a malformed answer; everything else is a message.
    return message if isinstance(message, bytes) else message.SerializeToString()


class SimulatedKubelet:
    """A pod-resources server backed by ``provider``; see the module docstring."""

    def __init__(
        self,
        provider: Callable[[], model.PodResourcesSnapshot],
        socket_path: str | None = None,
        fault_provider: Callable[[], Collection[str]] | None = None,
        slow_delay: float = 5.0,
        *,
        rate_limit: tuple[float, int] | None = (100.0, 10),
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._provider = provider
        self._fault_provider = fault_provider
        self._slow_delay = slow_delay
        self._own_dir: str | None = None
        if socket_path is None:
            # A short private directory: unix socket paths are limited to 107 bytes.
            self._own_dir = tempfile.mkdtemp(prefix="dra-kubelet-")
            socket_path = os.path.join(self._own_dir, "kubelet.sock")
        if len(os.fsencode(os.path.abspath(socket_path))) > _MAX_SOCKET_PATH:
            raise ValueError(
                f"simulated kubelet: socket path {socket_path!r} is longer than the "
                f"{_MAX_SOCKET_PATH} bytes a unix socket path may have"
            )
        self.socket_path: str = socket_path
        self._limiter = TokenBucket(rate_limit[0], rate_limit[1], monotonic) if rate_limit else None
        self.calls = 0
        self._calls_lock = threading.Lock()
        self._lock = threading.RLock()
        self._server: grpc.Server | None = None
        self._executor: futures.ThreadPoolExecutor | None = None
        self._running = False  # between start() and stop(), whether or not the socket is up
        self._injected: str | None = None
        self._watcher: threading.Thread | None = None
        self._stop_watch = threading.Event()
        self._stopped = threading.Event()  # wakes slow answers when the server goes down
        self._monotonic = monotonic
        self._unsynced_until = 0.0  # after a restart: no pods listed before this (monotonic) time

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self) -> SimulatedKubelet:
        with self._lock:
            if self._running:
                return self
            self._running = True
            self._stopped.clear()
            try:
                self._apply_socket_fault()
            except Exception:
                self._running = False
                raise
            if self._fault_provider is not None:
                self._stop_watch.clear()
                self._watcher = threading.Thread(target=self._watch, name="sim-kubelet-faults", daemon=True)
                self._watcher.start()
        return self

    def stop(self) -> None:
        """Stop serving and remove the socket (and the temporary directory, if ours)."""
        self._stop_watch.set()
        watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.join()
        with self._lock:
            self._running = False
            self._bring_down()
        if self._own_dir is not None:
            shutil.rmtree(self._own_dir, ignore_errors=True)

    def restart(self, down_seconds: float = 0.0, unsynced_seconds: float = RESTART_UNSYNCED_S) -> None:
        """What a kubelet restart looks like from outside: socket removed, later recreated, and
        for ``unsynced_seconds`` after that no pods listed."""
        with self._lock:
            self._bring_down()
            time.sleep(down_seconds)
            self._unsynced_until = self._monotonic() + unsynced_seconds
            if self._running:
                self._apply_socket_fault()

    def _snapshot(self) -> model.PodResourcesSnapshot:
        if self._monotonic() < self._unsynced_until:
            return model.PodResourcesSnapshot(())
        return self._provider()

    def inject(self, fault: str | None) -> None:
        """Force ``fault`` (one of ``FAULTS``) until ``inject(None)``; takes effect at once."""
        if fault is not None and fault not in FAULTS:
            raise ValueError(
                f"simulated kubelet: unknown fault {fault!r}; known: {', '.join(sorted(FAULTS))}"
            )
        with self._lock:
            self._injected = fault
            if self._running:
                self._apply_socket_fault()

    def __enter__(self) -> SimulatedKubelet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- faults ----------------------------------------------------------------------------------

    def _faults(self) -> set[str]:
        active: set[str] = set()
        if self._fault_provider is not None:
            try:
                active.update(self._fault_provider())
            except Exception:  # a broken scenario must not kill the server thread
                _log.exception("simulated kubelet: fault provider failed; assuming no faults")
        if self._injected is not None:
            active.add(self._injected)
        return active

    def _apply_socket_fault(self) -> None:
        with self._lock:
            gone = SOCKET_GONE in self._faults()
            if gone and self._server is not None:
                self._bring_down()
            elif not gone and self._server is None and self._running:
                self._bring_up()

    def _watch(self) -> None:
        while not self._stop_watch.wait(_POLL_SECONDS):
            self._apply_socket_fault()

    # --- server ------------------------------------------------------------------------------------

    def _bring_up(self) -> None:
        if self._own_dir is not None:
            os.makedirs(self._own_dir, exist_ok=True)  # stop() removed it; start() may follow
        self._remove_stale_socket()
        executor = futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="sim-kubelet")
        server = grpc.server(executor)
        handlers = {
            "List": grpc.unary_unary_rpc_method_handler(
                self._list,
                request_deserializer=api_pb2.ListPodResourcesRequest.FromString,
                response_serializer=_serialize,
            ),
            "Get": grpc.unary_unary_rpc_method_handler(
                self._get,
                request_deserializer=api_pb2.GetPodResourcesRequest.FromString,
                response_serializer=_serialize,
            ),
            "GetAllocatableResources": grpc.unary_unary_rpc_method_handler(
                self._allocatable,
                request_deserializer=api_pb2.AllocatableResourcesRequest.FromString,
                response_serializer=_serialize,
            ),
        }
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
        try:
            server.add_insecure_port("unix://" + os.path.abspath(self.socket_path))
        except RuntimeError as exc:
            executor.shutdown(wait=False)
            raise RuntimeError(f"simulated kubelet: cannot listen on {self.socket_path}: {exc}") from None
        server.start()
        self._stopped.clear()
        self._server, self._executor = server, executor

    def _bring_down(self) -> None:
        server, self._server = self._server, None
        executor, self._executor = self._executor, None
        if server is not None:
            self._stopped.set()
            server.stop(grace=None).wait()
        if executor is not None:
            executor.shutdown(wait=False)
        # gRPC unlinks the socket itself; make sure, since "removed" is the point of a restart.
        self._remove_stale_socket()

    def _remove_stale_socket(self) -> None:
        try:
            st = os.lstat(self.socket_path)
        except FileNotFoundError:
            return
        if not stat.S_ISSOCK(st.st_mode):
            raise RuntimeError(
                f"simulated kubelet: {self.socket_path} exists and is not a socket; not removing it"
            )
        os.unlink(self.socket_path)

    # --- handlers ----------------------------------------------------------------------------------

    def _list(self, request: api_pb2.ListPodResourcesRequest, context: grpc.ServicerContext) -> Any:
        with self._calls_lock:
            self.calls += 1
        return self._answer(context, lambda: response_from_snapshot(self._snapshot()))

    def _get(self, request: api_pb2.GetPodResourcesRequest, context: grpc.ServicerContext) -> Any:
        def build() -> api_pb2.GetPodResourcesResponse:
            for pod in self._snapshot().pods:
                if pod.name == request.pod_name and pod.namespace == request.pod_namespace:
                    return api_pb2.GetPodResourcesResponse(pod_resources=pod_resources_message(pod))
            raise _Abort(
                grpc.StatusCode.NOT_FOUND,
                f"pod {request.pod_name} in namespace {request.pod_namespace} not found",
            )

        return self._answer(context, build)

    def _allocatable(
        self, request: api_pb2.AllocatableResourcesRequest, context: grpc.ServicerContext
    ) -> Any:
        def build() -> api_pb2.AllocatableResourcesResponse:
            ids: dict[str, set[str]] = {}
            for pod in self._snapshot().pods:
                for ctr in pod.containers:
                    for plugin in ctr.plugin_devices:
                        ids.setdefault(plugin.resource_name, set()).update(plugin.device_ids)
            return api_pb2.AllocatableResourcesResponse(
                devices=[
                    api_pb2.ContainerDevices(resource_name=name, device_ids=sorted(dev_ids))
                    for name, dev_ids in sorted(ids.items())
                ]
            )

        return self._answer(context, build)

    def _answer(self, context: grpc.ServicerContext, build: Callable[[], Any]) -> Any:
        # The real kubelet's rate limiter is an interceptor: it runs before anything else.
        if self._limiter is not None and not self._limiter.allow():
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "rejected by rate limit")
        faults = self._faults()
        if RESOURCE_EXHAUSTED in faults:
            context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "rejected by rate limit")
        if SLOW in faults:
            self._wait_slow(context)
        if MALFORMED in faults:
            return MALFORMED_BYTES
        # context.abort raises a bare Exception, so it is called only outside the try.
        try:
            return build()
        except _Abort as exc:
            status = (exc.code, exc.details)
        except Exception as exc:  # a broken provider: report it the way a kubelet would
            status = (grpc.StatusCode.INTERNAL, f"simulated kubelet: provider failed: {exc}")
        context.abort(*status)

    def _wait_slow(self, context: grpc.ServicerContext) -> None:
        # Wake early when the client gives up or the server stops, so shutting down never
        # waits for a sleeping handler thread.
        done = threading.Event()
        context.add_callback(done.set)
        deadline = time.monotonic() + self._slow_delay
        while not done.is_set() and not self._stopped.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            done.wait(min(remaining, _POLL_SECONDS))
