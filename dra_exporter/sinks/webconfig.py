"""The web-config file (``--web-config FILE``): TLS, client certificates, basic auth, headers.

The format is the Prometheus exporter-toolkit one, so a file written for node-exporter or
dcgm-exporter works here too::

    tls_server_config:
      cert_file: server.crt            # relative paths are relative to the config file
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert
      client_ca_file: clients-ca.crt
      client_allowed_sans: [prometheus.monitoring.svc]
      min_version: TLS12               # TLS12 (default) or TLS13
      max_version: TLS13
      cipher_suites: [TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256]   # Go's names; TLS 1.2 only
      curve_preferences: [X25519]      # Python's ssl sets one curve: the first listed
      prefer_server_cipher_suites: true
    http_server_config:
      headers: {X-Content-Type-Options: nosniff}
    basic_auth_users:
      prometheus: $2y$10$...           # bcrypt hash, e.g. from `htpasswd -nBC 10 "" | tr -d ':\\n'`

Contract:

- ``load_web_config(path)`` checks the whole file at start-up (YAML shape, every key and
  value, bcrypt hashes, and the certificate, key and CA files by building a TLS context
  once) and returns a frozen ``WebConfig``; any problem is a ``WebConfigError`` whose one
  line names the file and the field. The file is read by ``strict_yaml`` (a regular file of
  at most 1 MiB; a key repeated at any level is an error, as exporter-toolkit's strict
  unmarshalling makes it). Unknown keys are errors, and so are the toolkit keys dra-exporter
  does not implement: a security setting silently ignored is worse than a refusal to start.
  The TLS settings Python's ``ssl`` can apply only in part are applied as far as it can,
  and one warning line says what is not; a file that sets nothing serves plain HTTP (as
  exporter-toolkit does), with a warning.
- No message, log line or ``repr`` ever contains a password, a hash or key material.
- ``TlsContexts`` gives the server's ``ssl.SSLContext`` and rebuilds it when the certificate,
  key or CA files change on disk, so a rotated certificate (cert-manager) is used by the
  next connection without a restart; a broken rotation keeps the last good context.
- ``BasicAuth`` checks ``Authorization`` headers with bcrypt (tens of milliseconds, on
  purpose), at most two at a time and good clients first, remembers recent results so a
  scrape every second does not pay a bcrypt each time, and throttles clients that keep
  failing (429), so a flood of wrong passwords never keeps a right one waiting.

Differences from exporter-toolkit, each chosen on purpose:

- ``RequestClientCert`` never asks for a certificate: Python's TLS stack verifies every
  certificate it asks for, and an unverified one proves nothing (the toolkit does not read
  it either). ``RequireAnyClientCert`` is refused for the same reason; use
  ``RequireAndVerifyClientCert`` with ``client_ca_file``.
- ``min_version``/``max_version`` accept ``TLS12`` and ``TLS13``; TLS 1.0 and 1.1 are
  refused (deprecated by RFC 8996).
- ``http2`` is accepted and has no effect: the endpoint speaks HTTP/1.1 (ALPN says so).
- ``cipher_suites`` (Go's names) restrict the TLS 1.2 suites through OpenSSL's names; TLS
  1.3 suites cannot be chosen in Python's ``ssl`` (Go ignores them there too) and suites
  this OpenSSL lacks (RC4, 3DES) are skipped, both named in the warning. Of
  ``curve_preferences`` only the first curve OpenSSL has is used (``set_ecdh_curve`` sets
  one), never a curve the file did not list. ``prefer_server_cipher_suites`` sets OpenSSL's
  server preference (Go ignores it since 1.18). Unknown names are errors, as in the toolkit.
- Basic auth: a per-client budget of failed checks (429 with ``Retry-After`` once spent),
  two bcrypt slots handed out by the client's standing instead of one global lock. The
  toolkit has neither; its dummy hash for unknown users and its cache of results, failures
  included, are followed.
- Inline ``cert``/``key``/``client_ca`` and ``rate_limit`` are refused by name.
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
import logging
import math
import os
import re
import secrets
import ssl
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import strict_yaml

from ..boundedio import require_regular_file

CLIENT_AUTH_TYPES = ("NoClientCert", "RequestClientCert", "RequireAnyClientCert", "VerifyClientCertIfGiven",
                     "RequireAndVerifyClientCert")
TLS_VERSIONS: Mapping[str, ssl.TLSVersion] = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}

#: Response headers a web config may add, with their allowed values (None: any value).
#: The same list as exporter-toolkit, so the ecosystem stays consistent.
EXTRA_HEADERS: Mapping[str, tuple[str, ...] | None] = {
    "Strict-Transport-Security": None,
    "X-Content-Type-Options": ("nosniff",),
    "X-Frame-Options": ("deny", "sameorigin"),
    "X-XSS-Protection": None,
    "Content-Security-Policy": None,
}

#: A web config is a few lines; anything bigger is the wrong file.
_MAX_FILE_BYTES = 1 << 20
_BCRYPT_HASH = re.compile(rb"\$2[abxy]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}")
#: bcrypt only ever looked at the first 72 bytes of a password (htpasswd, Go and OpenBSD
#: truncate); the ``bcrypt`` package refuses longer ones instead, so we truncate as they do.
_BCRYPT_MAX_PASSWORD = 72

_TOP_KEYS = ("tls_server_config", "http_server_config", "basic_auth_users")
_TLS_KEYS = ("cert_file", "key_file", "client_auth_type", "client_ca_file", "client_allowed_sans",
             "min_version", "max_version", "cipher_suites", "curve_preferences", "prefer_server_cipher_suites")
_HTTP_KEYS = ("http2", "headers")
#: exporter-toolkit keys we know and do not implement, with what to do instead.
_UNSUPPORTED = {
    "rate_limit": "rate limiting is not supported by dra-exporter",
    "cert": "inline certificates are not supported; write it to a file and use cert_file",
    "key": "inline keys are not supported; write it to a file and use key_file",
    "client_ca": "inline CAs are not supported; write it to a file and use client_ca_file",
}

#: The cipher-suite names exporter-toolkit accepts (Go's ``tls.CipherSuites()`` and
#: ``tls.InsecureCipherSuites()``), with the OpenSSL name of each TLS 1.2 suite. The TLS 1.3
#: suites map to None: Python's ``ssl`` cannot choose them (and Go ignores them here too).
CIPHER_SUITES: Mapping[str, str | None] = {
    "TLS_RSA_WITH_AES_128_CBC_SHA": "AES128-SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA": "AES256-SHA",
    "TLS_RSA_WITH_AES_128_GCM_SHA256": "AES128-GCM-SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384": "AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
    "TLS_RSA_WITH_RC4_128_SHA": "RC4-SHA",
    "TLS_RSA_WITH_3DES_EDE_CBC_SHA": "DES-CBC3-SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA256": "AES128-SHA256",
    "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA": "ECDHE-ECDSA-RC4-SHA",
    "TLS_ECDHE_RSA_WITH_RC4_128_SHA": "ECDHE-RSA-RC4-SHA",
    "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA": "ECDHE-RSA-DES-CBC3-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256": "ECDHE-ECDSA-AES128-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256": "ECDHE-RSA-AES128-SHA256",
    "TLS_AES_128_GCM_SHA256": None,
    "TLS_AES_256_GCM_SHA384": None,
    "TLS_CHACHA20_POLY1305_SHA256": None,
}
#: exporter-toolkit's curve names, with OpenSSL's (None: not in OpenSSL 3.0).
CURVES: Mapping[str, str | None] = {
    "CurveP256": "prime256v1",
    "CurveP384": "secp384r1",
    "CurveP521": "secp521r1",
    "X25519": "X25519",
    "X25519MLKEM768": None,
}

log = logging.getLogger(__name__)


class WebConfigError(ValueError):
    """The web-config file is unreadable or invalid; the message is one line, without secrets."""


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


@dataclass(frozen=True, slots=True)
class WebConfig:
    """A checked web-config file. ``users`` holds bcrypt hashes and never shows in ``repr``."""

    path: str = ""
    tls: TlsSettings | None = None
    users: tuple[tuple[str, bytes], ...] = field(default=(), repr=False)
    headers: tuple[tuple[str, str], ...] = ()
    not_applied: tuple[str, ...] = ()
    """Settings of the file that Python's ssl cannot apply, each with the reason."""

    @property
    def empty(self) -> bool:
        """Whether the file configures nothing: plain HTTP, no auth, no headers."""
        return self.tls is None and not self.users and not self.headers

    @property
    def basic_auth(self) -> bool:
        return bool(self.users)

    def describe(self) -> str:
        parts = [self.tls.describe() if self.tls else "plain HTTP"]
        if self.users:
            parts.append(f"basic auth ({len(self.users)} user{'s' if len(self.users) > 1 else ''})")
        return ", ".join(parts)


# --- loading ------------------------------------------------------------------------------------


def load_web_config(path: str | os.PathLike[str]) -> WebConfig:
    """Read and check a web-config file; raises ``WebConfigError`` with one clear line."""
    label = os.fspath(path)
    config = _build(label, _parse(label))
    if config.tls is not None:
        build_ssl_context(config.tls, label)  # fail at start-up, not at the first scrape
    if config.empty:
        # exporter-toolkit serves plain HTTP too; say so, since a file was given on purpose.
        log.warning("web config %s sets neither TLS, basic auth nor headers: serving plain HTTP "
                    "without authentication", label)
    if config.not_applied:
        log.warning("web config %s: not applied, as Python's ssl cannot: %s", label, "; ".join(config.not_applied))
    return config


def _parse(label: str) -> Any:
    try:
        return strict_yaml.load(strict_yaml.read_text(label, _MAX_FILE_BYTES))
    except strict_yaml.YamlFileError as e:
        raise WebConfigError(f"web config {label}: {e}") from None


class _Fields:
    """A mapping from the file, with its place in the file for messages."""

    def __init__(self, label: str, where: str, value: Any, allowed: tuple[str, ...]) -> None:
        self.label, self.where = label, where
        if value is None:
            value = {}
        if not isinstance(value, dict):
            raise self.error(f"must be a mapping, got {_kind(value)}")
        for key in value:
            name = f"{where}.{key}" if where else str(key)
            if key in _UNSUPPORTED:
                raise WebConfigError(f"web config {label}: {name}: {_UNSUPPORTED[key]}")
            if key not in allowed:
                raise WebConfigError(f"web config {label}: {name}: unknown key (allowed here: {', '.join(allowed)})")
        self.value: dict[str, Any] = value

    def error(self, message: str, key: str = "") -> WebConfigError:
        name = ".".join(part for part in (self.where, key) if part)
        return WebConfigError(f"web config {self.label}: {name + ': ' if name else ''}{message}")

    def string(self, key: str, default: str = "") -> str:
        value = self.value.get(key)
        if value is None:
            return default
        if not isinstance(value, str):
            raise self.error(f"must be a string, got {_kind(value)}", key)
        return value

    def choice(self, key: str, choices: tuple[str, ...], default: str) -> str:
        value = self.string(key, default) or default
        if value not in choices:
            raise self.error(f"{value!r} is not one of {', '.join(choices)}", key)
        return value


def _kind(value: Any) -> str:
    return {dict: "a mapping", list: "a list", bool: "a boolean", int: "a number", float: "a number"}.get(
        type(value), type(value).__name__)


def _build(label: str, data: Any) -> WebConfig:
    if data is not None and not isinstance(data, dict):
        raise WebConfigError(f"web config {label}: must be a YAML mapping, got {_kind(data)}")
    top = _Fields(label, "", data, _TOP_KEYS)
    base = Path(label).resolve().parent
    tls, not_applied = _tls(_Fields(label, "tls_server_config", top.value.get("tls_server_config"), _TLS_KEYS),
                            base)
    return WebConfig(
        path=label,
        tls=tls,
        users=_users(label, top.value.get("basic_auth_users")),
        headers=_http(_Fields(label, "http_server_config", top.value.get("http_server_config"), _HTTP_KEYS)),
        not_applied=not_applied,
    )


def _tls(f: _Fields, base: Path) -> tuple[TlsSettings | None, tuple[str, ...]]:
    """The TLS settings (None: plain HTTP) and the settings Python's ssl cannot apply."""
    if not any(f.value.get(k) not in (None, "", []) for k in _TLS_KEYS):
        return None, ()  # no TLS settings at all: plain HTTP, as with exporter-toolkit
    cert, key = f.string("cert_file"), f.string("key_file")
    if not cert or not key:
        raise f.error("cert_file and key_file are both required to serve TLS")
    auth = f.choice("client_auth_type", CLIENT_AUTH_TYPES, "NoClientCert")
    if auth == "RequireAnyClientCert":
        raise f.error("RequireAnyClientCert accepts any self-signed certificate and is not supported; "
                      "use RequireAndVerifyClientCert with client_ca_file", "client_auth_type")
    ca = f.string("client_ca_file")
    if ca and auth == "NoClientCert":
        raise f.error("client_ca_file is set but client_auth_type is NoClientCert; "
                      "set client_auth_type: RequireAndVerifyClientCert", "client_ca_file")
    if auth in ("VerifyClientCertIfGiven", "RequireAndVerifyClientCert") and not ca:
        raise f.error(f"client_auth_type {auth} needs client_ca_file (the CA that signs client certificates)",
                      "client_auth_type")
    sans = _sans(f)
    if sans and auth != "RequireAndVerifyClientCert":
        raise f.error("client_allowed_sans needs client_auth_type: RequireAndVerifyClientCert", "client_allowed_sans")
    low, high = _version(f, "min_version", "TLS12"), _version(f, "max_version", "TLS13")
    if TLS_VERSIONS[low] > TLS_VERSIONS[high]:
        raise f.error(f"min_version {low} is newer than max_version {high}", "min_version")
    ciphers, cipher_notes = _ciphers(f)
    curve, curve_notes = _curve(f)
    prefer = f.value.get("prefer_server_cipher_suites", True)
    if not isinstance(prefer, bool):
        raise f.error(f"must be true or false, got {_kind(prefer)}", "prefer_server_cipher_suites")
    settings = TlsSettings(cert_file=_path(base, cert), key_file=_path(base, key), client_auth_type=auth,
                           client_ca_file=_path(base, ca) if ca else "", client_allowed_sans=sans,
                           min_version=low, max_version=high, ciphers=ciphers, curve=curve,
                           prefer_server_ciphers=prefer)
    return settings, cipher_notes + curve_notes


def _names(f: _Fields, key: str, known: Mapping[str, str | None], what: str, example: str) -> list[str]:
    value = f.value.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise f.error(f"must be a list of {what} names", key)
    for name in value:
        if name not in known:
            # Refused like exporter-toolkit refuses it: a typo must not widen what is allowed.
            raise f.error(f"unknown {what} {name!r} (Go's names, as exporter-toolkit takes them, e.g. {example})",
                          key)
    return list(dict.fromkeys(value))


def _ciphers(f: _Fields) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The OpenSSL names of the listed TLS 1.2 suites this OpenSSL has, and what is not applied."""
    names = _names(f, "cipher_suites", CIPHER_SUITES, "cipher suite", "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256")
    tls13 = [n for n in names if CIPHER_SUITES[n] is None]
    usable: list[tuple[str, str]] = []
    missing: list[tuple[str, str]] = []
    for name in names:
        openssl = CIPHER_SUITES[name]
        if openssl is not None:
            (usable if _openssl_has_cipher(openssl) else missing).append((name, openssl))
    notes = []
    if tls13:
        notes.append(f"cipher_suites {', '.join(tls13)} (TLS 1.3 suites cannot be chosen in Python's ssl; "
                     "OpenSSL's TLS 1.3 suites apply)")
    if missing:
        notes.append(f"cipher_suites {', '.join(n for n, _ in missing)} (not in {ssl.OPENSSL_VERSION})")
    if missing and not usable:
        raise f.error(f"none of the TLS 1.2 suites listed is available in {ssl.OPENSSL_VERSION}; "
                      "list at least one it has (e.g. TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256)", "cipher_suites")
    return tuple(openssl for _, openssl in usable), tuple(notes)


def _openssl_has_cipher(openssl_name: str) -> bool:
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER).set_ciphers(openssl_name)
    except ssl.SSLError:
        return False
    return True


def _curve(f: _Fields) -> tuple[str, tuple[str, ...]]:
    """The one curve Python's ssl can set (``set_ecdh_curve``): the first listed that OpenSSL has.

    Using only the most preferred curve never allows a curve the file did not list; a client
    without it cannot connect, which the log line says.
    """
    names = _names(f, "curve_preferences", CURVES, "curve", ", ".join(CURVES))
    available = [n for n in names if CURVES[n] is not None]
    if names and not available:
        raise f.error(f"none of the curves listed is available in {ssl.OPENSSL_VERSION}; "
                      "list CurveP256, CurveP384, CurveP521 or X25519", "curve_preferences")
    if not available:
        return "", ()
    chosen = available[0]
    left = [n for n in names if n != chosen]
    notes = (f"curve_preferences {', '.join(left)} (Python's ssl sets one curve: only {chosen} is offered)",) \
        if left else ()
    return CURVES[chosen] or "", notes


def _version(f: _Fields, key: str, default: str) -> str:
    if f.string(key) in ("TLS10", "TLS11"):
        raise f.error(f"{f.string(key)} is obsolete (RFC 8996) and not supported; use TLS12 or TLS13", key)
    return f.choice(key, tuple(TLS_VERSIONS), default)


def _sans(f: _Fields) -> tuple[str, ...]:
    value = f.value.get("client_allowed_sans")
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise f.error("must be a list of non-empty strings", "client_allowed_sans")
    return tuple(value)


def _path(base: Path, name: str) -> str:
    return str(base / name)  # an absolute ``name`` wins in pathlib's join


def _http(f: _Fields) -> tuple[tuple[str, str], ...]:
    http2 = f.value.get("http2")
    if http2 is not None and not isinstance(http2, bool):
        raise f.error(f"must be true or false, got {_kind(http2)}", "http2")
    headers = f.value.get("headers")
    if headers is None:
        return ()
    if not isinstance(headers, dict):
        raise f.error(f"must be a mapping of header name to value, got {_kind(headers)}", "headers")
    canonical = {name.lower(): name for name in EXTRA_HEADERS}
    out = []
    for name, value in headers.items():
        where = f"headers.{name}"
        spelled = canonical.get(str(name).lower())
        if spelled is None:
            raise f.error(f"this header cannot be configured (allowed: {', '.join(EXTRA_HEADERS)})", where)
        if not isinstance(value, str):
            raise f.error(f"must be a string, got {_kind(value)}", where)
        if any(c in value for c in "\r\n\x00"):
            raise f.error("must not contain line breaks or NUL", where)
        allowed = EXTRA_HEADERS[spelled]
        if allowed is not None and value not in allowed:
            raise f.error(f"{value!r} is not one of {', '.join(allowed)}", where)
        if value:  # blank means unset, as with exporter-toolkit
            out.append((spelled, value))
    return tuple(out)


def _users(label: str, value: Any) -> tuple[tuple[str, bytes], ...]:
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise WebConfigError(f"web config {label}: basic_auth_users: must be a mapping of user to bcrypt hash, "
                             f"got {_kind(value)}")
    users = []
    for user, hashed in value.items():
        # The user name may appear in messages (it is not a secret); the hash never does.
        where = f"web config {label}: basic_auth_users[{str(user)!r}]"
        if not isinstance(user, str) or not user:
            raise WebConfigError(f"{where}: user names must be non-empty strings")
        if ":" in user or any(ord(c) < 32 for c in user):
            raise WebConfigError(f"{where}: user names cannot contain ':' or control characters "
                                 "(HTTP basic auth could not send them)")
        if not isinstance(hashed, str) or not _BCRYPT_HASH.fullmatch(hashed.encode("utf-8", "replace")):
            raise WebConfigError(f"{where}: not a bcrypt hash (expected $2a$, $2b$ or $2y$, a cost of 04-31 and "
                                 "60 characters in all, e.g. from `htpasswd -nBC 10 \"\" | tr -d ':\\n'`)")
        users.append((user, hashed.encode("ascii")))
    if users:
        _require_bcrypt(label)
    return tuple(users)


def _require_bcrypt(label: str) -> None:
    try:
        import bcrypt  # noqa: F401
    except ImportError:
        raise WebConfigError(f"web config {label}: basic_auth_users needs the 'bcrypt' Python package "
                             "(pip install bcrypt)") from None


# --- TLS ------------------------------------------------------------------------------------------


class _EncryptedKey(Exception):
    """Raised from OpenSSL's password callback: we never prompt for a passphrase."""


def _refuse_passphrase() -> bytes:
    # Without a callback OpenSSL would prompt on the terminal, hanging a daemon at start-up.
    raise _EncryptedKey


def build_ssl_context(tls: TlsSettings, label: str = "") -> ssl.SSLContext:
    """A server ``SSLContext`` for ``tls``; raises ``WebConfigError`` naming the file at fault."""
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
        raise WebConfigError(f"{prefix}.key_file: {tls.key_file} is encrypted; give an unencrypted key "
                             "(protect it with file permissions)") from None
    except ssl.SSLError as e:
        raise WebConfigError(f"{prefix}: cannot use cert_file {tls.cert_file} with key_file {tls.key_file}: "
                             f"{_ssl_reason(e)}") from None
    if tls.verifies_clients:
        try:
            ctx.load_verify_locations(cafile=tls.client_ca_file)
        except ssl.SSLError as e:
            raise WebConfigError(f"{prefix}.client_ca_file: {tls.client_ca_file} holds no usable CA certificate: "
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
        raise WebConfigError(f"{prefix}.{key}: {path}: no such file") from None
    except OSError as e:
        raise WebConfigError(f"{prefix}.{key}: {path}: cannot read it: {e.strerror}") from None


def _ssl_reason(e: ssl.SSLError) -> str:
    # OpenSSL's reason codes (KEY_VALUES_MISMATCH, NO_START_LINE, ...) name the problem and
    # never quote file content.
    reason = (e.reason or ("PEM_LIB" if "PEM lib" in str(e) else "")).replace("_", " ").lower()
    return {"key values mismatch": "the key does not belong to the certificate",
            "no start line": "not a PEM file",
            "pem lib": "not a PEM certificate and key",
            "no certificate or crl found": "no PEM certificate in it"}.get(reason, reason or "OpenSSL could not load it")


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
        except WebConfigError as e:
            # Half-written files during a rotation are normal: keep serving with the last
            # good certificate and try again at the next check.
            if str(e) != self._failed:
                self._log.warning("TLS files changed but cannot be used (keeping the previous ones): %s", e)
                self._failed = str(e)
            return
        self._stamp, self._context, self._failed = stamp, context, ""
        self.reloads += 1
        self._log.info("TLS certificate files changed; new connections use them")


# --- basic auth -----------------------------------------------------------------------------------


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
    - An unknown user costs one bcrypt against a dummy hash of the users' cost (the cost most
      users have; the higher one on a tie), so timing does not reveal which users exist.
    """

    def __init__(self, users: tuple[tuple[str, bytes], ...], *, ttl: float = 60.0, max_entries: int = 256,
                 slots: int = 2, max_waiting: int = 16, failure_burst: int = 10, refill_seconds: float = 6.0,
                 wait_timeout: float = 5.0, max_clients: int = 4096, throttle_delay: float = 1.0,
                 monotonic: Callable[[], float] = time.monotonic) -> None:
        if not users:
            raise ValueError("BasicAuth needs at least one user")
        self._users = dict(users)
        self._dummy = _dummy_hash(hashed for _, hashed in users)
        self._monotonic = monotonic
        self._key = secrets.token_bytes(32)
        self._successes = _ExpiringKeys(ttl, max_entries)
        self._failures = _ExpiringKeys(ttl, max_entries)
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
