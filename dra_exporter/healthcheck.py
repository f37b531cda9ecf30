"""``dra-exporter healthcheck``: the container image's HEALTHCHECK, asking the running exporter.

It speaks what the exporter serves: the same ``--listen`` and ``--web-config`` (their
``DRA_EXPORTER_*`` variables are what the image and chart set), so it asks ``/healthz`` over
HTTPS when the web-config turns TLS on. It talks to this machine only, so it checks no
certificate (the serving certificate names the node, not ``localhost``). Where the web-config
requires client certificates it cannot present one: it then only checks that the port accepts
a TCP connection, as the chart's probes do for basic auth. ``/healthz`` needs no basic auth.
"""

from __future__ import annotations

import socket
import ssl
import urllib.error
import urllib.request

from .sinks.http import parse_listen
from .sinks.webconfig import load_web_config

TIMEOUT_S = 4.0


def check(listen: str, web_config: str | None) -> str:
    """``""`` when the exporter answers healthy, else why not (one line)."""
    address = parse_listen(listen)
    wildcard = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}
    host = wildcard.get(address.host, address.host)
    config = load_web_config(web_config) if web_config else None
    tls = config.tls if config else None
    if tls is not None and tls.verifies_clients:
        try:
            with socket.create_connection((host, address.port), timeout=TIMEOUT_S):
                return ""
        except OSError as exc:
            return f"{host}:{address.port} does not accept connections: {exc}"
    netloc = f"[{host}]:{address.port}" if ":" in host else f"{host}:{address.port}"
    url = f"{'https' if tls else 'http'}://{netloc}/healthz"
    context = None
    if tls is not None:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE  # this machine's own exporter; see the module docstring
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_S, context=context) as response:
            return "" if response.status == 200 else f"{url} answered {response.status}"
    except (urllib.error.URLError, OSError) as exc:
        return f"{url}: {getattr(exc, 'reason', exc)}"
