"""Multi-node scenarios: a simulated cluster of several nodes, with NVIDIA ComputeDomains.

A multi-node scenario (``docs/scenarios.md``, the built-in ``gb200-domain``) is one YAML
document with ``nodes:`` — each entry an ordinary one-node scenario (``node``, ``gpus``,
``claims``, ``pods``, …) — plus what spans nodes: ``compute_domains`` and cluster ``faults``
(``imex_not_ready``). One exporter process plays one node (``--node-name``; the first node by
default): its fake NVML and kubelet are that node's, while its simulated API server serves the
objects of the whole cluster — every node's slices, claims and pods, the ComputeDomains and
their cliques — as a real API server would.

What a ComputeDomain brings, as NVIDIA's DRA driver does it (reference:
computedomain-nvlink.md §1), generated here so a scenario only names the domain:

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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from .k8s_objects import JSON, ClusterObjects, changes_key, cluster_objects, namespace_objects, object_metadata
from .scenario import Fault, Scenario, ScenarioError, derived_uuid
from .scenario_builder import Cursor, parse_scenario

CD_DRIVER: Final = "compute-domain.nvidia.com"
CD_GROUP_VERSION: Final = "resource.nvidia.com/v1beta1"
DOMAIN_LABEL: Final = "resource.nvidia.com/computeDomain"
CHANNEL_CLASS: Final = "compute-domain-default-channel.nvidia.com"
DAEMON_CLASS: Final = "compute-domain-daemon.nvidia.com"
CHANNEL_REQUEST: Final = "channel"
DAEMON_REQUEST: Final = "daemon"
#: ``status_form`` values: the driver releases whose ComputeDomain status shapes differ.
STATUS_FORMS: Final = ("v25.8", "v25.3")
ALLOCATION_MODES: Final = ("Single", "All")
CLUSTER_FAULTS: Final = ("imex_not_ready",)
#: The driver's default namespace up to v25.12 (v0.4+ uses dra-driver-nvidia-gpu).
DEFAULT_DRIVER_NAMESPACE: Final = "nvidia-dra-driver-gpu"
_FINALIZER: Final = "resource.nvidia.com/computeDomain"


@dataclass(frozen=True, slots=True)
class SimComputeDomain:
    namespace: str
    name: str
    uid: str
    nodes: tuple[str, ...]
    """Member nodes, in index order."""
    clique: str
    """``<clusterUUID>.<cliqueId>`` of every member (one NVLink clique)."""
    num_nodes: int = 0
    allocation_mode: str = "Single"
    status_form: str = "v25.8"
    cliques: bool = True
    channel_template: str = ""


@dataclass(frozen=True, slots=True)
class ClusterScenario:
    """The whole simulated cluster; ``Scenario.cluster`` of the node a process plays."""

    name: str
    nodes: tuple[Scenario, ...]
    compute_domains: tuple[SimComputeDomain, ...] = ()
    faults: tuple[Fault, ...] = ()
    """Cluster faults; ``params["node"]`` names the node."""
    driver_namespace: str = DEFAULT_DRIVER_NAMESPACE
    channel_claims: Mapping[tuple[str, str], str] = dataclasses.field(default_factory=dict, hash=False)
    """(namespace, claim) → the domain name whose IMEX channel the claim holds."""

    def node(self, name: str) -> Scenario | None:
        return next((n for n in self.nodes if n.node_name == name), None)

    def domain(self, namespace: str, name: str) -> SimComputeDomain | None:
        return next((d for d in self.compute_domains if (d.namespace, d.name) == (namespace, name)), None)

    def imex_not_ready(self, node: str, t: float) -> bool:
        return any(f.kind == "imex_not_ready" and f.params["node"] == node and f.active_at(t) for f in self.faults)


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


# --- the cluster's objects -----------------------------------------------------------------------


def objects(cluster: ClusterScenario, t: float) -> ClusterObjects:
    """Every object of the simulated cluster at ``t``: each node's, plus ComputeDomains and cliques."""
    parts = [cluster_objects(n, t) for n in cluster.nodes]
    claims = tuple(_with_config(cluster, c) for p in parts for c in p.resourceclaims)
    domains = tuple(compute_domain(cluster, d, t) for d in cluster.compute_domains)
    cliques = tuple(c for d in cluster.compute_domains if d.cliques for c in cliques_of(cluster, d, t))
    pods = tuple(o for p in parts for o in p.pods)
    return ClusterObjects(
        resourceslices=tuple(s for p in parts for s in p.resourceslices),
        resourceclaims=claims,
        pods=pods,
        nodes=tuple(n for p in parts for n in p.nodes),
        computedomains=domains,
        computedomaincliques=cliques,
        namespaces=namespace_objects(cluster.nodes[0].seed if cluster.nodes else 0,
                                     (*claims, *pods, *domains, *cliques)),
    )


def changes(cluster: ClusterScenario, t: float) -> object:
    """Equal for two instants exactly when ``objects`` gives the same objects (see ``changes_key``)."""
    return (tuple(changes_key(n, t) for n in cluster.nodes), tuple(f.active_at(t) for f in cluster.faults))


def _with_config(cluster: ClusterScenario, claim: JSON) -> JSON:
    """A compute-domain claim with the opaque config its template gives it (``status.allocation
    .devices.config``: the driver reads it at prepare time; the exporter reads the domain's UID there)."""
    meta = claim["metadata"]
    results = claim["status"]["allocation"]["devices"]["results"]
    if not any(r["driver"] == CD_DRIVER for r in results):
        return claim
    domain_name = cluster.channel_claims.get((meta["namespace"], meta["name"]))
    if domain_name is not None:
        domain = cluster.domain(meta["namespace"], domain_name)
        assert domain is not None
        request, params = CHANNEL_REQUEST, {"kind": "ComputeDomainChannelConfig", "domainID": domain.uid}
        if domain.status_form != "v25.3":
            params["allocationMode"] = domain.allocation_mode
    else:  # a daemon's claim: its template names the domain by UID
        uid = str(meta.get("annotations", {}).get("resource.kubernetes.io/pod-claim-name", ""))
        uid = uid.removeprefix("computedomain-daemon-")
        request, params = DAEMON_REQUEST, {"kind": "ComputeDomainDaemonConfig", "domainID": uid}
    out = copy.deepcopy(claim)
    config = {"source": "FromClaim", "requests": [request],
              "opaque": {"driver": CD_DRIVER, "parameters": {"apiVersion": CD_GROUP_VERSION, **params}}}
    out["status"]["allocation"]["devices"]["config"] = [config]
    out["spec"]["devices"]["config"] = [{k: v for k, v in config.items() if k != "source"}]
    return out


def _daemon(cluster: ClusterScenario, d: SimComputeDomain, index: int, node: str, t: float) -> JSON:
    entry: JSON = {"name": node, "ipAddress": f"10.244.{cluster.nodes.index(cluster.node(node)) + 1}.{10 + index}",
                   "cliqueID": d.clique}
    if d.status_form != "v25.3":
        entry["index"] = index
        entry["status"] = "NotReady" if cluster.imex_not_ready(node, t) else "Ready"
    return entry


def compute_domain(cluster: ClusterScenario, d: SimComputeDomain, t: float) -> JSON:
    """The ComputeDomain as the driver's controller writes it at ``t``."""
    nodes = [_daemon(cluster, d, i, n, t) for i, n in enumerate(d.nodes)]
    if d.status_form == "v25.3":
        # v25.3 lists a node once its daemon is up, and has no per-node status.
        nodes = [n for n in nodes if not cluster.imex_not_ready(n["name"], t)]
        ready = len(nodes) == len(d.nodes) and len(nodes) >= d.num_nodes
    else:
        ready = all(n["status"] == "Ready" for n in nodes) and len(nodes) >= d.num_nodes
    channel: JSON = {"resourceClaimTemplate": {"name": d.channel_template}}
    if d.status_form != "v25.3":
        channel["allocationMode"] = d.allocation_mode
    return {
        "apiVersion": CD_GROUP_VERSION,
        "kind": "ComputeDomain",
        "metadata": object_metadata(0, "ComputeDomain", d.name, d.namespace, d.uid, generation=1,
                              finalizers=[_FINALIZER]),
        "spec": {"numNodes": d.num_nodes, "channel": channel},
        "status": {"status": "Ready" if ready else "NotReady", "nodes": nodes},
    }


def cliques_of(cluster: ClusterScenario, d: SimComputeDomain, t: float) -> list[JSON]:
    """The domain's ComputeDomainCliques (one: every member is in the cluster's one clique)."""
    name = f"{d.uid}.{d.clique}"
    return [{
        "apiVersion": CD_GROUP_VERSION,
        "kind": "ComputeDomainClique",
        "metadata": object_metadata(0, "ComputeDomainClique", name, cluster.driver_namespace,
                              derived_uuid(0, "clique", name),
                              labels={DOMAIN_LABEL: d.uid, f"{DOMAIN_LABEL}.cliqueID": d.clique}),
        "daemons": [{("nodeName" if k == "name" else k): v for k, v in _daemon(cluster, d, i, n, t).items()}
                    for i, n in enumerate(d.nodes)],
    }]


def node_names(scenario: Scenario) -> tuple[str, ...]:
    """The nodes of the cluster ``scenario`` belongs to (itself only, for a one-node scenario)."""
    return tuple(n.node_name for n in scenario.cluster.nodes) if scenario.cluster else (scenario.node_name,)
