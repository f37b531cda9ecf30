"""NVLink per link, for the NVML source: which links a GPU has, and what they say each cycle.

Contract (one ``LinkState`` per whole GPU; MIG devices own no links):

- The links are found once per GPU, on its first cycle: ``nvmlDeviceGetNvLinkState`` is asked for
  every link index up to the binding's ``NVML_NVLINK_MAX_LINKS`` (nvml.h: 18 up to R550, 36 after),
  and every link it answers for, up or down, is one. NOT_SUPPORTED or INVALID_ARGUMENT means no link
  at that index, not the end of the links: links need not be numbered 0..count-1 (a link missing in
  the middle), and ``NVML_FI_DEV_NVLINK_LINK_COUNT`` is not asked (real NVML counts the links present,
  NVIDIA's mock the ones up: neither numbers them). No link (the recorded H200, PCIe boards,
  pre-NVLink GPUs) means nothing more is ever asked, and no family appears.
- Every cycle, each link's ``(fieldId, scopeId)`` entries ride in the device's one batched
  ``nvmlDeviceGetFieldValues`` call (``requests()`` in, ``readings()`` out, in the same order; read
  by ``nvml_fields``). An entry that answers NOT_SUPPORTED while its link is up is dropped for good
  (Blackwell refuses the Hopper counters and the other way round); on a link that is down it is only
  absent, since a counter may not answer on an untrained link and must come back with it.
- The entries are ordered field by field, each over every link. A field whose answers are all what
  they were last cycle gives last cycle's readings again (on 8 GB200s ~2,900 entries a cycle, most of
  them error counters that never move); a changed one is decoded by one ``struct`` call when every
  answer is a SUCCESS of one value type (``_Group``), entry by entry otherwise.
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
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat
from operator import mul
from typing import Any, Final

from .. import catalog as cat
from ..model import Labels, Reading
from .nvml_calls import Getter, Getters
from .nvml_fields import WORD, Answers, FieldValues

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
#: Link states that count as up: ACTIVE, and SLEEP (a trained link in a low-power state, not broken).
_UP_STATES: Final = ("NVML_NVLINK_STATE_ACTIVE", "NVML_NVLINK_STATE_SLEEP")
_WRAP_32: Final = 1 << 32
#: Without ``NVML_NVLINK_MAX_LINKS`` in the binding: nvml.h's value up to R550.
_DEFAULT_MAX_LINKS: Final = 18


@dataclass(frozen=True, slots=True)
class _Entry:
    """One ``(fieldId, scopeId)`` of a link in the batch, and what its answer becomes."""

    key: tuple[int, int]
    metric: str
    labels: Labels
    """``link`` and the family's own labels."""
    scale: float
    counter: bool
    link: int
    direction: str = ""
    """``tx``/``rx`` for the data counters, whose sum is ``dra_gpu_nvlink_bytes_total``."""
    is_state: bool = False


@dataclass(frozen=True, slots=True)
class _Group:
    """Consecutive entries of the batch that ask one field of every link (a per-index field: alone).

    Their answers nearly always change together (the data counters of a busy GPU) or not at all,
    and come back of one value type: such a group is decoded by one ``struct`` call and made into
    readings by ``map``, in C; only a group with an error, a link state or mixed types is read entry
    by entry."""

    start: int
    end: int
    entries: tuple[_Entry, ...]
    labels: tuple[Labels, ...]
    links: tuple[int, ...]


def _groups(entries: Sequence[_Entry]) -> list[_Group]:
    out: list[_Group] = []
    start = 0
    for end in range(1, len(entries) + 1):
        if end == len(entries) or entries[end].key[0] != entries[start].key[0]:
            run = tuple(entries[start:end])
            out.append(_Group(start, end, run, tuple(e.labels for e in run), tuple(e.link for e in run)))
            start = end
    return out


@dataclass(slots=True)
class LinkState:
    """What the source remembers about one GPU's links between cycles (mutable on purpose)."""

    links: tuple[int, ...] | None = None
    """None until discovered; ``()`` for a GPU without NVLink."""
    entries: list[_Entry] = field(default_factory=list)
    """This GPU's part of the field-value batch, in order: field by field, each over every link."""
    groups: list[_Group] = field(default_factory=list)
    changed: bool = True
    """``entries`` changed since the caller last built its batch from ``requests()``."""
    readings: list[Reading | None] = field(default_factory=list)
    """Per entry: the reading made of its last answer (None: absent)."""
    refused: set[int] = field(default_factory=set)
    """Entries whose last answer was NOT_SUPPORTED: dropped once their link is up."""
    up: dict[int, bool] = field(default_factory=dict)
    state_by_call: set[int] = field(default_factory=set)
    """Links whose state field is NOT_SUPPORTED: asked with ``nvmlDeviceGetNvLinkState`` instead."""
    info: dict[int, Reading] = field(default_factory=dict)
    info_readings: tuple[Reading, ...] = ()
    """``info``'s readings in link order."""
    wraps: dict[tuple[int, int], tuple[int, int]] = field(default_factory=dict)
    last_bytes: dict[str, dict[int, float]] = field(default_factory=dict)
    """Direction -> link -> the last value of its data counter."""
    totals: tuple[Reading, ...] = ()

    @property
    def has_bytes(self) -> bool:
        """The per-link data counters answer: their sum is the GPU's NVLink traffic."""
        return bool(self.last_bytes)


_new = object.__new__
#: The slot descriptors' setters (``vars``: mypy takes ``Reading.metric`` for the instance attribute).
_SET_METRIC, _SET_VALUE, _SET_LABELS = (vars(Reading)[name].__set__ for name in ("metric", "value", "labels"))


def bulk_readings(metric: str, values: Sequence[float], labels: Sequence[Labels]) -> list[Reading]:
    """``[Reading(metric, v, l) for v, l in zip(values, labels)]``, made without a Python call per reading:
    the objects are allocated and their three slots set by ``map`` in C (a third of the constructor's
    cost; ~300 readings per cycle on 8 GB200s). ``Reading`` is a frozen slots dataclass whose
    ``__init__`` only sets those slots (tests/test_nvlink.py holds the two equal); setting them on an
    object not yet handed out is its construction, not a mutation."""
    made = list(map(_new, repeat(Reading, len(values))))
    deque(map(_SET_METRIC, made, repeat(metric)), 0)
    deque(map(_SET_VALUE, made, values), 0)
    deque(map(_SET_LABELS, made, labels), 0)
    return made


def unwrap32(wraps: dict[Any, tuple[int, int]], key: Any, raw: int) -> int:
    """Make a 32-bit NVML counter monotonic: a value below the last one is taken as a wrap."""
    last, offset = wraps.get(key, (raw, 0))
    if raw < last:
        offset += _WRAP_32
    wraps[key] = (raw, offset)
    return raw + offset


class LinkReader:
    """Reads the NVLink families of whole GPUs; one instance per source, state per GPU."""

    def __init__(self, nvml: Any, fields: FieldValues, uint_type: int | None) -> None:
        self._nvml = nvml
        self._getters = Getters(nvml)
        self._state_getters: dict[int, Getter] = {}
        """Link -> its ``nvmlDeviceGetNvLinkState`` call, for links whose state field NVML refuses."""
        self._fields = fields
        self._uint = uint_type
        self._unsupported = frozenset(int(getattr(nvml, c)) for c in ("NVML_ERROR_NOT_SUPPORTED",
                                                                        "NVML_ERROR_FUNCTION_NOT_FOUND")
                                      if hasattr(nvml, c))
        #: What ``nvmlDeviceGetNvLinkState`` answers for an index where the GPU has no link.
        self._no_link = frozenset(int(getattr(nvml, c)) for c in ("NVML_ERROR_NOT_SUPPORTED",
                                                                    "NVML_ERROR_INVALID_ARGUMENT")
                                  if hasattr(nvml, c))
        self._no_function = _const(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND")
        self._success = int(nvml.NVML_SUCCESS)
        self._state_field = _const(nvml, _STATE)
        self._up_states = frozenset(v for c in _UP_STATES if (v := _const(nvml, c)) is not None)
        self._scoped = tuple((fid, family, labels, scale, counter)
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
        self._total_labels = tuple((direction, cat.GPU_NVLINK_BYTES.extra(direction=direction))
                                   for direction in ("rx", "tx"))
        self._up_readings = {(link, up): Reading(cat.GPU_NVLINK_LINK_UP.name, 1.0 if up else 0.0,
                                                 (("link", str(link)),))
                             for link in range(self._max_links()) for up in (False, True)}

    # -- one cycle ---------------------------------------------------------------------------

    def requests(self, state: LinkState) -> list[tuple[int, int]]:
        """This GPU's entries for the field-value call, in the order ``readings()`` expects them back."""
        state.changed = False
        return [entry.key for entry in state.entries]

    def readings(self, handle: Any, state: LinkState, answers: Answers, last: Answers | None, offset: int,
                 out: list[Reading]) -> None:
        """The link families, appended to ``out``, from this cycle's answers to ``requests()`` (at
        ``offset`` on in ``answers``; ``last``: the same batch's last cycle, None if it changed), and the
        few per-link calls."""
        # Only the groups whose answers changed are looked at (on an idle GB200: the two data counters),
        # and a changed group is converted in C where its answers allow (``_Group``).
        made, refused, wraps, fields = state.readings, state.refused, state.wraps, self._fields
        # Types and returns rarely change: one comparison for all links, then only each group's values
        # (byte ranges compared inline: ~20 groups per GPU per cycle).
        heads_same = answers.heads_same(last, offset, offset + len(state.entries))
        new, old = answers.values, (last.values if last is not None and len(last) == len(answers) else None)
        bytes_moved = False
        for group in state.groups:
            start, end = offset + group.start, offset + group.end
            if old is not None and new[WORD * start:WORD * end] == old[WORD * start:WORD * end] and (
                    heads_same or answers.same(last, start, end)):
                continue
            first = group.entries[0]
            bytes_moved = bytes_moved or bool(first.direction)
            decoded = None if first.is_state else fields.uniform(answers, start, end)
            if decoded is None:
                for i, entry in enumerate(group.entries, group.start):
                    if not answers.same(last, offset + i, offset + i + 1):
                        made[i] = self._reading(state, i, entry, answers, offset + i)
                continue
            value_type, numbers = decoded
            if first.counter and value_type == self._uint:
                numbers = [unwrap32(wraps, e.key, int(n)) for e, n in zip(group.entries, numbers, strict=True)]
            values = list(map(mul, numbers, repeat(first.scale)))
            made[group.start:group.end] = bulk_readings(first.metric, values, group.labels)
            if first.direction:
                state.last_bytes.setdefault(first.direction, {}).update(zip(group.links, values, strict=True))
            if refused:
                refused.difference_update(range(group.start, group.end))
        out += filter(None, made)
        for link in sorted(state.state_by_call):
            up = self._state_by_call(handle, link)
            if up is None:
                state.up.pop(link, None)
            else:
                state.up[link] = up
                out.append(self._up_readings.get((link, up)) or Reading(
                    cat.GPU_NVLINK_LINK_UP.name, 1.0 if up else 0.0, (("link", str(link)),)))
        self._drop_refused(state)
        links = state.links or ()
        if len(state.info) < len(links):  # a link's identity is read once, when it is first seen up
            for link in links:
                if state.up.get(link) and link not in state.info:
                    self._read_info(handle, state, link)
            state.info_readings = tuple(state.info[link] for link in links if link in state.info)
        out += state.info_readings
        if bytes_moved:
            state.totals = tuple(Reading(cat.GPU_NVLINK_BYTES.name, sum(per_link.values()), labels)
                                 for direction, labels in self._total_labels
                                 if (per_link := state.last_bytes.get(direction)))
        out += state.totals

    def _reading(self, state: LinkState, index: int, entry: _Entry, answers: Answers, at: int) -> Reading | None:
        """One changed answer (``answers`` entry ``at``) of a group that is not read as a whole."""
        value_type, ret = answers.head(at)
        if ret != self._success:
            if entry.is_state:
                state.up.pop(entry.link, None)
                if ret in self._unsupported:
                    state.state_by_call.add(entry.link)  # asked by call from now on
                    state.refused.add(index)
            elif ret in self._unsupported:
                state.refused.add(index)
            return None  # any other error: absent this cycle, asked again next cycle
        state.refused.discard(index)
        number = self._fields.number(answers, at)
        if number is None:
            return None
        if entry.is_state:
            up = number in self._up_states
            state.up[entry.link] = up
            return self._up_readings.get((entry.link, up)) or Reading(entry.metric, float(up), entry.labels)
        if entry.counter and value_type == self._uint:
            number = unwrap32(state.wraps, entry.key, int(number))
        value = float(number) * entry.scale
        if entry.direction:
            state.last_bytes.setdefault(entry.direction, {})[entry.link] = value
        return Reading(entry.metric, value, entry.labels)

    def _drop_refused(self, state: LinkState) -> None:
        """Entries NOT_SUPPORTED on a link that is up never answer: out of the batch."""
        drop = {i for i in state.refused
                if (entry := state.entries[i]).is_state or state.up.get(entry.link, False)}
        if not drop:
            return
        keep = [i for i in range(len(state.entries)) if i not in drop]
        state.entries = [state.entries[i] for i in keep]
        state.groups = _groups(state.entries)
        state.readings = [state.readings[i] for i in keep]
        state.refused = {new for new, old in enumerate(keep) if old in state.refused}
        state.changed = True

    # -- finding the links -------------------------------------------------------------------

    def discover(self, handle: Any, state: LinkState) -> None:
        """Find the GPU's links (once): every index ``nvmlDeviceGetNvLinkState`` answers for."""
        nvml = self._nvml
        call = getattr(nvml, "nvmlDeviceGetNvLinkState", None)
        links: list[int] = []
        for link in range(self._max_links() if call is not None else 0):
            try:
                call(handle, link)  # type: ignore[misc]
            except nvml.NVMLError as err:
                if err.value in self._no_link:
                    continue  # no link at this index; a higher one may exist
                if err.value == self._no_function:
                    break
                raise  # a GPU error: discovered again next cycle
            links.append(link)
        state.links = tuple(links)
        entries: list[_Entry] = []
        if self._state_field is not None:
            entries += [_Entry((self._state_field, link), cat.GPU_NVLINK_LINK_UP.name, (("link", str(link)),),
                               1.0, False, link, is_state=True) for link in state.links]
        else:
            state.state_by_call.update(state.links)
        for fid, family, labels, scale, counter in self._scoped:
            direction = labels[0][1] if family is cat.GPU_NVLINK_LINK_BYTES else ""
            entries += [_Entry((fid, link), family.name, (("link", str(link)), *labels), scale, counter, link,
                               direction) for link in state.links]
        for link in state.links:
            entries += [_Entry((fid, 0), cat.GPU_NVLINK_LINK_ERRORS.name, (("link", str(link)), ("type", kind)),
                               1.0, True, link) for fid, kind in self._per_index.get(link, ())]
        state.entries = entries
        state.groups = _groups(entries)
        state.readings = [None] * len(entries)
        state.changed = True

    def _max_links(self) -> int:
        return int(getattr(self._nvml, "NVML_NVLINK_MAX_LINKS", _DEFAULT_MAX_LINKS))

    def _state_by_call(self, handle: Any, link: int) -> bool | None:
        nvml = self._nvml
        getter = self._state_getters.get(link)
        if getter is None:
            # nvmlDeviceGetNvLinkState(device, link, nvmlEnableState_t *isActive): every cycle, per link.
            getter = self._state_getters[link] = (self._getters.make("nvmlDeviceGetNvLinkState", link)
                                                  or nvml.nvmlDeviceGetNvLinkState)
        try:
            return bool(getter(handle, link) == nvml.NVML_FEATURE_ENABLED)
        except nvml.NVMLError as err:
            if err.value in self._unsupported:
                return None
            raise

    def _read_info(self, handle: Any, state: LinkState, link: int) -> None:
        version = self._static(handle, "nvmlDeviceGetNvLinkVersion", link, self._versions)
        remote = self._static(handle, "nvmlDeviceGetNvLinkRemoteDeviceType", link, self._remote_types)
        if version is not None and remote is not None:
            state.info[link] = Reading(cat.GPU_NVLINK_LINK_INFO.name, 1.0,
                                       (("link", str(link)), ("version", version), ("remote_type", remote)))

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
