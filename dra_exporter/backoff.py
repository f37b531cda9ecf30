"""The one exponential backoff every source retries with: doubling, capped, with jitter.

After the n-th failure in a row the wait is ``min(maximum, initial * 2**(n-1))`` times a random
factor in ``[1 - jitter, 1 + jitter]`` (the cap applies before the jitter, as in client-go's
``wait.Backoff``, so waits at the cap still spread out). The jitter keeps the exporters of many
nodes, which fail together when the API server or a driver rollout does, from retrying in step.

Pure: the clock and the random source are injected, so tests choose both.
"""

from __future__ import annotations

import math
import random as _random
from collections.abc import Callable

#: The jitter every source uses unless it asks otherwise: ±20 %.
DEFAULT_JITTER = 0.2


class Backoff:
    """Counts failures in a row and says how long to wait before the next try.

    ``failed()`` records a failure and returns the wait; ``remaining()`` is how much of it is left
    (on ``monotonic``); ``succeeded()`` starts afresh. ``random`` returns a float in [0, 1).
    """

    def __init__(self, initial: float, maximum: float, *, jitter: float = DEFAULT_JITTER,
                 monotonic: Callable[[], float] | None = None,
                 random: Callable[[], float] = _random.random) -> None:
        if not (0 < initial <= maximum < math.inf):
            raise ValueError(f"backoff must be (initial, maximum) seconds with 0 < initial <= maximum, "
                             f"got ({initial!r}, {maximum!r})")
        if not 0 <= jitter < 1:
            raise ValueError(f"backoff jitter must be in [0, 1), got {jitter!r}")
        self.initial = float(initial)
        self.maximum = float(maximum)
        self.jitter = jitter
        self._monotonic = monotonic
        self._random = random
        self.failures = 0
        """Failures in a row since the last success."""
        self._retry_at = -math.inf

    def failed(self) -> float:
        """Record one more failure; returns the seconds to wait before the next try."""
        self.failures += 1
        base = min(self.maximum, self.initial * 2.0 ** min(self.failures - 1, 64))
        delay = base * (1.0 + self.jitter * (2.0 * self._random() - 1.0))
        if self._monotonic is not None:
            self._retry_at = self._monotonic() + delay
        return delay

    def remaining(self) -> float:
        """Seconds left of the wait the last failure started (0 when a try may go ahead now)."""
        if self._monotonic is None:
            raise TypeError("remaining() needs the monotonic clock the backoff was made with")
        return max(0.0, self._retry_at - self._monotonic())

    def succeeded(self) -> None:
        """A try worked: the next failure waits ``initial`` again."""
        self.failures = 0
        self._retry_at = -math.inf
