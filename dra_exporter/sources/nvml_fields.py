"""NVML field values, one batched call per device, read without pynvml's per-attribute wrappers.

Why not ``nvml.nvmlDeviceGetFieldValues`` and ``value.nvmlReturn``: on a GB200 a device's batch is
~360 ``(fieldId, scopeId)`` entries (18 links). pynvml's wrapper fills a fresh array entry by entry
through ``_PrintableStructure.__setattr__``, and every attribute read on an answer goes through
``_PrintableStructure.__getattribute__``: ~21,000 Python calls per cycle on 8 GPUs, costing ~20 times
what NVML itself spends answering (``benchmarks/bench_nvml_mock.py``). Here:

- a device's request is built once as pynvml's own ``c_nvmlFieldValue_t`` array and kept
  (``FieldBatch``); every cycle the request bytes are copied back over it (NVML writes the answer into
  the same array) and the C function is called through pynvml's loaded library
  (``pynvml._nvmlGetFunctionPointer``, the pointer pynvml's wrapper calls);
- the answers are unpacked straight from the array's bytes by one ``struct`` call per batch, at the
  offsets ctypes gives for pynvml's struct: one ``bytes`` per entry holding its ``valueType``,
  ``nvmlReturn`` and value union (contiguous in nvml.h's struct), so finding the entries whose answer
  changed since last cycle is a comparison of short byte strings, done in C; ``FieldValues.decoders``
  turns the few that changed into numbers;
- an NVML object without ``_nvmlGetFunctionPointer`` (the simulator's fake, a recorded replay) is
  called through its ``nvmlDeviceGetFieldValues``; its answer (pynvml structs) is unpacked the same way.

A non-SUCCESS return of the whole call raises ``nvml.NVMLError`` as pynvml's wrapper would.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable, Iterator, Sequence
from itertools import compress
from operator import ne
from typing import Any, Final

#: ``NVML_VALUE_TYPE_*`` -> its member of the ``c_nvmlValue_t`` union (every member starts at offset 0).
_VALUE_MEMBERS: Final = (
    ("NVML_VALUE_TYPE_DOUBLE", "dVal"),
    ("NVML_VALUE_TYPE_UNSIGNED_INT", "uiVal"),
    ("NVML_VALUE_TYPE_UNSIGNED_LONG", "ulVal"),
    ("NVML_VALUE_TYPE_UNSIGNED_LONG_LONG", "ullVal"),
    ("NVML_VALUE_TYPE_SIGNED_LONG_LONG", "sllVal"),
    ("NVML_VALUE_TYPE_SIGNED_INT", "siVal"),
    ("NVML_VALUE_TYPE_UNSIGNED_SHORT", "usVal"),
)


Answer = bytes
"""One entry's answer as NVML wrote it: ``valueType``, ``nvmlReturn`` and the value union's bytes. Equal
from cycle to cycle while NVML's answer is; ``FieldValues.head`` and ``FieldValues.decoders`` read it."""


class FieldBatch:
    """One device's request: the entries in order, and the ctypes array NVML answers into."""

    __slots__ = ("requests", "_plain", "_array", "_request_bytes", "_count", "_unpack")

    def __init__(self, requests: Sequence[tuple[int, int]], array: Any, record_format: str) -> None:
        self.requests = tuple(requests)
        # What pynvml's wrapper takes: a bare field id for scope 0 (the board-level fields).
        self._plain: list[int | tuple[int, int]] = [fid if scope == 0 else (fid, scope) for fid, scope in requests]
        self._array = array
        self._count = ctypes.c_int32(len(self.requests))
        self._request_bytes = bytes(memoryview(array).cast("B")) if array is not None else b""
        # The whole array in one call: one ``Answer`` per entry, the rest of each record skipped.
        self._unpack = struct.Struct("=" + record_format * len(self.requests)).unpack


class FieldValues:
    """Calls ``nvmlDeviceGetFieldValues`` for a ``FieldBatch`` and unpacks the answers."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._success = int(nvml.NVML_SUCCESS)
        struct_type = nvml.c_nvmlFieldValue_t
        self._struct_type = struct_type
        vt, ret, val = (getattr(struct_type, name).offset for name in ("valueType", "nvmlReturn", "value"))
        value_size, size = struct_type.value.size, ctypes.sizeof(struct_type)
        if not vt + 4 <= ret and ret + 4 <= val and val + value_size <= size:
            raise ValueError(f"unexpected layout of c_nvmlFieldValue_t: {(vt, ret, val)}, size {size}")
        span = val + value_size - vt
        self._record_format = f"{vt}x{span}s{size - vt - span}x"
        self.head = struct.Struct(f"=I{ret - vt - 4}xI").unpack_from
        """``head(answer)`` -> ``(valueType, nvmlReturn)``."""
        members = dict(dict(struct_type._fields_)["value"]._fields_)
        tail = span - (val - vt)
        #: valueType -> one answer's layout, its value in the member's own C type.
        self._layouts = {int(getattr(nvml, const)): f"I{ret - vt - 4}xI{val - ret - 4}x{code}{tail - width}x"
                         for const, member in _VALUE_MEMBERS if hasattr(nvml, const) and member in members
                         for code, width in (_standard(members[member]),)}
        self.decoders: dict[int, Callable[[Answer], tuple[int, int, float]]] = {
            value_type: struct.Struct("=" + layout).unpack_from for value_type, layout in self._layouts.items()}
        """``valueType`` -> ``decoder(answer)`` -> ``(valueType, nvmlReturn, value)``; a type this binding
        does not know is absent."""
        self._uniform: dict[tuple[int, int], Callable[[bytes], tuple[Any, ...]]] = {}
        pointer = getattr(nvml, "_nvmlGetFunctionPointer", None)
        self._pointer = pointer if callable(pointer) else None
        """pynvml's: the C function through the library it loaded. None for a fake NVML."""

    def batch(self, requests: Sequence[tuple[int, int]]) -> FieldBatch:
        if self._pointer is None or not requests:
            return FieldBatch(requests, None, self._record_format)
        array = (self._struct_type * len(requests))()
        for entry, (field_id, scope_id) in zip(array, requests, strict=True):
            entry.fieldId, entry.scopeId = field_id, scope_id
        return FieldBatch(requests, array, self._record_format)

    def read(self, handle: Any, batch: FieldBatch) -> tuple[Answer, ...]:
        """The answers, one per request, in order; raises ``nvml.NVMLError`` if the call fails."""
        if not batch.requests:
            return ()
        array = batch._array
        if array is None:
            answer = self._nvml.nvmlDeviceGetFieldValues(handle, batch._plain)
            data = bytes(memoryview(answer).cast("B")) if isinstance(answer, ctypes.Array) else \
                b"".join(bytes(memoryview(value).cast("B")) for value in answer)
            return batch._unpack(data)
        function = self._pointer("nvmlDeviceGetFieldValues")  # type: ignore[misc]
        ctypes.memmove(array, batch._request_bytes, len(batch._request_bytes))
        ret = function(handle, batch._count, ctypes.byref(array))
        if ret != self._success:
            raise self._nvml.NVMLError(ret)
        return batch._unpack(array)

    def number(self, answer: Answer) -> float | None:
        """The value of a SUCCESS answer as a number; None for a value type this binding does not know."""
        decoder = self.decoders.get(self.head(answer)[0])
        return None if decoder is None else decoder(answer)[2]

    def uniform(self, answers: Sequence[Answer]) -> tuple[int, Sequence[float]] | None:
        """``(valueType, values)`` when every answer is a SUCCESS of one known type (one counter over a
        GPU's links, as NVML answers it nearly always), decoded by one ``struct`` call; else None."""
        value_type, ret = self.head(answers[0])
        key = (value_type, len(answers))
        unpack = self._uniform.get(key)
        if unpack is None:
            layout = self._layouts.get(value_type)
            if ret != self._success or layout is None:
                return None
            unpack = self._uniform[key] = struct.Struct("=" + layout * len(answers)).unpack
        flat = unpack(b"".join(answers))
        count = len(answers)
        if flat[1::3].count(self._success) != count or flat[0::3].count(value_type) != count:
            return None
        return value_type, flat[2::3]


def changed(answers: Sequence[Answer], last: Sequence[Answer | None]) -> Iterator[int]:
    """The indices whose answer differs from last cycle's; compared and selected in C, not per entry."""
    return compress(range(len(answers)), map(ne, answers, last))


def _standard(ctype: Any) -> tuple[str, int]:
    """A ctypes number type's ``struct`` code in standard sizes (``=``), and its width. Its own code is
    native: C's ``unsigned long`` is 8 bytes on 64-bit Linux, where ``=L`` reads 4."""
    width, code = ctypes.sizeof(ctype), ctype._type_
    if code in "fd":
        return {4: "f", 8: "d"}[width], width
    signed = {1: "b", 2: "h", 4: "i", 8: "q"}[width]
    return (signed.upper() if code.isupper() else signed), width
