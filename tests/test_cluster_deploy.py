"""The chart's cluster mode: off by default; when on, one Deployment replica with its own ServiceAccount,
read-only RBAC on exactly the four DRA kinds, pods and Nodes, Service and ServiceMonitor, none of which the node
agent's selectors pick up."""

from __future__ import annotations

from typing import Any

from deploy_tools import NAMESPACE, render_chart

from dra_exporter.config import DEFAULT_CLUSTER_LISTEN

ON = {"cluster": {"enabled": True}, "serviceMonitor": {"enabled": True}}


def cluster_objects(values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {d["kind"]: d for d in render_chart(values)
            if d["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "cluster"}


def test_off_by_default() -> None:
    assert not cluster_objects({})
    assert "Deployment" not in {d["kind"] for d in render_chart()}


def test_one_replica_reading_only_the_dra_objects_pods_and_nodes() -> None:
    objs = cluster_objects(ON)
    assert set(objs) == {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment", "Service",
                         "ServiceMonitor"}
    deployment = objs["Deployment"]["spec"]
    assert deployment["replicas"] == 1
    pod = deployment["template"]["spec"]
    assert pod["serviceAccountName"] == objs["ServiceAccount"]["metadata"]["name"]
    (ctr,) = pod["containers"]
    assert ctr["args"][0] == "cluster"
    assert f"--listen=0.0.0.0:{DEFAULT_CLUSTER_LISTEN.rsplit(':', 1)[1]}" in ctr["args"]
    assert "hostPID" not in pod and not ctr.get("volumeMounts"), "no node access"
    dra, pods, nodes = objs["ClusterRole"]["rules"]
    assert dra == {"apiGroups": ["resource.k8s.io"], "verbs": ["list", "watch"],
                   "resources": ["resourceclaims", "resourceslices", "deviceclasses", "devicetaintrules"]}
    assert pods == {"apiGroups": [""], "verbs": ["list", "watch"], "resources": ["pods"]}, "what the source asks"
    assert nodes == {"apiGroups": [""], "verbs": ["list", "watch"], "resources": ["nodes"]}, "the node filters"
    binding = objs["ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == objs["ClusterRole"]["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": objs["ServiceAccount"]["metadata"]["name"],
                                    "namespace": NAMESPACE}]


def test_node_agent_selectors_do_not_pick_up_the_cluster_mode_and_vice_versa() -> None:
    docs = render_chart(ON)
    node_monitor = next(d for d in docs if d["kind"] == "ServiceMonitor"
                        and d["metadata"]["labels"].get("app.kubernetes.io/component") != "cluster")
    node_service = next(d for d in docs if d["kind"] == "Service"
                        and d["metadata"]["labels"].get("app.kubernetes.io/component") != "cluster")
    daemonset = next(d for d in docs if d["kind"] == "DaemonSet")
    objs = cluster_objects(ON)
    cluster_pod_labels = objs["Deployment"]["spec"]["template"]["metadata"]["labels"].items()
    cluster_service_labels = objs["Service"]["metadata"]["labels"].items()
    assert not node_monitor["spec"]["selector"]["matchLabels"].items() <= cluster_service_labels
    assert not node_service["spec"]["selector"].items() <= cluster_pod_labels
    assert not daemonset["spec"]["selector"]["matchLabels"].items() <= cluster_pod_labels
    assert objs["Service"]["spec"]["selector"].items() <= cluster_pod_labels
    assert objs["ServiceMonitor"]["spec"]["selector"]["matchLabels"].items() <= cluster_service_labels
    (endpoint,) = objs["ServiceMonitor"]["spec"]["endpoints"]
    assert {r["targetLabel"]: r["replacement"] for r in endpoint["relabelings"]} == {"job": "dra-exporter-cluster"}


def test_cluster_objects_validate_against_kubernetes_schemas_strictly() -> None:
    import kubernetes_validate as kv

    for version in ("1.34.0", "1.37.0"):
        for doc in cluster_objects(ON).values():
            if doc["kind"] != "ServiceMonitor":
                kv.validate(doc, version, strict=True)


def _alerts(groups: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}


def test_every_alert_the_repository_ships_is_in_some_rendering_of_the_chart_and_the_reverse() -> None:
    import yaml
    from deploy_tools import CHART_CLUSTER_RULES, CLUSTER_RULES, REPO

    shipped: dict[str, dict[str, Any]] = {}
    for path in sorted((REPO / "deploy").glob("*.yaml")):
        if not path.name.endswith(".test.yaml"):
            shipped |= _alerts(yaml.safe_load(path.read_text()).get("groups", []))
    renderings = [{"prometheusRule": {"enabled": True}},
                  {**ON, "prometheusRule": {"enabled": True}}]
    rendered: dict[str, dict[str, Any]] = {}
    for values in renderings:
        (rule,) = [d for d in render_chart(values) if d["kind"] == "PrometheusRule"]
        rendered |= _alerts(rule["spec"]["groups"])
    assert set(shipped) == set(rendered)
    # The cluster alerts come with the cluster mode, whose exporter they read, and are the file's own.
    cluster = set(_alerts(yaml.safe_load(CLUSTER_RULES.read_text())["groups"]))
    assert {"DraClaimPendingTooLong", "DraDeviceClassExhausted", "DraResourcePoolIncomplete"} <= cluster
    (node_only,) = [d for d in render_chart(renderings[0]) if d["kind"] == "PrometheusRule"]
    assert not cluster & set(_alerts(node_only["spec"]["groups"]))
    assert {name: rendered[name]["expr"] for name in cluster} == {name: shipped[name]["expr"] for name in cluster}
    assert CHART_CLUSTER_RULES.read_text() == CLUSTER_RULES.read_text(), "sync with: python3 tests/deploy_tools.py"
