"""Shared fixtures: the real Prometheus tools and the real Kubernetes control plane.

``promtool`` is the path to promtool; ``prometheus`` is a factory that starts a real
Prometheus scraping given targets and stops it after the test; ``prom`` is one Prometheus
scraping the operator kit's fault scenario, once per ``--naming`` the chart offers, shared by
the alert and dashboard tests. ``node_bed`` is the real node (kubelet and NVIDIA's DRA plugin) of
``tests/nodetestbed.py``, marked ``testbed_node``. ``kube`` is one real control plane (etcd, kube-apiserver,
kube-scheduler, kube-controller-manager from ``KUBEBUILDER_ASSETS``) for the whole session: tests
take their own namespaces (``kube.namespace()``) and nodes (``kube.ready_node()``), and the
cluster-scoped objects a module made are deleted when it ends (``cluster_objects_per_module``); every
test that uses it is marked ``testbed_kube``. Without the tools a test is skipped on a developer machine, but
fails under ``CI=true``: CI must never pass by skipping.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# Run outside the project's venv (a bare `pytest`, another Python), every test module fails to import:
# say so once, with the command that makes the environment (the README's).
_NEEDED = ("dra_exporter", "dra_exporter_sim", "kubernetes", "prometheus_client", "pynvml", "hypothesis")
if _missing := [name for name in _NEEDED if importlib.util.find_spec(name) is None]:
    pytest.exit(f"this Python ({sys.executable}) lacks {', '.join(_missing)}: run the tests in the project's venv: "
                "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/python -m pytest -q",
                returncode=2)

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
from kubetestbed import SKIP_HINT, ControlPlane, assets_folder  # noqa: E402
from nodetestbed import DEFAULT_PROFILE, TIMINGS, NodeBed, NodeBeds, unavailable_reason  # noqa: E402
from nodetestbed import testbed_folder as node_testbed_folder  # noqa: E402
from nvmltestbed import SKIP_HINT as NVML_SKIP_HINT  # noqa: E402
from nvmltestbed import library_folder, testbed_folder  # noqa: E402
from promharness import PROMETHEUS_INSTALL_HINT, PromServer, find_tool, free_port, start_prometheus  # noqa: E402

# Fixtures that stand for a test bed, and the marker their tests carry (``pytest -m testbed_kube``).
TESTBED_FIXTURES = {"kube": "testbed_kube", "nvml_testbed": "testbed_nvml", "node_beds": "testbed_node",
                    "node_bed": "testbed_node"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        # A parametrized argument of the same name is not the fixture.
        params = getattr(getattr(item, "callspec", None), "params", {})
        for fixture, marker in TESTBED_FIXTURES.items():
            if fixture in getattr(item, "fixturenames", ()) and fixture not in params:
                item.add_marker(marker)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The times the node test bed's tests measured (labels after a pod starts, gone after it is
    deleted, back after a kubelet restart): figures to read, never asserted beyond the issue's bounds."""
    if TIMINGS:
        terminalreporter.section("node test bed: measured times")
        for what, seconds in TIMINGS:
            terminalreporter.write_line(f"{seconds:6.2f} s  {what}")


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"


def _require(tool: str) -> str:
    path = find_tool(tool)
    if path:
        return path
    message = f"{tool} is not installed; install it with `{PROMETHEUS_INSTALL_HINT}` (Debian/Ubuntu)"
    if _in_ci():
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


@pytest.fixture(scope="session", params=["native", "dcgm", "dcgm-4.10"])
def prom(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PromServer]:
    """The fault scenario scraped by Prometheus, from an exporter set up as the chart with
    each ``naming`` but ``both`` sets it up: every alert and every panel must work under each."""
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


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """The real control plane, once per session; skipped (one line) without KUBEBUILDER_ASSETS,
    failed under CI=true: CI must run these tests, not skip them."""
    assets = assets_folder()
    if assets is None:
        if _in_ci():
            pytest.fail(f"CI=true and {SKIP_HINT}", pytrace=False)
        pytest.skip(SKIP_HINT)
    plane = ControlPlane.start(tmp_path_factory.mktemp("kube"), assets)
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture(scope="module", autouse=True)
def cluster_objects_per_module(request: pytest.FixtureRequest) -> Iterator[None]:
    """A module that uses ``kube`` leaves its cluster-scoped objects behind for no other: what it made
    of ``kubetestbed.SHARED_COLLECTIONS`` (slices, classes, Nodes…) is deleted when it ends, so that
    every module sees the same cluster whatever ran before it."""
    uses_kube = assets_folder() is not None and any(
        getattr(item, "module", None) is request.module and "kube" in getattr(item, "fixturenames", ())
        for item in request.session.items)
    if not uses_kube:
        yield
        return
    plane: ControlPlane = request.getfixturevalue("kube")
    before = plane.cluster_objects()
    yield
    plane.remove_cluster_objects(before)


@dataclass(frozen=True)
class NvmlTestbed:
    """The mock NVML: ``library`` is the folder holding libnvidia-ml.so.1, ``folder`` the test bed with the
    board profiles (see tests/nvmltestbed.py)."""

    folder: Path
    library: Path


@pytest.fixture(scope="session")
def nvml_testbed() -> NvmlTestbed:
    """NVIDIA's mock NVML; skipped (one line) without DRA_EXPORTER_TESTBED_NVML, failed under CI=true."""
    folder = testbed_folder()
    if folder is None:
        if _in_ci():
            pytest.fail(f"CI=true and {NVML_SKIP_HINT}", pytrace=False)
        pytest.skip(NVML_SKIP_HINT)
    return NvmlTestbed(folder=folder, library=library_folder(folder))


@pytest.fixture(scope="session")
def node_beds() -> Iterator[NodeBeds]:
    """The node test bed's keeper; skipped (one line) without DRA_EXPORTER_TESTBED_NODE or root, failed
    under CI=true. Always stopped at the end of the session."""
    folder = node_testbed_folder()
    reason = unavailable_reason(folder)
    if reason is not None or folder is None:
        if _in_ci():
            pytest.fail(f"CI=true and {reason}", pytrace=False)
        pytest.skip(str(reason))
    beds = NodeBeds(folder)
    try:
        yield beds
    finally:
        beds.close()


@pytest.fixture(scope="module")
def node_bed(node_beds: NodeBeds) -> NodeBed:
    """The real node with the default board (8 × H100)."""
    return node_beds.bed(DEFAULT_PROFILE)
