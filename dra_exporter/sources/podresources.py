"""Source: the kubelet pod-resources API (``v1.PodResourcesLister/List`` on a unix socket).

Contract: ``PodResourcesSource.collect()`` makes at most one ``List`` call, with a deadline,
and returns a ``model.PodResourcesSnapshot``: every pod on the node with, per container, the
DRA claims it references (claim namespace/name and the driver/pool/device triplets) and the
device-plugin devices it holds. On any failure it raises ``SourceError`` with a message for
operators; it never lets a gRPC or protobuf exception escape.

Reliability rules, from how a real kubelet behaves:

* the socket disappears while the kubelet restarts and a new one appears at the same path;
  the source notices both (missing path, changed inode, ``UNAVAILABLE``) and drops its
  channel, so a stale connection never sticks;
* the kubelet rate-limits this API (100 QPS, burst 10) and answers ``RESOURCE_EXHAUSTED``;
  that, ``UNAVAILABLE`` and ``DEADLINE_EXCEEDED`` start an exponential backoff during which
  ``collect`` fails at once without calling the kubelet; one success resets it;
* answers are untrusted: a size cap on the channel, count limits checked on the decoded
  message before any record is built (``MAX_PODS``, ``MAX_CONTAINERS``, ``MAX_DEVICES``) and
  our own decoding turn oversize or corrupt data into a clear ``SourceError``; an answer over
  a limit starts the backoff, as a likely repeat would cost a decode every cycle;
* while a DRA driver rolls out, its kubelet plugin re-registers and the answer briefly lacks
  that driver's devices: a container that is still listed keeps the claims it had for up to
  ``CLAIM_GAP_GRACE_S`` (``_ClaimGapBridge``), so attribution does not flap;
* a kubelet that has just restarted answers on its new socket with no pods at all until it has
  its pods again (~1 s on a real kubelet 1.36): an empty answer on a new socket, within
  ``RESTART_SETTLE_S`` of its first answer, while the old socket's last answer had pods, keeps
  that answer. Pods deleted while the kubelet was down leave with its first full answer.

``snapshot_from_response`` is the pure decoding (its inverse, which only the simulated kubelet
needs, is ``dra_exporter_sim.kubelet.response_from_snapshot``). gRPC is imported here and
nowhere in the pure core.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import random as _random
import stat
import threading
import time
from collections.abc import Callable, Iterable
from typing import Any, Final, Protocol

import grpc
from google.protobuf.message import DecodeError

from .. import model
from ..backoff import Backoff
from ..proto import api_pb2
from . import Source, SourceError

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
LIST_METHOD = "/v1.PodResourcesLister/List"
#: How long a container that is still listed keeps a claim the kubelet's answer stopped naming.
#: A plugin re-registers within seconds of a rollout; a pod's claims never change while it lives.
CLAIM_GAP_GRACE_S: Final = 30.0

#: How long a restarted kubelet's empty answers are taken for "not synced yet" (see above): a real
#: kubelet 1.36 lists its pods again ~1 s after its new socket appears; short enough that pods that
#: really all went while it was down leave within seconds.
RESTART_SETTLE_S: Final = 3.0

# What one List answer may hold, far above any real node: a node runs at most 110 pods by default
# and kubelets are rarely set beyond 250-1000 (``--max-pods``); kubelets before 1.34 list terminated
# pods too. An answer over a count is refused before any record is built: 100k pods fit in 9.6 MB
# on the wire but cost 282 MB in this source alone (benchmarks/kubelet_answer_memory.py).
MAX_PODS: Final = 2_000
MAX_CONTAINERS: Final = 8_000
"""Containers of all pods together (init and sidecar containers included): 4 per pod at MAX_PODS."""
MAX_DEVICES: Final = 8_000
"""Device entries of all containers together: device-plugin resources and their ids, claim
references, claim devices and CDI names (a node has tens of GPUs or MIG devices, and a few
device-plugin resources)."""
MAX_ANSWER_BYTES: Final = MAX_PODS * 512 + MAX_CONTAINERS * 128 + MAX_DEVICES * 256
"""The gRPC receive limit (3.9 MiB): what an answer at every count limit takes with long names
(a pod 512 bytes: its 253-character name and 63-character namespace; a container 128; a device
entry 256). Decoding runs before any count can be checked, and upb builds every sub-message at
once: 16 MiB of empty containers (2 bytes each) cost 610 MB (153 MB at this limit), so the kubelet client's usual
16 MiB would let one answer cost more than the exporter's whole memory limit."""

#: Status codes after which the kubelet is asked again only once the backoff expires.
_BACKOFF_CODES = frozenset(
    {grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED}
)



class _ListCall(Protocol):
    """The ``List`` method as this module calls it (grpc is untyped): the request and a timeout in,
    the answer's raw bytes out (no response deserializer; ``_decode`` reads them)."""

    def __call__(self, request: api_pb2.ListPodResourcesRequest, *, timeout: float) -> bytes: ...

class AnswerOverLimitError(SourceError):
    """A ``List`` answer over ``MAX_PODS``, ``MAX_CONTAINERS`` or ``MAX_DEVICES``."""


class PodResourcesSource(Source[model.PodResourcesSnapshot]):
    """Reads pod → container → claims/devices from the kubelet, one ``List`` per ``collect``."""

    name = "podresources"

    def __init__(
        self,
        socket_path: str = DEFAULT_SOCKET,
        *,
        timeout: float = 2.0,
        backoff: tuple[float, float] = (0.5, 30.0),
        monotonic: Callable[[], float] = time.monotonic,
        max_message_bytes: int = MAX_ANSWER_BYTES,
        claim_grace: float = CLAIM_GAP_GRACE_S,
        logger: logging.Logger | None = None,
        random: Callable[[], float] = _random.random,
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"podresources: timeout must be positive, got {timeout}")
        try:
            self._backoff = Backoff(*backoff, monotonic=monotonic, random=random)
        except ValueError as exc:
            raise ValueError(f"podresources: {exc}") from None
        if max_message_bytes <= 0:
            raise ValueError(f"podresources: max_message_bytes must be positive, got {max_message_bytes}")
        self.socket_path = socket_path
        self._timeout = timeout
        self._monotonic = monotonic
        self._max_message_bytes = max_message_bytes
        self._log = logger or logging.getLogger(__name__)
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._list: _ListCall | None = None
        self._socket_id: tuple[int, int, int] | None = None
        self._last_error = ""
        self._bridge = _ClaimGapBridge(claim_grace)
        # The last answer with pods and the socket that gave it; when the current socket first answered.
        self._last_full: tuple[model.PodResourcesSnapshot, tuple[int, int, int] | None] | None = None
        self._answering_since: tuple[tuple[int, int, int] | None, float] | None = None

    # --- public -----------------------------------------------------------------------------

    def collect(self) -> model.PodResourcesSnapshot:
        """One ``List`` call turned into a snapshot; raises ``SourceError`` on any failure."""
        with self._lock:
            self._check_backoff()
            call = self._connect()
            raw = self._call_list(call)
            try:
                snapshot = self._bridge.apply(_decode(raw), self._monotonic())
            except AnswerOverLimitError as exc:
                # Like an answer over the byte limit: the next one is likely as big, and each
                # costs a decode; do not ask again every cycle.
                raise SourceError(self._start_backoff(str(exc))) from None
            if self._backoff.failures:
                self._log.info("podresources: kubelet answering again at %s", self.socket_path)
            self._backoff.succeeded()
            return self._settle(snapshot)

    def _settle(self, snapshot: model.PodResourcesSnapshot) -> model.PodResourcesSnapshot:
        """The last answer with pods, for an empty answer from a kubelet that has just restarted."""
        now, socket_id = self._monotonic(), self._socket_id
        if self._answering_since is None or self._answering_since[0] != socket_id:
            self._answering_since = (socket_id, now)
        if snapshot.pods:
            self._last_full = (snapshot, socket_id)
            return snapshot
        if (self._last_full is not None and self._last_full[1] != socket_id
                and now - self._answering_since[1] < RESTART_SETTLE_S):
            self._log.debug("podresources: the restarted kubelet lists no pods yet; keeping its last answer")
            return self._last_full[0]
        self._last_full = None
        return snapshot

    def close(self) -> None:
        with self._lock:
            self._drop_channel()

    # --- connection ---------------------------------------------------------------------------

    def _check_backoff(self) -> None:
        if self._backoff.remaining():
            # The same text on every call while backing off: the agent logs a source's
            # error only when it changes, so a countdown here would log every cycle.
            raise SourceError(f"podresources: backing off after: {self._last_error}")

    def _connect(self) -> _ListCall:
        socket_id = self._stat_socket()
        if self._list is not None and socket_id == self._socket_id:
            return self._list
        # First use, or the kubelet recreated its socket: a channel to the old inode would
        # keep failing (or wait in gRPC's own reconnect backoff), so start afresh.
        self._drop_channel()
        target = "unix://" + os.path.abspath(self.socket_path)
        options = [
            ("grpc.max_receive_message_length", self._max_message_bytes),
            # We run our own backoff; gRPC's reconnect backoff (up to minutes) must not add to it.
            ("grpc.initial_reconnect_backoff_ms", 100),
            ("grpc.max_reconnect_backoff_ms", 1000),
            # A private subchannel pool, so a recreated channel cannot inherit a stale connection.
            ("grpc.use_local_subchannel_pool", 1),
        ]
        channel = grpc.insecure_channel(target, options=options)
        # Raw bytes out: we decode ourselves so corrupt answers get a clear message.
        self._list = channel.unary_unary(
            LIST_METHOD,
            request_serializer=api_pb2.ListPodResourcesRequest.SerializeToString,
            response_deserializer=None,
        )
        self._channel = channel
        self._socket_id = socket_id
        return self._list

    def _stat_socket(self) -> tuple[int, int, int]:
        path = self.socket_path
        try:
            st = os.stat(path)
        except FileNotFoundError:
            # The kubelet removes its socket while restarting; drop the channel so the
            # new socket gets a new connection.
            self._drop_channel()
            raise SourceError(f"podresources: kubelet socket {path} not found") from None
        except PermissionError:
            self._drop_channel()
            raise SourceError(
                f"podresources: no permission to reach kubelet socket {path} "
                "(mount /var/lib/kubelet/pod-resources and run with access to it)"
            ) from None
        except OSError as exc:
            self._drop_channel()
            raise SourceError(f"podresources: cannot access kubelet socket {path}: {exc.strerror}") from None
        if not stat.S_ISSOCK(st.st_mode):
            self._drop_channel()
            raise SourceError(f"podresources: {path} exists but is not a unix socket")
        # The ctime tells a recreated socket apart even when the filesystem reuses the inode.
        return (st.st_dev, st.st_ino, st.st_ctime_ns)

    def _drop_channel(self) -> None:
        if self._channel is not None:
            self._channel.close()
        self._channel = None
        self._list = None
        self._socket_id = None

    # --- the call -------------------------------------------------------------------------------

    def _call_list(self, call: _ListCall) -> bytes:
        try:
            return call(api_pb2.ListPodResourcesRequest(), timeout=self._timeout)
        except grpc.RpcError as exc:
            code, details = _status(exc)
            message = self._describe(code, details)
            if code == grpc.StatusCode.UNAVAILABLE:
                self._drop_channel()
            if code in _BACKOFF_CODES:
                message = self._start_backoff(message)
            raise SourceError(message) from None

    def _describe(self, code: grpc.StatusCode | None, details: str) -> str:
        path = self.socket_path
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED and "larger than max" in details:
            # gRPC's own size check reuses RESOURCE_EXHAUSTED; say which limit applies.
            return (
                f"podresources: kubelet answer exceeds max_message_bytes={self._max_message_bytes} "
                f"({details})"
            )
        if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
            return f"podresources: kubelet rate limit hit ({details or 'RESOURCE_EXHAUSTED'})"
        if code == grpc.StatusCode.UNAVAILABLE:
            return f"podresources: kubelet at {path} unavailable ({details or 'UNAVAILABLE'})"
        if code == grpc.StatusCode.DEADLINE_EXCEEDED:
            return f"podresources: kubelet did not answer List within {self._timeout:g}s"
        if code == grpc.StatusCode.UNIMPLEMENTED:
            return (
                f"podresources: kubelet at {path} does not serve {LIST_METHOD} "
                f"(kubelet too old or API disabled: {details})"
            )
        name = code.name if code is not None else "UNKNOWN"
        return f"podresources: List failed with {name}: {details}"

    def _start_backoff(self, message: str) -> str:
        delay = self._backoff.failed()
        self._last_error = message
        self._log.debug(
            "podresources: backing off %.1fs after failure %d: %s", delay, self._backoff.failures, message
        )
        return f"{message}; next try in {delay:.3g}s"


class _ClaimGapBridge:
    """Keeps a still-listed container's claims through a short gap in the kubelet's answer.

    A pod's claims are fixed for its life (``spec.resourceClaims`` is immutable), so a container
    that is listed again without a claim it had means the kubelet briefly lost that driver's
    devices (its plugin re-registering during a rolling update), not that the claim went: the
    last-known claim use is kept for up to ``grace`` seconds. A pod that leaves the answer takes
    its claims with it at once. (A pod recreated under the same name within ``grace`` with
    other claims would show the old ones for that long: pod-resources carries no pod UID.)
    """

    def __init__(self, grace: float) -> None:
        self._grace = grace
        # (namespace, pod, container) → (claim namespace, claim name) → (use, missing since or None)
        self._known: dict[tuple[str, str, str], dict[tuple[str, str], tuple[model.ClaimUse, float | None]]] = {}

    def apply(self, snapshot: model.PodResourcesSnapshot, now: float) -> model.PodResourcesSnapshot:
        known: dict[tuple[str, str, str], dict[tuple[str, str], tuple[model.ClaimUse, float | None]]] = {}
        pods = []
        for pod in snapshot.pods:
            containers = []
            for c in pod.containers:
                key = (pod.namespace, pod.name, c.name)
                state: dict[tuple[str, str], tuple[model.ClaimUse, float | None]] = {
                    (u.namespace, u.name): (u, None) for u in c.claims}
                kept = []
                for claim, (use, since) in self._known.get(key, {}).items():
                    missing_since = now if since is None else since
                    if claim not in state and now - missing_since < self._grace:
                        state[claim] = (use, missing_since)
                        kept.append(use)
                known[key] = state
                containers.append(dataclasses.replace(c, claims=c.claims + tuple(kept)) if kept else c)
            pods.append(dataclasses.replace(pod, containers=tuple(containers)))
        self._known = known
        return model.PodResourcesSnapshot(tuple(pods))


def _status(exc: grpc.RpcError) -> tuple[grpc.StatusCode | None, str]:
    # Errors from a unary call are also grpc.Call objects; be defensive about others.
    code = exc.code() if callable(getattr(exc, "code", None)) else None
    details = exc.details() if callable(getattr(exc, "details", None)) else ""
    return code, details or ""


def _decode(raw: Any) -> model.PodResourcesSnapshot:
    if not isinstance(raw, bytes):
        raise SourceError(f"podresources: kubelet answered List with {type(raw).__name__}, not bytes")
    try:
        response = api_pb2.ListPodResourcesResponse.FromString(raw)
    except DecodeError as exc:
        raise SourceError(
            f"podresources: kubelet answered List with {len(raw)} bytes that are not a valid "
            f"ListPodResourcesResponse ({exc})"
        ) from None
    _check_counts(response)
    return snapshot_from_response(response)


def _check_counts(resp: api_pb2.ListPodResourcesResponse) -> None:
    """Refuse an answer over ``MAX_PODS`` / ``MAX_CONTAINERS`` / ``MAX_DEVICES`` (pure).

    Counts raw entries (repeated ones too: each costs work before they are merged), and a list
    is walked only after its length was counted and checked, so checking costs at most the
    limits, never the answer.
    """
    def refuse(what: str, limit: int, name: str) -> AnswerOverLimitError:
        return AnswerOverLimitError(f"podresources: kubelet answer lists more than {limit} {what} "
                                    f"({name}); refused, the last good view is kept")

    if len(resp.pod_resources) > MAX_PODS:
        raise refuse("pods", MAX_PODS, "MAX_PODS")
    if sum(len(pod.containers) for pod in resp.pod_resources) > MAX_CONTAINERS:
        raise refuse("containers", MAX_CONTAINERS, "MAX_CONTAINERS")
    devices = 0
    for pod in resp.pod_resources:
        for ctr in pod.containers:
            devices += len(ctr.devices) + len(ctr.dynamic_resources)
            if devices > MAX_DEVICES:
                raise refuse("device entries", MAX_DEVICES, "MAX_DEVICES")
            devices += sum(len(group.device_ids) for group in ctr.devices)
            for dyn in ctr.dynamic_resources:
                devices += len(dyn.claim_resources)
                if devices > MAX_DEVICES:
                    raise refuse("device entries", MAX_DEVICES, "MAX_DEVICES")
                devices += sum(len(res.cdi_devices) for res in dyn.claim_resources)
            if devices > MAX_DEVICES:
                raise refuse("device entries", MAX_DEVICES, "MAX_DEVICES")


# --- pure conversions -------------------------------------------------------------------------

# Accumulators for merging: (driver, pool, device, share_id) -> CDI names.
_Devices = dict[tuple[str, str, str, str], set[str]]


class _ContainerAcc:
    __slots__ = ("claims", "plugins")

    def __init__(self) -> None:
        self.claims: dict[tuple[str, str], _Devices] = {}
        self.plugins: dict[str, set[str]] = {}

    def build(self, name: str) -> model.ContainerAllocation:
        claims = tuple(
            model.ClaimUse(namespace=ns, name=claim, devices=_build_devices(devices))
            for (ns, claim), devices in sorted(self.claims.items())
        )
        plugins = tuple(
            model.PluginDevices(resource_name=resource, device_ids=tuple(sorted(ids)))
            for resource, ids in sorted(self.plugins.items())
        )
        return model.ContainerAllocation(name=name, claims=claims, plugin_devices=plugins)


def _build_devices(devices: _Devices) -> tuple[model.ClaimDevice, ...]:
    return tuple(
        model.ClaimDevice(driver=d, pool=p, device=dev, cdi_devices=tuple(sorted(cdi)), share_id=share)
        for (d, p, dev, share), cdi in sorted(devices.items())
    )


def snapshot_from_response(resp: api_pb2.ListPodResourcesResponse) -> model.PodResourcesSnapshot:
    """Normalise a ``List`` answer into a snapshot (pure).

    Pods are sorted by (namespace, name), containers by name, claims by (namespace, name),
    devices by (driver, pool, device, share_id) and ids/CDI names alphabetically: the kubelet
    builds these lists from Go maps, so their order means nothing and changes between calls.
    Repeated entries are merged: the kubelet lists a claim once per ``resources.claims``
    reference of the container, and on kubelets before 1.34 a terminated pod can share its
    name with the running one. ``share_id`` is ``""`` when the field is absent.
    """
    pods: dict[tuple[str, str], dict[str, _ContainerAcc]] = {}
    for pod in resp.pod_resources:
        containers = pods.setdefault((pod.namespace, pod.name), {})
        for ctr in pod.containers:
            acc = containers.setdefault(ctr.name, _ContainerAcc())
            _add_claims(acc, ctr.dynamic_resources)
            for devs in ctr.devices:
                acc.plugins.setdefault(devs.resource_name, set()).update(devs.device_ids)
    return model.PodResourcesSnapshot(
        pods=tuple(
            model.PodAllocation(
                namespace=ns,
                name=name,
                containers=tuple(acc.build(cname) for cname, acc in sorted(containers.items())),
            )
            for (ns, name), containers in sorted(pods.items())
        )
    )


def _add_claims(acc: _ContainerAcc, dynamic_resources: Iterable[api_pb2.DynamicResource]) -> None:
    for dyn in dynamic_resources:
        devices = acc.claims.setdefault((dyn.claim_namespace, dyn.claim_name), {})
        for res in dyn.claim_resources:
            share = res.share_id if res.HasField("share_id") else ""
            key = (res.driver_name, res.pool_name, res.device_name, share)
            devices.setdefault(key, set()).update(cdi.name for cdi in res.cdi_devices)
