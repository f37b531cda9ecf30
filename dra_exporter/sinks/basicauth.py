"""Basic auth for the scrape endpoint: ``Authorization: Basic`` checked against bcrypt hashes.

``BasicAuth`` checks headers with bcrypt (tens of milliseconds, on purpose), at most two at a
time and good clients first, remembers recent results so a scrape every second does not pay a
bcrypt each time, and throttles clients that keep failing (429), so a flood of wrong passwords
never keeps a right one waiting. No password, hash or ``Authorization`` value is ever logged or
kept in clear. The users and their hashes come from a web-config file (``sinks.webconfig``).

Differences from exporter-toolkit, on purpose: a per-client budget of failed checks (429 with
``Retry-After`` once spent), and two bcrypt slots handed out by the client's standing instead of
one global lock. Its dummy hash for unknown users and its cache of results, failures included,
are followed.
"""

from __future__ import annotations

import base64
import binascii
import enum
import hashlib
import heapq
import hmac
import ipaddress
import itertools
import math
import secrets
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

#: bcrypt only ever looked at the first 72 bytes of a password (htpasswd, Go and OpenBSD
#: truncate); the ``bcrypt`` package refuses longer ones instead, so we truncate as they do.
_BCRYPT_MAX_PASSWORD = 72
#: The standing of a proven client (a recent success, no failure since): ahead of standing 0.
PROVEN = -1


class AuthVerdict(enum.Enum):
    """What a basic-auth check says about one request."""

    OK = "ok"
    DENIED = "denied"
    """Missing, malformed or wrong credentials: 401."""
    THROTTLED = "throttled"
    """Not checked: the client spent its budget of failed checks, or the verifiers are busy: 429."""


class BasicAuth:
    """Checks ``Authorization: Basic`` headers against bcrypt hashes, so that no flood of
    wrong passwords can keep a right one waiting.

    - Successful checks are remembered for ``ttl`` seconds, and failed ones too (as
      exporter-toolkit caches both), under an HMAC of user, password and hash with a
      per-process random key: no password is kept in clear, and a client repeating a wrong
      password costs a dictionary look-up, not a bcrypt.
    - At most ``slots`` bcrypt checks run at once (bcrypt is slow on purpose and releases the
      GIL: a burst of bad passwords must not take every core of the node), in the request's
      own thread. Waiting checks are let in by their client's standing: the number of its
      failed or unfinished checks that its budget has not yet forgotten, then arrival. A
      client that has not failed goes ahead of every client that has, so good logins never
      queue behind failures. At most ``max_waiting`` checks wait; when a better-placed one
      comes, the worst-placed waiter is answered THROTTLED without a bcrypt.
    - Each client (peer address; an IPv6 /64, since one host holds the whole prefix) has a
      budget of ``failure_burst`` checks, refilled one per ``refill_seconds`` and given back
      on success. A client that has spent it is answered THROTTLED at once, without a
      bcrypt, until a check comes back: a short back-off, so a Prometheus whose password was
      just fixed is checked again within ``refill_seconds``. That answer comes after
      ``throttle_delay`` seconds, so one connection cannot turn refusals into a flood of
      requests that keeps the interpreter from good logins.
    - A client with a successful login in the last ``proven_ttl`` seconds is *proven*: while it
      has not failed since, its checks go ahead of every unproven client's, fresh ones included.
      Without it a flood from many addresses (each new address starts in good standing) put a
      good login behind the whole waiting room, 16 bcrypts: 2.4 s at worst from 300 addresses.
      What a first login from a new address cannot be told from an attacker's is not guessed:
      it waits in arrival order among the clients that have not failed.
    - An unknown user costs one bcrypt against a dummy hash of the users' cost (the cost most
      users have; the higher one on a tie), so timing does not reveal which users exist.
    """

    def __init__(self, users: tuple[tuple[str, bytes], ...], *, ttl: float = 60.0, max_entries: int = 256,
                 slots: int = 2, max_waiting: int = 16, failure_burst: int = 10, refill_seconds: float = 6.0,
                 wait_timeout: float = 5.0, max_clients: int = 4096, throttle_delay: float = 1.0,
                 proven_ttl: float = 3600.0, max_proven: int = 256,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        if not users:
            raise ValueError("BasicAuth needs at least one user")
        self._users = dict(users)
        self._dummy = _dummy_hash(hashed for _, hashed in users)
        self._monotonic = monotonic
        self._key = secrets.token_bytes(32)
        self._successes = _ExpiringKeys(ttl, max_entries)
        self._failures = _ExpiringKeys(ttl, max_entries)
        self._proven = _ExpiringKeys(proven_ttl, max_proven)
        self._budget = _FailureBudget(failure_burst, refill_seconds, max_clients)
        self._gate = _PriorityGate(slots, max_waiting)
        self._wait_timeout = wait_timeout
        self._throttle_delay = throttle_delay
        #: Whole seconds a THROTTLED client should wait (the ``Retry-After`` header).
        self.retry_after = max(1, math.ceil(refill_seconds))
        self._count_lock = threading.Lock()
        #: bcrypt verifications made; tests and benchmarks read it.
        self.bcrypt_checks = 0

    @property
    def waiting(self) -> int:
        """Checks waiting for a bcrypt slot now."""
        return self._gate.waiting

    def check(self, authorization: str | None, peer: str = "") -> bool:
        """Whether the header carries a valid user and password."""
        return self.verdict(authorization, peer) is AuthVerdict.OK

    def verdict(self, authorization: str | None, peer: str = "") -> AuthVerdict:
        """Check the header sent by the client at address ``peer``."""
        credentials = _parse_basic(authorization)
        if credentials is None:
            return AuthVerdict.DENIED
        user, password = credentials
        hashed = self._users.get(user)
        key = hmac.new(self._key, user.encode() + b"\x00" + password + b"\x00" + (hashed or b""),
                       hashlib.sha256).digest()
        now = self._monotonic()
        if hashed is not None and self._successes.holds(key, now):
            return AuthVerdict.OK
        if self._failures.holds(key, now):
            return AuthVerdict.DENIED
        client = client_key(peer)
        standing = self._budget.take(client, now)
        if standing is None:
            return self._throttled()
        if standing == 0 and self._proven.holds(client.encode(), now):
            standing = PROVEN
        if not self._gate.acquire(standing, self._wait_timeout):
            # Turned away, the check still counts against the client's budget: given back, a
            # flood of fresh clients would retry at the best standing for ever and keep every
            # place in the waiting room from a good login.
            return self._throttled()
        try:
            ok = self._verify(password, hashed if hashed is not None else self._dummy) and hashed is not None
        finally:
            self._gate.release()
        now = self._monotonic()
        if ok:
            self._budget.give_back(client, now)
            self._successes.add(key, now)
            self._proven.add(client.encode(), now)
            return AuthVerdict.OK
        self._failures.add(key, now)
        return AuthVerdict.DENIED

    def _throttled(self) -> AuthVerdict:
        # Answering at once would let each attacker's connection send thousands of requests
        # a second, and parsing them takes the interpreter from good logins; a blocked thread
        # costs nothing, and the connection is held by the client anyway.
        if self._throttle_delay > 0:
            time.sleep(self._throttle_delay)
        return AuthVerdict.THROTTLED

    def _verify(self, password: bytes, hashed: bytes) -> bool:
        import bcrypt

        with self._count_lock:
            self.bcrypt_checks += 1
        try:
            return bool(bcrypt.checkpw(password[:_BCRYPT_MAX_PASSWORD], hashed))
        except ValueError:
            return False


def _dummy_hash(hashes: Iterator[bytes]) -> bytes:
    """A bcrypt hash no password matches, of the cost most of ``hashes`` have (ties: the higher)."""
    import bcrypt

    costs = Counter(int(h[4:6]) for h in hashes)
    cost = max(costs, key=lambda c: (costs[c], c))
    # A random salt and an all-zero digest: checking it costs a full bcrypt of that cost,
    # and since no password hashes to zeros, and the result is ignored anyway, it never matches.
    return bcrypt.gensalt(rounds=cost, prefix=b"2b") + b"." * 31


def client_key(peer: str) -> str:
    """Whose budget a connection from ``peer`` spends: its IPv4 address, or its IPv6 /64."""
    try:
        address = ipaddress.ip_address(peer.split("%", 1)[0])
    except ValueError:
        return peer
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return str(address.ipv4_mapped)
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


class _ExpiringKeys:
    """A bounded set of keys, each forgotten ``ttl`` seconds after it was added."""

    def __init__(self, ttl: float, max_entries: int) -> None:
        self._ttl = ttl
        self._max_entries = max_entries
        self._expiry: dict[bytes, float] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._expiry)

    def holds(self, key: bytes, now: float) -> bool:
        with self._lock:
            expiry = self._expiry.get(key)
            return expiry is not None and expiry > now

    def add(self, key: bytes, now: float) -> None:
        with self._lock:
            if key not in self._expiry and len(self._expiry) >= self._max_entries:
                # The expired ones, or else the oldest (dicts keep insertion order).
                for stale in [k for k, exp in self._expiry.items() if exp <= now] or list(self._expiry)[:1]:
                    del self._expiry[stale]
            self._expiry.pop(key, None)
            self._expiry[key] = now + self._ttl


class _FailureBudget:
    """Per client: ``burst`` bcrypt checks, one back every ``refill_seconds``, one back per success."""

    def __init__(self, burst: int, refill_seconds: float, max_clients: int) -> None:
        if burst < 1 or refill_seconds <= 0:
            raise ValueError(f"failure budget needs burst >= 1 and refill > 0, got {burst}, {refill_seconds}")
        self._burst = float(burst)
        self._rate = 1.0 / refill_seconds
        self._max_clients = max_clients
        self._lock = threading.Lock()
        #: client -> (tokens, when they were counted)
        self._clients: dict[str, tuple[float, float]] = {}

    def take(self, client: str, now: float) -> int | None:
        """Spend one check: the client's standing before it (checks spent and not yet back,
        0 for a client in good standing), or None when its budget is spent."""
        with self._lock:
            tokens = self._tokens(client, now)
            if tokens < 1.0:
                self._clients[client] = (tokens, now)
                return None
            if client not in self._clients and len(self._clients) >= self._max_clients:
                self._forget_some(now)
            self._clients[client] = (tokens - 1.0, now)
            return math.ceil(self._burst - tokens)

    def give_back(self, client: str, now: float) -> None:
        with self._lock:
            if client in self._clients:
                self._clients[client] = (min(self._burst, self._tokens(client, now) + 1.0), now)

    def _tokens(self, client: str, now: float) -> float:
        tokens, then = self._clients.get(client, (self._burst, now))
        return min(self._burst, tokens + (now - then) * self._rate)

    def _forget_some(self, now: float) -> None:
        # Clients whose budget is whole again carry no information; else drop the oldest.
        whole = [c for c in self._clients if self._tokens(c, now) >= self._burst]
        for client in whole or list(self._clients)[: max(1, self._max_clients // 8)]:
            del self._clients[client]


@dataclass(order=True, slots=True)
class _Waiter:
    standing: int
    arrival: int
    woken: threading.Event = field(default_factory=threading.Event, compare=False)
    granted: bool = field(default=False, compare=False)
    shed: bool = field(default=False, compare=False)


class _PriorityGate:
    """At most ``slots`` holders at once; waiters get in by (standing, arrival), lowest first."""

    def __init__(self, slots: int, max_waiting: int) -> None:
        if slots < 1 or max_waiting < 1:
            raise ValueError(f"the gate needs slots >= 1 and max_waiting >= 1, got {slots}, {max_waiting}")
        self._free = slots
        self._max_waiting = max_waiting
        self._waiting: list[_Waiter] = []  # a heap
        self._arrivals = itertools.count()
        self._lock = threading.Lock()

    @property
    def waiting(self) -> int:
        with self._lock:
            return len(self._waiting)

    def acquire(self, standing: int, timeout: float) -> bool:
        """Take a slot, waiting at most ``timeout`` seconds; False when shed or timed out."""
        with self._lock:
            if self._free:
                self._free -= 1
                return True
            waiter = _Waiter(standing, next(self._arrivals))
            if len(self._waiting) >= self._max_waiting:
                worst = max(self._waiting)
                if worst.standing <= standing:
                    return False  # everyone waiting is placed at least as well
                self._waiting.remove(worst)
                heapq.heapify(self._waiting)
                worst.shed = True
                worst.woken.set()
            heapq.heappush(self._waiting, waiter)
        waiter.woken.wait(timeout)
        with self._lock:
            if waiter.granted:
                return True
            if not waiter.shed:  # timed out
                self._waiting.remove(waiter)
                heapq.heapify(self._waiting)
            return False

    def release(self) -> None:
        with self._lock:
            if self._waiting:
                waiter = heapq.heappop(self._waiting)
                waiter.granted = True
                waiter.woken.set()
            else:
                self._free += 1


def _parse_basic(header: str | None) -> tuple[str, bytes] | None:
    if not header:
        return None
    scheme, _, encoded = header.strip().partition(" ")
    if scheme.lower() != "basic" or not encoded:
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, sep, password = decoded.partition(b":")
    if not sep:
        return None
    try:
        return user.decode("utf-8"), password
    except UnicodeDecodeError:
        return None
