"""The simulated node's clock.

Everything the simulator answers is a function of *simulated time*: seconds since
the scenario started. The clock either follows the host's monotonic clock (a
running demo) or stands still until a test moves it (``frozen=True``), which is
what makes simulated outputs reproducible. Wall-clock timestamps of the simulated
node are ``epoch + now()``: a running clock's epoch is the host's wall clock at simulated
t=0, so its timestamps are the host's (a real Prometheus sees ``time() - timestamp`` near 0,
not negative); a frozen clock's epoch is ``FIXED_EPOCH``, so snapshots and tests stay
reproducible byte for byte.

``wait_until`` lets a thread sleep until a simulated instant without spinning:
it wakes when the instant is reached, when someone moves the clock, or when its
wall-clock timeout runs out.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Final

#: Wall time (Unix seconds) of simulated t=0 on a frozen clock: fixed, so what a snapshot or
#: a test prints does not depend on when it ran.
FIXED_EPOCH: Final = 1_800_000_000.0


class SimClock:
    """Simulated seconds since scenario start; thread-safe."""

    def __init__(self, start: float = 0.0, *, frozen: bool = False) -> None:
        _check_time(start)
        self._frozen = frozen
        self._base = float(start)
        # Simulated time is ``_base`` plus the monotonic time elapsed since ``_anchor``.
        self._anchor = time.monotonic()
        #: Wall time (Unix seconds) of simulated t=0. A running clock is anchored to the host's wall
        #: clock once, here, and then follows the monotonic clock: its offset from the host's time
        #: stays fixed (~0) and never jumps when the host's clock is stepped.
        self.epoch = FIXED_EPOCH if frozen else time.time() - self._base
        self._cond = threading.Condition(threading.Lock())

    @property
    def frozen(self) -> bool:
        return self._frozen

    def now(self) -> float:
        """Simulated seconds since the scenario started."""
        with self._cond:
            return self._now_locked()

    def wall(self) -> float:
        """Wall-clock time of the simulated node (Unix seconds)."""
        return self.epoch + self.now()

    def advance(self, seconds: float) -> float:
        """Move simulated time forward by ``seconds``; returns the new time."""
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(f"the simulated clock only moves forward; cannot advance by {seconds!r} s")
        with self._cond:
            self._rebase(self._now_locked() + seconds)
            return self._base

    def set(self, t: float) -> None:
        """Jump to simulated time ``t`` (forwards or backwards)."""
        _check_time(t)
        with self._cond:
            self._rebase(float(t))

    def wait_until(self, t: float, timeout_s: float) -> bool:
        """Block until simulated time reaches ``t`` or ``timeout_s`` wall seconds pass.

        Returns True when ``t`` was reached. Never spins: it sleeps on a condition
        that ``advance``/``set`` notify, bounded by the time ``t`` is due.
        """
        deadline = time.monotonic() + max(0.0, timeout_s)
        with self._cond:
            while True:
                now = self._now_locked()
                if now >= t:
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                if not self._frozen:
                    # A running clock reaches t on its own after (t - now) wall seconds.
                    remaining = min(remaining, t - now)
                self._cond.wait(remaining)

    def _now_locked(self) -> float:
        if self._frozen:
            return self._base
        return self._base + (time.monotonic() - self._anchor)

    def _rebase(self, t: float) -> None:
        self._base = t
        self._anchor = time.monotonic()
        self._cond.notify_all()

    def __repr__(self) -> str:
        return f"SimClock(now={self.now():.3f}, frozen={self._frozen})"


def _check_time(t: float) -> None:
    if not math.isfinite(t) or t < 0:
        raise ValueError(f"simulated time must be a finite number of seconds >= 0, not {t!r}")
