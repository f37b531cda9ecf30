"""Pure normalisation of NVIDIA's ``resource.nvidia.com/v1beta1`` objects: ComputeDomains and
ComputeDomainCliques, in the forms the NVIDIA DRA driver writes them.

Like ``kubeapi_normalize`` (whose untrusted-field helpers it shares): a JSON dict in, a frozen
``model`` record out, no I/O. The claims' side (the opaque ``ComputeDomainChannelConfig``) is
read by ``kubeapi_normalize.claim_from_dict``, the one reader of DRA objects; which claims tie a
node to which domain is the join's business (``join_domains``).

Forms (reference: computedomain-nvlink.md §1):

* v25.8+ (and v0.4): ``spec.channel.allocationMode``, ``status.nodes[]`` with ``name``,
  ``ipAddress``, ``cliqueID``, ``index`` and ``status``; ``status.status`` Ready/NotReady;
* v25.3: ``status.nodes[]`` with only ``name``, ``ipAddress`` and ``cliqueID``, no
  ``allocationMode`` (both read as ``""``/None);
* ComputeDomainCliques (v25.12+, gate ``ComputeDomainCliques``): a top-level ``daemons[]`` of
  the same entries (``nodeName`` for ``name``), labelled with the domain's UID.

The IMEX daemon's pod IP (``ipAddress``) is not kept: it changes with every daemon restart and
is no label anyone should group by.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from .. import model
from ..join_domains import DOMAIN_UID_LABEL
from .kubeapi_normalize import _int, _list, _map, _map_of, _str, resource_names

GROUP: Final = "resource.nvidia.com"
VERSION: Final = "v1beta1"
DOMAINS: Final = "computedomains"
CLIQUES: Final = "computedomaincliques"
#: Entries kept per domain or clique: the driver's maximum IMEX domain is 18 nodes per clique,
#: a hostile or broken object must not make thousands of series.
MAX_NODES: Final = 256


def served(resource_list: Mapping[str, Any]) -> frozenset[str]:
    """Which of computedomains and computedomaincliques ``GET /apis/resource.nvidia.com/v1beta1``
    lists."""
    return resource_names(resource_list) & {DOMAINS, CLIQUES}


def compute_domain_from_dict(obj: Mapping[str, Any]) -> model.ComputeDomain:
    meta, spec, status = _map(obj, "metadata"), _map(obj, "spec"), _map(obj, "status")
    return model.ComputeDomain(
        namespace=_str(meta, "namespace"), name=_str(meta, "name"), uid=_str(meta, "uid"),
        num_nodes=max(0, _int(spec, "numNodes")),
        allocation_mode=_str(_map(spec, "channel"), "allocationMode"),
        status=_str(status, "status"),
        nodes=_nodes(_list(status, "nodes"), "name"),
    )


def clique_from_dict(obj: Mapping[str, Any]) -> model.ComputeDomainClique:
    meta = _map(obj, "metadata")
    labels = _map(meta, "labels")
    daemons = _nodes(_list(obj, "daemons"), "nodeName")
    return model.ComputeDomainClique(
        namespace=_str(meta, "namespace"), name=_str(meta, "name"), domain_uid=_str(labels, DOMAIN_UID_LABEL),
        clique=_str(labels, f"{DOMAIN_UID_LABEL}.cliqueID") or next((d.clique for d in daemons if d.clique), ""),
        daemons=daemons,
    )


def _nodes(raw: Sequence[Any], name_key: str) -> tuple[model.ComputeDomainNode, ...]:
    # A list-map keyed by name: one entry per node (PR #1453: stale memberships can repeat a
    # name; the last one wins, as a later write would).
    nodes: dict[str, model.ComputeDomainNode] = {}
    for entry in map(_map_of, raw[:MAX_NODES]):
        if name := _str(entry, name_key):
            nodes[name] = model.ComputeDomainNode(name=name, clique=_str(entry, "cliqueID"),
                                                  index=_index(entry.get("index")), status=_str(entry, "status"))
    return tuple(nodes[n] for n in sorted(nodes))


def _index(value: Any) -> int | None:
    """``index`` (int32; v25.3 has none): None when absent or not an integer."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    return None


def for_node(domains: Sequence[model.ComputeDomain], cliques: Sequence[model.ComputeDomainClique],
             wanted: frozenset[str]) -> tuple[tuple[model.ComputeDomain, ...], tuple[model.ComputeDomainClique, ...]]:
    """Only the domains whose UID is in ``wanted`` (those this node's claims reference) and their
    cliques, sorted."""
    return (tuple(sorted((d for d in domains if d.uid in wanted), key=lambda d: (d.namespace, d.name))),
            tuple(sorted((c for c in cliques if c.domain_uid in wanted), key=lambda c: (c.namespace, c.name))))
