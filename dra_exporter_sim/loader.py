"""Loading a scenario: a built-in name, a scenario YAML file or a cluster dump.

The one entry point the exporter uses (through the package's ``load_scenario``). It reads the
documents (``scenario_builder.read_documents``) and hands them to the reader of their format:
Kubernetes objects to ``dump``, a multi-node scenario to ``multinode``, a scenario document to
``scenario_builder``.
"""

from __future__ import annotations

import os

from .dump import is_dump, parse_dump
from .multinode import is_cluster, parse_cluster
from .scenario import Scenario, ScenarioError
from .scenario_builder import builtin_scenarios, parse_scenario, read_documents

__all__ = ["builtin_scenarios", "load_scenario"]


def load_scenario(source: str | os.PathLike[str], node_name: str | None = None) -> Scenario:
    """Load a built-in scenario by name, a scenario YAML file or a cluster dump; raises ``ScenarioError``.

    A cluster dump (``kubectl get resourceslices,resourceclaims,pods -A -o yaml``: a ``kind: List``
    or several Kubernetes objects) becomes the scenario of node ``node_name``; see ``dump``.
    A multi-node scenario (``nodes:``, see ``multinode``) becomes the scenario of node ``node_name``
    (default: its first). ``node_name`` is not used for a one-node scenario, which names its node itself.
    """
    label, docs = read_documents(source)
    if is_dump(docs):
        return parse_dump(docs, label, node_name)
    if len(docs) == 1 and is_cluster(docs[0]):
        return parse_cluster(docs[0], label, node_name)
    if len(docs) > 1:
        raise ScenarioError(f"{label}: {len(docs)} YAML documents; a scenario is one document "
                            "(several documents are only accepted as a dump of Kubernetes objects)")
    return parse_scenario(docs[0], label)
