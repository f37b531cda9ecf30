"""Time every NVML call a source makes, without changing what it gets back.

``TimedNvml(nvml)`` stands in for the pynvml module (or the simulator's fake): attribute reads
pass through, and every ``nvml*`` function is wrapped so that the time spent inside it is
added to ``seconds`` and counted in ``calls``; so is every C function taken from pynvml's
``_nvmlGetFunctionPointer`` (the source calls ``nvmlDeviceGetFieldValues`` that way). The clock
is wall time (``perf_counter``: what real NVML makes a cycle wait) unless another is given (``thread_time``: the CPU the
simulator's fake burns, which a CPU budget must leave out). The NVML source reads functions and
constants from the object it is given, so it cannot tell the difference.

That gives the floor of a collection cycle: the time NVML itself needs. What the source
spends beyond it is its own cost. Wrapping costs well under a microsecond per call, which
lands on the NVML side of that split.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any


class TimedNvml:
    """A pass-through proxy of an NVML module that times each ``nvml*`` call."""

    def __init__(self, nvml: Any, clock: Callable[[], float] = time.perf_counter) -> None:
        self._nvml = nvml
        self._clock = clock
        self.seconds: defaultdict[str, float] = defaultdict(float)
        self.calls: Counter[str] = Counter()

    def reset(self) -> None:
        self.seconds.clear()
        self.calls.clear()

    @property
    def total_seconds(self) -> float:
        return sum(self.seconds.values())

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._nvml, name)
        if name.startswith("nvml") and callable(value) and not isinstance(value, type):
            value = self._timed(name, value)
        elif name == "_nvmlGetFunctionPointer" and callable(value):
            value = self._timed_pointers(value)
        # Cached on the instance: the next read of ``name`` no longer comes through here.
        setattr(self, name, value)
        return value

    def _timed_pointers(self, lookup: Callable[[str], Any]) -> Callable[[str], Any]:
        """pynvml's C function lookup, for callers that skip pynvml's wrapper (``sources/nvml_fields``):
        the C functions it hands out are timed under their own names too."""
        pointers: dict[str, Callable[..., Any]] = {}

        def pointer(name: str) -> Callable[..., Any]:
            timed = pointers.get(name)
            if timed is None:
                timed = pointers[name] = self._timed(name, lookup(name))
            return timed

        return pointer

    def _timed(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        seconds, calls, clock = self.seconds, self.calls, self._clock

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = clock()
            try:
                return function(*args, **kwargs)
            finally:
                seconds[name] += clock() - started
                calls[name] += 1

        return timed
