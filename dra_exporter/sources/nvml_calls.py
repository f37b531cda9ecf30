"""NVML getters of one number called straight through pynvml's loaded library, for the NVML source.

pynvml's wrapper of a getter like ``nvmlDeviceGetPowerUsage`` makes a ctypes out-parameter, looks the
C function up under a lock, calls it and checks the return: on NVIDIA's mock NVML about as much CPU
again as the call through ctypes itself, and the NVML source makes a dozen such calls per GPU per
cycle. A ``Getter`` keeps its out-parameter and the function pointer (looked up through pynvml's
``_nvmlGetFunctionPointer`` on first use, so a missing symbol raises NVML's FUNCTION_NOT_FOUND then, as
pynvml would), and raises ``nvml.NVMLError`` for a non-SUCCESS return exactly as pynvml's wrapper does.

Only getters whose C signature is ``(device[, integer arguments], T *out...)`` are made here, each
out-parameter of the C type nvml.h gives it (a struct of unsigned ints as an array of them); the
signatures are the ones pynvml's wrappers call. An NVML
object without ``_nvmlGetFunctionPointer`` (the simulator's fake, a recorded replay) gets None: the
caller calls the binding's own function then.

A getter's out-parameter is shared by every device it is asked for: one source's cycle runs on one
thread.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from typing import Any

Getter = Callable[..., Any]
"""``getter(handle, *ignored)`` -> what NVML wrote through the first out-parameter; further arguments
(a caller's per-device state) are not used."""


class Getters:
    """Makes ``Getter``s over one NVML binding."""

    def __init__(self, nvml: Any) -> None:
        pointer = getattr(nvml, "_nvmlGetFunctionPointer", None)
        self._lookup: Callable[[str], Any] | None = pointer if callable(pointer) else None
        self._error = nvml.NVMLError
        self._success = int(nvml.NVML_SUCCESS)

    def make(self, function: str, *args: int, outs: tuple[Any, ...] = (ctypes.c_uint,),
             read: Callable[[Any], Any] | None = None) -> Getter | None:
        """A getter calling ``function(device, *args, &out...)``, one pointer per type in ``outs``; it
        returns ``read(first out)``, or the first out's ``value``. None without pynvml's lookup."""
        lookup, error, success = self._lookup, self._error, self._success
        if lookup is None:
            return None
        values = [out() for out in outs]
        first = values[0]
        call_args = (*args, *(ctypes.byref(v) for v in values))
        found: list[Any] = []

        def getter(handle: Any, *_ignored: Any) -> Any:
            if not found:
                found.append(lookup(function))  # raises FUNCTION_NOT_FOUND as pynvml's wrapper would
            ret = found[0](handle, *call_args)
            if ret != success:
                raise error(ret)
            return first.value if read is None else read(first)

        return getter
