"""The Grafana dashboards: generated from the catalogue, importable, and every query works.

The live tests run ``dra-exporter serve --simulate`` (the demo node, XIDs moved early) scraped
every second by the real Prometheus, substitute the dashboard variables as Grafana would for
"All", and check that every panel's PromQL parses and returns data.
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
import time
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest
from deploy_tools import REPO, chart_exporter_env, fault_scenario, require_tool, running_exporter
from promharness import PromServer, free_port, start_prometheus

from dra_exporter import catalog as cat

DASHBOARDS = REPO / "dashboards"
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


def load_dashboards() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def query_panels(dash: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in dash["panels"] if p["type"] not in ("row", "text")]


def targets(dash: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    for panel in query_panels(dash):
        for target in panel["targets"]:
            yield panel["title"], target


def variables(dash: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {v["name"]: v for v in dash["templating"]["list"]}


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


def test_the_four_views_exist() -> None:
    titles = {d["title"] for d in load_dashboards().values()}
    assert titles == {
        "DRA GPUs / Cluster overview",
        "DRA GPUs / Claims and namespaces",
        "DRA GPUs / Node",
        "DRA GPUs / MIG and shared GPUs",
    }


@pytest.mark.parametrize("name", sorted(p.name for p in DASHBOARDS.glob("*.json")))
def test_dashboard_is_importable_with_a_datasource_variable(name: str) -> None:
    dash = load_dashboards()[name]
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 36
    assert "id" not in dash or dash["id"] is None, "an exported id would clash on import"
    assert "__inputs" not in dash, "the datasource is a variable, not an import-time input"
    variables_ = variables(dash)
    ds = variables_["datasource"]
    assert (ds["type"], ds["query"]) == ("datasource", "prometheus")
    node = variables_["node"]
    assert f", {GEN.NODE_LABEL})" in node["query"]["query"], "the node picker lists the scrape target label"
    for var in variables_.values():
        if var["type"] == "query":
            assert var["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
            assert var["includeAll"] and var["allValue"] == ALL
            assert re.fullmatch(r"label_values\(.+, \w+\)", var["query"]["query"]), var["query"]


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
            assert f'{GEN.NODE_LABEL}=~"$node"' in target["expr"], f"{panel['title']} ignores the node picker"


def test_queries_use_only_catalogue_metrics() -> None:
    for name, dash in load_dashboards().items():
        queries = [tg["expr"] for _, tg in targets(dash)] + [
            v["query"]["query"] for v in dash["templating"]["list"] if v["type"] == "query"
        ]
        for metric in set(re.findall(r"\bdra_[a-z0-9_]+", " ".join(queries))):
            assert metric in cat.BY_NAME, f"{name}: {metric} is not in dra_exporter/catalog.py"


# --- live checks against the real Prometheus --------------------------------------------------


@pytest.fixture(scope="module", params=["native", "dcgm"])
def prom(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[PromServer]:
    """Every panel must work under every naming the chart offers (``dcgm`` keeps what they read)."""
    binary = require_tool("prometheus", "apt-get install -y prometheus")
    workdir = tmp_path_factory.mktemp(f"dashboards-{request.param}")
    env = chart_exporter_env({"naming": request.param})
    with running_exporter(fault_scenario(workdir), free_port(), env=env) as port:
        server = start_prometheus(binary, workdir / "prometheus", [f"127.0.0.1:{port}"], "1s")
        try:
            # Enough scrapes for rate() over $__rate_interval, and the scenario's XIDs have landed.
            server.wait_for("count_over_time(dra_gpu_up[1m]) >= 6", timeout=90)
            server.wait_for(f"count({cat.GPU_XID_ERRORS.name}) >= 2", timeout=60)
            yield server
        finally:
            server.stop()


def run(prom: PromServer, target: dict[str, Any], expr: str) -> list[dict[str, Any]]:
    if target["range"]:
        end = time.time()
        return list(
            prom.api("query_range", query=expr, start=str(end - 30), end=str(end), step="1")["result"]
        )
    return prom.query(expr)


@pytest.mark.prometheus
@pytest.mark.parametrize("name", sorted(p.name for p in DASHBOARDS.glob("*.json")))
def test_every_panel_query_returns_data(prom: PromServer, name: str) -> None:
    dash = load_dashboards()[name]
    all_values = {v: ALL for v in variables(dash) if v != "datasource"}
    empty = []
    for title, target in targets(dash):
        expr = substitute(target["expr"], all_values)
        if not run(prom, target, expr):
            empty.append(f"{title}: {expr}")
    assert not empty, "panels without data:\n" + "\n".join(empty)


@pytest.mark.prometheus
@pytest.mark.parametrize("name", sorted(p.name for p in DASHBOARDS.glob("*.json")))
def test_variables_list_values_and_every_query_accepts_a_selection(prom: PromServer, name: str) -> None:
    dash = load_dashboards()[name]
    chosen: dict[str, str] = {}
    for var in dash["templating"]["list"]:
        if var["type"] != "query":
            continue
        match = re.fullmatch(r"label_values\((.+), (\w+)\)", var["query"]["query"])
        assert match, var["query"]
        selector, label = match.groups()
        found = prom.query(
            f"group by ({label}) ({substitute(selector, {**{k: ALL for k in variables(dash)}, **chosen})})"
        )
        values = sorted(r["metric"][label] for r in found)
        assert values, f"variable {var['name']} lists nothing"
        # Grafana escapes a selected value for a regex inside a PromQL string: \\. for a dot.
        chosen[var["name"]] = re.escape(values[0]).replace("\\", "\\\\")
    for _, target in targets(dash):
        run(prom, target, substitute(target["expr"], chosen))  # raises on a PromQL error


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
