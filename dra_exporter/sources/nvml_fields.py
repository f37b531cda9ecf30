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
- the answers leave the array as two byte strings (``Answers``), copied in C through strided views
  of it: every entry's ``(valueType, nvmlReturn)`` pair, and every entry's value union. No Python
  object per entry: finding what changed since last cycle compares ranges of those strings, and a
  range whose entries all answer SUCCESS in one value type (one counter over a GPU's links) is
  decoded by one ``memoryview`` cast into a list of numbers;
- an NVML object without ``_nvmlGetFunctionPointer`` (the simulator's fake, a recorded replay) is
  called through its ``nvmlDeviceGetFieldValues``; its answer (pynvml structs) is read the same way.

The layout is the one ctypes computes for pynvml's struct; the views need nvml.h's: the type and
return next to each other and the value 8-byte aligned (so on every ABI NVML ships for), checked once.
A non-SUCCESS return of the whole call raises ``nvml.NVMLError`` as pynvml's wrapper would.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Sequence
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
WORD: Final = 8
"""Bytes per entry in each of ``Answers``' strings: the type and return (two 32-bit words), the value."""
_HEAD: Final = struct.Struct("=II")


class Answers:
    """One call's answers: ``heads`` (per entry, its ``valueType`` and ``nvmlReturn`` as NVML wrote
    them) and ``values`` (per entry, the 8 bytes of its value union); entry ``i`` at ``8 * i`` in both.
    Equal bytes from cycle to cycle mean an equal answer."""

    __slots__ = ("heads", "values", "_views")

    def __init__(self, heads: bytes, values: bytes) -> None:
        self.heads = heads
        self.values = values
        self._views: dict[str, memoryview[Any]] = {}

    def __len__(self) -> int:
        return len(self.heads) // WORD

    def same(self, last: Answers | None, start: int, end: int) -> bool:
        """Entries ``start:end`` answered as in ``last``."""
        if last is None or len(last.heads) != len(self.heads):
            return False
        a, b = start * WORD, end * WORD
        return self.values[a:b] == last.values[a:b] and self.heads[a:b] == last.heads[a:b]

    def heads_same(self, last: Answers | None, start: int, end: int) -> bool:
        """Entries ``start:end`` answered with the types and returns of ``last`` (values aside)."""
        return last is not None and len(last.heads) == len(self.heads) and \
            self.heads[start * WORD:end * WORD] == last.heads[start * WORD:end * WORD]

    def head(self, index: int) -> tuple[int, int]:
        """``(valueType, nvmlReturn)`` of one entry."""
        return _HEAD.unpack_from(self.heads, index * WORD)

    def view(self, code: str) -> memoryview[Any]:
        """``values`` as numbers of one native ``struct`` code (made once per call and code)."""
        found = self._views.get(code)
        if found is None:
            found = self._views[code] = memoryview(self.values).cast(code)  # type: ignore[call-overload]
        return found


class FieldBatch:
    """One device's request: the entries in order, and the ctypes array NVML answers into."""

    __slots__ = ("requests", "_plain", "_array", "_request_bytes", "_count", "_heads", "_values")

    def __init__(self, requests: Sequence[tuple[int, int]], array: Any, fields: FieldValues) -> None:
        self.requests = tuple(requests)
        # What pynvml's wrapper takes: a bare field id for scope 0 (the board-level fields).
        self._plain: list[int | tuple[int, int]] = [fid if scope == 0 else (fid, scope) for fid, scope in requests]
        self._array = array
        self._count = ctypes.c_int32(len(self.requests))
        self._request_bytes = bytes(memoryview(array).cast("B")) if array is not None else b""
        self._heads: memoryview[int] | None = None
        self._values: memoryview[int] | None = None
        if array is not None:
            self._heads, self._values = fields.views(array)


class FieldValues:
    """Calls ``nvmlDeviceGetFieldValues`` for a ``FieldBatch`` and reads the answers."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._success = int(nvml.NVML_SUCCESS)
        struct_type = nvml.c_nvmlFieldValue_t
        self._struct_type = struct_type
        vt, ret, val = (getattr(struct_type, name).offset for name in ("valueType", "nvmlReturn", "value"))
        size = ctypes.sizeof(struct_type)
        if not (ret == vt + 4 and vt % WORD == 0 and val % WORD == 0 and size % WORD == 0
                and struct_type.value.size == WORD):
            raise ValueError(f"unexpected layout of c_nvmlFieldValue_t: {(vt, ret, val)}, size {size}")
        self._head_word, self._value_word, self._stride = vt // WORD, val // WORD, size // WORD
        members = dict(dict(struct_type._fields_)["value"]._fields_)
        self.codes: dict[int, str] = {int(getattr(nvml, const)): _native_code(members[member])
                                      for const, member in _VALUE_MEMBERS if hasattr(nvml, const) and member in members}
        """valueType -> the value member's native ``struct`` code; a type this binding does not know is absent."""
        self._ok: dict[int, bytes] = {}
        pointer = getattr(nvml, "_nvmlGetFunctionPointer", None)
        self._pointer = pointer if callable(pointer) else None
        """pynvml's: the C function through the library it loaded. None for a fake NVML."""

    def batch(self, requests: Sequence[tuple[int, int]]) -> FieldBatch:
        if self._pointer is None or not requests:
            return FieldBatch(requests, None, self)
        array = (self._struct_type * len(requests))()
        for entry, (field_id, scope_id) in zip(array, requests, strict=True):
            entry.fieldId, entry.scopeId = field_id, scope_id
        return FieldBatch(requests, array, self)

    def views(self, buffer: Any) -> tuple[memoryview[int], memoryview[int]]:
        """Strided views of an array of answers: every entry's head, every entry's value."""
        words = memoryview(buffer).cast("B").cast("Q")
        return words[self._head_word::self._stride], words[self._value_word::self._stride]

    def read(self, handle: Any, batch: FieldBatch) -> Answers:
        """The answers, one per request, in order; raises ``nvml.NVMLError`` if the call fails."""
        if not batch.requests:
            return Answers(b"", b"")
        array = batch._array
        if array is None:
            answer = self._nvml.nvmlDeviceGetFieldValues(handle, batch._plain)
            data = bytes(memoryview(answer).cast("B")) if isinstance(answer, ctypes.Array) else \
                b"".join(bytes(memoryview(value).cast("B")) for value in answer)
            heads, values = self.views(data)
            return Answers(heads.tobytes(), values.tobytes())
        function = self._pointer("nvmlDeviceGetFieldValues")  # type: ignore[misc]
        ctypes.memmove(array, batch._request_bytes, len(batch._request_bytes))
        ret = function(handle, batch._count, ctypes.byref(array))
        if ret != self._success:
            raise self._nvml.NVMLError(ret)
        assert batch._heads is not None and batch._values is not None  # made with the array
        return Answers(batch._heads.tobytes(), batch._values.tobytes())

    def number(self, answers: Answers, index: int) -> float | None:
        """The value of a SUCCESS answer as a number; None for a value type this binding does not know."""
        code = self.codes.get(answers.head(index)[0])
        return None if code is None else answers.view(code)[index * WORD // struct.calcsize(code)]

    def uniform(self, answers: Answers, start: int, end: int) -> tuple[int, list[Any]] | None:
        """``(valueType, values)`` of entries ``start:end`` when every one is a SUCCESS of one known type
        (one counter over a GPU's links, as NVML answers it nearly always), decoded in C; else None."""
        value_type, ret = answers.head(start)
        code = self.codes.get(value_type)
        if ret != self._success or code is None:
            return None
        ok = self._ok.get(value_type)
        if ok is None:
            ok = self._ok[value_type] = _HEAD.pack(value_type, self._success)
        count = end - start
        if answers.heads[start * WORD:end * WORD] != ok * count:
            return None
        step = WORD // struct.calcsize(code)  # a narrower member is the union's first bytes, on any byte order
        return value_type, answers.view(code)[start * step:end * step:step].tolist()


def _native_code(ctype: Any) -> str:
    """A ctypes number type's ``struct`` code in native sizes (C's ``unsigned long``: 8 bytes on 64-bit
    Linux, where the standard ``=L`` reads 4), checked against its ctypes size."""
    code = str(ctype._type_)
    if struct.calcsize(code) != ctypes.sizeof(ctype) or WORD % struct.calcsize(code):
        raise ValueError(f"unexpected c_nvmlValue_t member {ctype.__name__}")
    return code
