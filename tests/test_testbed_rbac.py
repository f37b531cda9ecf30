"""The chart's ClusterRoles under real RBAC: each one created in the real kube-apiserver, bound to
its ServiceAccount, and used with that account's token by the exporter it is for — the node
agent (``serve`` on a simulated node, ``--kubeconfig`` with the token) and the cluster mode
(``cluster``). The apiserver's audit log says what each one asked and what it was answered:
no request may be refused, and the role must grant exactly what the exporter used — nothing
missing, nothing more (the server's own SelfSubjectRulesReview of the token, less what every
authenticated user may do, must be the role's rules; writes, secrets and the rest are denied).

deploy/manifests/dra-exporter.yaml carries the node agent's role as the chart renders it by
default (tests/test_deploy.py checks the rendering); its rules are checked here to be the same.
"""

from __future__ import annotations

import re
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_tools import MANIFESTS
from kubenode import GpuNode, Identity, allocated, chart_identities, claim, install_compute_domain_crds, request
from kubetestbed import ControlPlane, free_port

from dra_exporter.sources.kubeapi_normalize import cluster_pod_from_dict

pytestmark = pytest.mark.testbed_kube

Access = tuple[str, str, str]
"""(verb, API group, resource)."""

#: What the node agent asks: its node's slices and those that name no node, the claims its pods
#: use (one GET each), the list of claims (the census, only because a CDI spec here names a claim no
#: local pod explains), its node's pods, the DeviceTaintRules, its own Node (a slice selects nodes by
#: label here) and NVIDIA's ComputeDomains and their cliques (served here).
NODE_AGENT_USES: frozenset[Access] = frozenset({
    ("list", "resource.k8s.io", "resourceslices"), ("watch", "resource.k8s.io", "resourceslices"),
    ("get", "resource.k8s.io", "resourceclaims"), ("list", "resource.k8s.io", "resourceclaims"),
    ("list", "resource.k8s.io", "devicetaintrules"), ("watch", "resource.k8s.io", "devicetaintrules"),
    ("list", "", "pods"), ("watch", "", "pods"), ("get", "", "nodes"),
    ("list", "resource.nvidia.com", "computedomains"), ("watch", "resource.nvidia.com", "computedomains"),
    ("list", "resource.nvidia.com", "computedomaincliques"),
    ("watch", "resource.nvidia.com", "computedomaincliques"),
})
LEFTOVER_CLAIM_UID = "6d1f0c3e-2b7a-4c55-9e0d-1a2b3c4d5e6f"
#: What the cluster mode asks: every DRA object of the cluster, the pods and the Nodes, listed and watched.
CLUSTER_USES: frozenset[Access] = frozenset(
    (verb, group, resource) for verb in ("list", "watch")
    for group, resource in (("resource.k8s.io", "resourceslices"), ("resource.k8s.io", "resourceclaims"),
                            ("resource.k8s.io", "deviceclasses"), ("resource.k8s.io", "devicetaintrules"),
                            ("", "pods"), ("", "nodes")))
#: What every authenticated user may do (system:basic-user): ask the authoriser about itself.
SELF_REVIEWS = {("authorization.k8s.io", "selfsubjectaccessreviews"),
                ("authorization.k8s.io", "selfsubjectrulesreviews"), ("authentication.k8s.io", "selfsubjectreviews")}
#: What neither role may do, asked of the authoriser: writes of what they read, and what they never read.
DENIED: tuple[tuple[str, str, str, str], ...] = (
    ("get", "", "secrets", ""), ("list", "", "secrets", ""), ("list", "", "configmaps", ""),
    ("create", "", "pods", ""), ("delete", "", "pods", ""), ("patch", "", "pods", "status"),
    ("create", "", "pods", "exec"), ("get", "", "pods", "log"), ("list", "", "nodes", ""),
    ("patch", "", "nodes", ""), ("create", "", "serviceaccounts", "token"), ("list", "", "events", ""),
    ("update", "resource.k8s.io", "resourceclaims", ""), ("patch", "resource.k8s.io", "resourceclaims", "status"),
    ("delete", "resource.k8s.io", "resourceclaims", ""), ("create", "resource.k8s.io", "resourceslices", ""),
    ("delete", "resource.k8s.io", "resourceslices", ""), ("create", "resource.k8s.io", "deviceclasses", ""),
    ("create", "resource.k8s.io", "devicetaintrules", ""), ("update", "resource.nvidia.com", "computedomains", ""),
    ("list", "apiextensions.k8s.io", "customresourcedefinitions", ""),
    ("create", "rbac.authorization.k8s.io", "clusterrolebindings", ""),
)


def expand(rules: Iterable[Mapping[str, Any]]) -> set[Access]:
    return {(verb, group, resource) for rule in rules for group in rule.get("apiGroups", ())
            for resource in rule.get("resources", ()) for verb in rule.get("verbs", ())}


@pytest.fixture(scope="module")
def chart(kube: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Identity]]:
    with chart_identities(kube, tmp_path_factory.mktemp("rbac")) as identities:
        yield identities


def _scrape(port: int, path: str = "/metrics") -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except OSError:
        return 0, ""


@contextmanager
def exporter(*args: str) -> Iterator[int]:
    """``dra-exporter ARGS --listen 127.0.0.1:<port>`` until the block ends; yields the port once
    /readyz says 200."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "dra_exporter.cli", *args, "--listen", f"127.0.0.1:{port}",
                             "--interval", "1"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while _scrape(port, "/readyz")[0] != 200:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"{args[0]} not ready: {proc.communicate()[0][-3000:]}")
            time.sleep(0.2)
        yield port
    finally:
        proc.terminate()
        try:
            proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()


def used(kube: ControlPlane, user: str) -> tuple[set[Access], list[str]]:
    """(what ``user`` asked, the refused requests) according to the audit log."""
    asked, refused = set(), []
    for event in kube.audit_events(user):
        ref = event.get("objectRef")
        code = event.get("responseStatus", {}).get("code", 0)
        if code in (401, 403):
            refused.append(f"{event['verb']} {event['requestURI']}: {code}")
        if ref and (ref.get("apiGroup", ""), ref["resource"]) not in SELF_REVIEWS:
            resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
            asked.add((event["verb"], ref.get("apiGroup", ""), resource))
    return asked, refused


def wait_until_used(kube: ControlPlane, identity: Identity, wanted: frozenset[Access]) -> set[Access]:
    deadline = time.monotonic() + 30
    while True:
        asked, refused = used(kube, identity.user)
        assert not refused, f"{identity.user} was refused: {refused}"
        if asked >= wanted or time.monotonic() > deadline:
            return asked
        time.sleep(0.2)


def rules_review(kube: ControlPlane, identity: Identity) -> set[Access]:
    """What the server says the token may do in its namespace, less what every user may."""
    status, body = kube.request("POST", "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews",
                                {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview",
                                 "spec": {"namespace": identity.namespace}}, token=identity.token)
    assert status == 201, body
    return {a for a in expand(body["status"]["resourceRules"]) if (a[1], a[2]) not in SELF_REVIEWS}


def access_review(kube: ControlPlane, user: str, verb: str, group: str, resource: str, subresource: str = "") -> bool:
    status, body = kube.request("POST", "/apis/authorization.k8s.io/v1/subjectaccessreviews", {
        "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview",
        "spec": {"user": user, "groups": ["system:serviceaccounts", "system:authenticated"],
                 "resourceAttributes": {"verb": verb, "group": group, "resource": resource,
                                        "subresource": subresource, "namespace": "default"}}})
    assert status == 201, body
    return bool(body["status"].get("allowed"))


# --- the node agent ------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def node_scenario(kube: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A simulated node with one allocated claim, a slice that selects nodes by label (so the agent
    reads its Node), a DeviceTaintRule and the ComputeDomain CRDs served."""
    node = GpuNode.register(kube, [{"index": 0}], seed=13, prefix="rbac")
    label = kube.unique("rbac")
    kube.request("PATCH", f"/api/v1/nodes/{node.name}", {"metadata": {"labels": {"rbac-test": label}}},
                 content_type="application/merge-patch+json")
    selector = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "rbac-test", "operator": "In",
                                                             "values": [label]}]}]}
    nic = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice", "metadata": {"name": label},
           "spec": {"driver": "nic.example.com", "pool": {"name": label, "generation": 1, "resourceSliceCount": 1},
                    "nodeSelector": selector, "devices": [{"name": "tor-0"}]}}
    kube.create(nic)
    rule = {"apiVersion": "resource.k8s.io/v1beta2", "kind": "DeviceTaintRule", "metadata": {"name": label},
            "spec": {"deviceSelector": {"driver": "nic.example.com", "pool": label},
                     "taint": {"key": "example.com/rbac", "effect": "NoSchedule"}}}
    install_compute_domain_crds(kube)
    ns = kube.namespace("rbac-work")
    kube.create(claim(ns, "one", request("gpu", cel=node.uuid_cel("gpu-0"))))
    kube.pod(ns, "one-0", claims={"gpu": "one"}, node_name=node.name)
    kube.wait_scheduled(ns, "one-0")
    pod = kube.run_pod(ns, "one-0")
    kube.create(rule)
    try:
        # A spec NVIDIA's plugin left for a claim that never existed here: the claim census lists the claims.
        leftover = [{"claim_uid": LEFTOVER_CLAIM_UID, "devices": ["gpu-0"]}]
        yield node.scenario(tmp_path_factory.mktemp("rbac-node") / "node.yaml", [allocated(kube, ns, "one")], [pod],
                            leftover_cdi_specs=leftover)
    finally:
        kube.delete(f"/apis/resource.k8s.io/v1/resourceslices/{label}")
        kube.delete(f"/apis/resource.k8s.io/v1beta2/devicetaintrules/{label}")


def test_the_node_agent_reads_everything_with_its_role_and_the_role_grants_only_that(
        kube: ControlPlane, chart: dict[str, Identity], node_scenario: Path) -> None:
    identity = chart["node"]
    with exporter("serve", "--simulate", str(node_scenario), "--kubeconfig", str(identity.kubeconfig)) as port:
        _, metrics = _scrape(port)
        assert 'dra_exporter_source_up{source="kubeapi"} 1' in metrics
        asked = wait_until_used(kube, identity, NODE_AGENT_USES)
        orphan = re.compile(rf'dra_orphan_prepared_device_since_timestamp_seconds{{claim_uid="{LEFTOVER_CLAIM_UID}",'
                            r'device="gpu-0",driver="gpu.nvidia.com",reason="claim_deleted",uuid="GPU-[^"]+"}')
        deadline = time.monotonic() + 10
        while not orphan.search(metrics := _scrape(port)[1]) and time.monotonic() < deadline:
            time.sleep(0.5)  # the census answered; the next cycle's frame shows it
    assert asked == NODE_AGENT_USES
    assert 'claim="one"' in metrics and "example.com/rbac" in metrics, "the claim and the taint rule were read"
    assert orphan.search(metrics), "the claim census read the claims: the leftover spec's claim is gone"
    assert expand(identity.rules) == NODE_AGENT_USES, "the role grants exactly what the agent uses"
    assert rules_review(kube, identity) == NODE_AGENT_USES, "and the server grants the token nothing more"


def test_the_committed_manifests_carry_the_same_node_agent_role(chart: dict[str, Identity]) -> None:
    (role,) = [d for d in yaml.safe_load_all(MANIFESTS.read_text()) if d and d["kind"] == "ClusterRole"]
    assert expand(role["rules"]) == expand(chart["node"].rules) == NODE_AGENT_USES


# --- the cluster mode -----------------------------------------------------------------------------------

def test_the_cluster_mode_reads_everything_with_its_role_and_the_role_grants_only_that(
        kube: ControlPlane, chart: dict[str, Identity], node_scenario: Path) -> None:
    identity = chart["cluster"]
    with exporter("cluster", "--kubeconfig", str(identity.kubeconfig)) as port:
        asked = wait_until_used(kube, identity, CLUSTER_USES)
        _, metrics = _scrape(port)
        # Everything it reads, as many as the server holds (what earlier tests left included).
        deadline = time.monotonic() + 30
        while (held := _cluster_objects(_scrape(port)[1])) != (served := _served_counts(kube)):
            assert time.monotonic() < deadline, (held, served)
            time.sleep(0.5)
    assert asked == CLUSTER_USES
    assert 'dra_exporter_source_up{source="kubeapi"} 1' in metrics
    assert "nic.example.com" in metrics, "the cluster's slices were read"
    assert expand(identity.rules) == CLUSTER_USES, "the role grants exactly what the cluster mode uses"
    assert rules_review(kube, identity) == CLUSTER_USES, "and the server grants the token nothing more"


def _cluster_objects(metrics: str) -> dict[str, int]:
    found = re.findall(r'^dra_cluster_objects\{kind="(\w+)"\} (\S+)$', metrics, re.MULTILINE)
    return {kind: int(float(value)) for kind, value in found}


def _served_counts(kube: ControlPlane) -> dict[str, int]:
    paths = {"ResourceSlice": "/apis/resource.k8s.io/v1/resourceslices",
             "ResourceClaim": "/apis/resource.k8s.io/v1/resourceclaims",
             "DeviceClass": "/apis/resource.k8s.io/v1/deviceclasses",
             "DeviceTaintRule": "/apis/resource.k8s.io/v1beta2/devicetaintrules"}
    counts = {kind: len(kube.get(path)["items"]) for kind, path in paths.items()}
    # Pods: those that can still wait for a claim and name one (what the cluster mode keeps).
    counts["Pod"] = sum(1 for p in kube.get("/api/v1/pods")["items"]
                        if (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
                        and cluster_pod_from_dict(p).claims)
    counts["Node"] = len(kube.get("/api/v1/nodes")["items"])
    return counts


# --- neither may write, nor read what it does not use -------------------------------------------------------

@pytest.mark.parametrize("mode", ["node", "cluster"])
def test_neither_role_may_write_or_read_secrets(kube: ControlPlane, chart: dict[str, Identity], mode: str) -> None:
    user = chart[mode].user
    uses = NODE_AGENT_USES if mode == "node" else CLUSTER_USES
    # The cluster mode lists Nodes (its node filters); the node agent only gets its own.
    allowed = [" ".join(a) for a in DENIED if (a[:3] not in uses or a[3]) and access_review(kube, user, *a)]
    assert allowed == [], f"{mode} may {allowed}"
    assert all(access_review(kube, user, *a) for a in uses)
