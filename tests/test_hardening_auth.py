"""Issue #13, items 2 and 12: basic auth under a flood of wrong passwords, and web-config files
as operators bring them (duplicate keys, node_exporter's TLS keys, empty files, odd files).

No test here times anything: the bcrypt flood is measured by ``benchmarks/bench_auth.py``;
these tests prove the mechanism (who gets the next bcrypt, who gets none at all).
"""

from __future__ import annotations

import base64
import functools
import http.client
import logging
import os
import socket
import ssl
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import bcrypt
import pytest
from certs import Pki, make_pki
from simnode import eventually

from dra_exporter import catalog, model
from dra_exporter.sinks.basicauth import AuthVerdict, BasicAuth, client_key
from dra_exporter.sinks.prometheus import PrometheusSink
from dra_exporter.sinks.tls import build_ssl_context
from dra_exporter.sinks.webconfig import WebConfig, WebConfigError, load_web_config

PASSWORD = "correct horse battery staple"
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4))  # cost 4: fast tests
#: Time allowed to a thread that must finish; only a hang ever reaches it.
HANG_GUARD_S = 30.0


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def header(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def tiny_frame() -> model.Frame:
    spec = catalog.BUILD_INFO
    return model.Frame((model.Family(spec.name, (model.Sample(tuple((lbl, "x") for lbl in spec.labels), 1.0),)),))


@contextmanager
def serving(config: WebConfig) -> Iterator[PrometheusSink]:
    sink = PrometheusSink("127.0.0.1:0", web_config=config)
    sink.start()
    sink.publish(tiny_frame())
    try:
        yield sink
    finally:
        sink.stop()


def get(port: int, *, source: str = "127.0.0.1", headers: dict[str, str] | None = None,
        ctx: ssl.SSLContext | None = None) -> tuple[int, dict[str, str]]:
    """GET /metrics from the loopback address ``source`` (all of 127/8 is the loopback)."""
    conn: http.client.HTTPConnection
    if ctx is None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=(source, 0))
    else:
        conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, source_address=(source, 0), context=ctx)
    try:
        conn.request("GET", "/metrics", headers=headers or {})
        response = conn.getresponse()
        response.read()
        return response.status, {k.lower(): v for k, v in response.getheaders()}
    finally:
        conn.close()


class BcryptSpy:
    """Stands in for ``bcrypt.checkpw``: records each call, can hold calls until released,
    then runs the real check."""

    def __init__(self, real: Callable[[bytes, bytes], bool]) -> None:
        self.real = real
        self.calls: list[tuple[bytes, bytes]] = []
        self.inside = 0
        self.release = threading.Event()
        self.release.set()
        self.barrier: threading.Barrier | None = None
        self._lock = threading.Lock()

    def __call__(self, password: bytes, hashed: bytes) -> bool:
        with self._lock:
            self.calls.append((password, hashed))
            self.inside += 1
        try:
            if self.barrier is not None:
                self.barrier.wait()
            self.release.wait(HANG_GUARD_S)
            return self.real(password, hashed)
        finally:
            with self._lock:
                self.inside -= 1

    @property
    def passwords(self) -> list[str]:
        return [p.decode() for p, _ in self.calls]


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> BcryptSpy:
    spy = BcryptSpy(bcrypt.checkpw)
    monkeypatch.setattr(bcrypt, "checkpw", spy)
    return spy


def in_thread(target: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(target()), daemon=True)
    thread.start()
    return thread, result


# --- item 2: the bcrypt flood ------------------------------------------------------------------------


def test_unknown_users_run_bcrypt_against_a_dummy_hash_of_the_users_cost(spy: BcryptSpy) -> None:
    """Before: the first user's own hash stood in for unknown users. Now a dummy hash, of the
    cost most users have, is checked: an unknown user costs one bcrypt like a known one."""
    users = (("a", bcrypt.hashpw(b"pa", bcrypt.gensalt(5))), ("b", bcrypt.hashpw(b"pb", bcrypt.gensalt(5))),
             ("c", bcrypt.hashpw(b"pc", bcrypt.gensalt(4))))
    auth = BasicAuth(users)
    assert auth.verdict(header("nobody", "pa"), "10.0.0.1") is AuthVerdict.DENIED
    assert auth.verdict(header("a", "wrong"), "10.0.0.1") is AuthVerdict.DENIED
    assert len(spy.calls) == 2, "the unknown user ran bcrypt, as the known one did"
    (_, dummy), (_, known) = spy.calls
    assert known == users[0][1]
    assert dummy not in {h for _, h in users}, "no real user's hash stands in for unknown users"
    assert dummy[:7] == b"$2b$05$", "the dummy hash has the users' usual cost"
    assert not bcrypt.checkpw(b"pa", dummy) and not bcrypt.checkpw(b"", dummy)


def test_good_logins_are_not_queued_behind_failures(spy: BcryptSpy) -> None:
    """One bcrypt slot, held by an attacker; three attackers' checks wait, then a good login
    from a client that has not failed: it gets the slot next, ahead of all three."""
    auth = BasicAuth((("prometheus", HASH),), slots=1)
    for i in (1, 2, 3):  # each attacker has failed once already
        assert auth.verdict(header("prometheus", f"guess {i}"), f"10.0.0.{i}") is AuthVerdict.DENIED
    spy.calls.clear()
    spy.release.clear()
    threads = [in_thread(lambda: auth.verdict(header("prometheus", "blocker"), "10.0.0.1"))]
    eventually(lambda: spy.inside == 1)
    for i in (2, 3, 1):
        threads.append(in_thread(functools.partial(auth.verdict, header("prometheus", f"again {i}"), f"10.0.0.{i}")))
    eventually(lambda: auth.waiting == 3)
    threads.append(in_thread(lambda: auth.verdict(header("prometheus", PASSWORD), "10.0.0.9")))
    eventually(lambda: auth.waiting == 4)
    spy.release.set()
    for thread, _ in threads:
        thread.join(HANG_GUARD_S)
    assert spy.passwords[:2] == ["blocker", PASSWORD], spy.passwords
    assert [r for _, r in threads] == [[AuthVerdict.DENIED]] * 4 + [[AuthVerdict.OK]]


def test_a_client_that_logged_in_before_goes_ahead_of_a_flood_from_fresh_addresses(spy: BcryptSpy) -> None:
    """Hardening IV, item 8: attackers on ever new addresses have not failed yet either, so standing
    alone put a good login behind every one of them that came first (2.4 s from 300 addresses).
    A client with a recent success goes first: here, ahead of three fresh attackers that waited."""
    now = [0.0]
    auth = BasicAuth((("prometheus", HASH),), slots=1, monotonic=lambda: now[0])
    assert auth.verdict(header("prometheus", PASSWORD), "10.0.0.9") is AuthVerdict.OK  # Prometheus, earlier
    now[0] += 120  # its remembered success has expired: the next login is a real bcrypt
    spy.calls.clear()
    spy.release.clear()
    threads = [in_thread(lambda: auth.verdict(header("prometheus", "blocker"), "10.0.1.1"))]
    eventually(lambda: spy.inside == 1)
    for i in (2, 3, 4):  # fresh addresses: standing 0, like a client that never failed
        threads.append(in_thread(functools.partial(auth.verdict, header("prometheus", f"guess {i}"), f"10.0.1.{i}")))
        eventually(lambda i=i: auth.waiting == i - 1)
    threads.append(in_thread(lambda: auth.verdict(header("prometheus", PASSWORD), "10.0.0.9")))
    eventually(lambda: auth.waiting == 4)
    spy.release.set()
    for thread, _ in threads:
        thread.join(HANG_GUARD_S)
    assert spy.passwords[:2] == ["blocker", PASSWORD], spy.passwords
    assert threads[-1][1] == [AuthVerdict.OK]


def test_bcrypt_checks_run_side_by_side_not_under_one_lock(spy: BcryptSpy) -> None:
    """With two slots, two checks are inside bcrypt at the same moment (under one global lock
    the second never enters while the first waits for it, and the barrier breaks)."""
    auth = BasicAuth((("prometheus", HASH),), slots=2)
    spy.barrier = threading.Barrier(2, timeout=HANG_GUARD_S)
    threads = [in_thread(functools.partial(auth.verdict, header("prometheus", f"guess {i}"), f"10.0.0.{i}"))
               for i in (1, 2)]
    for thread, _ in threads:
        thread.join(HANG_GUARD_S)
    assert not spy.barrier.broken
    assert [r for _, r in threads] == [[AuthVerdict.DENIED]] * 2


def test_a_full_waiting_room_sheds_the_worst_placed_check_never_a_better_one(spy: BcryptSpy) -> None:
    auth = BasicAuth((("prometheus", HASH),), slots=1, max_waiting=2, throttle_delay=0.0)
    for i in (1, 2, 3):
        assert auth.verdict(header("prometheus", f"guess {i}"), f"10.0.0.{i}") is AuthVerdict.DENIED
    spy.calls.clear()
    spy.release.clear()
    blocker = in_thread(lambda: auth.verdict(header("prometheus", "blocker"), "10.0.0.1"))
    eventually(lambda: spy.inside == 1)
    worse = in_thread(lambda: auth.verdict(header("prometheus", "again 1"), "10.0.0.1"))  # standing 2
    eventually(lambda: auth.waiting == 1)
    better = in_thread(lambda: auth.verdict(header("prometheus", "again 2"), "10.0.0.2"))  # standing 1
    eventually(lambda: auth.waiting == 2)
    good = in_thread(lambda: auth.verdict(header("prometheus", PASSWORD), "10.0.0.9"))  # standing 0
    worse[0].join(HANG_GUARD_S)
    assert worse[1] == [AuthVerdict.THROTTLED], "the worst-placed waiter made room for the good login"
    # The room is full of better-placed checks: a newcomer as badly placed as them is refused at once.
    assert auth.verdict(header("prometheus", "again 3"), "10.0.0.3") is AuthVerdict.THROTTLED
    spy.release.set()
    for thread, _ in (blocker, better, good):
        thread.join(HANG_GUARD_S)
    assert (better[1], good[1]) == ([AuthVerdict.DENIED], [AuthVerdict.OK])
    assert spy.passwords == ["blocker", PASSWORD, "again 2"], "shed checks never ran bcrypt"


def test_a_client_that_spent_its_failure_budget_is_throttled_without_bcrypt(spy: BcryptSpy) -> None:
    now = [0.0]
    auth = BasicAuth((("prometheus", HASH),), failure_burst=3, refill_seconds=5.0, throttle_delay=0.0,
                     monotonic=lambda: now[0])
    assert [auth.verdict(header("prometheus", f"guess {i}"), "10.0.0.1") for i in range(4)] == \
        [AuthVerdict.DENIED] * 3 + [AuthVerdict.THROTTLED]
    assert len(spy.calls) == 3, "the throttled check ran no bcrypt"
    assert auth.verdict(header("prometheus", PASSWORD), "10.0.0.1") is AuthVerdict.THROTTLED
    assert auth.verdict(header("prometheus", PASSWORD), "10.0.0.2") is AuthVerdict.OK, "other clients unaffected"
    assert auth.verdict(header("prometheus", PASSWORD), "10.0.0.1") is AuthVerdict.OK, \
        "a remembered good login passes even from a throttled client"
    assert auth.verdict(header("prometheus", "guess 9"), "10.0.0.1") is AuthVerdict.THROTTLED
    now[0] += 5.0  # one check comes back per refill period: a short back-off
    assert auth.verdict(header("prometheus", "guess 9"), "10.0.0.1") is AuthVerdict.DENIED
    assert auth.verdict(header("prometheus", "guess 10"), "10.0.0.1") is AuthVerdict.THROTTLED
    assert auth.retry_after == 5


def test_the_failure_budget_forgets_clients_beyond_its_bound() -> None:
    auth = BasicAuth((("prometheus", HASH),), failure_burst=1, max_clients=8)
    for i in range(64):
        auth.verdict(header("prometheus", f"guess {i}"), f"10.0.1.{i}")
    assert len(auth._budget._clients) <= 8


@pytest.mark.parametrize("peer, key", [
    ("10.1.2.3", "10.1.2.3"),
    ("::ffff:10.1.2.3", "10.1.2.3"),
    ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
    ("2001:db8:1:2:bbbb::7", "2001:db8:1:2::/64"),
    ("fe80::1%eth0", "fe80::/64"),
    ("", ""),
])
def test_one_ipv6_host_holds_a_whole_slash_64_and_spends_one_budget(peer: str, key: str) -> None:
    assert client_key(peer) == key


def test_over_http_throttled_clients_get_429_and_others_are_still_checked(tmp_path: Path, spy: BcryptSpy) -> None:
    path = tmp_path / "web.yml"
    path.write_text(f"basic_auth_users:\n  prometheus: {HASH.decode()}\n")
    with serving(load_web_config(path)) as sink:
        assert get(sink.port, source="127.0.0.1", headers={"Authorization": header("prometheus", PASSWORD)})[0] == 200
        statuses = [get(sink.port, source="127.0.0.1", headers={"Authorization": header("prometheus", f"g{i}")})
                    for i in range(11)]
        assert [s for s, _ in statuses] == [401] * 10 + [429]
        assert statuses[-1][1]["retry-after"] == "6" and "www-authenticate" not in statuses[-1][1]
        assert len(spy.calls) == 11, "one bcrypt for the login and each of the 10 failures; none for the 429"
        # Another address is checked as usual; a remembered login passes from the throttled one.
        assert get(sink.port, source="127.0.0.2", headers={"Authorization": header("prometheus", "g0")})[0] == 401
        assert get(sink.port, source="127.0.0.1", headers={"Authorization": header("prometheus", PASSWORD)})[0] == 200


# --- item 12: web-config files ------------------------------------------------------------------------


def run_serve(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dra_exporter.cli", "serve", "--simulate", "--listen",
                           "127.0.0.1:0", *args], capture_output=True, text=True, timeout=120, check=False,
                          env={**os.environ, "PYTHONPATH": os.environ.get("PYTHONPATH", "")})


def test_a_duplicate_key_exits_2_with_one_line(tmp_path: Path) -> None:
    """Before: YAML kept the second ``basic_auth_users`` block and silently dropped alice."""
    path = tmp_path / "web.yml"
    path.write_text(f"basic_auth_users:\n  alice: {HASH.decode()}\nbasic_auth_users:\n  bob: {HASH.decode()}\n")
    done = run_serve("--web-config", str(path))
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert f"web config {path}: invalid YAML at line 3, column 1: duplicate key 'basic_auth_users'" in done.stderr
    assert HASH.decode() not in done.stderr


@pytest.mark.parametrize("make, message", [
    (lambda p: os.mkfifo(p), "not a regular file"),
    (lambda p: p.symlink_to("/dev/zero"), "not a regular file"),
], ids=["fifo-without-a-writer", "dev-zero"])
def test_files_that_are_not_regular_are_refused_before_reading(tmp_path: Path, make, message: str) -> None:  # type: ignore[no-untyped-def]
    """Before: a FIFO with no writer blocked ``open()`` for ever; ``/dev/zero`` was read up to the cap."""
    path = tmp_path / "web.yml"
    make(path)
    thread, result = in_thread(lambda: _error_of(path))
    thread.join(HANG_GUARD_S)
    assert not thread.is_alive(), "load_web_config hung"
    assert result and message in str(result[0]) and "\n" not in str(result[0])


def _error_of(path: Path) -> str:
    try:
        load_web_config(path)
    except WebConfigError as e:
        return str(e)
    return "loaded"


def node_exporter_config(pki: Pki, folder: Path, extra: str) -> Path:
    path = folder / "node-exporter-web.yml"
    path.write_text(f"tls_server_config:\n  cert_file: {pki.server.cert}\n  key_file: {pki.server.key}\n"
                    f"  min_version: TLS12\n  max_version: TLS13\n{extra}")
    return path


def client(pki: Pki, *, tls12_cipher: str = "", curve: str = "") -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=pki.ca.cert)
    if tls12_cipher:
        ctx.maximum_version = ssl.TLSVersion.TLSv1_2
        ctx.set_ciphers(tls12_cipher)
    if curve:
        ctx.set_ecdh_curve(curve)
    return ctx


def test_a_node_exporter_tls_config_starts_applies_what_python_can_and_says_what_not_in_one_line(
        pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Before: cipher_suites, curve_preferences and prefer_server_cipher_suites were refused."""
    caplog.set_level(logging.INFO)
    path = node_exporter_config(pki, tmp_path, """  cipher_suites:
    - TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256
    - TLS_AES_128_GCM_SHA256
    - TLS_RSA_WITH_RC4_128_SHA
  curve_preferences: [CurveP384, X25519]
  prefer_server_cipher_suites: true
""")
    config = load_web_config(path)
    lines = [r.getMessage() for r in caplog.records if "not applied" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    for named in ("TLS_AES_128_GCM_SHA256", "TLS_RSA_WITH_RC4_128_SHA", "X25519", "only CurveP384"):
        assert named in lines[0]
    assert "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256" not in lines[0], "applied settings are not listed"
    with serving(config) as sink:
        assert get(sink.port, ctx=client(pki))[0] == 200  # TLS 1.3, OpenSSL's suites, on P-384
        assert get(sink.port, ctx=client(pki, tls12_cipher="ECDHE-ECDSA-AES128-GCM-SHA256"))[0] == 200
        with pytest.raises((ssl.SSLError, ConnectionError)):
            get(sink.port, ctx=client(pki, tls12_cipher="ECDHE-ECDSA-AES256-GCM-SHA384"))  # not listed
        assert get(sink.port, ctx=client(pki, curve="secp384r1"))[0] == 200
        with pytest.raises((ssl.SSLError, ConnectionError)):
            get(sink.port, ctx=client(pki, curve="prime256v1"))  # only the first curve is offered


def test_prefer_server_cipher_suites_sets_openssls_server_preference(pki: Pki, tmp_path: Path) -> None:
    for value, expected in (("true", True), ("false", False)):
        config = load_web_config(node_exporter_config(pki, tmp_path, f"  prefer_server_cipher_suites: {value}\n"))
        assert config.tls is not None and config.not_applied == ()
        ctx = build_ssl_context(config.tls)
        assert bool(ctx.options & ssl.OP_CIPHER_SERVER_PREFERENCE) is expected


def test_an_empty_web_config_serves_plain_http(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "web.yml"
    path.write_text("")
    with caplog.at_level(logging.WARNING):
        config = load_web_config(path)
    assert "serving plain HTTP without authentication" in caplog.text
    with serving(config) as sink:
        assert get(sink.port)[0] == 200


def test_the_tls_port_stays_usable_for_a_client_that_cannot_connect(pki: Pki, tmp_path: Path) -> None:
    """A client refused for its curve does not take the server down with it."""
    config = load_web_config(node_exporter_config(pki, tmp_path, "  curve_preferences: [CurveP521]\n"))
    with serving(config) as sink:
        with pytest.raises((ssl.SSLError, ConnectionError)):
            get(sink.port, ctx=client(pki, curve="prime256v1"))
        with socket.create_connection(("127.0.0.1", sink.port), timeout=10):
            pass
        assert get(sink.port, ctx=client(pki))[0] == 200
