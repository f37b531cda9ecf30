"""The "DRA cluster capacity" dashboard against a real Prometheus scraping ``dra-exporter cluster
--simulate`` (the built-in cluster) as ``job="dra-exporter-cluster"``, the chart's job: every panel's
PromQL returns data, every variable lists values and narrows the queries, and the panels say what the
cluster mode's own frame (``cluster --simulate --once``) says.

The node agents' dashboards get the same live checks from tests/test_dashboards.py (conftest ``prom``);
the static checks there cover this dashboard too.
"""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from deploy_tools import require_tool, running_exporter
from prometheus_client.parser import text_string_to_metric_families
from promharness import PROMETHEUS_INSTALL_HINT, PromServer, free_port, start_prometheus
from test_dashboards import (
    GEN,
    all_values,
    assert_every_panel_query_returns_data,
    assert_variables_list_values_and_every_query_accepts_a_selection,
    load_dashboards,
    query_panels,
    substitute,
)

from dra_exporter import catalog as cat

pytestmark = [pytest.mark.slow, pytest.mark.prometheus]  # a real Prometheus filling for ~10 s

DASHBOARD = "dra-cluster-capacity.json"
Samples = list[tuple[dict[str, str], float]]


@pytest.fixture(scope="module")
def cluster_prom(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PromServer]:
    binary = require_tool("prometheus", PROMETHEUS_INSTALL_HINT)
    workdir = tmp_path_factory.mktemp("cluster-dashboard")
    with running_exporter("cluster", free_port(), interval=1, mode="cluster") as port:
        server = start_prometheus(binary, workdir / "prometheus", [f"127.0.0.1:{port}"], "1s", job=GEN.CLUSTER_JOB)
        try:
            # Enough scrapes that the graphs' 30 s ranges hold several samples.
            server.wait_for(f"count_over_time({cat.CLUSTER_OBJECTS.name}{{kind=\"ResourceSlice\"}}[1m]) >= 4",
                            timeout=90)
            yield server
        finally:
            server.stop()


@pytest.fixture(scope="module")
def frame() -> dict[str, Samples]:
    """``dra-exporter cluster --simulate --once``: one frame of the same simulated cluster."""
    out = subprocess.run([sys.executable, "-m", "dra_exporter.cli", "cluster", "--simulate", "--once"],
                         capture_output=True, text=True, timeout=120, check=True, cwd=Path(__file__).parent)
    families: dict[str, Samples] = defaultdict(list)
    for family in text_string_to_metric_families(out.stdout):
        for sample in family.samples:
            families[sample.name].append((dict(sample.labels), float(sample.value)))
    return families


def dashboard() -> dict[str, Any]:
    return load_dashboards()[DASHBOARD]


def panel(title: str) -> dict[str, Any]:
    (found,) = [p for p in query_panels(dashboard()) if p["title"] == title]
    return found


def instant(prom: PromServer, title: str, ref: str = "A", **chosen: str) -> list[dict[str, Any]]:
    """The panel's query ``ref`` as Grafana runs it with "All" (or the ``chosen`` values)."""
    (target,) = [tg for tg in panel(title)["targets"] if tg["refId"] == ref]
    return prom.query(substitute(target["expr"], {**all_values(dashboard()), **chosen}))


def value(prom: PromServer, title: str, **chosen: str) -> float:
    (sample,) = instant(prom, title, **chosen)
    return float(sample["value"][1])


def by(prom: PromServer, title: str, label: str, ref: str = "A") -> dict[str, float]:
    return {r["metric"].get(label, ""): float(r["value"][1]) for r in instant(prom, title, ref)}


def total(samples: Samples, **match: str) -> float:
    return sum(v for labels, v in samples if all(labels.get(k) == want for k, want in match.items()))


def test_every_panel_query_returns_data(cluster_prom: PromServer) -> None:
    assert_every_panel_query_returns_data(cluster_prom, dashboard())


def test_variables_list_values_and_every_query_accepts_a_selection(cluster_prom: PromServer) -> None:
    assert_variables_list_values_and_every_query_accepts_a_selection(cluster_prom, dashboard())


def test_capacity_panels_agree_with_the_frame(cluster_prom: PromServer, frame: dict[str, Samples]) -> None:
    devices = frame[cat.CLUSTER_DEVICES.name]
    assert value(cluster_prom, "Devices") == total(devices)
    for title, state in (("Tainted", "tainted"), ("Unavailable devices", "unavailable")):
        assert value(cluster_prom, title) == total(devices, state=state) > 0, title
    gpus = frame[cat.CLUSTER_GPU_EQUIVALENTS.name]
    for title, state in (("GPU-equivalents free", "free"), ("GPU-equivalents allocated", "allocated"),
                         ("GPU-equivalents blocked", "blocked")):
        assert value(cluster_prom, title) == pytest.approx(total(gpus, state=state)), title
        assert total(gpus, state=state) > 0, title
    placeable = frame[cat.CLUSTER_CLASS_PLACEABLE.name]
    assert by(cluster_prom, "Placeable claims by DeviceClass", "device_class") == {
        labels["device_class"]: v for labels, v in placeable}
    # The driver picker narrows the counts to that driver's devices.
    assert value(cluster_prom, "Devices", driver="gpu\\\\.example\\\\.com") == total(devices, driver="gpu.example.com")
    nodes = {labels["node"] for labels, _ in devices}
    assert by(cluster_prom, "Capacity by node", "node") == {n: total(devices, node=n) for n in nodes}
    assert by(cluster_prom, "Capacity by node", "node", "D") == {n: total(devices, node=n, state="tainted")
                                                                 for n in nodes}
    classes = frame[cat.CLUSTER_CLASS_DEVICES.name]
    names = {labels["device_class"] for labels, _ in classes}
    assert by(cluster_prom, "DeviceClasses", "device_class", "B") == {
        c: total(classes, device_class=c, state="free") for c in names}


def test_claim_panels_agree_with_the_frame(cluster_prom: PromServer, frame: dict[str, Samples]) -> None:
    pending = frame[cat.CLUSTER_CLAIM_PENDING.name]
    assert value(cluster_prom, "Pending claims") == total(frame[cat.CLUSTER_CLAIMS.name], state="pending") == 3
    assert len(pending) == 3, "one series per claim"
    rows = {(r["metric"]["namespace"], r["metric"]["claim"], r["metric"]["request"], r["metric"]["device_class"])
            for r in instant(cluster_prom, "Pending claims and their age")}
    assert rows == {(s["namespace"], s["claim"], s["request"], s["device_class"])
                    for s, _ in frame[cat.CLUSTER_CLAIM_PENDING_REQUEST.name]}
    assert ("inference", "mig-either", "gpu/gpu", "gpu.nvidia.com") in rows, "a prioritized list: a row per subrequest"
    # Ages run on the simulated clock from the same start: the served ones are at least the frame's.
    assert value(cluster_prom, "Oldest pending claim") >= max(v for _, v in pending) > 0
    # The class picker narrows pending claims through their requests' classes.
    assert value(cluster_prom, "Pending claims", device_class="tpu\\\\.example\\\\.com") == 1
    why = {(r["metric"]["claim"], r["metric"]["reason"]) for r in instant(cluster_prom, "Why claims wait")}
    assert why == {(s["claim"], s["reason"]) for s, _ in frame[cat.CLUSTER_CLAIM_PENDING_REASON.name]} == {
        ("typo-job", "class_missing"), ("tpu-job", "no_matching_device")}
    unreserved = frame[cat.CLUSTER_CLAIM_UNRESERVED.name]
    assert value(cluster_prom, "Claims held by no pod") == len(unreserved) == 1
    assert value(cluster_prom, "Devices held by no pod") == total(unreserved)
    assert by(cluster_prom, "DeviceClasses", "device_class", "H")["tpu.example.com"] == 1, "tpu-job-2: no pod waits"
    assert value(cluster_prom, "Classes nothing matches") == 1  # tpu.example.com: no TPU in the cluster


def test_fragmentation_pools_and_taints_agree_with_the_frame(cluster_prom: PromServer,
                                                             frame: dict[str, Samples]) -> None:
    fit = frame[cat.CLUSTER_PARTITIONS_FIT.name]
    gpus: dict[tuple[str, ...], list[float]] = defaultdict(list)
    for labels, v in fit:
        gpus[(labels["driver"], labels["pool"], labels["counter_set"])].append(v)
    partly = sum(1 for vs in gpus.values() if max(vs) > 0 and min(vs) == 0)
    assert value(cluster_prom, "Partly used GPUs") == partly > 0
    assert value(cluster_prom, "Full GPUs") == sum(1 for vs in gpus.values() if max(vs) == 0)
    assert value(cluster_prom, "GPUs with everything free") == sum(1 for vs in gpus.values() if min(vs) > 0)
    profiles = {labels["profile"] for labels, _ in fit}
    assert by(cluster_prom, "Free placements by profile", "profile") == {p: total(fit, profile=p) for p in profiles}
    complete = frame[cat.CLUSTER_POOL_COMPLETE.name]
    assert value(cluster_prom, "Incomplete pools") == sum(1 for _, v in complete if v == 0) == 1
    rules = {r["metric"]["rule"]: float(r["value"][1]) for r in instant(cluster_prom, "DeviceTaintRules")}
    assert rules == {labels["rule"]: v for labels, v in frame[cat.CLUSTER_TAINT_RULE_DEVICES.name]}
