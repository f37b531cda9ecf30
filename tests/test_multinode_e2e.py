"""Four exporters on the simulated 4-node ``gb200-domain`` cluster, one real Prometheus scraping all
four (issue #14): every ComputeDomain dashboard query returns data, the per-domain NVLink sum is the
sum of the four nodes' links, and the faults — gb200-node-1 GPU 2's NVLink 5 down and counting
errors from t=15 s, gb200-node-3's IMEX daemon NotReady from t=20 s — make their alerts'
expressions true (their ``for:`` is minutes; the rules' own timing is promtool-tested in
deploy/prometheus-rules.test.yaml)."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_tools import require_tool, running_exporter
from promharness import PromServer, free_port, start_prometheus

from dra_exporter import catalog as cat

ROOT = Path(__file__).resolve().parents[1]
NODES = [f"gb200-node-{i}" for i in range(4)]
ALL = ".*"

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]


@pytest.fixture(scope="module")
def prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PromServer]:
    binary = require_tool("prometheus", "apt-get install -y prometheus")
    workdir = tmp_path_factory.mktemp("multinode")
    with contextlib.ExitStack() as stack:
        ports = [stack.enter_context(running_exporter("gb200-domain", free_port(),
                                                      env={"DRA_EXPORTER_NODE_NAME": node}))
                 for node in NODES]
        server = start_prometheus(binary, workdir / "prometheus", [f"127.0.0.1:{p}" for p in ports], "1s")
        stack.callback(server.stop)
        server.wait_for(f"count(count by (instance) ({cat.GPU_UP.name})) == 4", timeout=60)
        server.wait_for("count_over_time(dra_gpu_up[1m]) >= 6", timeout=60)
        # The fault: gb200-node-3's IMEX daemon is NotReady from simulated (= wall) second 20.
        server.wait_for(f"max by (node) ({cat.COMPUTE_DOMAIN_NODE_READY.name}{{node=\"gb200-node-3\"}}) == 0",
                        timeout=60)
        server.ports = dict(zip(NODES, ports, strict=True))  # type: ignore[attr-defined]
        yield server


def dashboard_targets() -> Iterator[tuple[str, dict[str, Any]]]:
    dash = json.loads((ROOT / "dashboards" / "dra-compute-domain.json").read_text())
    for panel in dash["panels"]:
        for target in panel.get("targets", ()):
            yield panel["title"], target


def test_every_compute_domain_dashboard_query_returns_data(prom: PromServer) -> None:
    empty = []
    for title, target in dashboard_targets():
        expr = target["expr"].replace("$node", ALL).replace("$__rate_interval", "1m")
        if target.get("range"):
            end = time.time()
            result = prom.api("query_range", query=expr, start=str(end - 20), end=str(end), step="1")["result"]
        else:
            result = prom.query(expr)
        if not result:
            empty.append(f"{title}: {expr}")
    assert not empty, "panels without data:\n" + "\n".join(empty)


def test_the_domain_spans_the_four_nodes_and_their_sixteen_gpus(prom: PromServer) -> None:
    gpus = prom.query(f"count by (compute_domain) ({cat.COMPUTE_DOMAIN_GPU_INFO.name})")
    assert [(r["metric"]["compute_domain"], r["value"][1]) for r in gpus] == [("mpi-domain", "16")]
    holders = prom.query(f"count by (pod) ({cat.COMPUTE_DOMAIN_CHANNEL_INFO.name})")
    assert sorted(r["metric"]["pod"] for r in holders) == [f"mpi-worker-{i}" for i in range(4)], \
        "the launcher holds no channel"
    members = prom.query(f"max by (node) ({cat.COMPUTE_DOMAIN_NODE_READY.name})")
    assert {r["metric"]["node"]: r["value"][1] for r in members} == {
        "gb200-node-0": "1", "gb200-node-1": "1", "gb200-node-2": "1", "gb200-node-3": "0"}
    # Every member's agent reports all four members.
    counts = prom.query(f"count by (instance) ({cat.COMPUTE_DOMAIN_NODE_READY.name})")
    assert [r["value"][1] for r in counts] == ["4"] * 4


def test_per_domain_nvlink_sum_is_the_sum_of_the_four_nodes(prom: PromServer) -> None:
    at = str(time.time() - 2)
    nvlink = f"rate({cat.GPU_NVLINK_LINK_BYTES.name}[1m])"
    per_domain = prom.api("query", query=f"sum by (compute_domain) ({nvlink} * on (uuid) group_left (compute_domain) "
                                         f"max by (uuid, compute_domain) ({cat.COMPUTE_DOMAIN_GPU_INFO.name}))",
                          time=at)["result"]
    per_node = prom.api("query", query=f"sum by (instance) ({nvlink})", time=at)["result"]
    assert len(per_node) == 4 and len(per_domain) == 1
    assert all(float(r["value"][1]) > 0 for r in per_node), "the MPI job's traffic curves"
    assert float(per_domain[0]["value"][1]) == pytest.approx(sum(float(r["value"][1]) for r in per_node))


def test_the_imex_not_ready_fault_fires_the_compute_domain_alerts(prom: PromServer) -> None:
    rules = {r["alert"]: r for g in yaml.safe_load((ROOT / "deploy" / "prometheus-rules.yaml").read_text())["groups"]
             if g["name"] == "compute-domain" for r in g["rules"]}
    node = prom.query(rules["DraComputeDomainNodeNotReady"]["expr"])
    assert [(r["metric"]["compute_domain"], r["metric"]["node"]) for r in node] == [("mpi-domain", "gb200-node-3")]
    domain = prom.query(rules["DraComputeDomainNotReady"]["expr"])
    assert [(r["metric"]["namespace"], r["metric"]["compute_domain"]) for r in domain] == [("mpi", "mpi-domain")]


def test_the_degraded_link_fires_the_nvlink_alert_on_its_node_only(prom: PromServer) -> None:
    rules = {r["alert"]: r for g in yaml.safe_load((ROOT / "deploy" / "prometheus-rules.yaml").read_text())["groups"]
             for r in g["rules"]}
    node1 = f"127.0.0.1:{prom.ports['gb200-node-1']}"  # type: ignore[attr-defined]
    prom.wait_for(rules["DraGpuNvlinkErrors"]["expr"], timeout=60)
    firing = prom.query(rules["DraGpuNvlinkErrors"]["expr"])
    assert [(r["metric"]["instance"], r["metric"]["gpu"], r["metric"]["link"]) for r in firing] == [(node1, "2", "5")]
    down = prom.query(f"{cat.GPU_NVLINK_LINK_UP.name} == 0")
    assert [(r["metric"]["instance"], r["metric"]["gpu"], r["metric"]["link"]) for r in down] == [(node1, "2", "5")]
    assert prom.query(rules["DraGpuFabricDegraded"]["expr"]) == [], "the fabric itself stays healthy"
    # The link was up before the fault and its GPU serves the domain: critical, not the warning.
    member = prom.query(rules["DraComputeDomainNvlinkLinkDown"]["expr"])
    assert [(r["metric"]["instance"], r["metric"]["gpu"], r["metric"]["link"], r["metric"]["compute_domain"])
            for r in member] == [(node1, "2", "5", "mpi-domain")]
    assert prom.query(rules["DraGpuNvlinkLinkDown"]["expr"]) == [], "a domain member's link is the critical alert"
