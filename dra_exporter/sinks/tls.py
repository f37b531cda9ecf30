"""TLS for the scrape endpoint: the server ``SSLContext`` from ``TlsSettings``, rebuilt when its
files change, and the client-certificate SAN check.

- ``build_ssl_context(settings)`` builds the context (TLS 1.2-1.3, no renegotiation, the
  configured TLS 1.2 suites and curve, client-certificate verification, ALPN ``http/1.1``);
  any problem with the files is a ``TlsError`` whose one line names the file at fault and never
  quotes its content. OpenSSL is never let to prompt for a key's passphrase.
- ``TlsContexts`` gives the server's ``ssl.SSLContext`` and rebuilds it when the certificate,
  key or CA files change on disk, so a rotated certificate (cert-manager) is used by the
  next connection without a restart; a broken rotation keeps the last good context.
- ``peer_san_allowed`` is ``client_allowed_sans`` applied to a verified client certificate.

``TlsSettings`` come from a web-config file (``sinks.webconfig``, which checks every value).
"""

from __future__ import annotations

import ipaddress
import logging
import os
import ssl
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..boundedio import require_regular_file

TLS_VERSIONS: Mapping[str, ssl.TLSVersion] = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}

log = logging.getLogger(__name__)


class TlsError(ValueError):
    """The TLS files cannot be used; the message is one line naming the file, without key material."""


@dataclass(frozen=True, slots=True)
class TlsSettings:
    """``tls_server_config``, with file paths made absolute."""

    cert_file: str
    key_file: str
    client_auth_type: str = "NoClientCert"
    client_ca_file: str = ""
    client_allowed_sans: tuple[str, ...] = ()
    min_version: str = "TLS12"
    max_version: str = "TLS13"
    ciphers: tuple[str, ...] = ()
    """OpenSSL names of the TLS 1.2 suites allowed (empty: OpenSSL's defaults)."""
    curve: str = ""
    """The one OpenSSL curve for key exchange (empty: OpenSSL's defaults)."""
    prefer_server_ciphers: bool = True
    """exporter-toolkit's default, and Python's."""

    @property
    def verifies_clients(self) -> bool:
        return self.client_auth_type in ("VerifyClientCertIfGiven", "RequireAndVerifyClientCert")

    def describe(self) -> str:
        """For the start-up log line: what a client must bring (never a path's content)."""
        clients = {"RequireAndVerifyClientCert": "client certificate required",
                   "VerifyClientCertIfGiven": "client certificate verified if given"}.get(
            self.client_auth_type, "no client certificate")
        return f"TLS {self.min_version}-{self.max_version}, {clients}"


class _EncryptedKey(Exception):
    """Raised from OpenSSL's password callback: we never prompt for a passphrase."""


def _refuse_passphrase() -> bytes:
    # Without a callback OpenSSL would prompt on the terminal, hanging a daemon at start-up.
    raise _EncryptedKey


def build_ssl_context(tls: TlsSettings, label: str = "") -> ssl.SSLContext:
    """A server ``SSLContext`` for ``tls``; raises ``TlsError`` naming the file at fault."""
    prefix = f"web config {label}: tls_server_config" if label else "tls_server_config"
    for key, path in (("cert_file", tls.cert_file), ("key_file", tls.key_file), ("client_ca_file", tls.client_ca_file)):
        if path:
            _check_readable(prefix, key, path)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = TLS_VERSIONS[tls.min_version]
    ctx.maximum_version = TLS_VERSIONS[tls.max_version]
    # Client-initiated renegotiation only lets a client make the server work harder.
    ctx.options |= ssl.OP_NO_RENEGOTIATION
    if tls.prefer_server_ciphers:
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    else:
        ctx.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE
    if tls.ciphers:
        ctx.set_ciphers(":".join(tls.ciphers))  # TLS 1.2 and below only; checked at load
    if tls.curve:
        ctx.set_ecdh_curve(tls.curve)
    try:
        ctx.load_cert_chain(tls.cert_file, tls.key_file, password=_refuse_passphrase)
    except _EncryptedKey:
        raise TlsError(f"{prefix}.key_file: {tls.key_file} is encrypted; give an unencrypted key "
                             "(protect it with file permissions)") from None
    except ssl.SSLError as e:
        raise TlsError(f"{prefix}: cannot use cert_file {tls.cert_file} with key_file {tls.key_file}: "
                             f"{_ssl_reason(e)}") from None
    if tls.verifies_clients:
        try:
            ctx.load_verify_locations(cafile=tls.client_ca_file)
        except ssl.SSLError as e:
            raise TlsError(f"{prefix}.client_ca_file: {tls.client_ca_file} holds no usable CA certificate: "
                                 f"{_ssl_reason(e)}") from None
        ctx.verify_mode = ssl.CERT_REQUIRED if tls.client_auth_type == "RequireAndVerifyClientCert" \
            else ssl.CERT_OPTIONAL
    # HTTP/1.1 only; say so, so HTTP/2-capable clients do not try h2.
    ctx.set_alpn_protocols(["http/1.1"])
    return ctx


def _check_readable(prefix: str, key: str, path: str) -> None:
    try:
        require_regular_file(path)  # ssl's own open would block on a FIFO for ever
    except FileNotFoundError:
        raise TlsError(f"{prefix}.{key}: {path}: no such file") from None
    except OSError as e:
        raise TlsError(f"{prefix}.{key}: {path}: cannot read it: {e.strerror}") from None


def _ssl_reason(e: ssl.SSLError) -> str:
    # OpenSSL's reason codes (KEY_VALUES_MISMATCH, NO_START_LINE, ...) name the problem and
    # never quote file content.
    reason = (e.reason or ("PEM_LIB" if "PEM lib" in str(e) else "")).replace("_", " ").lower()
    return {"key values mismatch": "the key does not belong to the certificate",
            "no start line": "not a PEM file",
            "pem lib": "not a PEM certificate and key",
            "no certificate or crl found": "no PEM certificate in it",
            }.get(reason, reason or "OpenSSL could not load it")


def peer_san_allowed(peer_cert: Mapping[str, Any] | None, allowed: tuple[str, ...]) -> bool:
    """Whether a verified client certificate (``SSLSocket.getpeercert()``) has an allowed SAN.

    DNS names, e-mail addresses and URIs compare as strings; IP addresses as addresses, since
    Python spells IPv6 SANs in full (``0:0:0:0:0:0:0:1``).
    """
    if not allowed:
        return True
    if not peer_cert:
        return False
    wanted_ips = set()
    for value in allowed:
        try:
            wanted_ips.add(ipaddress.ip_address(value))
        except ValueError:
            pass
    for kind, value in peer_cert.get("subjectAltName", ()):
        if kind == "IP Address":
            try:
                if ipaddress.ip_address(value.strip()) in wanted_ips:
                    return True
            except ValueError:
                continue
        elif value in allowed:
            return True
    return False


class TlsContexts:
    """The current server ``SSLContext``, rebuilt when its files change on disk.

    ``context()`` is called once per connection, in that connection's thread; it looks at
    the files' stat at most every ``check_interval`` seconds, so a handshake never waits for
    more than a few ``stat`` calls.
    """

    def __init__(self, tls: TlsSettings, *, check_interval: float = 1.0,
                 monotonic: Callable[[], float] = time.monotonic, logger: logging.Logger | None = None) -> None:
        self.settings = tls
        self._interval = check_interval
        self._monotonic = monotonic
        self._log = logger or log
        self._lock = threading.Lock()
        self._files = tuple(p for p in (tls.cert_file, tls.key_file, tls.client_ca_file) if p)
        self._stamp = self._stat()
        self._context = build_ssl_context(tls)
        self._checked = monotonic()
        self._failed = ""
        #: How many times the files changed and a new context was built.
        self.reloads = 0

    def context(self) -> ssl.SSLContext:
        now = self._monotonic()
        with self._lock:
            if now - self._checked >= self._interval:
                self._checked = now
                self._maybe_reload()
            return self._context

    def _stat(self) -> tuple[tuple[int, int, int], ...]:
        stamps = []
        for path in self._files:
            try:
                st = os.stat(path)
                stamps.append((st.st_ino, st.st_size, st.st_mtime_ns))
            except OSError:
                stamps.append((0, 0, 0))
        return tuple(stamps)

    def _maybe_reload(self) -> None:
        stamp = self._stat()
        if stamp == self._stamp:
            return
        try:
            context = build_ssl_context(self.settings)
        except TlsError as e:
            # Half-written files during a rotation are normal: keep serving with the last
            # good certificate and try again at the next check.
            if str(e) != self._failed:
                self._log.warning("TLS files changed but cannot be used (keeping the previous ones): %s", e)
                self._failed = str(e)
            return
        self._stamp, self._context, self._failed = stamp, context, ""
        self.reloads += 1
        self._log.info("TLS certificate files changed; new connections use them")
