"""``--web-config``: the exporter-toolkit file format, TLS, client certificates, basic auth.

Every TLS test runs against a throw-away PKI made here (``tests/certs.py``) and the real
``PrometheusSink`` on a loopback port.
"""

from __future__ import annotations

import base64
import http.client
import logging
import os
import socket
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import bcrypt
import pytest
from certs import Pair, Pki, common_name, make_pki, new_server_pair
from simnode import eventually

from dra_exporter import catalog, model
from dra_exporter.sinks.basicauth import BasicAuth
from dra_exporter.sinks.prometheus import PrometheusSink
from dra_exporter.sinks.tls import TlsContexts, TlsSettings
from dra_exporter.sinks.webconfig import WebConfig, WebConfigError, load_web_config

PASSWORD = "correct horse battery staple"
WRONG = "hunter2-but-wrong"
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()  # cost 4: fast tests
OTHER_HASH = bcrypt.hashpw(b"other secret", bcrypt.gensalt(4)).decode()
#: Ways a TLS client can learn it was turned away (TLS 1.3 clients may only see it on read).
REJECTED = (ssl.SSLError, ConnectionError)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def write_config(folder: Path, text: str, name: str = "web.yml") -> Path:
    path = folder / name
    path.write_text(text)
    return path


def tls_block(pki: Pki, **extra: str | list[str]) -> str:
    lines = [f"  cert_file: {pki.server.cert}", f"  key_file: {pki.server.key}"]
    for key, value in extra.items():
        lines.append(f"  {key}: {value if isinstance(value, str) else '[' + ', '.join(value) + ']'}")
    return "tls_server_config:\n" + "\n".join(lines) + "\n"


def tiny_frame() -> model.Frame:
    spec = catalog.BUILD_INFO
    return model.Frame((model.Family(spec.name, (model.Sample(tuple((lbl, "x") for lbl in spec.labels), 1.0),)),))


@contextmanager
def serving(config: WebConfig | None, **kwargs: float) -> Iterator[PrometheusSink]:
    sink = PrometheusSink("127.0.0.1:0", web_config=config, **kwargs)  # type: ignore[arg-type]
    sink.start()
    sink.publish(tiny_frame())
    try:
        yield sink
    finally:
        sink.stop()


def client_context(pki: Pki, cert: Pair | None = None, *, max_version: ssl.TLSVersion | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=pki.ca.cert)
    if cert is not None:
        ctx.load_cert_chain(cert.cert, cert.key)
    if max_version is not None:
        ctx.maximum_version = max_version
    return ctx


def get(port: int, path: str = "/metrics", *, ctx: ssl.SSLContext | None = None,
        headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    conn: http.client.HTTPConnection
    if ctx is None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    else:
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=ctx, timeout=10)
    try:
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        return response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
    finally:
        conn.close()


def basic(user: str, password: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}


# --- loading -----------------------------------------------------------------------------------


def test_full_config_loads_with_paths_relative_to_the_config_file(pki: Pki) -> None:
    path = write_config(pki.folder, f"""
tls_server_config:
  cert_file: server.crt
  key_file: server.key
  client_auth_type: RequireAndVerifyClientCert
  client_ca_file: ca.crt
  client_allowed_sans: [prometheus.monitoring.svc]
  min_version: TLS13
http_server_config:
  http2: true
  headers:
    X-Content-Type-Options: nosniff
    strict-transport-security: max-age=31536000
    X-XSS-Protection: ""
basic_auth_users:
  prometheus: {HASH}
""", "relative.yml")
    config = load_web_config(path)
    assert config.tls == TlsSettings(
        cert_file=pki.server.cert, key_file=pki.server.key, client_auth_type="RequireAndVerifyClientCert",
        client_ca_file=pki.ca.cert, client_allowed_sans=("prometheus.monitoring.svc",),
        min_version="TLS13", max_version="TLS13")
    assert config.users == (("prometheus", HASH.encode()),)
    # Header names are canonicalised; a blank value means "unset", as with exporter-toolkit.
    assert config.headers == (("X-Content-Type-Options", "nosniff"), ("Strict-Transport-Security", "max-age=31536000"))
    assert "client certificate required" in config.describe() and "basic auth (1 user)" in config.describe()


def test_empty_file_means_plain_http_without_auth_with_a_warning(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    # As exporter-toolkit: an empty file serves plain HTTP. A file was given on purpose, so say so.
    caplog.set_level(logging.WARNING)
    for name, text in (("empty.yml", ""), ("comments.yml", "# nothing yet\n"),
                       ("empty-tls.yml", "tls_server_config: {}\n")):
        caplog.clear()
        config = load_web_config(write_config(tmp_path, text, name))
        assert (config.tls, config.users, config.headers) == (None, (), ())
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "serving plain HTTP without authentication" in warnings[0], warnings
        assert name in warnings[0]
    caplog.clear()
    load_web_config(write_config(tmp_path, f"basic_auth_users:\n  alice: {HASH}\n", "users.yml"))
    assert not caplog.records, "a file that configures something is not warned about"


def test_repr_never_shows_hashes(pki: Pki) -> None:
    config = load_web_config(write_config(pki.folder, f"basic_auth_users:\n  alice: {HASH}\n", "repr.yml"))
    assert HASH not in repr(config) and HASH not in str(config)


BAD_CONFIGS = [
    ("listen: 1\n", "listen: unknown key"),
    ("- a\n- b\n", "must be a YAML mapping"),
    ("tls_server_config: [1]\n", "tls_server_config: must be a mapping"),
    ("rate_limit: {interval: 1s}\n", "rate_limit: rate limiting is not supported"),
    ("{tls}  cipher_suites: [TLS_RSA_WITH_NULL]\n", "cipher_suites: unknown cipher suite 'TLS_RSA_WITH_NULL'"),
    ("{tls}  cipher_suites: TLS_AES_128_GCM_SHA256\n", "cipher_suites: must be a list of cipher suite names"),
    ("{tls}  cipher_suites: [TLS_RSA_WITH_RC4_128_SHA]\n", "cipher_suites: none of the TLS 1.2 suites listed"),
    ("{tls}  curve_preferences: [P256]\n", "curve_preferences: unknown curve 'P256'"),
    ("{tls}  curve_preferences: [X25519MLKEM768]\n", "curve_preferences: none of the curves listed"),
    ("{tls}  prefer_server_cipher_suites: maybe\n", "prefer_server_cipher_suites: must be true or false"),
    ("tls_server_config:\n  cert: inline\n", "cert: inline certificates are not supported"),
    ("tls_server_config:\n  cert_flie: a\n", "cert_flie: unknown key"),
    ("tls_server_config:\n  cert_file: a\n", "cert_file and key_file are both required"),
    ("{tls}  client_auth_type: Sometimes\n", "'Sometimes' is not one of NoClientCert"),
    ("{tls}  client_auth_type: RequireAnyClientCert\n", "RequireAnyClientCert accepts any self-signed"),
    ("{tls}  client_ca_file: {ca}\n", "client_ca_file is set but client_auth_type is NoClientCert"),
    ("{tls}  client_auth_type: RequireAndVerifyClientCert\n", "needs client_ca_file"),
    ("{tls}  client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: {ca}\n  client_allowed_sans: [x]\n",
     "client_allowed_sans needs client_auth_type: RequireAndVerifyClientCert"),
    ("{tls}  min_version: TLS10\n", "TLS10 is obsolete"),
    ("{tls}  min_version: SSL3\n", "'SSL3' is not one of TLS12, TLS13"),
    ("{tls}  min_version: TLS13\n  max_version: TLS12\n", "min_version TLS13 is newer than max_version TLS12"),
    ("{tls}  min_version: 1.2\n", "min_version: must be a string"),
    ("tls_server_config:\n  cert_file: /nonexistent/server.crt\n  key_file: /nonexistent/server.key\n",
     "cert_file: /nonexistent/server.crt: no such file"),
    ("tls_server_config:\n  cert_file: {ca}\n  key_file: {server_key}\n", "the key does not belong to the certificate"),
    ("tls_server_config:\n  cert_file: {web}\n  key_file: {server_key}\n", "not a PEM"),
    ("{tls}  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {web}\n", "holds no usable CA"),
    ("http_server_config:\n  headers:\n    Set-Cookie: a=b\n", "headers.Set-Cookie: this header cannot be configured"),
    ("http_server_config:\n  headers:\n    X-Frame-Options: allow\n", "'allow' is not one of deny, sameorigin"),
    ("http_server_config:\n  headers:\n    Content-Security-Policy: \"a\\r\\nSet-Cookie: x\"\n",
     "must not contain line breaks"),
    ("http_server_config:\n  http2: yes please\n", "http2: must be true or false"),
    ("basic_auth_users: [alice]\n", "basic_auth_users: must be a mapping"),
    ("basic_auth_users:\n  alice: plaintext-password\n", "basic_auth_users['alice']: not a bcrypt hash"),
    ("basic_auth_users:\n  alice: $2b$04$tooshort\n", "basic_auth_users['alice']: not a bcrypt hash"),
    ("basic_auth_users:\n  alice: 12345\n", "basic_auth_users['alice']: not a bcrypt hash"),
    ("basic_auth_users:\n  'a:b': {hash}\n", "cannot contain ':'"),
    ("basic_auth_users:\n  alice: {hash}\n  alice: {hash}\n",
     "invalid YAML at line 3, column 3: duplicate key 'alice'"),
    ("basic_auth_users:\n  alice: {hash}\nbasic_auth_users:\n  bob: {hash}\n",
     "line 3, column 1: duplicate key 'basic_auth_users'"),
    ("{tls}  client_auth_type: NoClientCert\n  client_auth_type: RequireAndVerifyClientCert\n",
     "duplicate key 'client_auth_type'"),
    ("tls_server_config:\n  cert_file: [a\n", "invalid YAML at line 3"),
]


@pytest.mark.parametrize("text, message", BAD_CONFIGS, ids=[m for _, m in BAD_CONFIGS])
def test_bad_configs_are_one_line_errors_naming_file_and_field(pki: Pki, tmp_path: Path, text: str,
                                                               message: str) -> None:
    web = tmp_path / "web.yml"
    for placeholder, value in {"{tls}": tls_block(pki), "{ca}": pki.ca.cert, "{server_key}": pki.server.key,
                               "{web}": str(web), "{hash}": HASH}.items():
        text = text.replace(placeholder, value)
    web.write_text(text)
    with pytest.raises(WebConfigError) as err:
        load_web_config(web)
    line = str(err.value)
    assert message in line
    assert "\n" not in line and line.startswith(f"web config {web}")
    assert HASH not in line


@pytest.mark.parametrize("setup, message", [
    (lambda p: None, "no such file"),
    (lambda p: p.mkdir(), "is a directory"),
    (lambda p: p.write_bytes(b"\xff\xfe\x00bad"), "not a UTF-8 text file"),
    (lambda p: p.write_bytes(b"#" * (2 << 20)), "larger than 1 MiB"),
    (lambda p: p.write_text("basic_auth_users: " + "[" * 5000 + "]" * 5000), "YAML nested too deeply"),
])
def test_unreadable_files_are_one_line_errors(tmp_path: Path, setup, message: str) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "web.yml"
    setup(path)
    with pytest.raises(WebConfigError, match=message) as err:
        load_web_config(path)
    assert "\n" not in str(err.value)


def test_yaml_errors_do_not_quote_the_hash_line(tmp_path: Path) -> None:
    # PyYAML's own messages quote the offending line; ours give the position only.
    path = write_config(tmp_path, f'basic_auth_users:\n  alice: "{HASH}\n  bob: x\n')
    with pytest.raises(WebConfigError, match="invalid YAML at line") as err:
        load_web_config(path)
    assert HASH not in str(err.value) and HASH[7:30] not in str(err.value)


def test_encrypted_key_is_refused_without_prompting(pki: Pki, tmp_path: Path) -> None:
    from certs import issue, make_ca, write

    locked = write(tmp_path, "locked", issue(make_ca("ca"), "s", dns=("localhost",), server=True),
                   passphrase=b"key passphrase")
    path = write_config(tmp_path, f"tls_server_config:\n  cert_file: {locked.cert}\n  key_file: {locked.key}\n")
    with pytest.raises(WebConfigError, match="is encrypted; give an unencrypted key") as err:
        load_web_config(path)
    assert "key passphrase" not in str(err.value) and "PRIVATE KEY" not in str(err.value)


def test_key_material_never_appears_in_errors(pki: Pki, tmp_path: Path) -> None:
    key_text = Path(pki.server.key).read_text()
    body = "".join(key_text.splitlines()[1:-1])
    garbage = tmp_path / "half.key"
    garbage.write_text(key_text[: len(key_text) // 2])  # a key cut in half, as during a bad copy
    path = write_config(tmp_path, f"tls_server_config:\n  cert_file: {pki.server.cert}\n  key_file: {garbage}\n")
    with pytest.raises(WebConfigError) as err:
        load_web_config(path)
    assert body[:20] not in str(err.value) and body[-20:] not in str(err.value)


# --- TLS -------------------------------------------------------------------------------------


def test_tls_serves_metrics_and_probes(pki: Pki) -> None:
    config = load_web_config(write_config(pki.folder, tls_block(pki), "tls.yml"))
    with serving(config) as sink:
        status, headers, body = get(sink.port, ctx=client_context(pki))
        assert status == 200 and int(headers["content-length"]) == len(body) and b"dra_exporter_build_info" in body
        assert get(sink.port, "/healthz", ctx=client_context(pki))[0] == 200
        assert get(sink.port, "/readyz", ctx=client_context(pki))[0] == 200


def test_plain_http_to_the_tls_port_fails_cleanly_and_the_server_keeps_serving(pki: Pki) -> None:
    config = load_web_config(write_config(pki.folder, tls_block(pki), "tls.yml"))
    with serving(config) as sink:
        status, _, body = get(sink.port)  # plain HTTP
        assert status == 400 and b"HTTP request to an HTTPS server" in body
        with socket.create_connection(("127.0.0.1", sink.port), timeout=10) as junk:
            junk.sendall(b"\x00\x01\x02 not tls at all")
            assert junk.recv(100) == b""  # closed without an answer
        assert get(sink.port, ctx=client_context(pki))[0] == 200


def test_a_stalled_tls_handshake_does_not_block_other_clients(pki: Pki) -> None:
    """The handshake runs in the connection's thread: with it in the accept loop, the second
    client would wait for the first one's 60 s timeout and its own 10 s timeout would fire."""
    config = load_web_config(write_config(pki.folder, tls_block(pki), "tls.yml"))
    with serving(config, request_timeout=60) as sink:
        silent = socket.create_connection(("127.0.0.1", sink.port))
        half = socket.create_connection(("127.0.0.1", sink.port))
        half.sendall(b"\x16\x03\x01\x02\x00\x01")  # the start of a ClientHello, then silence
        try:
            for _ in range(3):
                assert get(sink.port, ctx=client_context(pki))[0] == 200
        finally:
            silent.close()
            half.close()


def test_a_trickling_tls_handshake_is_cut_at_the_request_deadline(pki: Pki) -> None:
    """The deadline watchdog covers the handshake: one byte every 0.2 s never trips a
    per-recv timeout, but the 1 s request deadline ends it."""
    config = load_web_config(write_config(pki.folder, tls_block(pki), "tls.yml"))
    with serving(config, request_timeout=1.0) as sink:
        with socket.create_connection(("127.0.0.1", sink.port), timeout=10) as slow:
            slow.sendall(b"\x16\x03\x01")
            cut = False
            for _ in range(300):  # 60 s at most, far beyond the deadline
                try:
                    slow.sendall(b"\x00")
                except OSError:
                    cut = True
                    break
                time.sleep(0.2)
            assert cut, "the trickling handshake was never cut"
        assert get(sink.port, ctx=client_context(pki))[0] == 200


@pytest.mark.parametrize("client, accepted", [("client", True), (None, False), ("stranger", False)],
                         ids=["trusted-cert", "no-cert", "cert-from-another-ca"])
def test_required_client_certificates(pki: Pki, client: str | None, accepted: bool) -> None:
    config = load_web_config(write_config(pki.folder, tls_block(
        pki, client_auth_type="RequireAndVerifyClientCert", client_ca_file=pki.ca.cert), "mtls.yml"))
    with serving(config) as sink:
        ctx = client_context(pki, getattr(pki, client) if client else None)
        if accepted:
            assert get(sink.port, ctx=ctx)[0] == 200
        else:
            with pytest.raises(REJECTED):
                get(sink.port, ctx=ctx)
        # Whatever happened to that client, a good one is still served.
        assert get(sink.port, ctx=client_context(pki, pki.client))[0] == 200


def test_verify_client_cert_if_given(pki: Pki) -> None:
    config = load_web_config(write_config(pki.folder, tls_block(
        pki, client_auth_type="VerifyClientCertIfGiven", client_ca_file=pki.ca.cert), "optional.yml"))
    with serving(config) as sink:
        assert get(sink.port, ctx=client_context(pki))[0] == 200
        assert get(sink.port, ctx=client_context(pki, pki.client))[0] == 200
        with pytest.raises(REJECTED):
            get(sink.port, ctx=client_context(pki, pki.stranger))


def test_request_client_cert_does_not_ask_for_one(pki: Pki) -> None:
    config = load_web_config(write_config(pki.folder, tls_block(pki, client_auth_type="RequestClientCert"),
                                          "request.yml"))
    with serving(config) as sink:
        assert get(sink.port, ctx=client_context(pki))[0] == 200
        assert get(sink.port, ctx=client_context(pki, pki.stranger))[0] == 200  # never asked, never checked


def test_client_allowed_sans(pki: Pki) -> None:
    config = load_web_config(write_config(pki.folder, tls_block(
        pki, client_auth_type="RequireAndVerifyClientCert", client_ca_file=pki.ca.cert,
        client_allowed_sans=["prometheus.monitoring.svc", "10.0.0.1"]), "sans.yml"))
    with serving(config) as sink:
        assert get(sink.port, ctx=client_context(pki, pki.client))[0] == 200
        with pytest.raises(REJECTED):
            get(sink.port, ctx=client_context(pki, pki.intruder))  # same CA, SAN not allowed


def test_min_version_tls13_refuses_tls12_clients(pki: Pki) -> None:
    config = load_web_config(write_config(pki.folder, tls_block(pki, min_version="TLS13"), "tls13.yml"))
    with serving(config) as sink:
        assert get(sink.port, ctx=client_context(pki))[0] == 200
        with pytest.raises(REJECTED):
            get(sink.port, ctx=client_context(pki, max_version=ssl.TLSVersion.TLSv1_2))


def test_rotated_certificate_files_are_used_without_a_restart(pki: Pki, tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    live = Pair(str(tmp_path / "live.crt"), str(tmp_path / "live.key"))
    first = new_server_pair(tmp_path, pki.ca, "first", "first-cert")
    os.replace(first.cert, live.cert)
    os.replace(first.key, live.key)
    config = load_web_config(write_config(tmp_path, f"tls_server_config:\n  cert_file: {live.cert}\n"
                                                    f"  key_file: {live.key}\n"))

    def served_name() -> str:
        with socket.create_connection(("127.0.0.1", sink.port), timeout=10) as raw, \
                client_context(pki).wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            return common_name(tls.getpeercert(binary_form=True) or b"")

    with serving(config) as sink:
        assert served_name() == "first-cert"
        # A broken rotation (a truncated certificate) keeps the last good one, with a warning.
        Path(live.cert).write_text("-----BEGIN CERTIFICATE-----\ntruncated\n")
        with caplog.at_level(logging.WARNING):
            # Files are looked at when a connection comes (at most once a second).
            eventually(lambda: served_name() == "first-cert" and "cannot be used" in caplog.text)
        second = new_server_pair(tmp_path, pki.ca, "second", "second-cert")
        os.replace(second.key, live.key)
        os.replace(second.cert, live.cert)
        eventually(lambda: served_name() == "second-cert")


def test_tls_contexts_reload_only_when_files_change(pki: Pki, tmp_path: Path) -> None:
    now = [0.0]
    live = new_server_pair(tmp_path, pki.ca, "live", "one")
    contexts = TlsContexts(TlsSettings(live.cert, live.key), check_interval=5.0, monotonic=lambda: now[0])
    first = contexts.context()
    now[0] = 10.0
    assert contexts.context() is first and contexts.reloads == 0  # nothing changed
    new_server_pair(tmp_path, pki.ca, "live", "two")  # rewrites live.crt/live.key
    now[0] = 12.0
    assert contexts.context() is first, "checked at most every check_interval"
    now[0] = 15.0
    assert contexts.context() is not first and contexts.reloads == 1


# --- basic auth ------------------------------------------------------------------------------------


def users_config(folder: Path, extra: str = "") -> WebConfig:
    return load_web_config(write_config(folder, f"{extra}basic_auth_users:\n  prometheus: {HASH}\n"
                                                f"  grafana: {OTHER_HASH}\n", "users.yml"))


@pytest.mark.parametrize("headers", [
    {}, basic("prometheus", WRONG), basic("nobody", PASSWORD), basic("grafana", PASSWORD),
    {"Authorization": "Bearer " + PASSWORD}, {"Authorization": "Basic !!!not-base64"},
    {"Authorization": "Basic " + base64.b64encode(b"no-colon").decode()},
], ids=["none", "wrong-password", "unknown-user", "other-users-password", "bearer", "bad-base64", "no-colon"])
def test_basic_auth_rejects(tmp_path: Path, headers: dict[str, str]) -> None:
    with serving(users_config(tmp_path)) as sink:
        status, response_headers, body = get(sink.port, headers=headers)
        assert status == 401 and body == b"unauthorized\n"
        assert response_headers["www-authenticate"].startswith("Basic realm=")
        assert get(sink.port, "/", headers=headers)[0] == 401, "the index page is protected too"


def test_basic_auth_accepts_the_right_password_and_probes_need_none(tmp_path: Path) -> None:
    with serving(users_config(tmp_path)) as sink:
        assert get(sink.port, headers=basic("prometheus", PASSWORD))[0] == 200
        assert get(sink.port, headers=basic("grafana", "other secret"))[0] == 200
        # kubelet probes cannot send credentials; they learn nothing but "ok".
        assert get(sink.port, "/healthz")[::2] == (200, b"ok\n")
        assert get(sink.port, "/readyz")[0] == 200


def test_basic_auth_and_client_certificates_together(pki: Pki) -> None:
    config = users_config(pki.folder, tls_block(pki, client_auth_type="RequireAndVerifyClientCert",
                                                client_ca_file=pki.ca.cert))
    with serving(config) as sink:
        ctx = client_context(pki, pki.client)
        assert get(sink.port, ctx=ctx)[0] == 401
        assert get(sink.port, ctx=ctx, headers=basic("prometheus", PASSWORD))[0] == 200
        with pytest.raises(REJECTED):
            get(sink.port, ctx=client_context(pki), headers=basic("prometheus", PASSWORD))


def test_checks_are_remembered_briefly_successes_and_failures() -> None:
    now = [100.0]
    auth = BasicAuth((("prometheus", HASH.encode()),), ttl=60.0, monotonic=lambda: now[0])
    good = basic("prometheus", PASSWORD)["Authorization"]
    bad = basic("prometheus", WRONG)["Authorization"]
    assert all(auth.check(good) for _ in range(20))
    assert auth.bcrypt_checks == 1, "a scrape every second must not pay a bcrypt each time"
    assert not any(auth.check(bad) for _ in range(3))
    assert auth.bcrypt_checks == 2, "a repeated wrong password is remembered (as exporter-toolkit caches it)"
    assert not auth.check(basic("prometheus", WRONG + "2")["Authorization"])
    assert auth.bcrypt_checks == 3, "another wrong password is checked"
    assert not auth.check(basic("nobody", PASSWORD)["Authorization"])
    assert auth.bcrypt_checks == 4, "unknown users cost a bcrypt too (no user enumeration by timing)"
    now[0] += 61.0
    assert auth.check(good) and auth.bcrypt_checks == 5, "the remembered success expired"
    assert not auth.check(bad) and auth.bcrypt_checks == 6, "the remembered failure expired"


def test_remembered_checks_stay_bounded() -> None:
    auth = BasicAuth((("u", bcrypt.hashpw(b"p", bcrypt.gensalt(4))),), max_entries=4)
    for i in range(10):
        assert not auth.check(basic("u", f"wrong {i}")["Authorization"], peer=f"10.0.0.{i}")
        auth._successes.add(bytes([i]), 0.0)
    assert len(auth._failures) <= 4 and len(auth._successes) <= 4


def test_passwords_longer_than_72_bytes_compare_like_htpasswd() -> None:
    long = "x" * 100
    auth = BasicAuth((("u", bcrypt.hashpw(long[:72].encode(), bcrypt.gensalt(4))),))
    assert auth.check(basic("u", long)["Authorization"])


# --- headers and secrets --------------------------------------------------------------------------


def test_configured_headers_are_on_every_response(tmp_path: Path) -> None:
    config = users_config(tmp_path, "http_server_config:\n  headers:\n    X-Frame-Options: deny\n"
                                    "    Content-Security-Policy: default-src 'none'\n")
    with serving(config) as sink:
        for path, headers, status in [("/metrics", basic("prometheus", PASSWORD), 200), ("/metrics", {}, 401),
                                      ("/nope", basic("prometheus", PASSWORD), 404), ("/healthz", {}, 200)]:
            got, response_headers, _ = get(sink.port, path, headers=headers)
            assert got == status
            assert response_headers["x-frame-options"] == "deny"
            assert response_headers["content-security-policy"] == "default-src 'none'"


def test_no_secret_reaches_the_logs(pki: Pki, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    config = users_config(pki.folder, tls_block(pki, client_auth_type="VerifyClientCertIfGiven",
                                                client_ca_file=pki.ca.cert))
    with serving(config) as sink:
        get(sink.port, ctx=client_context(pki), headers=basic("prometheus", PASSWORD))
        get(sink.port, ctx=client_context(pki), headers=basic("prometheus", WRONG))
        get(sink.port, ctx=client_context(pki), headers=basic(WRONG, PASSWORD))
        get(sink.port, headers=basic("prometheus", PASSWORD))  # plain HTTP to TLS
        with pytest.raises(REJECTED):
            get(sink.port, ctx=client_context(pki, pki.stranger), headers=basic("prometheus", PASSWORD))
    with pytest.raises(WebConfigError):
        load_web_config(write_config(tmp_path, f'basic_auth_users:\n  alice: "{HASH}\n'))
    logged = "\n".join(f"{r.getMessage()} {r.exc_text or ''}" for r in caplog.records)
    assert "basic auth failed" in logged and "TLS handshake failed" in logged, "the log was captured"
    key_body = "".join(Path(pki.server.key).read_text().splitlines()[1:-1])
    sent = [basic(user, password)["Authorization"].split()[1]
            for user, password in (("prometheus", PASSWORD), ("prometheus", WRONG), (WRONG, PASSWORD))]
    for secret in (PASSWORD, WRONG, HASH, OTHER_HASH, key_body[:24], *sent):
        assert secret not in logged


# --- privileges: no write access needed outside a temp dir ------------------------------------------


def _read_only_wrapper(tmpdir: Path) -> list[str] | None:
    """A command prefix under which the whole filesystem is read-only except ``tmpdir``.

    As root: a private mount namespace with ``/`` remounted read-only and ``tmpdir`` bind-mounted
    writable (root ignores file modes, so modes alone prove nothing). Without root: file modes
    do the job (the caller makes HOME and the working directory read-only). None when root
    cannot make a mount namespace here.
    """
    if os.geteuid() != 0:
        return []
    script = 'mount --bind "$TMPDIR" "$TMPDIR" && mount -o remount,bind,ro / && exec "$@"'
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh", "true"],
                           env={**os.environ, "TMPDIR": str(tmpdir)}, capture_output=True, check=False)
    if probe.returncode != 0:
        return None
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"]


def test_serve_needs_no_write_access_outside_its_temp_dir(tmp_path: Path) -> None:
    from promharness import free_port

    home, cwd, tmpdir = tmp_path / "home", tmp_path / "cwd", tmp_path / "tmp"
    for folder in (home, cwd, tmpdir):
        folder.mkdir()
    wrapper = _read_only_wrapper(tmpdir)
    if wrapper is None:
        pytest.skip("running as root without mount namespaces: cannot make the filesystem read-only")
    for folder in (home, cwd):
        folder.chmod(0o555)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "TMPDIR": str(tmpdir),
           "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    port = free_port()
    proc = subprocess.Popen([*wrapper, sys.executable, "-m", "dra_exporter.cli", "serve", "--simulate",
                             "--listen", f"127.0.0.1:{port}"], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        def ready() -> bool:
            assert proc.poll() is None, proc.communicate()[1].decode()[-2000:]
            try:
                return get(port, "/readyz")[0] == 200
            except OSError:
                return False

        eventually(ready, timeout=60, step=0.2)
        status, _, body = get(port)
        assert status == 200 and b"dra_gpu_up{" in body
    finally:
        proc.terminate()
        _, stderr = proc.communicate(timeout=30)
    text = stderr.decode()
    assert proc.returncode == 0, text[-2000:]
    assert "Traceback" not in text and "Read-only file system" not in text and " ERROR " not in text, text[-2000:]
    assert not list(home.iterdir()) and not list(cwd.iterdir())
    assert not list(tmpdir.iterdir()), f"left behind in TMPDIR: {list(tmpdir.iterdir())}"
