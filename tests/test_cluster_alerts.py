"""The cluster mode's alert rules: promtool accepts them, its unit tests pass, and each alert has a
runbook section in docs/operating.md."""

from __future__ import annotations

import re
import subprocess

import yaml
from deploy_tools import REPO

from benchmarks.bench_cluster import run as bench_run

RULES = REPO / "deploy" / "cluster-rules.yaml"
OPERATING = REPO / "docs" / "operating.md"


def test_promtool_accepts_and_unit_tests_the_cluster_rules(promtool: str) -> None:
    check = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60,
                           check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    tested = subprocess.run([promtool, "test", "rules", "cluster-rules.test.yaml"], cwd=RULES.parent,
                            capture_output=True, text=True, timeout=120, check=False)
    assert tested.returncode == 0 and "SUCCESS" in tested.stdout, tested.stdout + tested.stderr


def test_every_cluster_alert_is_unit_tested_and_has_a_runbook() -> None:
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    tests = (RULES.parent / "cluster-rules.test.yaml").read_text()
    headings = set(re.findall(r"^### Runbook: (\w+)$", OPERATING.read_text(), re.MULTILINE))
    for rule in rules:
        assert f"alertname: {rule['alert']}" in tests, rule["alert"]
        assert rule["annotations"]["runbook"] == f"docs/operating.md#runbook-{rule['alert'].lower()}"
        assert rule["alert"] in headings, rule["alert"]
        assert 'job="dra-exporter-cluster"' in rule["expr"], "the chart's ServiceMonitor sets this job"


def test_the_scale_benchmark_runs_in_a_tiny_configuration() -> None:
    result = bench_run(nodes=5, cycles=1)
    assert (result["gpus"], result["claims"], result["pending"]) == (40, 60, 1)
    assert result["pods_kept"] == 60, "one pod per claim; daemon pods and finished jobs are not kept"
    assert result["devices"] == 5 * (6 + 2 * 7)  # a quarter of the GPUs split into 7
    for kind in ("resourceslices", "resourceclaims", "deviceclasses", "devicetaintrules", "pods"):
        assert result["api_requests"][f"list {kind}"] == 1
    assert result["series"] > 0
