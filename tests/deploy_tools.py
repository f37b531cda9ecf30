"""Helpers for the operator-kit tests: external tools, the simulated exporter, the Helm chart.

- ``require_tool`` / ``require_module``: a missing tool skips a test on a developer machine but
  fails it under ``CI=true`` (CI must never pass by skipping), like ``conftest.py`` does for
  promtool.
- ``running_exporter``: ``dra-exporter serve --simulate`` as a subprocess on a free port.
- ``fault_scenario``: the built-in demo node with its XIDs moved early, so a test sees XID
  series within seconds.
- ``render_chart`` / ``manifests_text``: the chart rendered offline by Helm's own Go code
  (PyPI ``helm-python-sdk``, which bundles Helm v4's SDK), as parsed documents or as the text
  committed in ``deploy/manifests/``.

``python3 tests/deploy_tools.py`` rewrites ``deploy/manifests/dra-exporter.yaml`` and the
chart's copies of ``deploy/prometheus-rules.yaml``, ``deploy/recording-rules.yaml`` and
``dashboards/*.json`` after a change to the chart, the rules or the dashboards.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "deploy" / "helm" / "dra-exporter"
RULES = REPO / "deploy" / "prometheus-rules.yaml"
CHART_RULES = CHART / "files" / "prometheus-rules.yaml"
CHART_DASHBOARDS = CHART / "files" / "dashboards"
DASHBOARDS = REPO / "dashboards"
RECORDING_RULES = REPO / "deploy" / "recording-rules.yaml"
CHART_RECORDING_RULES = CHART / "files" / "recording-rules.yaml"
CLUSTER_RULES = REPO / "deploy" / "cluster-rules.yaml"
CHART_CLUSTER_RULES = CHART / "files" / "cluster-rules.yaml"
MANIFESTS = REPO / "deploy" / "manifests" / "dra-exporter.yaml"
RELEASE = "dra-exporter"
NAMESPACE = "monitoring"
KUBE_VERSION = "1.34.0"
"""The Kubernetes version the manifests are validated against (kubernetes-validate schemas)."""

_MANIFEST_HEADER = f"""\
# Generated from deploy/helm/dra-exporter with its default values (release "{RELEASE}",
# namespace "{NAMESPACE}"): do not edit; run `python3 tests/deploy_tools.py` after changing the chart.
# Install: kubectl create namespace {NAMESPACE} && kubectl apply -f deploy/manifests/
"""


def _missing(message: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI=true and {message}: CI must run these tests, not skip them", pytrace=False)
    pytest.skip(message)


def require_tool(name: str, install_hint: str) -> str:
    """Path of the executable ``name`` (PATH, then next to this Python), else skip/fail."""
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if not found:
        _missing(f"{name} is not installed; install it with `{install_hint}`")
    return str(found)


def require_module(name: str, pip_name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ImportError:
        _missing(f"Python module {name} is not installed; install it with `pip install {pip_name}`")
        raise  # unreachable: _missing raises


# --- the simulated exporter -------------------------------------------------------------------


def fault_scenario(directory: Path) -> Path:
    """The demo node with XIDs a few seconds in (on a whole GPU and on a MIG device), and one pod whose
    NodePrepareResources fails (its claim allocated here, never prepared: ``dra_claim_not_prepared``)."""
    from dra_exporter_sim import scenario as sim_scenario

    demo = yaml.safe_load((Path(sim_scenario.__file__).parent / "scenarios" / "demo.yaml").read_text())
    demo["faults"] = [
        {"kind": "xid", "gpu": 2, "xid": 13, "at": 4},
        {"kind": "xid", "gpu": 5, "xid": 31, "mig_device": "gpu-5-mig-1g18gb-19-0", "at": 5},
        {"kind": "prepare_failed", "pod": "inference/embed-2", "at": 0},
    ]
    path = directory / "demo-early-xids.yaml"
    path.write_text(yaml.safe_dump(demo, sort_keys=False))
    return path


def _get(url: str) -> int:
    # Readiness of our own test server: its certificate is a throw-away one.
    context = ssl._create_unverified_context() if url.startswith("https:") else None
    try:
        with urllib.request.urlopen(url, timeout=5, context=context) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


@contextmanager
def running_exporter(
    scenario: str | Path,
    port: int,
    *,
    interval: float = 0.5,
    command: list[str] | None = None,
    env: dict[str, str] | None = None,
    scheme: str = "http",
    mode: str = "serve",
) -> Iterator[int]:
    """Run ``serve --simulate`` (``mode="cluster"``: ``cluster --simulate``, the scenario a cluster's)
    until the block ends; yields the port once /readyz says 200.

    With ``command`` (an installed program) the exporter runs without this process's
    ``PYTHONPATH``, so it is that program's package that runs, not the checkout's."""
    argv = (command or [sys.executable, "-m", "dra_exporter.cli"]) + [
        mode,
        "--simulate",
        str(scenario),
        "--listen",
        f"127.0.0.1:{port}",
        "--interval",
        str(interval),
    ]
    inherited = {k: v for k, v in os.environ.items() if not (command and k == "PYTHONPATH")}
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**inherited, **(env or {})}
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"exporter exited with {proc.returncode}: {proc.communicate()[0]}")
            try:
                if _get(f"{scheme}://127.0.0.1:{port}/readyz") == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError("exporter not ready within 60 s")
            time.sleep(0.2)
        yield port
    finally:
        proc.terminate()
        try:
            proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate(timeout=20)


def chart_exporter_env(values: dict[str, Any]) -> dict[str, str]:
    """The plain ``DRA_EXPORTER_*`` variables the chart's DaemonSet sets with ``values``: run the
    simulated exporter with them to see what the chart's exporter would publish."""
    (daemonset,) = [d for d in render_chart(values) if d["kind"] == "DaemonSet"]
    (main,) = daemonset["spec"]["template"]["spec"]["containers"]
    wanted = ("DRA_EXPORTER_NAMING",)
    return {e["name"]: e["value"] for e in main["env"] if e["name"] in wanted and "value" in e}


def kit_native_families() -> set[str]:
    """Every native family the shipped alert rules and dashboards query."""
    texts = [RULES.read_text()] + [p.read_text() for p in sorted(DASHBOARDS.glob("*.json"))]
    return set(re.findall(r"\bdra_[a-z0-9_]+", " ".join(texts)))


def recording_rules_every(interval: str, directory: Path, groups: list[dict[str, Any]] | None = None) -> Path:
    """``deploy/recording-rules.yaml`` (or the given groups of it) evaluated every ``interval``: the
    shipped 1m leaves a test of a minute with one evaluation. Always the same file name, so
    Prometheus gives the groups the same evaluation offset each time."""
    chosen = groups or yaml.safe_load(RECORDING_RULES.read_text())["groups"]
    for group in chosen:
        group["interval"] = interval
    path = directory / "recording-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": chosen}, sort_keys=False))
    return path


# --- the Helm chart ---------------------------------------------------------------------------


def helm() -> ModuleType:
    return require_module("helm_python", "helm-python-sdk")


def render_templates(values: dict[str, Any] | None = None, *, namespace: str = NAMESPACE) -> dict[str, str]:
    """Template path → rendered text, as ``helm template`` would produce them (NOTES excluded)."""
    with helm().Chart.load(str(CHART)) as chart:
        rendered = chart.render(values or {}, name=RELEASE, namespace=namespace, is_install=True)
    return {
        path: text
        for path, text in sorted(rendered.items())
        if not path.endswith("NOTES.txt") and text.strip()
    }


def render_chart(values: dict[str, Any] | None = None, *, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
    """Every Kubernetes object the chart renders with ``values``."""
    docs: list[dict[str, Any]] = []
    for text in render_templates(values, namespace=namespace).values():
        docs.extend(d for d in yaml.safe_load_all(text) if d)
    return docs


# The order ``helm install`` applies kinds in, so ``kubectl apply -f`` creates what a pod needs first.
_INSTALL_ORDER = (
    "ServiceAccount",
    "Secret",
    "ClusterRole",
    "ClusterRoleBinding",
    "ResourceClaimTemplate",
    "ConfigMap",
    "Service",
    "DaemonSet",
    "ServiceMonitor",
    "PodMonitor",
    "PrometheusRule",
)


def manifests_text() -> str:
    """What ``deploy/manifests/dra-exporter.yaml`` must contain: the default rendering."""
    parts = []
    for path, text in render_templates().items():
        for body in (b.strip("\n") for b in text.split("\n---\n")):
            doc = yaml.safe_load(body)
            if doc:
                parts.append((_INSTALL_ORDER.index(doc["kind"]), path, f"---\n# Source: {path}\n{body}\n"))
    return _MANIFEST_HEADER + "".join(part for *_, part in sorted(parts))


def main() -> int:
    CHART_RULES.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(RULES, CHART_RULES)
    shutil.copyfile(RECORDING_RULES, CHART_RECORDING_RULES)
    shutil.copyfile(CLUSTER_RULES, CHART_CLUSTER_RULES)
    shutil.rmtree(CHART_DASHBOARDS, ignore_errors=True)
    CHART_DASHBOARDS.mkdir(parents=True)
    for dashboard in sorted(DASHBOARDS.glob("*.json")):
        shutil.copyfile(dashboard, CHART_DASHBOARDS / dashboard.name)
    MANIFESTS.parent.mkdir(parents=True, exist_ok=True)
    MANIFESTS.write_text(manifests_text())
    print(f"wrote {CHART_RULES.relative_to(REPO)}, {CHART_RECORDING_RULES.relative_to(REPO)}, "
          f"{CHART_CLUSTER_RULES.relative_to(REPO)}, "
          f"{CHART_DASHBOARDS.relative_to(REPO)}/ and "
          f"{MANIFESTS.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
