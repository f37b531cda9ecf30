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
- What the file configures is applied by ``sinks.tls`` (the ``SSLContext``, rebuilt when the
  certificate files rotate; the SAN check) and ``sinks.basicauth`` (bcrypt checks, throttling).

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

import logging
import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .. import strict_yaml
from .tls import TLS_VERSIONS, TlsError, TlsSettings, build_ssl_context

CLIENT_AUTH_TYPES = ("NoClientCert", "RequestClientCert", "RequireAnyClientCert", "VerifyClientCertIfGiven",
                     "RequireAndVerifyClientCert")

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
        try:
            build_ssl_context(config.tls, label)  # fail at start-up, not at the first scrape
        except TlsError as exc:
            raise WebConfigError(str(exc)) from None
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
