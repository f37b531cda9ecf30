"""Shared fixtures: the real Prometheus tools.

``promtool`` is the path to promtool; ``prometheus`` is a factory that starts a real
Prometheus scraping given targets and stops it after the test. Without the tools a test is
skipped on a developer machine, but fails under ``CI=true``: CI must never pass by skipping.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

# Tests import helpers as top-level modules (``import promharness``) whatever pytest's
# rootdir/import mode is.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from promharness import PROMETHEUS_INSTALL_HINT, PromServer, find_tool, start_prometheus  # noqa: E402


def _require(tool: str) -> str:
    path = find_tool(tool)
    if path:
        return path
    message = f"{tool} is not installed; install it with `{PROMETHEUS_INSTALL_HINT}` (Debian/Ubuntu)"
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true and {message}: CI must run the Prometheus tests, not skip them", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def promtool() -> str:
    return _require("promtool")


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[..., PromServer]]:
    binary = _require("prometheus")
    servers: list[PromServer] = []

    def start(targets: list[str], scrape_interval: str = "1s") -> PromServer:
        server = start_prometheus(binary, tmp_path / f"prometheus-{len(servers)}", targets, scrape_interval)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()
