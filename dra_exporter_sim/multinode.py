"""Multi-node scenarios: a simulated cluster of several nodes, with NVIDIA ComputeDomains.

A multi-node scenario (``docs/scenarios.md``, the built-in ``gb200-domain``) is one YAML
document with ``nodes:`` — each entry an ordinary one-node scenario (``node``, ``gpus``,
``claims``, ``pods``, …) — plus what spans nodes: ``compute_domains`` and cluster ``faults``
(``imex_not_ready``). One exporter process plays one node (``--node-name``; the first node by
default): its fake NVML and kubelet are that node's, while its simulated API server serves the
objects of the whole cluster — every node's slices, claims and pods, the ComputeDomains and
their cliques — as a real API server would.

What a ComputeDomain brings, as NVIDIA's DRA driver does it (reference:
computedomain-nvlink.md §1), generated so a scenario only names the domain (the claims, pods and
slice entries here, while parsing; the ComputeDomain objects by ``k8s_objects``):

* on each member node, the ``compute-domain.nvidia.com`` slice (pool = node name) with
  ``channel-0`` and ``daemon-0``;
* on each member node, the IMEX daemon pod in the driver namespace, holding ``daemon-0`` through
  a claim from the template ``computedomain-daemon-<uid>`` with a ``ComputeDomainDaemonConfig``;
* for each pod that says ``compute_domain: <name>``, a claim from the domain's channel template
  holding ``channel-0``, with a ``ComputeDomainChannelConfig`` naming the domain's UID;
* the ComputeDomain object, its ``status.nodes[]`` in the driver's v25.8+ form (``index``,
  ``status``) or v25.3 form (neither), and with ``cliques: true`` one ComputeDomainClique per
  clique (``daemons[]``). An ``imex_not_ready`` fault makes a member's daemon NotReady (v25.3:
  it leaves ``status.nodes``), and with it the domain.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from typing import Any, Final

from .scenario import (
    CD_DRIVER,
    CHANNEL_REQUEST,
    DAEMON_REQUEST,
    DEFAULT_DRIVER_NAMESPACE,
    ClusterScenario,
    Fault,
    Scenario,
    ScenarioError,
    SimComputeDomain,
    derived_uuid,
)
from .scenario_builder import Cursor, parse_scenario

CHANNEL_CLASS: Final = "compute-domain-default-channel.nvidia.com"
DAEMON_CLASS: Final = "compute-domain-daemon.nvidia.com"
#: ``status_form`` values: the driver releases whose ComputeDomain status shapes differ.
STATUS_FORMS: Final = ("v25.8", "v25.3")
ALLOCATION_MODES: Final = ("Single", "All")
CLUSTER_FAULTS: Final = ("imex_not_ready",)



def is_cluster(doc: Any) -> bool:
    """Whether a parsed scenario document describes several nodes (``nodes:`` and no ``node:`` of its own)."""
    return isinstance(doc, dict) and "nodes" in doc and "node" not in doc


def parse_cluster(doc: Any, label: str, node_name: str | None = None) -> Scenario:
    """The scenario of node ``node_name`` (default: the first) of a multi-node document, with the
    whole cluster in ``Scenario.cluster``. Raises ``ScenarioError`` naming the field."""
    top = Cursor(label, "", doc)
    top.mapping(("nodes",), ("description", "seed", "api_version", "gpu_model", "driver_namespace",
                             "compute_domains", "faults", "fabric"))
    seed = top.key("seed").int(default=0)
    driver_ns = top.key("driver_namespace").name("namespace") if top.key("driver_namespace").present \
        else DEFAULT_DRIVER_NAMESPACE
    entries = list(top.key("nodes").items())
    if not entries:
        raise top.key("nodes").error("a multi-node scenario needs at least one node")
    names: list[str] = []
    for _, n in entries:
        if not isinstance(n.value, dict):
            raise n.error("expected a mapping: a one-node scenario (node, gpus, claims, pods, …)")
        name = n.key("node").name("node name")
        if name in names:
            raise n.key("node").error(f"node {name!r} is listed twice")
        names.append(name)
    fabric = _fabric(top.key("fabric"), seed)
    domains: list[SimComputeDomain] = []
    for _, d in top.key("compute_domains").items():
        domain = _domain(d, seed, names, fabric)
        for i, node in enumerate(domain.nodes):
            # One IMEX daemon per node (its compute-domain slice has one daemon device).
            if other := next((o for o in domains if node in o.nodes), None):
                raise Cursor(label, f"{d.path}.nodes[{i}]", node).error(
                    f"node {node!r} is already in ComputeDomain {other.namespace}/{other.name}; a node runs one "
                    "IMEX daemon, so it is in at most one domain")
        if any((o.namespace, o.name) == (domain.namespace, domain.name) for o in domains):
            raise d.key("name").error(f"ComputeDomain {domain.namespace}/{domain.name} is defined twice")
        domains.append(domain)
    channel_claims: dict[tuple[str, str], str] = {}
    nodes = tuple(
        _node(n, i, top, seed, domains, driver_ns, channel_claims) for i, n in entries)
    uuids: dict[str, str] = {}
    for i, member in enumerate(nodes):
        for dev in member.gpu_devices():
            if dev.uuid in uuids:
                raise entries[i][1].error(f"GPU UUID {dev.uuid} is also on node {uuids[dev.uuid]}: UUIDs are "
                                          "unique in a cluster (give each node its own seed)")
            uuids[dev.uuid] = member.node_name
    faults = tuple(_cluster_fault(f, names) for _, f in top.key("faults").items())
    cluster = ClusterScenario(label, nodes, tuple(domains), faults, driver_ns, channel_claims)
    chosen = node_name or names[0]
    played = cluster.node(chosen)
    if played is None:
        raise ScenarioError(f"{label}: no node {chosen!r} in this multi-node scenario (nodes: {', '.join(names)})")
    description = top.key("description").str(default="")
    return dataclasses.replace(played, name=label, cluster=cluster,
                               description=played.description or description)


def _fabric(cur: Cursor, seed: int) -> str:
    """The NVLink clique of the cluster's GPUs, ``<clusterUUID>.<cliqueId>``."""
    if not cur.present:
        return f"{derived_uuid(seed, 'fabric', 'cluster')}.0"
    cur.mapping(("cluster_uuid", "clique_id"))
    cluster_uuid = cur.key("cluster_uuid").str()
    return f"{cluster_uuid.lower()}.{cur.key('clique_id').int(minimum=0)}"


def _domain(cur: Cursor, seed: int, names: Sequence[str], clique: str) -> SimComputeDomain:
    cur.mapping(("namespace", "name", "nodes"), ("uid", "num_nodes", "allocation_mode", "status_form", "cliques",
                                                 "channel_template"))
    ns, name = cur.key("namespace").name("namespace"), cur.key("name").name("ComputeDomain name")
    members: list[str] = []
    for _, n in cur.key("nodes").items():
        node = n.str()
        if node not in names:
            raise n.error(f"no node {node!r} in this scenario (nodes: {', '.join(names)})")
        if node in members:
            raise n.error(f"node {node!r} is listed twice")
        members.append(node)
    if not members:
        raise cur.key("nodes").error("a ComputeDomain needs at least one node")
    mode = cur.key("allocation_mode").str(default="Single")
    if mode not in ALLOCATION_MODES:
        raise cur.key("allocation_mode").error(f"{mode!r} is not one of {', '.join(ALLOCATION_MODES)}")
    form = cur.key("status_form").str(default="v25.8")
    if form not in STATUS_FORMS:
        raise cur.key("status_form").error(f"{form!r} is not one of {', '.join(STATUS_FORMS)}")
    cliques = cur.key("cliques").bool(form != "v25.3")
    if cliques and form == "v25.3":
        raise cur.key("cliques").error("ComputeDomainCliques came with v25.12; status_form v25.3 has none")
    template = cur.key("channel_template").name("ResourceClaimTemplate name") \
        if cur.key("channel_template").present else f"{name}-channel"
    uid = cur.key("uid").str() if cur.key("uid").present else derived_uuid(seed, "k8s", "ComputeDomain", ns, name)
    return SimComputeDomain(ns, name, uid, tuple(members), clique, cur.key("num_nodes").int(default=0, minimum=0),
                            mode, form, cliques, template)


def _node(cur: Cursor, index: int, top: Cursor, seed: int, domains: Sequence[SimComputeDomain],
          driver_ns: str, channel_claims: dict[tuple[str, str], str]) -> Scenario:
    """One node's scenario; the compute-domain devices, daemon pod and channel claims added."""
    doc = copy.deepcopy(cur.value)
    name = doc["node"]
    # Each node its own seed (by default): UUIDs and PIDs are derived from it and must differ.
    doc.setdefault("seed", seed + index)
    for key in ("api_version", "gpu_model"):
        if top.key(key).present:
            doc.setdefault(key, top.key(key).value)
    mine = [d for d in domains if name in d.nodes]
    if mine:
        if any(isinstance(s, dict) and s.get("driver") == CD_DRIVER for s in doc.get("slices") or ()):
            raise cur.key("slices").error(f"the {CD_DRIVER} slice of a ComputeDomain member is generated; "
                                          "leave it out")
        doc.setdefault("slices", []).append({"driver": CD_DRIVER, "devices": [
            {"name": "channel-0", "attributes": {"type": "channel", "id": 0}},
            {"name": "daemon-0", "attributes": {"type": "daemon", "id": 0}}]})
    claims = doc.setdefault("claims", [])
    pods = doc.setdefault("pods", [])
    if not isinstance(claims, list) or not isinstance(pods, list):
        raise cur.error("claims and pods must be lists")
    for j, pod in enumerate(list(pods)):
        if not isinstance(pod, dict) or "compute_domain" not in pod:
            continue
        where = Cursor(cur.label, f"{cur.path}.pods[{j}]", pod)
        wanted = where.key("compute_domain").name("ComputeDomain name")
        ns = where.key("namespace").name("namespace")
        domain = next((d for d in mine if (d.namespace, d.name) == (ns, wanted)), None)
        if domain is None:
            raise where.key("compute_domain").error(
                f"no ComputeDomain {ns}/{wanted} with node {name!r} among its nodes (a channel's claim must be in "
                "the domain's namespace)")
        pod = dict(pod)
        del pod["compute_domain"]
        pod_name = where.key("name").name("pod name")
        claim = f"{pod_name}-{CHANNEL_REQUEST}"
        claims.append({"namespace": ns, "name": claim, "template": domain.channel_template, "driver": CD_DRIVER,
                       "requests": [{"name": CHANNEL_REQUEST, "device_class": CHANNEL_CLASS,
                                     "devices": ["channel-0"]}]})
        containers = [dict(c) for c in pod.get("containers") or () if isinstance(c, dict)]
        if containers:
            containers[0]["claims"] = [*(containers[0].get("claims") or ()), claim]
        pod["containers"] = containers
        pods[j] = pod
        channel_claims[(ns, claim)] = domain.name
    for d in mine:
        pod_name = f"computedomain-daemon-{d.uid[:8]}-{derived_uuid(seed, 'daemon', name)[:5]}"
        claim = f"{pod_name}-{DAEMON_REQUEST}"
        claims.append({"namespace": driver_ns, "name": claim, "template": f"computedomain-daemon-{d.uid}",
                       "driver": CD_DRIVER,
                       "requests": [{"name": DAEMON_REQUEST, "device_class": DAEMON_CLASS, "devices": ["daemon-0"]}]})
        pods.append({"namespace": driver_ns, "name": pod_name,
                     "containers": [{"name": "compute-domain-daemon", "claims": [claim]}]})
    return parse_scenario(doc, cur.label, path=cur.path)


def _cluster_fault(cur: Cursor, names: Sequence[str]) -> Fault:
    cur.mapping(("kind", "at"), ("until", "node"))
    kind = cur.key("kind").str()
    if kind not in CLUSTER_FAULTS:
        raise cur.key("kind").error(f"{kind!r} is not a cluster fault ({', '.join(CLUSTER_FAULTS)}); a node's faults "
                                    "go in its own faults list")
    node = cur.key("node").str()
    if node not in names:
        raise cur.key("node").error(f"no node {node!r} in this scenario (nodes: {', '.join(names)})")
    at = cur.key("at").number(minimum=0)
    until = cur.key("until").number(minimum=0) if cur.key("until").present else None
    if until is not None and until <= at:
        raise cur.key("until").error(f"must be after 'at' ({until:g} <= {at:g})")
    return Fault(kind, at, until, None, {"node": node})


def node_names(scenario: Scenario) -> tuple[str, ...]:
    """The nodes of the cluster ``scenario`` belongs to (itself only, for a one-node scenario)."""
    return tuple(n.node_name for n in scenario.cluster.nodes) if scenario.cluster else (scenario.node_name,)
