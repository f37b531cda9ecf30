"""The simulated node: fake NVML, kubelet pod-resources server, API server and scenarios.

Lets anyone run the real code paths without a GPU or a cluster; every test uses it. The
exporter (``dra_exporter``) reaches the simulator only through the names of this module
(``.importlinter`` holds it to that); the simulator reads Kubernetes objects and builds its
records with the exporter's own reader and model (``dra_exporter.sources.kubeapi_normalize``,
``dra_exporter.model``), so the two cannot drift apart.

The node and the loaders are imported on first use: the CLI names ``ScenarioError`` on every
command (``healthcheck`` too, every 30 s in the image), and importing the simulated servers and
the cluster-dump reader (the Kubernetes quantity parser) costs about 0.3 s.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .clock import SimClock
from .scenario import Scenario, ScenarioError

if TYPE_CHECKING:
    from .apiserver import SimulatedApiServer
    from .clock import FIXED_EPOCH
    from .cluster import load_cluster
    from .loader import builtin_scenarios, load_scenario
    from .multinode import node_names
    from .node import SimulatedNode

__all__ = ["FIXED_EPOCH", "Scenario", "ScenarioError", "SimClock", "SimulatedApiServer", "SimulatedNode",
           "builtin_scenarios", "load_cluster", "load_scenario", "node_names"]


def __getattr__(name: str) -> Any:
    if name == "SimulatedNode":
        from .node import SimulatedNode

        return SimulatedNode
    if name == "SimulatedApiServer":  # for `dra-exporter cluster --simulate`
        from .apiserver import SimulatedApiServer

        return SimulatedApiServer
    if name == "load_cluster":
        from .cluster import load_cluster

        return load_cluster
    if name == "FIXED_EPOCH":
        from .clock import FIXED_EPOCH

        return FIXED_EPOCH
    if name == "node_names":  # for `dra-exporter demo`: the nodes of a multi-node scenario
        from .multinode import node_names

        return node_names
    if name in ("load_scenario", "builtin_scenarios"):
        from . import loader

        return getattr(loader, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
