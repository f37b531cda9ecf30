"""XID events for the NVML source: a daemon thread that waits on an NVML event set.

Contract:
- ``XidCounter`` is the thread-safe hand-over between the event thread (writer) and
  ``NvmlSource.collect()`` (reader). Counts only grow while the process lives; they are
  exported as counters, because a "last XID" gauge loses every XID but the latest.
- ``EventWatcher`` registers XID/ECC events on every GPU that supports them, waits with
  ``nvmlEventSetWait_v2`` in a loop (a timeout is the normal, quiet case) and counts XIDs
  per (device UUID, XID code) with the wall-clock time. An event whose ``gpuInstanceId``
  names a MIG device of that GPU counts on the MIG device.
- ``stop()`` returns within about one poll interval: the wait is bounded by ``poll_ms``.

It uses only the NVML call surface shared with the simulator's fake NVML.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

#: NVML's "no GPU/compute instance" id: the event concerns the whole GPU.
NO_INSTANCE = 0xFFFFFFFF

#: MIG devices of each GPU: parent UUID -> {(gi_id, ci_id): MIG UUID}.
MigIndex = Mapping[str, Mapping[tuple[int, int], str]]


@dataclass(frozen=True, slots=True)
class XidTally:
    """XIDs seen on one device since the exporter started."""

    counts: tuple[tuple[int, int], ...]
    """(xid code, count) pairs sorted by code."""
    last_timestamp: float
    """Wall-clock seconds of the latest XID on this device."""


class XidCounter:
    """Grow-only XID counts per device UUID, safe to write from one thread and read from another."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, dict[int, int]] = {}
        self._last: dict[str, float] = {}
        # Bumped on every add so readers can skip rebuilding tallies when nothing happened.
        self._version = 0
        self._cache: tuple[int, dict[str, XidTally]] = (0, {})

    def add(self, uuid: str, xid: int, timestamp: float) -> None:
        with self._lock:
            per_device = self._counts.setdefault(uuid, {})
            per_device[xid] = per_device.get(xid, 0) + 1
            self._last[uuid] = max(timestamp, self._last.get(uuid, timestamp))
            self._version += 1

    def tallies(self) -> dict[str, XidTally]:
        """A consistent copy of every device's tally (cheap when no XID arrived since the last call)."""
        with self._lock:
            version, cached = self._cache
            if version == self._version:
                return cached
            tallies = {uuid: XidTally(tuple(sorted(counts.items())), self._last[uuid])
                       for uuid, counts in self._counts.items()}
            self._cache = (self._version, tallies)
            return tallies


def handle_key(handle: Any) -> Hashable:
    """A key under which two handles of the same NVML device compare equal.

    pynvml hands out a new ctypes pointer object for the device of every event, so the
    pointer's address is the identity; a fake's handles are plain Python objects.
    """
    if isinstance(handle, ctypes._Pointer):
        return ("ptr", ctypes.cast(handle, ctypes.c_void_p).value)
    if isinstance(handle, Hashable):
        try:
            hash(handle)
        except TypeError:  # hashable by type, not by value: a tuple that holds a list
            pass
        else:
            return handle
    return ("id", id(handle))


class EventWatcher:
    """Counts XID events of the registered GPUs on a daemon thread."""

    def __init__(self, nvml: Any, counter: XidCounter, *, poll_ms: int,
                 wall_clock: Callable[[], float], logger: logging.Logger) -> None:
        self._nvml = nvml
        self._counter = counter
        self._poll_ms = max(1, int(poll_ms))
        self._wall_clock = wall_clock
        self._log = logger
        self._xid_mask = int(nvml.nvmlEventTypeXidCriticalError)
        self._wanted = (self._xid_mask | int(nvml.nvmlEventTypeSingleBitEccError)
                        | int(nvml.nvmlEventTypeDoubleBitEccError))
        self._event_set: Any = None
        self._uuids: dict[Hashable, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: Replaced wholesale by the collecting thread (an atomic reference swap), never mutated.
        self.mig_index: MigIndex = {}

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, gpus: Iterable[tuple[Any, str]]) -> bool:
        """Register ``(handle, uuid)`` GPUs and start the thread; False when no GPU has events."""
        self._event_set = self._nvml.nvmlEventSetCreate()
        for handle, uuid in gpus:
            self.register(handle, uuid)
        if not self._uuids:
            self._free_set()
            return False
        self._thread = threading.Thread(target=self._run, name="nvml-events", daemon=True)
        self._thread.start()
        return True

    def register(self, handle: Any, uuid: str) -> None:
        """Add one GPU to the event set; a GPU without XID/ECC events is silently skipped."""
        if self._event_set is None:
            return
        nvml = self._nvml
        try:
            mask = int(nvml.nvmlDeviceGetSupportedEventTypes(handle)) & self._wanted
            if mask:
                nvml.nvmlDeviceRegisterEvents(handle, mask, self._event_set)
        except nvml.NVMLError as err:
            if err.value != nvml.NVML_ERROR_NOT_SUPPORTED:
                self._log.warning("nvml: cannot watch XID events on %s: %s", uuid, err)
            return
        if mask:
            self._uuids[handle_key(handle)] = uuid

    def stop(self) -> None:
        """Stop the thread (within about one poll interval) and free the event set."""
        self._stop.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=self._poll_ms / 1000 + 5.0)
            if thread.is_alive():
                # Freeing a set that a wait still uses would be unsafe; leave it to process exit.
                self._log.warning("nvml: the XID event thread did not stop in time")
                return
        self._free_set()

    def _free_set(self) -> None:
        event_set, self._event_set = self._event_set, None
        if event_set is None:
            return
        try:
            self._nvml.nvmlEventSetFree(event_set)
        except self._nvml.NVMLError as err:
            self._log.debug("nvml: freeing the event set failed: %s", err)

    def _run(self) -> None:
        nvml = self._nvml
        timeout = nvml.NVML_ERROR_TIMEOUT
        failing = False
        while not self._stop.is_set():
            try:
                data = nvml.nvmlEventSetWait_v2(self._event_set, self._poll_ms)
            except nvml.NVMLError as err:
                if err.value == timeout:
                    continue
                if not failing:
                    self._log.warning("nvml: waiting for XID events failed: %s; retrying", err)
                    failing = True
                # Without this pause a persistent error (a lost GPU) would spin a core.
                self._stop.wait(self._poll_ms / 1000)
                continue
            if failing:
                self._log.info("nvml: waiting for XID events works again")
                failing = False
            try:
                self._on_event(data)
            except Exception as err:  # noqa: BLE001 - one odd event must not end XID counting
                self._log.warning("nvml: an NVML event could not be counted: %r", err)

    def _on_event(self, data: Any) -> None:
        if not int(data.eventType) & self._xid_mask:
            return  # ECC events: the volatile ECC field counters already count them each cycle.
        uuid = self._uuid_of(data.device)
        if uuid is None:
            return
        target = self._mig_target(uuid, int(data.gpuInstanceId), int(data.computeInstanceId))
        self._counter.add(target, int(data.eventData), self._wall_clock())

    def _uuid_of(self, handle: Any) -> str | None:
        uuid = self._uuids.get(handle_key(handle))
        if uuid is not None:
            return uuid
        # Unknown handle shape: ask NVML. May fail on a GPU that just fell off the bus.
        try:
            return _text(self._nvml.nvmlDeviceGetUUID(handle))
        except self._nvml.NVMLError as err:
            self._log.warning("nvml: an XID event arrived for an unidentifiable device: %s", err)
            return None

    def _mig_target(self, uuid: str, gi_id: int, ci_id: int) -> str:
        if gi_id == NO_INSTANCE:
            return uuid
        migs = self.mig_index.get(uuid)
        if not migs:
            return uuid
        exact = migs.get((gi_id, ci_id))
        if exact is not None:
            return exact
        # The event names the GPU instance only: count it on its first compute instance.
        for (gi, _ci), mig_uuid in sorted(migs.items()):
            if gi == gi_id:
                return mig_uuid
        return uuid


def _text(value: Any) -> str:
    """pynvml returns str in recent versions and bytes in old ones."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
