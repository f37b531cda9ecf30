"""Which DeviceClasses a frame evaluates: a CEL time budget per frame, shared by all classes.

Why: evaluations run one after another (one worker, and the library holds the GIL), so without a
bound a frame costs the sum over every class: 100 classes whose CEL takes just over the 1 s limit
kept every frame from finishing (``/readyz`` 503 for minutes, ``/healthz`` 503 after 60 s, the
kubelet restarting the pod), and 3,000 ordinary classes made the first frame 37 s. Here a frame
starts no evaluation once ``budget`` seconds are spent (one already running ends within the
engine's own time limit), and a class it did not get to is *waiting*: it matches nothing, its
capacity is not reported and ``dra_cluster_class_selectors_pending`` says so. The next frame takes
the classes that have waited longest first, so every class is evaluated in the end; classes already
evaluated come first of all, over the devices of new slices only.

Each class's results are kept by its content (its selectors): a class object that is listed again,
renamed or copied costs nothing, and a class evaluated over part of the devices when the budget ran
out keeps what it has (the selector's memo) for the next frame.

A failure of the run rather than of the class (``Interrupted``: the worker killed, by the kernel or
an operator, or an evaluation past the time limit on a busy CPU) is never the class's answer: the
class waits and is tried again on a later frame, at the back of the queue. Only after
``MAX_TRIES`` such failures in a row is it refused (``error``), with one log line: a class that
always crashes the library or always takes longer than the limit would otherwise cost a worker
restart on every frame.

Pure: no I/O; the clock is an argument (tests drive it).
"""

from __future__ import annotations

import itertools
import logging
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

from ..model import DeviceClassInfo, ResourceSliceInfo
from .selectors import CelEngine, ClassSelector, Interrupted, MemoBudget

#: Failures of the run in a row after which a class is refused as one the scheduler cannot evaluate.
MAX_TRIES: Final = 3
#: The cluster mode's budget per frame, in seconds of CEL: a quarter of the interval, at least
#: ``MIN_FRAME_BUDGET`` (a frame also builds the allocator's view and the families: ~0.1-1 s for
#: 5,000 nodes; one evaluation may run past the budget by the engine's time limit, 1 s).
FRAME_BUDGET_SHARE: Final = 0.25
MIN_FRAME_BUDGET: Final = 1.0
#: What a waiting class's ``error`` says (its capacity is not reported, as for a refused class).
WAITING: Final = "selectors not evaluated yet: waiting for the CEL time budget of a later frame"

log = logging.getLogger(__name__)


def frame_budget(interval: float) -> float:
    """The seconds of class CEL one frame of the cluster mode may cost at ``interval``."""
    return max(MIN_FRAME_BUDGET, FRAME_BUDGET_SHARE * interval)


@dataclass(slots=True, eq=False)
class _Entry:
    """One content (a tuple of selectors) and how far its evaluation got."""

    expressions: tuple[str, ...]
    name: str
    """A class with this content: the one named in log lines and in the engine's requests."""
    place: int
    """Its place in the queue (smaller goes first): when it started waiting, in arrival order;
    ``-1``: it was evaluated and lost that on new devices, so it goes first."""
    selector: ClassSelector | None = None
    ready: bool = False
    tries: int = 0
    interrupted_in: int = -1
    """The frame its last run was interrupted in: not tried again in that frame."""
    refused: ClassSelector | None = None
    """After ``MAX_TRIES`` interrupted runs: the class's answer, a selector whose ``error`` says why."""


@dataclass(slots=True)
class FrameCel:
    """What one frame got: per class name, its selector (evaluated, refused or waiting)."""

    selectors: dict[str, ClassSelector] = field(default_factory=dict)
    waiting: frozenset[str] = frozenset()
    evaluated: int = 0
    """Classes whose evaluation this frame finished."""
    seconds: float = 0.0


class ClassQueue:
    """The classes' selectors across frames; see the module docstring. ``budget`` None: no budget
    (every class evaluated in the first frame; tests and one-shot tools)."""

    def __init__(self, engine: CelEngine | None, memo: MemoBudget, budget: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.engine = engine
        self.memo = memo
        self.budget = budget
        self.clock = clock
        self._entries: dict[tuple[str, ...], _Entry] = {}
        self._places = itertools.count()
        self._frames = itertools.count()
        self._frame = -1
        self._seen: dict[str, ResourceSliceInfo] = {}
        self._waiting: dict[str, ClassSelector] = {}

    def frame(self, classes: Sequence[DeviceClassInfo], slices: Sequence[ResourceSliceInfo]) -> FrameCel:
        started = self.clock()
        deadline = started + self.budget if self.budget is not None else math.inf
        self._frame = next(self._frames)
        entries: dict[tuple[str, ...], _Entry] = {}
        for c in sorted(classes, key=lambda c: c.name):
            key = tuple(c.selectors)
            entries[key] = entries.get(key) or self._entries.get(key) or _Entry(key, c.name, next(self._places))
        self._entries = entries  # contents no class has any more are dropped, with their memo
        new = [sl for sl in slices if self._seen.get(sl.name) is not sl]
        self._seen = {sl.name: sl for sl in slices}
        evaluated = 0
        # Classes already evaluated, over the new slices' devices: they keep their place if they can.
        for entry in entries.values():
            if entry.ready and new and not self._run(entry, new, deadline):
                entry.ready, entry.place = False, -1
        for entry in sorted((e for e in entries.values()
                             if not e.ready and e.refused is None and e.interrupted_in != self._frame),
                            key=lambda e: e.place):
            if self.clock() >= deadline:
                break
            if self._run(entry, slices, deadline):
                entry.ready = True
                evaluated += 1
        out = FrameCel(evaluated=evaluated, seconds=self.clock() - started)
        waiting = set()
        for c in classes:
            entry = entries[tuple(c.selectors)]
            if entry.refused is not None:
                out.selectors[c.name] = entry.refused
            elif entry.ready and entry.selector is not None:
                out.selectors[c.name] = entry.selector
            else:
                out.selectors[c.name] = self._placeholder(c.name)
                waiting.add(c.name)
        out.waiting = frozenset(waiting)
        self._waiting = {n: s for n, s in self._waiting.items() if n in waiting}
        return out

    def _run(self, entry: _Entry, slices: Iterable[ResourceSliceInfo], deadline: float) -> bool:
        """Evaluates ``entry`` over every device of ``slices`` until ``deadline``: True when it has an
        answer for all of them (or a refusal that is the class's answer)."""
        if entry.selector is None:
            entry.selector = ClassSelector(DeviceClassInfo(entry.name, entry.expressions), self.engine, self.memo)
        selector = entry.selector
        for sl in slices:
            for device in sl.devices:
                if selector.error:
                    break
                if self.clock() >= deadline and not selector.memoised(sl.driver, device):
                    return False  # the budget is spent: what it has is kept for the next frame
                selector.matches(sl.driver, device)
        if isinstance(selector.error, Interrupted):
            entry.selector, entry.tries, entry.interrupted_in = None, entry.tries + 1, self._frame
            entry.place = next(self._places)  # to the back of the queue: the others get their turn
            if entry.tries >= MAX_TRIES:
                why = f"{selector.error} ({entry.tries} tries in a row)"
                log.warning("DeviceClass %s: selectors not evaluated, its capacity is not reported: %s",
                            ascii(entry.name)[1:-1], why)
                entry.refused = _refused(entry.name, why, self.memo)
                return True
            return False
        entry.tries = 0
        return True

    def _placeholder(self, name: str) -> ClassSelector:
        found = self._waiting.get(name)
        if found is None:
            found = self._waiting[name] = _refused(name, WAITING, self.memo)
        return found


def _refused(name: str, why: str, memo: MemoBudget) -> ClassSelector:
    """A selector that matches nothing, ``error`` saying why (no CEL: it has no expressions)."""
    selector = ClassSelector(DeviceClassInfo(name), None, memo)
    selector.error = why
    return selector
