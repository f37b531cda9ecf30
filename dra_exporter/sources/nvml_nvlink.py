"""NVLink per link, for the NVML source: which links a GPU has, and what they say each cycle.

Contract (one ``LinkState`` per whole GPU; MIG devices own no links):

- The links are found once per GPU: ``NVML_FI_DEV_NVLINK_LINK_COUNT`` rides in the GPU's first
  field-value call (so the link families start on its second cycle); where that field is
  NOT_SUPPORTED, by asking ``nvmlDeviceGetNvLinkState`` link after link until one is refused. No
  link (the recorded H200, PCIe boards, pre-NVLink GPUs) means nothing more is ever asked, and no
  family appears.
- Every cycle, each link's ``(fieldId, scopeId)`` entries ride in the device's one batched
  ``nvmlDeviceGetFieldValues`` call (``requests()`` in, ``readings()`` out). An entry that answers
  NOT_SUPPORTED while its link is up is dropped for good (Blackwell refuses the Hopper counters and
  the other way round); on a link that is down it is only absent this cycle, since a counter may
  not answer on an untrained link and must come back with it.
- Link identity (NVLink version, the far end's device type) does not change while the driver is
  loaded: read once per link with ``nvmlDeviceGetNvLinkVersion``/``RemoteDeviceType``, when the
  link is first seen up.
- Units: throughput counters are KiB in NVML and bytes here; speed is MBps in NVML and bytes per
  second here. Counters NVML reports as 32-bit values are unwrapped (``unwrap32``), so they only
  grow. ``dra_gpu_nvlink_bytes_total`` is the sum of the per-link data counters (the last value of
  each link, so a link missing one cycle does not make the sum drop).

NVML errors other than NOT_SUPPORTED propagate: the caller marks the device down.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from .. import catalog as cat
from ..model import Labels, Reading

#: Per-link field values (scopeId = link): NVML constant -> (family, labels, scale, counter).
_SCOPED: Final = (
    ("NVML_FI_DEV_NVLINK_GET_SPEED", cat.GPU_NVLINK_LINK_SPEED, (), 1e6, False),  # MBps
    ("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", cat.GPU_NVLINK_LINK_BYTES, (("direction", "tx"),), 1024.0, True),
    ("NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", cat.GPU_NVLINK_LINK_BYTES, (("direction", "rx"),), 1024.0, True),
    # Up to Hopper (nvml.h: "unsupported for Blackwell+").
    ("NVML_FI_DEV_NVLINK_ERROR_DL_CRC", cat.GPU_NVLINK_LINK_ERRORS, (("type", "crc_flit"),), 1.0, True),
    ("NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY", cat.GPU_NVLINK_LINK_ERRORS, (("type", "replay"),), 1.0, True),
    ("NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY", cat.GPU_NVLINK_LINK_ERRORS, (("type", "recovery"),), 1.0, True),
    # NVLink5 (Blackwell).
    *((f"NVML_FI_DEV_NVLINK_COUNT_{suffix}", cat.GPU_NVLINK_LINK_ERRORS, (("type", kind),), 1.0, True)
      for suffix, kind in (("MALFORMED_PACKET_ERRORS", "malformed_packet"),
                           ("BUFFER_OVERRUN_ERRORS", "buffer_overrun"), ("RCV_ERRORS", "rcv"),
                           ("RCV_REMOTE_ERRORS", "rcv_remote"), ("RCV_GENERAL_ERRORS", "rcv_general"),
                           ("LOCAL_LINK_INTEGRITY_ERRORS", "local_link_integrity"),
                           ("XMIT_DISCARDS", "xmit_discards"), ("EFFECTIVE_ERRORS", "effective"),
                           ("SYMBOL_ERRORS", "symbol"))),
    ("NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS", cat.GPU_NVLINK_LINK_RECOVERIES,
     (("result", "successful"),), 1.0, True),
    ("NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS", cat.GPU_NVLINK_LINK_RECOVERIES,
     (("result", "failed"),), 1.0, True),
)
#: Error counters NVML has only per link index (the link is in the field's name, scopeId 0): the
#: data CRC and ECC counters of links 0-11, which the scoped DL fields above do not cover.
_PER_INDEX = re.compile(r"NVML_FI_DEV_NVLINK_(CRC_DATA|ECC_DATA)_ERROR_COUNT_L(\d+)")
_STATE: Final = "NVML_FI_DEV_NVLINK_GET_STATE"
_LINK_COUNT: Final = "NVML_FI_DEV_NVLINK_LINK_COUNT"
#: Link states that count as up: ACTIVE, and SLEEP (a trained link in a low-power state, not broken).
_UP_STATES: Final = ("NVML_NVLINK_STATE_ACTIVE", "NVML_NVLINK_STATE_SLEEP")
_WRAP_32: Final = 1 << 32


@dataclass(frozen=True, slots=True)
class _Entry:
    family: cat.MetricSpec
    labels: Labels
    """The family's own labels after ``link``."""
    scale: float
    counter: bool
    link: int


@dataclass(slots=True)
class LinkState:
    """What the source remembers about one GPU's links between cycles (mutable on purpose)."""

    links: tuple[int, ...] | None = None
    """None until probed; ``()`` for a GPU without NVLink."""
    requests: dict[tuple[int, int], _Entry] = field(default_factory=dict)
    state_by_call: set[int] = field(default_factory=set)
    """Links whose state field is NOT_SUPPORTED: asked with ``nvmlDeviceGetNvLinkState`` instead."""
    info: dict[int, Labels] = field(default_factory=dict)
    wraps: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    last_bytes: dict[tuple[int, str], float] = field(default_factory=dict)


def unwrap32(wraps: dict[Any, tuple[int, int]], key: Any, raw: int) -> int:
    """Make a 32-bit NVML counter monotonic: a value below the last one is taken as a wrap."""
    last, offset = wraps.get(key, (raw, 0))
    if raw < last:
        offset += _WRAP_32
    wraps[key] = (raw, offset)
    return raw + offset


class LinkReader:
    """Reads the NVLink families of whole GPUs; one instance per source, state per GPU."""

    def __init__(self, nvml: Any, value_of: Callable[[Any], float | None], uint_type: int | None) -> None:
        self._nvml = nvml
        self._value_of = value_of
        """The number in a ``c_nvmlFieldValue_t`` (None for an unknown value type)."""
        self._uint = uint_type
        self._unsupported = frozenset(int(getattr(nvml, c)) for c in ("NVML_ERROR_NOT_SUPPORTED",
                                                                        "NVML_ERROR_FUNCTION_NOT_FOUND")
                                      if hasattr(nvml, c))
        self._success = int(nvml.NVML_SUCCESS)
        self._state_field = _const(nvml, _STATE)
        self._count_field = _const(nvml, _LINK_COUNT)
        self._up_states = frozenset(v for c in _UP_STATES if (v := _const(nvml, c)) is not None)
        self._scoped = tuple((fid, _Entry(family, labels, scale, counter, -1))
                             for const, family, labels, scale, counter in _SCOPED
                             if (fid := _const(nvml, const)) is not None)
        self._per_index: dict[int, list[tuple[int, str]]] = {}
        for name in dir(nvml):
            if m := _PER_INDEX.fullmatch(name):
                self._per_index.setdefault(int(m[2]), []).append((int(getattr(nvml, name)), m[1].lower()))
        self._versions = _enum_names(nvml, re.compile(r"NVML_NVLINK_VERSION_(\d+)_(\d+)"),
                                     lambda m: f"{m[1]}.{m[2]}")
        self._remote_types = _enum_names(nvml, re.compile(r"NVML_NVLINK_DEVICE_TYPE_([A-Z]+)"),
                                         lambda m: m[1].lower())
        self.field_ids = frozenset({fid for fid, _ in self._scoped} | {self._state_field or -1}
                                   | {self._count_field or -1}
                                   | {fid for entries in self._per_index.values() for fid, _ in entries})
        """Every field id this reader asks for: the caller hands their answers back to ``readings()``."""

    # -- one cycle ---------------------------------------------------------------------------

    def requests(self, state: LinkState) -> list[int | tuple[int, int]]:
        """The entries for this cycle's field-value call: the link count until the links are known."""
        if state.links is None:
            return [] if self._count_field is None else [self._count_field]
        return list(state.requests)

    def readings(self, handle: Any, state: LinkState, values: Iterable[Any]) -> list[Reading]:
        """The link families from this cycle's answers to ``requests()`` (and the few per-link calls)."""
        answers = {(int(v.fieldId), int(v.scopeId)): v for v in values}
        if state.links is None:
            self._probe(handle, state, answers.get((self._count_field or -1, 0)))
            return []
        up: dict[int, bool] = {}
        out: list[Reading] = []
        for link in state.links:
            is_up = self._link_up(handle, state, link, answers.get((self._state_field or -1, link)))
            if is_up is not None:
                up[link] = is_up
                out.append(Reading(cat.GPU_NVLINK_LINK_UP.name, 1.0 if is_up else 0.0, (("link", str(link)),)))
            if is_up and link not in state.info:
                self._read_info(handle, state, link)
            if link in state.info:
                out.append(Reading(cat.GPU_NVLINK_LINK_INFO.name, 1.0, (("link", str(link)), *state.info[link])))
        dropped = []
        for key, answer in answers.items():
            entry = state.requests.get(key)
            if entry is None or entry.family is cat.GPU_NVLINK_LINK_UP:
                continue
            ret = int(answer.nvmlReturn)
            if ret != self._success:
                if ret in self._unsupported and up.get(entry.link, False):
                    dropped.append(key)
                continue
            number = self._value_of(answer)
            if number is None:
                continue
            if entry.counter and int(answer.valueType) == self._uint:
                number = unwrap32(state.wraps, key, int(number))
            value = float(number) * entry.scale
            if entry.family is cat.GPU_NVLINK_LINK_BYTES:
                state.last_bytes[(entry.link, entry.labels[0][1])] = value
            out.append(Reading(entry.family.name, value, (("link", str(entry.link)), *entry.labels)))
        for key in dropped:
            del state.requests[key]
        for direction in ("rx", "tx"):
            per_link = [v for (_, d), v in state.last_bytes.items() if d == direction]
            if per_link:
                out.append(Reading(cat.GPU_NVLINK_BYTES.name, sum(per_link),
                                   cat.GPU_NVLINK_BYTES.extra(direction=direction)))
        return out

    # -- finding the links -------------------------------------------------------------------

    def _probe(self, handle: Any, state: LinkState, count: Any) -> None:
        if count is not None and int(count.nvmlReturn) == self._success:
            links = max(0, min(int(self._value_of(count) or 0), self._max_links()))
        elif count is None or int(count.nvmlReturn) in self._unsupported:
            links = self._count_by_state(handle)
        else:
            return  # a passing error: asked again next cycle
        state.links = tuple(range(links))
        for link in state.links:
            if self._state_field is not None:
                state.requests[(self._state_field, link)] = _Entry(cat.GPU_NVLINK_LINK_UP, (), 1.0, False, link)
            for fid, entry in self._scoped:
                state.requests[(fid, link)] = _Entry(entry.family, entry.labels, entry.scale, entry.counter, link)
            for fid, kind in self._per_index.get(link, ()):
                state.requests[(fid, 0)] = _Entry(cat.GPU_NVLINK_LINK_ERRORS, (("type", kind),), 1.0, True, link)

    def _count_by_state(self, handle: Any) -> int:
        """Without a link count: a link exists while ``nvmlDeviceGetNvLinkState`` answers for it."""
        nvml = self._nvml
        if not hasattr(nvml, "nvmlDeviceGetNvLinkState"):
            return 0
        count = 0
        while count < self._max_links():
            try:
                nvml.nvmlDeviceGetNvLinkState(handle, count)
            except nvml.NVMLError as err:
                if err.value in self._unsupported or err.value == nvml.NVML_ERROR_INVALID_ARGUMENT:
                    break
                raise
            count += 1
        return count

    def _max_links(self) -> int:
        return int(getattr(self._nvml, "NVML_NVLINK_MAX_LINKS", 18))

    def _link_up(self, handle: Any, state: LinkState, link: int, answer: Any) -> bool | None:
        nvml = self._nvml
        if link not in state.state_by_call:
            if answer is None:
                return None
            ret = int(answer.nvmlReturn)
            if ret == self._success:
                return self._value_of(answer) in self._up_states
            if ret not in self._unsupported:
                return None  # absent this cycle, asked again next cycle
            state.state_by_call.add(link)
            state.requests.pop((self._state_field or -1, link), None)
        try:
            return bool(nvml.nvmlDeviceGetNvLinkState(handle, link) == nvml.NVML_FEATURE_ENABLED)
        except nvml.NVMLError as err:
            if err.value in self._unsupported:
                return None
            raise

    def _read_info(self, handle: Any, state: LinkState, link: int) -> None:
        version = self._static(handle, "nvmlDeviceGetNvLinkVersion", link, self._versions)
        remote = self._static(handle, "nvmlDeviceGetNvLinkRemoteDeviceType", link, self._remote_types)
        if version is not None and remote is not None:
            state.info[link] = (("version", version), ("remote_type", remote))

    def _static(self, handle: Any, function: str, link: int, names: Mapping[int, str]) -> str | None:
        """A per-link enum as its name; ``""`` where NVML does not say; None on another error (try later)."""
        nvml = self._nvml
        call = getattr(nvml, function, None)
        if call is None:
            return ""
        try:
            value = int(call(handle, link))
        except nvml.NVMLError as err:
            return "" if err.value in self._unsupported else None
        return names.get(value, str(value))


def _const(nvml: Any, name: str) -> int | None:
    value = getattr(nvml, name, None)
    return None if value is None else int(value)


def _enum_names(nvml: Any, pattern: re.Pattern[str], name: Callable[[re.Match[str]], str]) -> dict[int, str]:
    return {int(getattr(nvml, const)): name(m) for const in dir(nvml) if (m := pattern.fullmatch(const))}
