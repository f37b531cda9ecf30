"""The join's ComputeDomain section: NVIDIA's multi-node NVLink domains as metric families.

Pure, like ``join`` (which calls it): the cluster snapshot and the GPUs' holders in, samples out.

How a pod belongs to a domain (NVIDIA's DRA driver, ``compute-domain.nvidia.com``): its claim's
allocation has a result of that driver (device ``channel-<n>``: an IMEX channel) and an opaque
config of that driver whose parameters are ``kind: ComputeDomainChannelConfig`` and
``domainID: <the domain's metadata.uid>``. The IMEX daemon's own claim carries a
``ComputeDomainDaemonConfig`` with the same ``domainID``: it makes the node a member, not a
channel holder. Members and their readiness come from the domain's ``status.nodes[]``, or, where
that is empty (the controller fills it from the cliques every 2 s, so only briefly), from the
domain's ComputeDomainCliques' ``daemons[]``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Final

from . import catalog as cat
from .model import ClaimInfo, ClusterSnapshot, ComputeDomain, ComputeDomainNode, Labels

COMPUTE_DOMAIN_DRIVER: Final = "compute-domain.nvidia.com"
CHANNEL_CONFIG_KIND: Final = "ComputeDomainChannelConfig"
DAEMON_CONFIG_KIND: Final = "ComputeDomainDaemonConfig"
#: The label the driver puts on cliques (and daemon pods, nodes, templates): the domain's UID.
DOMAIN_UID_LABEL: Final = "resource.nvidia.com/computeDomain"
_READY: Final = "Ready"


@dataclass(frozen=True, slots=True)
class DomainUse:
    """One device of a claim that ties the claim to a domain."""

    claim: ClaimInfo
    device: str
    domain_uid: str
    channel: bool
    """An IMEX channel (a workload's claim); False for the IMEX daemon's own device."""


def domain_uses(claims: Iterable[ClaimInfo]) -> Iterator[DomainUse]:
    """Every compute-domain device of ``claims`` with the domain its opaque config names. A config
    applies to the results of the requests it lists (none listed: all of them)."""
    for claim in claims:
        configs = [c for c in claim.configs if c.driver == COMPUTE_DOMAIN_DRIVER and c.parameter("domainID")
                   and c.parameter("kind") in (CHANNEL_CONFIG_KIND, DAEMON_CONFIG_KIND)]
        for result in claim.results:
            if result.driver != COMPUTE_DOMAIN_DRIVER:
                continue
            for config in configs:
                if not config.requests or any(result.serves(r) for r in config.requests):
                    yield DomainUse(claim, result.device, config.parameter("domainID"),
                                    config.parameter("kind") == CHANNEL_CONFIG_KIND)


def referenced_domains(claims: Iterable[ClaimInfo]) -> frozenset[str]:
    """UIDs of the domains ``claims`` (this node's) hold a channel or a daemon of."""
    return frozenset(use.domain_uid for use in domain_uses(claims))


def members(domain: ComputeDomain, cluster: ClusterSnapshot) -> tuple[ComputeDomainNode, ...]:
    """The domain's nodes: ``status.nodes``, else its cliques' daemons."""
    if domain.nodes:
        return domain.nodes
    daemons = {d.name: d for c in cluster.compute_domain_cliques if c.domain_uid == domain.uid for d in c.daemons}
    return tuple(daemons[name] for name in sorted(daemons))


def node_ready(node: ComputeDomainNode) -> bool:
    """v25.8+ writes each node's status; v25.3 writes none, and lists a node once its daemon joined."""
    return node.status == _READY or not node.status


def domain_families(cluster: ClusterSnapshot, gpu_holders: Iterable[tuple[str, str, str, str]]
                    ) -> Iterator[tuple[cat.MetricSpec, Labels, float]]:
    """(family, labels, value) of every ComputeDomain family, the labels built by the family's
    spec. ``gpu_holders``: (uuid, gpu index, namespace, pod) for each whole GPU of this node and
    each pod that holds it."""
    names = {d.uid: d for d in cluster.compute_domains}
    for d in cluster.compute_domains:
        yield cat.COMPUTE_DOMAIN_INFO, cat.COMPUTE_DOMAIN_INFO.series(
            namespace=d.namespace, compute_domain=d.name, uid=d.uid, allocation_mode=d.allocation_mode,
            num_nodes=str(d.num_nodes)), 1
        yield cat.COMPUTE_DOMAIN_READY, cat.COMPUTE_DOMAIN_READY.series(
            namespace=d.namespace, compute_domain=d.name), 1 if d.status == _READY else 0
        for node in members(d, cluster):
            yield cat.COMPUTE_DOMAIN_NODE_READY, cat.COMPUTE_DOMAIN_NODE_READY.series(
                namespace=d.namespace, compute_domain=d.name, node=node.name, clique=node.clique,
                index="" if node.index is None else str(node.index)), 1 if node_ready(node) else 0
    pods_of = _claim_pods(cluster)
    holders: dict[tuple[str, str], set[str]] = {}
    for use in domain_uses(cluster.claims):
        if not use.channel:
            continue
        domain = names.get(use.domain_uid)
        name = domain.name if domain else ""  # the CRD not served (or not yet listed): still a holder
        for pod in pods_of.get((use.claim.namespace, use.claim.name), ()):
            holders.setdefault((use.claim.namespace, pod), set()).add(name)
            yield cat.COMPUTE_DOMAIN_CHANNEL_INFO, cat.COMPUTE_DOMAIN_CHANNEL_INFO.series(
                namespace=use.claim.namespace, claim=use.claim.name, pod=pod, compute_domain=name,
                device=use.device), 1
    for uuid, gpu, namespace, pod in gpu_holders:
        for name in sorted(holders.get((namespace, pod), ())):
            yield cat.COMPUTE_DOMAIN_GPU_INFO, cat.COMPUTE_DOMAIN_GPU_INFO.series(
                uuid=uuid, gpu=gpu, namespace=namespace, pod=pod, compute_domain=name), 1


def _claim_pods(cluster: ClusterSnapshot) -> dict[tuple[str, str], tuple[str, ...]]:
    """(namespace, claim) → this node's live pods that reference it. Only the node's pod watch
    counts: a shared claim's ``reservedFor`` may name pods of other nodes."""
    out: dict[tuple[str, str], set[str]] = {}
    for pod in cluster.pods:
        if not pod.terminal:
            for claim in pod.claims:
                out.setdefault((pod.namespace, claim), set()).add(pod.name)
    return {k: tuple(sorted(v)) for k, v in out.items()}
