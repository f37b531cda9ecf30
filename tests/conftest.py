"""Shared fixtures: the real Prometheus tools.

``promtool`` is the path to promtool; ``prometheus`` is a factory that starts a real
Prometheus scraping given targets and stops it after the test; ``prom`` is one Prometheus
scraping the operator kit's fault scenario, once per ``--naming`` the chart offers, shared by
the alert and dashboard tests. Without the tools a test is skipped on a developer machine, but
fails under ``CI=true``: CI must never pass by skipping.
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

from deploy_tools import (  # noqa: E402
    chart_exporter_env,
    fault_scenario,
    recording_rules_every,
    require_tool,
    running_exporter,
)
from promharness import PROMETHEUS_INSTALL_HINT, PromServer, find_tool, free_port, start_prometheus  # noqa: E402


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


@pytest.fixture(scope="session", params=["native", "dcgm"])
def prom(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PromServer]:
    """The fault scenario scraped by Prometheus, from an exporter set up as the chart with
    ``naming`` native or dcgm sets it up: every alert and every panel must work under both."""
    from dra_exporter import catalog as cat
    from dra_exporter import showback

    binary = require_tool("prometheus", PROMETHEUS_INSTALL_HINT)
    workdir = tmp_path_factory.mktemp(f"kit-{request.param}")
    env = chart_exporter_env({"naming": request.param})
    assert env["DRA_EXPORTER_NAMING"] == request.param
    with running_exporter(fault_scenario(workdir), free_port(), env=env) as port:
        server = start_prometheus(binary, workdir / "prometheus", [f"127.0.0.1:{port}"], "1s",
                                  rule_files=[recording_rules_every("1s", workdir)])
        try:
            # Enough scrapes for the panels' rate() over $__rate_interval, and the scenario's XIDs
            # (the alerts') have landed.
            server.wait_for("count_over_time(dra_gpu_up[1m]) >= 6", timeout=90)
            server.wait_for(f"count_over_time({showback.HELD_NAMESPACE}[1m]) >= 3", timeout=60)
            server.wait_for(f"count({cat.GPU_XID_ERRORS.name}) >= 2", timeout=60)
            yield server
        finally:
            server.stop()
