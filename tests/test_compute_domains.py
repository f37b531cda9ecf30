"""NVIDIA ComputeDomains (issue #14, item 3): the objects in the forms the driver writes them
(v25.8+ status with index/status, v25.3 without; cliques on and off), normalised, joined, read by
the kubeapi source from the simulated API server and from a cluster dump; the multi-node
simulated cluster they live in (item 4)."""

from __future__ import annotations

import copy
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from dra_exporter import catalog as cat
from dra_exporter import model
from dra_exporter.join_domains import domain_families, domain_uses
from dra_exporter.sources.computedomain import clique_from_dict, compute_domain_from_dict
from dra_exporter.sources.kubeapi import REDISCOVER_S, KubeApiSource, Timeouts
from dra_exporter.sources.kubeapi_normalize import claim_from_dict
from dra_exporter_sim.apiserver import SimulatedApiServer
from dra_exporter_sim.clock import SimClock
from dra_exporter_sim.k8s_objects import cluster_objects
from dra_exporter_sim.loader import load_scenario
from dra_exporter_sim.scenario import ScenarioError
from dra_exporter_sim.scenario_builder import parse_scenario

DUMPS = Path(__file__).parent / "dumps"
FAST = Timeouts(request=5.0, backoff=(0.05, 0.2))
UID = "44444444-0000-4000-8000-000000000001"
CLIQUE = "7b968a6d-c8aa-45e1-9e07-e1e51be99c31.1"


# --- objects as the driver writes them ------------------------------------------------------------

def v25_8_domain(**status: Any) -> dict[str, Any]:
    return {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
            "metadata": {"name": "train", "namespace": "ml", "uid": UID},
            "spec": {"numNodes": 2, "channel": {"resourceClaimTemplate": {"name": "train-channel"},
                                                "allocationMode": "All"}},
            "status": {"status": "NotReady", "nodes": [
                {"name": "node-b", "ipAddress": "10.0.0.2", "cliqueID": CLIQUE, "index": 1, "status": "NotReady"},
                {"name": "node-a", "ipAddress": "10.0.0.1", "cliqueID": CLIQUE, "index": 0, "status": "Ready"}],
                       **status}}


def v25_3_domain() -> dict[str, Any]:
    return {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomain",
            "metadata": {"name": "old", "namespace": "ml", "uid": "uid-old"},
            "spec": {"numNodes": 1, "channel": {"resourceClaimTemplate": {"name": "old-channel"}}},
            "status": {"status": "Ready", "nodes": [{"name": "node-a", "ipAddress": "10.0.0.1", "cliqueID": CLIQUE}]}}


def clique(*daemons: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainClique",
            "metadata": {"name": f"{UID}.{CLIQUE}", "namespace": "dra-driver-nvidia-gpu",
                         "labels": {"resource.nvidia.com/computeDomain": UID,
                                    "resource.nvidia.com/computeDomain.cliqueID": CLIQUE}},
            "daemons": list(daemons)}


def channel_claim(name: str, domain_uid: str, kind: str = "ComputeDomainChannelConfig",
                  requests: list[str] | None = None) -> dict[str, Any]:
    config: dict[str, Any] = {"source": "FromClaim", "opaque": {"driver": "compute-domain.nvidia.com", "parameters": {
        "apiVersion": "resource.nvidia.com/v1beta1", "kind": kind, "domainID": domain_uid, "allocationMode": "Single",
        "nested": {"ignored": True}}}}
    if requests is not None:
        config["requests"] = requests
    return {"metadata": {"namespace": "ml", "name": name, "uid": f"uid-{name}"},
            "status": {"allocation": {"devices": {
                "results": [{"request": "channel", "driver": "compute-domain.nvidia.com", "pool": "node-a",
                             "device": "channel-0"}],
                "config": [config, {"source": "FromClass", "opaque": {"driver": "gpu.nvidia.com",
                                                                       "parameters": {"kind": "GpuConfig"}}}]}}}}


def test_v25_8_status_keeps_index_and_status_per_node_sorted_by_name() -> None:
    cd = compute_domain_from_dict(v25_8_domain())
    assert (cd.namespace, cd.name, cd.uid, cd.num_nodes, cd.allocation_mode, cd.status) == (
        "ml", "train", UID, 2, "All", "NotReady")
    assert cd.nodes == (model.ComputeDomainNode("node-a", CLIQUE, 0, "Ready"),
                        model.ComputeDomainNode("node-b", CLIQUE, 1, "NotReady"))


def test_v25_3_status_has_no_index_status_or_allocation_mode() -> None:
    cd = compute_domain_from_dict(v25_3_domain())
    assert cd.allocation_mode == ""
    assert cd.nodes == (model.ComputeDomainNode("node-a", CLIQUE, None, ""),)


def test_a_domain_without_status_and_broken_fields_reads_as_empty() -> None:
    raw = v25_8_domain()
    del raw["status"]
    raw["spec"]["numNodes"] = "lots"
    cd = compute_domain_from_dict(raw)
    assert (cd.status, cd.nodes, cd.num_nodes) == ("", (), 0)
    broken = v25_8_domain()
    broken["status"]["nodes"] = [None, {"name": 3}, {"name": "n", "index": True}, "x"]
    assert compute_domain_from_dict(broken).nodes == (model.ComputeDomainNode("n"),)


def test_clique_daemons_and_labels() -> None:
    c = clique({"nodeName": "node-a", "cliqueID": CLIQUE, "index": 0, "status": "Ready"})
    got = clique_from_dict(c)
    assert (got.domain_uid, got.clique, got.namespace) == (UID, CLIQUE, "dra-driver-nvidia-gpu")
    assert got.daemons == (model.ComputeDomainNode("node-a", CLIQUE, 0, "Ready"),)


def test_the_claims_opaque_configs_keep_top_level_scalars_only() -> None:
    claim = claim_from_dict(channel_claim("c", UID, requests=["channel"]), "v1")
    cd, gpu = claim.configs
    assert (cd.driver, cd.requests, cd.source) == ("compute-domain.nvidia.com", ("channel",), "FromClaim")
    assert dict(cd.parameters) == {"apiVersion": "resource.nvidia.com/v1beta1", "kind": "ComputeDomainChannelConfig",
                                   "domainID": UID, "allocationMode": "Single"}
    assert (gpu.driver, gpu.source, gpu.parameter("kind")) == ("gpu.nvidia.com", "FromClass", "GpuConfig")


@pytest.mark.parametrize(("kind", "requests", "channel"), [
    ("ComputeDomainChannelConfig", None, True), ("ComputeDomainChannelConfig", ["channel"], True),
    ("ComputeDomainDaemonConfig", None, False)])
def test_a_claim_ties_its_compute_domain_device_to_the_config_s_domain(
        kind: str, requests: list[str] | None, channel: bool) -> None:
    uses = list(domain_uses([claim_from_dict(channel_claim("c", UID, kind, requests), "v1")]))
    assert [(u.device, u.domain_uid, u.channel) for u in uses] == [("channel-0", UID, channel)]


def test_a_config_for_another_request_or_kind_ties_nothing() -> None:
    assert not list(domain_uses([claim_from_dict(channel_claim("c", UID, requests=["other"]), "v1")]))
    assert not list(domain_uses([claim_from_dict(channel_claim("c", UID, kind="GpuConfig"), "v1")]))


# --- the join ------------------------------------------------------------------------------------

def cluster(domain: dict[str, Any] | None, cliques: tuple[dict[str, Any], ...] = (),
            claim_domain: str = UID) -> model.ClusterSnapshot:
    pod = model.PodInfo("ml", "worker-0", "pod-uid", "Running", claims=("worker-0-channel", "worker-0-gpus"))
    gone = model.PodInfo("ml", "done-0", "pod-uid-2", "Succeeded", claims=("done-0-channel",))
    return model.ClusterSnapshot(
        node="node-a", claims=(claim_from_dict(channel_claim("worker-0-channel", claim_domain), "v1"),
                               claim_from_dict(channel_claim("done-0-channel", claim_domain), "v1")),
        pods=(pod, gone),
        compute_domains=(compute_domain_from_dict(domain),) if domain else (),
        compute_domain_cliques=tuple(clique_from_dict(c) for c in cliques))


def families(snapshot: model.ClusterSnapshot,
             holders: tuple[tuple[str, str, str, str], ...] = ()) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for spec, labels, value in domain_families(snapshot, holders):
        assert tuple(k for k, _ in labels) == spec.labels
        out.setdefault(spec.name, []).append((dict(labels), value))
    return out


def test_join_v25_8_domain_readiness_members_channel_and_gpus() -> None:
    got = families(cluster(v25_8_domain()), (("GPU-a", "0", "ml", "worker-0"), ("GPU-b", "1", "ml", "someone-else")))
    assert got[cat.COMPUTE_DOMAIN_INFO.name] == [({"namespace": "ml", "compute_domain": "train", "uid": UID,
                                              "allocation_mode": "All", "num_nodes": "2"}, 1)]
    assert got[cat.COMPUTE_DOMAIN_READY.name] == [({"namespace": "ml", "compute_domain": "train"}, 0)]
    assert [(s["node"], s["index"], v) for s, v in got[cat.COMPUTE_DOMAIN_NODE_READY.name]] == [
        ("node-a", "0", 1), ("node-b", "1", 0)]
    assert got[cat.COMPUTE_DOMAIN_CHANNEL_INFO.name] == [({"namespace": "ml", "claim": "worker-0-channel",
                                                      "pod": "worker-0", "compute_domain": "train",
                                                      "device": "channel-0"}, 1)], "finished pods hold nothing"
    assert got[cat.COMPUTE_DOMAIN_GPU_INFO.name] == [
        ({"uuid": "GPU-a", "gpu": "0", "namespace": "ml", "pod": "worker-0", "compute_domain": "train"}, 1)]


def test_join_members_come_from_the_cliques_when_status_nodes_is_empty() -> None:
    domain = v25_8_domain()
    domain["status"]["nodes"] = []
    daemons = (clique({"nodeName": "node-c", "cliqueID": CLIQUE, "index": 2, "status": "NotReady"},
                      {"nodeName": "node-a", "cliqueID": CLIQUE, "index": 0, "status": "Ready"}),)
    got = families(cluster(domain, daemons))
    assert [(s["node"], s["clique"], s["index"], v) for s, v in got[cat.COMPUTE_DOMAIN_NODE_READY.name]] == [
        ("node-a", CLIQUE, "0", 1), ("node-c", CLIQUE, "2", 0)]
    # With status.nodes filled, the status wins (the controller rebuilds it from the cliques).
    with_nodes = families(cluster(v25_8_domain(), daemons))
    assert {s["node"] for s, _ in with_nodes[cat.COMPUTE_DOMAIN_NODE_READY.name]} == {"node-a", "node-b"}


def test_join_v25_3_listed_nodes_are_ready_and_index_is_empty() -> None:
    old = v25_3_domain()
    got = families(cluster(old, claim_domain="uid-old"))
    assert got[cat.COMPUTE_DOMAIN_READY.name] == [({"namespace": "ml", "compute_domain": "old"}, 1)]
    assert got[cat.COMPUTE_DOMAIN_NODE_READY.name] == [({"namespace": "ml", "compute_domain": "old", "node": "node-a",
                                                    "clique": CLIQUE, "index": ""}, 1)]
    assert got[cat.COMPUTE_DOMAIN_INFO.name][0][0]["allocation_mode"] == ""


def test_join_without_the_crd_still_names_the_channel_holders() -> None:
    got = families(cluster(None), (("GPU-a", "0", "ml", "worker-0"),))
    assert cat.COMPUTE_DOMAIN_INFO.name not in got
    assert [s["compute_domain"] for s, _ in got[cat.COMPUTE_DOMAIN_CHANNEL_INFO.name]] == [""]
    assert [s["compute_domain"] for s, _ in got[cat.COMPUTE_DOMAIN_GPU_INFO.name]] == [""]


# --- through the kubeapi source: the simulated multi-node cluster -----------------------------------

def two_nodes(**domain: Any) -> dict[str, Any]:
    def node(i: int, pods: list[dict[str, Any]]) -> dict[str, Any]:
        return {"node": f"node-{i}", "gpus": [{"index": 0}],
                "claims": [{"namespace": "mpi", "name": f"w{i}-gpu", "devices": ["gpu-0"]}] if pods else [],
                "pods": pods}
    return {"seed": 7, "compute_domains": [{"namespace": "mpi", "name": "dom", "nodes": ["node-0", "node-1"],
                                            **domain},
                                           {"namespace": "mpi", "name": "other", "nodes": ["node-2"]}],
            "faults": [{"kind": "imex_not_ready", "node": "node-1", "at": 100}],
            "nodes": [node(0, [{"namespace": "mpi", "name": "w0", "compute_domain": "dom",
                                "containers": [{"name": "c", "claims": ["w0-gpu"]}]}]),
                      node(1, [{"namespace": "mpi", "name": "w1", "compute_domain": "dom",
                                "containers": [{"name": "c", "claims": ["w1-gpu"]}]}]),
                      node(2, [])]}


def write(tmp_path: Path, doc: dict[str, Any]) -> Path:
    import yaml

    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


@contextmanager
def reading(scenario: Any, t: float = 50.0, **kw: Any) -> Iterator[tuple[SimulatedApiServer, KubeApiSource]]:
    with SimulatedApiServer(scenario, SimClock(t, frozen=True), poll_s=0.02, **kw) as server:
        src = KubeApiSource(scenario.node_name, kubeconfig=server.kubeconfig_path, timeouts=FAST)
        try:
            yield server, src
        finally:
            src.close()


@pytest.mark.parametrize(("form", "cliques"), [("v25.8", True), ("v25.8", False), ("v25.3", False)])
def test_source_reads_the_domains_of_this_nodes_claims_only(tmp_path: Path, form: str, cliques: bool) -> None:
    scenario = load_scenario(write(tmp_path, two_nodes(status_form=form, cliques=cliques)), "node-0")
    with reading(scenario) as (server, src):
        snap = src.collect()
        assert [d.name for d in snap.compute_domains] == ["dom"], "'other' has no member here"
        assert [c.domain_uid for c in snap.compute_domain_cliques] == ([snap.compute_domains[0].uid] if cliques else [])
        assert src.compute_domain_resources == {"computedomains", "computedomaincliques"}
        assert {p.name for p in snap.pods} == {"w0", *(p.name for p in snap.pods if p.namespace != "mpi")}, \
            "the pod watch stays this node's"
        nodes = snap.compute_domains[0].nodes
        assert [n.name for n in nodes] == ["node-0", "node-1"]
        assert {n.status for n in nodes} == ({""} if form == "v25.3" else {"Ready"})
        assert server.requests[("list", "computedomains")] == 1
        assert server.requests[("list", "computedomaincliques")] == 1


def test_imex_not_ready_fault_makes_the_member_and_the_domain_not_ready(tmp_path: Path) -> None:
    scenario = load_scenario(write(tmp_path, two_nodes()), "node-0")
    with reading(scenario, t=150.0) as (_, src):
        snap = src.collect()
    dom = snap.compute_domains[0]
    assert dom.status == "NotReady"
    assert {n.name: n.status for n in dom.nodes} == {"node-0": "Ready", "node-1": "NotReady"}
    v25_3 = load_scenario(write(tmp_path, two_nodes(status_form="v25.3", cliques=False)), "node-0")
    with reading(v25_3, t=150.0) as (_, src):
        dom = src.collect().compute_domains[0]
    assert (dom.status, [n.name for n in dom.nodes]) == ("NotReady", ["node-0"]), "v25.3: the node leaves the list"


def test_absent_crd_is_the_feature_off_with_one_discovery_until_the_rediscovery_period(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="dra_exporter.sources.kubeapi")
    scenario = parse_scenario({"node": "n", "gpus": [{"index": 0}],
                               "claims": [{"namespace": "a", "name": "c", "devices": ["gpu-0"]}],
                               "pods": [{"namespace": "a", "name": "p",
                                         "containers": [{"name": "c", "claims": ["c"]}]}]})
    now = [0.0]
    with SimulatedApiServer(scenario, SimClock(50.0, frozen=True), poll_s=0.02) as server:
        src = KubeApiSource(scenario.node_name, kubeconfig=server.kubeconfig_path, timeouts=FAST,
                            monotonic=lambda: now[0])
        try:
            for _ in range(3):
                snap = src.collect()
            assert snap.compute_domains == () and snap.claims, "the rest of the view is read"
            assert src.compute_domain_resources == frozenset()
            assert not any(res.startswith("computedomain") for _, res in server.requests)
            discoveries = server.requests[("get", "discovery")]
            now[0] = REDISCOVER_S - 1
            src.collect()
            assert server.requests[("get", "discovery")] == discoveries, "not before the period"
            now[0] = REDISCOVER_S
            src.collect()
            assert server.requests[("get", "discovery")] == discoveries + 1, "a driver installed since is found"
        finally:
            src.close()
    messages = [r.getMessage() for r in caplog.records if "resource.nvidia.com" in r.getMessage()]
    assert len(messages) == 1 and "not served" in messages[0], messages


def test_a_cluster_dump_with_compute_domains_through_the_kubeapi_source() -> None:
    scenario = load_scenario(DUMPS / "computedomain.yaml")
    with reading(scenario) as (_, src):
        snap = src.collect()
    assert [d.name for d in snap.compute_domains] == ["legacy-domain", "train-domain"], "'elsewhere' is not ours"
    got = families(snap)
    ready = {(s["compute_domain"], s["node"]): v for s, v in got[cat.COMPUTE_DOMAIN_NODE_READY.name]}
    assert ready == {("legacy-domain", "gpu-node-a"): 1, ("legacy-domain", "gpu-node-c"): 1,
                     ("train-domain", "gpu-node-a"): 1, ("train-domain", "gpu-node-b"): 0}
    assert {(s["pod"], s["compute_domain"]) for s, _ in got[cat.COMPUTE_DOMAIN_CHANNEL_INFO.name]} == {
        ("trainer-0", "train-domain"), ("legacy-0", "legacy-domain")}


# --- the multi-node scenario ------------------------------------------------------------------------

def test_gb200_domain_each_node_plays_itself_and_serves_the_whole_cluster() -> None:
    uuids: set[str] = set()
    for i in range(4):
        node = f"gb200-node-{i}"
        scenario = load_scenario("gb200-domain", node)
        assert scenario.node_name == node and len(scenario.gpus) == 4
        uuids |= {g.uuid for g in scenario.gpus}
        workers = [p.name for p in scenario.pods if p.namespace == "mpi"]
        assert workers == (["mpi-launcher", f"mpi-worker-{i}"] if i == 0 else [f"mpi-worker-{i}"])
        objects = cluster_objects(scenario, 10.0)
        assert {s["spec"]["nodeName"] for s in objects.resourceslices} == {f"gb200-node-{n}" for n in range(4)}
        assert len(objects.computedomains) == 1 and len(objects.computedomaincliques) == 1
    assert len(uuids) == 16, "GPU UUIDs are unique in the cluster"
    before, after = (cluster_objects(load_scenario("gb200-domain"), t).computedomains[0]["status"] for t in (10, 30))
    assert before["status"] == "Ready" and after["status"] == "NotReady"
    assert [n["status"] for n in after["nodes"]] == ["Ready", "Ready", "Ready", "NotReady"]


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d["compute_domains"][0].update(nodes=["node-0", "node-9"]), "compute_domains[0].nodes[1]: no node"),
    (lambda d: d["nodes"][1].update(node="node-0"), "nodes[1].node: node 'node-0' is listed twice"),
    (lambda d: d["faults"][0].update(kind="gpu_lost"), "faults[0].kind: 'gpu_lost' is not a cluster fault"),
    (lambda d: d["nodes"][0]["pods"][0].update(compute_domain="nope"),
     "nodes[0].pods[0].compute_domain: no ComputeDomain"),
    (lambda d: d["compute_domains"][0].update(status_form="v9"), "status_form: 'v9' is not one of"),
    (lambda d: d["nodes"][1].update(seed=7), "is also on node node-0"),
    (lambda d: d["nodes"][1]["gpus"].append({"index": 5}), "nodes[1].gpus: GPU indexes must be"),
    (lambda d: d["compute_domains"][1].update(nodes=["node-1"]), "compute_domains[1].nodes[0]: node 'node-1' is "
     "already in ComputeDomain mpi/dom"),
])
def test_multinode_mistakes_name_the_field(tmp_path: Path, change: Any, message: str) -> None:
    doc = copy.deepcopy(two_nodes())
    change(doc)
    with pytest.raises(ScenarioError, match="cluster.yaml: ") as info:
        load_scenario(write(tmp_path, doc))
    assert message in str(info.value)


def test_a_node_the_cluster_does_not_have(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError,
                       match=r"no node 'node-7' in this multi-node scenario \(nodes: node-0, node-1, node-2\)"):
        load_scenario(write(tmp_path, two_nodes()), "node-7")
