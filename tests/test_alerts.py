"""The alert rules: valid for promtool, unit-tested both ways, documented, and live-checked.

``promtool test rules deploy/prometheus-rules.test.yaml`` carries the behaviour (each alert
fires in one case and stays quiet in another); these tests make sure it runs, that no alert
goes untested or without a runbook, and that the expressions work against what the exporter
really publishes (the simulated demo node scraped by the real Prometheus).
"""

from __future__ import annotations

import re
import subprocess
from typing import Any

import pytest
import yaml
from deploy_tools import (
    CHART,
    REPO,
    RULES,
    kit_native_families,
)
from promharness import PromServer

from dra_exporter import catalog as cat
from dra_exporter import naming

RULE_TESTS = REPO / "deploy" / "prometheus-rules.test.yaml"
OPERATING = REPO / "docs" / "operating.md"
CRITICAL_XIDS = {"48", "63", "64", "74", "79", "92", "94", "95"}
RUNBOOK_BASE = yaml.safe_load((CHART / "values.yaml").read_text())["prometheusRule"]["runbookBaseUrl"]


def alerts() -> dict[str, dict[str, Any]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {rule["alert"]: rule for group in groups for rule in group["rules"] if "alert" in rule}


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of a Markdown page."""
    anchors = set()
    for heading in re.findall(r"^#+ (.+)$", markdown, re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        anchors.add(slug)
    return anchors


def test_promtool_accepts_the_rules(promtool: str) -> None:
    proc = subprocess.run(
        [promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in proc.stdout


def test_promtool_unit_tests_pass(promtool: str) -> None:
    proc = subprocess.run(
        [promtool, "test", "rules", RULE_TESTS.name],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=RULE_TESTS.parent,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCESS" in proc.stdout


def test_every_alert_is_tested_firing_and_quiet() -> None:
    cases = [
        case for test in yaml.safe_load(RULE_TESTS.read_text())["tests"] for case in test["alert_rule_test"]
    ]
    fires = {c["alertname"] for c in cases if c["exp_alerts"]}
    quiet = {c["alertname"] for c in cases if not c["exp_alerts"]}
    assert set(alerts()) - fires == set(), "alerts never shown to fire"
    assert set(alerts()) - quiet == set(), "alerts never shown to stay quiet"


def test_every_alert_has_severity_summary_description_and_a_runbook_that_exists() -> None:
    anchors = github_anchors(OPERATING.read_text())
    for name, rule in alerts().items():
        assert rule["labels"]["severity"] in {"critical", "warning", "info"}, name
        notes = rule["annotations"]
        assert notes["summary"] and notes["description"], name
        # Absolute, under the base the chart swaps for prometheusRule.runbookBaseUrl.
        base, _, anchor = notes["runbook_url"].partition("#")
        assert base == RUNBOOK_BASE and anchor in anchors, f"{name}: no section #{anchor} in docs/operating.md"
        assert anchor == f"runbook-{name.lower()}", name


def test_rules_use_only_catalogue_metrics_and_the_scrape_job() -> None:
    for name, rule in alerts().items():
        for metric in re.findall(r"\bdra_[a-z0-9_]+", rule["expr"]):
            assert metric in cat.BY_NAME, f"{name}: {metric} is not in the catalogue"
    assert 'up{job="dra-exporter"}' in alerts()["DraExporterDown"]["expr"]


def test_critical_and_other_xids_split_the_codes_between_two_alerts() -> None:
    critical, other = alerts()["DraGpuCriticalXid"]["expr"], alerts()["DraGpuXidErrors"]["expr"]
    (codes,) = set(re.findall(r'xid=~"([\d|]+)"', critical))
    assert CRITICAL_XIDS <= set(codes.split("|"))
    assert set(re.findall(r'xid!~"([\d|]+)"', other)) == {codes}, "the warning covers every other code"


# --- live: the expressions against what the exporter publishes ------------------------------


@pytest.mark.parametrize("dcgm", list(cat.DCGM_NAMINGS))
def test_dcgm_naming_keeps_every_native_family_the_rules_and_dashboards_read(dcgm: str) -> None:
    assert not kit_native_families() & naming.REPLACED[dcgm], f"alerts or panels would go dark under --naming {dcgm}"


def test_the_kept_families_are_only_what_the_kit_reads() -> None:
    sources = {source.name for n in cat.DCGM_NAMINGS.values() for source, form in n.forms if form.replaces}
    assert cat.DCGM_KEPT_FOR_KIT == kit_native_families() & sources, "keep only what the kit reads"


@pytest.mark.slow  # the kit's Prometheus (conftest ``prom``) takes ~12 s per naming to fill
@pytest.mark.prometheus
def test_expressions_evaluate_on_the_simulated_node(prom: PromServer) -> None:
    results = {name: prom.query(rule["expr"]) for name, rule in alerts().items()}  # raises on a bad expr
    # The scenario's XIDs 13 (GPU 2) and 31 (a MIG device of GPU 5) are application faults.
    xids = {
        (r["metric"]["gpu"], r["metric"]["xid"], r["metric"].get("profile", ""))
        for r in results["DraGpuXidErrors"]
    }
    assert xids == {("2", "13", ""), ("5", "31", "1g.18gb")}
    for name in (
        "DraGpuCriticalXid",
        "DraGpuLost",
        "DraGpuRowRemapFailure",
        "DraGpuUncorrectableEccErrors",
        "DraExporterSourceDown",
        "DraExporterDown",
        "DraExporterAbsent",
        "DraClaimIdle",
        "DraDeviceUnhealthy",
        "DraClaimDeviceConditionFalse",
    ):
        assert results[name] == [], f"{name} on a healthy demo node: {results[name]}"


def test_operating_guide_links_resolve_and_name_both_admin_access_labels() -> None:
    text = OPERATING.read_text()
    anchors = github_anchors(text)
    for link in re.findall(r"\]\(#([^)]+)\)", text):
        assert link in anchors, f"docs/operating.md links to #{link}, which is no heading"
    # The namespace label admin access needs changed its key in Kubernetes 1.34.
    assert "resource.kubernetes.io/admin-access=true" in text and "resource.k8s.io/admin-access=true" in text
