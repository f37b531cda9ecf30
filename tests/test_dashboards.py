"""The Grafana dashboards: generated from the catalogue, importable, and every query works.

The live tests run ``dra-exporter serve --simulate`` (the demo node, XIDs moved early) scraped
every second by the real Prometheus, substitute the dashboard variables as Grafana would for
"All", and check that every panel's PromQL parses and returns data. The cluster mode's dashboard
(``job="dra-exporter-cluster"``) gets the same checks against ``dra-exporter cluster --simulate``
in tests/test_cluster_dashboard.py.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from deploy_tools import REPO
from promharness import PromServer

from dra_exporter import catalog as cat
from dra_exporter import showback

DASHBOARDS = REPO / "dashboards"
RECORDED = re.compile(r"\b[a-z_]+:dra_[a-z_]+:[a-z_]+\b")
"""A recorded series (level:metric:operations) of deploy/recording-rules.yaml."""
# What Grafana puts in for its built-in variables; with 1 s scrapes these windows hold samples.
BUILTINS = {"$__rate_interval": "10s", "$__range": "1m", "$__interval": "1s"}
ALL = ".*"  # the variables' allValue


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("dashboards_generate", DASHBOARDS / "generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module


GEN = _generator()
CLUSTER_JOB = f'job="{GEN.CLUSTER_JOB}"'
"""What the cluster mode's dashboards select: one target for the whole cluster, no node picker."""


def load_dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def is_cluster_mode(dash: dict[str, Any]) -> bool:
    """A dashboard on ``dra-exporter cluster`` rather than the node agents."""
    return any(CLUSTER_JOB in tg["expr"] for _, tg in targets(dash))


#: Dashboards only a multi-node cluster fills (tests/test_multinode_e2e.py checks every query of them there).
MULTI_NODE_DASHBOARDS = ("dra-compute-domain.json",)


def node_agent_dashboards() -> list[str]:
    """The dashboards the node agent's Prometheus (conftest ``prom``, the demo node) can fill."""
    return [name for name, dash in load_dashboards().items()
            if not is_cluster_mode(dash) and name not in MULTI_NODE_DASHBOARDS]


def query_panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dash["panels"] if p["type"] not in ("row", "text")]


def targets(dash: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for panel in query_panels(dash):
        for target in panel["targets"]:
            yield panel["title"], target


def variables(dash: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in dash["templating"]["list"]}


def names_only(var: dict[str, Any]) -> bool:
    """A hidden query variable that only names something in panel titles (the prices' currency)."""
    return var["type"] == "query" and var["hide"] == 2


def substitute(expr: str, values: dict[str, str]) -> str:
    for name, value in {**BUILTINS, **values}.items():
        expr = expr.replace(name if name.startswith("$__") else f"${name}", value)
    assert "$" not in expr, f"unsubstituted variable in {expr!r}"
    return expr


# --- static checks ----------------------------------------------------------------------------


def test_committed_dashboards_are_the_generators_output() -> None:
    generated = {d.filename: GEN.render(d) for d in GEN.dashboards()}
    committed = {p.name: p.read_text() for p in DASHBOARDS.glob("*.json")}
    assert committed == generated, "regenerate with: python3 dashboards/generate.py"


def test_the_seven_views_exist() -> None:
    titles = {d["title"] for d in load_dashboards().values()}
    assert titles == {
        "DRA GPUs / Cluster overview",
        "DRA GPUs / Claims and namespaces",
        "DRA GPUs / Node",
        "DRA GPUs / MIG and shared GPUs",
        "DRA GPUs / ComputeDomain",
        "DRA GPUs / Showback",
        "DRA cluster capacity",
    }
    assert [n for n, d in load_dashboards().items() if is_cluster_mode(d)] == ["dra-cluster-capacity.json"]


@pytest.mark.parametrize("name", sorted(p.name for p in DASHBOARDS.glob("*.json")))
def test_dashboard_is_importable_with_a_datasource_variable(name: str) -> None:
    dash = load_dashboards()[name]
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 36
    assert "id" not in dash or dash["id"] is None, "an exported id would clash on import"
    assert "__inputs" not in dash, "the datasource is a variable, not an import-time input"
    variables_ = variables(dash)
    ds = variables_["datasource"]
    assert (ds["type"], ds["query"]) == ("datasource", "prometheus")
    if is_cluster_mode(dash):  # one target for the cluster: its series carry node themselves
        assert ", node)" in variables_["node"]["query"]["query"], "the node picker lists the node label"
    elif "node" in variables_:  # the showback dashboard is cluster-wide: its rules have summed the nodes
        node = variables_["node"]
        assert f", {GEN.NODE_LABEL})" in node["query"]["query"], "the node picker lists the scrape target label"
    for var in variables_.values():
        if var["type"] == "query":
            assert var["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert re.fullmatch(r"label_values\(.+, \w+\)", var["query"]["query"]), var["query"]
            if names_only(var):  # hidden, it names something in titles: no query may select by it
                assert not var["includeAll"] and not var["multi"]
                assert not any(f"${var['name']}" in tg["expr"] for _, tg in targets(dash)), var["name"]
                assert any(f"${{{var['name']}}}" in p["title"] for p in query_panels(dash)), var["name"]
            else:
                assert var["includeAll"] and var["allValue"] == ALL


@pytest.mark.parametrize("name", sorted(p.name for p in DASHBOARDS.glob("*.json")))
def test_panels_are_laid_out_and_query_through_the_variable(name: str) -> None:
    dash = load_dashboards()[name]
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for panel in dash["panels"]:
        pos = panel["gridPos"]
        assert 0 <= pos["x"] and pos["x"] + pos["w"] <= 24 and pos["h"] > 0, panel["title"]
        mine = {
            (x, y) for x in range(pos["x"], pos["x"] + pos["w"]) for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not cells & mine, f"{panel['title']} overlaps another panel"
        cells |= mine
    declared = set(variables(dash))
    for panel in query_panels(dash):
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"] and panel["description"], panel["title"]
        refs = [tg["refId"] for tg in panel["targets"]]
        assert len(refs) == len(set(refs)), panel["title"]
        for target in panel["targets"]:
            used = set(re.findall(r"\$(\w+)", target["expr"])) - {k[1:] for k in BUILTINS}
            assert used <= declared, f"{panel['title']}: undeclared variables {used - declared}"
            if is_cluster_mode(dash):  # as the cluster alerts select it; every query of it, for any Prometheus
                assert target["expr"].count("{") == target["expr"].count(CLUSTER_JOB), panel["title"]
            elif "node" in declared:
                assert f'{GEN.NODE_LABEL}=~"$node"' in target["expr"], f"{panel['title']} ignores the node picker"
            else:  # a cluster-wide dashboard reads only the recorded, cluster-level series
                assert RECORDED.search(target["expr"]) and not re.search(r"(?<![\w:])dra_", target["expr"]), \
                    panel["title"]


def test_queries_use_only_catalogue_metrics() -> None:
    for name, dash in load_dashboards().items():
        queries = [tg["expr"] for _, tg in targets(dash)] + [
            v["query"]["query"] for v in dash["templating"]["list"] if v["type"] == "query"
        ]
        for metric in set(re.findall(r"(?<![\w:])dra_[a-z0-9_]+", " ".join(queries))):
            assert metric in cat.BY_NAME, f"{name}: {metric} is not in dra_exporter/catalog.py"
        for record in set(RECORDED.findall(" ".join(queries))):
            assert record in showback.BY_RECORD or record == showback.PRICE, \
                f"{name}: {record} is not a recording rule"


# --- panel arithmetic, on promtool's evaluator ------------------------------------------------


def panel_exprs(dash_name: str, title: str, **values: str) -> list[str]:
    """A panel's queries with the variables on "All" (and ``values``)."""
    dash = load_dashboards()[dash_name]
    exprs = [target["expr"] for panel_title, target in targets(dash) if panel_title == title]
    assert exprs, f"{dash_name}: no panel {title!r}"
    return [substitute(e, {**all_values(dash), **values}) for e in exprs]


def panel_expr(dash_name: str, title: str, **values: str) -> str:
    (expr,) = panel_exprs(dash_name, title, **values)
    return expr


def promtool_expr_tests(promtool: str, directory: Path, series: list[dict[str, str]],
                        cases: list[dict[str, Any]], interval: str = "1m") -> None:
    """Evaluate expressions over given series with promtool (no rules): its unit-test runner."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "none.yaml").write_text("groups: []\n")
    tests = directory / "panels.test.yaml"
    tests.write_text(yaml.safe_dump({"rule_files": ["none.yaml"], "tests": [
        {"interval": interval, "input_series": series, "promql_expr_test": cases}]}, sort_keys=False))
    result = subprocess.run([promtool, "test", "rules", tests.name], cwd=directory, capture_output=True,
                            text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_xid_panels_count_a_devices_first_xid_and_not_a_change_of_holder(
        promtool: str, tmp_path: Path) -> None:
    """A device's first XID starts its counter at 1, which increase() alone reads as nothing; a GPU
    that changes hands starts new series with the old count, which is no XID."""
    xid = cat.GPU_XID_ERRORS.name
    node = 'instance="node-a", job="dra-exporter"'
    series = [
        {"series": f'{xid}{{{node}, uuid="GPU-0", gpu="0", xid="79"}}', "values": "_x30 1x30"},  # first XID at 30m
        {"series": f'{xid}{{{node}, uuid="GPU-1", gpu="1", xid="13"}}', "values": "2x30 3x30"},  # one more
        {"series": f'{xid}{{{node}, uuid="GPU-2", gpu="2", xid="31", claim="a"}}', "values": "1x30"},
        {"series": f'{xid}{{{node}, uuid="GPU-2", gpu="2", xid="31", claim="b"}}', "values": "_x30 1x30"},
    ]
    overview = panel_expr("dra-overview.json", "XID errors in the last hour")
    node_stat = panel_expr("dra-node.json", "XID errors in range", **{"$__range": "1h"})
    promtool_expr_tests(promtool, tmp_path, series, [
        {"expr": f"round({overview})", "eval_time": "60m", "exp_samples": [
            {"labels": '{instance="node-a", xid="79"}', "value": 1},
            {"labels": '{instance="node-a", xid="13"}', "value": 1},
            {"labels": '{instance="node-a", xid="31"}', "value": 0}]},
        {"expr": f"round({node_stat})", "eval_time": "60m", "exp_samples": [{"labels": "{}", "value": 2}]},
    ])


def test_idle_claims_lists_only_claims_of_gpu_devices(promtool: str, tmp_path: Path) -> None:
    """An IMEX channel claim and a ComputeDomain daemon claim have no device with activity: they
    are never idle claims (the 4-node demo listed 8 of them)."""
    alloc, consumer = cat.CLAIM_ALLOCATION_INFO.name, cat.CLAIM_CONSUMER_INFO.name
    node = 'instance="node-a", job="dra-exporter"'
    gpu_driver = 'driver="gpu.nvidia.com", pool="node-a"'
    cd_driver = 'driver="compute-domain.nvidia.com", pool="node-a"'
    series = [
        {"series": f'{alloc}{{{node}, namespace="ml", claim="train", {gpu_driver}, device="gpu-0", uuid="GPU-0", '
                   f'admin_access="false", request="gpu"}}', "values": "1x60"},
        {"series": f'{cat.GPU_UTILIZATION.name}{{{node}, uuid="GPU-0", gpu="0", namespace="ml", claim="train", '
                   f'pod="train-0"}}', "values": "0x60"},
        {"series": f'{consumer}{{{node}, namespace="ml", claim="train", pod="train-0", container="main"}}',
         "values": "1x60"},
        {"series": f'{alloc}{{{node}, namespace="mpi", claim="worker-0-channel", {cd_driver}, device="channel-0", '
                   f'admin_access="false", request="channel"}}', "values": "1x60"},
        {"series": f'{consumer}{{{node}, namespace="mpi", claim="worker-0-channel", pod="worker-0", container="w"}}',
         "values": "1x60"},
        {"series": f'{alloc}{{{node}, namespace="nvidia-dra-driver", claim="domain-daemon", {cd_driver}, '
                   f'device="daemon-0", admin_access="false", request="daemon"}}', "values": "1x60"},
    ]
    devices, pods, idle_for = panel_exprs("dra-claims.json", "Idle claims", **{"$__range": "1h", "$__interval": "1m"})
    only_train = [{"labels": '{instance="node-a", namespace="ml", claim="train"}', "value": 1}]
    promtool_expr_tests(promtool, tmp_path, series, [
        {"expr": devices, "eval_time": "30m", "exp_samples": only_train},
        {"expr": pods, "eval_time": "30m", "exp_samples": only_train},
        {"expr": f"{idle_for} > 0", "eval_time": "30m", "exp_samples": [
            {"labels": '{instance="node-a", namespace="ml", claim="train"}', "value": 1800}]},
    ])


def test_the_cost_panels_price_each_model_then_the_default_then_the_price_variable(
        promtool: str, tmp_path: Path) -> None:
    """Each device pays the price recorded for its GPU model (``dra-exporter recording-rules
    --price-file``), a model without one the recorded default, and without a default the price
    variable; a MIG device its share. Half an hour of samples, read over the last hour."""
    held, price = showback.HELD_DEVICE, showback.PRICE
    node = 'instance="node-a", job="dra-exporter"'
    h200, a100 = 'model="NVIDIA H200"', 'model="NVIDIA A100-SXM4-80GB"'
    devices = [
        {"series": f'{held}{{{node}, namespace="ml", claim="train", uuid="GPU-0", {h200}, profile=""}}',
         "values": "_ 1x29"},  # 0.5 h × 4.5
        {"series": f'{held}{{{node}, namespace="ml", claim="train", uuid="MIG-1", {h200}, profile="3g.71gb"}}',
         "values": "_ 0.5x29"},  # 0.25 h × 4.5
        {"series": f'{held}{{{node}, namespace="inf", claim="vllm", uuid="GPU-2", {a100}, profile=""}}',
         "values": "_ 1x29"},  # 0.5 h × the default, else × $price
    ]
    prices = [{"series": f'{price}{{model="NVIDIA H200", currency="EUR"}}', "values": "4.5x60"}]
    default = [{"series": f'{price}{{currency="EUR"}}', "values": "3x60"}]

    def cases(inf: float, **values: str) -> list[dict[str, Any]]:
        ml = 0.75 * 4.5
        window = {"$__range": "1h", "price": "2", **values}
        total = panel_expr("dra-showback.json", "Cost ${currency}", **window)
        per_ns = panel_expr("dra-showback.json", "Cost by namespace ${currency}", **window)
        per_claim = panel_expr("dra-showback.json", "Top claims by cost ${currency}", **window)
        return [
            {"expr": f"round(1000 * ({total}))", "eval_time": "60m", "exp_samples": [
                {"labels": "{}", "value": round(1000 * (ml + inf))}]},
            {"expr": f"round(1000 * ({per_ns}))", "eval_time": "60m", "exp_samples": [
                {"labels": '{namespace="ml"}', "value": round(1000 * ml)},
                {"labels": '{namespace="inf"}', "value": round(1000 * inf)}]},
            {"expr": f"round(1000 * ({per_claim}))", "eval_time": "60m", "exp_samples": [
                {"labels": '{namespace="ml", claim="train"}', "value": round(1000 * ml)},
                {"labels": '{namespace="inf", claim="vllm"}', "value": round(1000 * inf)}]},
        ]

    promtool_expr_tests(promtool, tmp_path / "default", devices + prices + default, cases(0.5 * 3))
    promtool_expr_tests(promtool, tmp_path / "variable", devices + prices, cases(0.5 * 2))
    only_ml = panel_expr("dra-showback.json", "Cost ${currency}", **{"$__range": "1h", "namespace": "ml"})
    promtool_expr_tests(promtool, tmp_path / "namespace", devices + prices, [
        {"expr": f"round(1000 * ({only_ml}))", "eval_time": "60m", "exp_samples": [
            {"labels": "{}", "value": round(1000 * 0.75 * 4.5)}]}])
    # Without any price series every device pays the price variable: the dashboard as before prices.
    unpriced = panel_expr("dra-showback.json", "Cost ${currency}", **{"$__range": "1h", "price": "2"})
    promtool_expr_tests(promtool, tmp_path / "none", devices, [
        {"expr": f"round(1000 * ({unpriced}))", "eval_time": "60m", "exp_samples": [
            {"labels": "{}", "value": round(1000 * 1.25 * 2)}]}])


def test_the_cost_panels_name_the_recorded_currency() -> None:
    dash = load_dashboards()["dra-showback.json"]
    currency = variables(dash)["currency"]
    assert currency["query"]["query"] == f"label_values({showback.PRICE}, currency)" and names_only(currency)
    costs = [p["title"] for p in query_panels(dash) if "cost" in p["title"].lower()]
    assert len(costs) == 3 and all(t.endswith(" ${currency}") for t in costs), costs


def test_the_nvlink_throughput_description_names_both_sources() -> None:
    """The counter sums NVML's per-link counters where they exist and integrates GPM only where
    they do not (catalogue help of dra_gpu_nvlink_bytes_total); the panel must not say GPM alone."""
    panel = next(p for p in query_panels(load_dashboards()["dra-node.json"]) if p["title"] == "NVLink throughput")
    assert "per-link" in panel["description"] and "GPM" in panel["description"], panel["description"]
    assert "(from GPM)" not in panel["description"]


# --- live checks against the real Prometheus --------------------------------------------------


def run(prom: PromServer, target: dict[str, Any], expr: str) -> list[dict[str, Any]]:
    if target["range"]:
        end = time.time()
        return list(
            prom.api("query_range", query=expr, start=str(end - 30), end=str(end), step="1")["result"]
        )
    return prom.query(expr)


def all_values(dash: dict[str, Any]) -> dict[str, str]:
    """Each variable as Grafana fills it by default: "All" (a textbox: its default)."""
    return {v: var["query"] if var["type"] == "textbox" else ALL
            for v, var in variables(dash).items() if v != "datasource"}


def assert_every_panel_query_returns_data(prom: PromServer, dash: dict[str, Any]) -> None:
    empty = []
    for title, target in targets(dash):
        expr = substitute(target["expr"], all_values(dash))
        if not run(prom, target, expr):
            empty.append(f"{title}: {expr}")
    assert not empty, "panels without data:\n" + "\n".join(empty)


def assert_variables_list_values_and_every_query_accepts_a_selection(prom: PromServer, dash: dict[str, Any]) -> None:
    chosen: dict[str, str] = {v["name"]: v["query"] for v in dash["templating"]["list"] if v["type"] == "textbox"}
    for var in dash["templating"]["list"]:
        if var["type"] != "query" or names_only(var):  # prices are recorded only where a price file says
            continue
        match = re.fullmatch(r"label_values\((.+), (\w+)\)", var["query"]["query"])
        assert match, var["query"]
        selector, label = match.groups()
        found = prom.query(
            f"group by ({label}) ({substitute(selector, {**{k: ALL for k in variables(dash)}, **chosen})})"
        )
        values = sorted(v for r in found if (v := r["metric"].get(label)))  # Grafana lists no empty value
        assert values, f"variable {var['name']} lists nothing"
        # Grafana escapes a selected value for a regex inside a PromQL string: \\. for a dot.
        chosen[var["name"]] = re.escape(values[0]).replace("\\", "\\\\")
    for _, target in targets(dash):
        run(prom, target, substitute(target["expr"], chosen))  # raises on a PromQL error


@pytest.mark.slow  # the kit's Prometheus (conftest ``prom``) takes ~12 s per naming to fill
@pytest.mark.prometheus
@pytest.mark.parametrize("name", node_agent_dashboards())
def test_every_panel_query_returns_data(prom: PromServer, name: str) -> None:
    assert_every_panel_query_returns_data(prom, load_dashboards()[name])


@pytest.mark.slow  # the kit's Prometheus (conftest ``prom``) takes ~12 s per naming to fill
@pytest.mark.prometheus
@pytest.mark.parametrize("name", node_agent_dashboards())
def test_variables_list_values_and_every_query_accepts_a_selection(prom: PromServer, name: str) -> None:
    assert_variables_list_values_and_every_query_accepts_a_selection(prom, load_dashboards()[name])


@pytest.mark.slow  # the kit's Prometheus (conftest ``prom``) takes ~12 s per naming to fill
@pytest.mark.prometheus
def test_overview_counts_match_the_demo_node(prom: PromServer) -> None:
    dash = load_dashboards()["dra-overview.json"]
    stats = {p["title"]: p["targets"][0]["expr"] for p in query_panels(dash) if p["type"] == "stat"}

    def value(title: str) -> float:
        (sample,) = prom.query(substitute(stats[title], {"node": ALL}))
        return float(sample["value"][1])

    # demo.yaml: 8 GPUs, 2 + 7 MIG devices; claims hold GPUs 0-3 and 6, one 3g and four 1g MIG
    # devices; GPU 7, one 3g and three 1g are free; nothing claimed has been idle.
    assert value("GPUs") == 8
    assert value("MIG devices") == 9
    assert value("Allocated devices") == 10
    assert value("Unallocated devices") == 5
    assert value("Claimed but idle") == 0
    assert value("Devices down") == 0
