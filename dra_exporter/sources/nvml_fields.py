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
- the answers are unpacked straight from the array's bytes with ``struct``, at the offsets ctypes
  gives for pynvml's struct: one ``(valueType, nvmlReturn, value bytes)`` tuple per entry, equal
  from cycle to cycle while NVML's answer is (the caller reuses its reading then);
- an NVML object without ``_nvmlGetFunctionPointer`` (the simulator's fake, a recorded replay) is
  called through its ``nvmlDeviceGetFieldValues``; its answer (pynvml structs) is unpacked the same way.

A non-SUCCESS return of the whole call raises ``nvml.NVMLError`` as pynvml's wrapper would.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Sequence
from typing import Any, Final

#: ``NVML_VALUE_TYPE_*`` -> how its ``c_nvmlValue_t`` member is laid out (the union starts every one
#: at offset 0, so the first bytes in native order are the member on any byte order).
_VALUE_FORMATS: Final = (
    ("NVML_VALUE_TYPE_DOUBLE", "d"),
    ("NVML_VALUE_TYPE_UNSIGNED_INT", "I"),
    ("NVML_VALUE_TYPE_UNSIGNED_LONG", "L"),
    ("NVML_VALUE_TYPE_UNSIGNED_LONG_LONG", "Q"),
    ("NVML_VALUE_TYPE_SIGNED_LONG_LONG", "q"),
    ("NVML_VALUE_TYPE_SIGNED_INT", "i"),
    ("NVML_VALUE_TYPE_UNSIGNED_SHORT", "H"),
)

Answer = tuple[int, int, bytes]
"""One entry's answer: ``(valueType, nvmlReturn, the value union's bytes)``; compare them, decode with
``FieldValues.number``."""


class FieldBatch:
    """One device's request: the entries in order, and the ctypes array NVML answers into."""

    __slots__ = ("requests", "_plain", "_array", "_request_bytes", "_count")

    def __init__(self, requests: Sequence[tuple[int, int]], array: Any) -> None:
        self.requests = tuple(requests)
        # What pynvml's wrapper takes: a bare field id for scope 0 (the board-level fields).
        self._plain: list[int | tuple[int, int]] = [fid if scope == 0 else (fid, scope) for fid, scope in requests]
        self._array = array
        self._count = ctypes.c_int32(len(self.requests))
        self._request_bytes = bytes(memoryview(array).cast("B")) if array is not None else b""


class FieldValues:
    """Calls ``nvmlDeviceGetFieldValues`` for a ``FieldBatch`` and unpacks the answers."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._success = int(nvml.NVML_SUCCESS)
        struct_type = nvml.c_nvmlFieldValue_t
        self._struct_type = struct_type
        offsets = {name: getattr(struct_type, name).offset for name in ("valueType", "nvmlReturn", "value")}
        value_size = struct_type.value.size
        # The answer's three fields at the offsets ctypes computed for pynvml's struct, the rest skipped.
        vt, ret, val, size = offsets["valueType"], offsets["nvmlReturn"], offsets["value"], ctypes.sizeof(struct_type)
        if not vt + 4 <= ret and ret + 4 <= val and val + value_size <= size:
            raise ValueError(f"unexpected layout of c_nvmlFieldValue_t: {offsets}, size {size}")
        self._record = struct.Struct(f"={vt}xI{ret - vt - 4}xI{val - ret - 4}x{value_size}s{size - val - value_size}x")
        self._decoders = {int(getattr(nvml, const)): struct.Struct(f"={fmt}")
                          for const, fmt in _VALUE_FORMATS if hasattr(nvml, const)}
        pointer = getattr(nvml, "_nvmlGetFunctionPointer", None)
        self._pointer = pointer if callable(pointer) else None
        """pynvml's: the C function through the library it loaded. None for a fake NVML."""

    def batch(self, requests: Sequence[tuple[int, int]]) -> FieldBatch:
        if self._pointer is None or not requests:
            return FieldBatch(requests, None)
        array = (self._struct_type * len(requests))()
        for entry, (field_id, scope_id) in zip(array, requests, strict=True):
            entry.fieldId, entry.scopeId = field_id, scope_id
        return FieldBatch(requests, array)

    def read(self, handle: Any, batch: FieldBatch) -> list[Answer]:
        """The answers, one per request, in order; raises ``nvml.NVMLError`` if the call fails."""
        if not batch.requests:
            return []
        array = batch._array
        if array is None:
            answer = self._nvml.nvmlDeviceGetFieldValues(handle, batch._plain)
            data = bytes(memoryview(answer).cast("B")) if isinstance(answer, ctypes.Array) else \
                b"".join(bytes(memoryview(value).cast("B")) for value in answer)
            return list(self._record.iter_unpack(data))
        function = self._pointer("nvmlDeviceGetFieldValues")  # type: ignore[misc]
        ctypes.memmove(array, batch._request_bytes, len(batch._request_bytes))
        ret = function(handle, batch._count, ctypes.byref(array))
        if ret != self._success:
            raise self._nvml.NVMLError(ret)
        return list(self._record.iter_unpack(array))

    def number(self, answer: Answer) -> float | None:
        """The value of a SUCCESS answer as a number; None for a value type this binding does not know."""
        decoder = self._decoders.get(answer[0])
        return None if decoder is None else decoder.unpack_from(answer[2])[0]
