"""The cluster mode as a program of the one runtime (``dra_exporter.runtime``): the cluster-wide
source (``sources.registry.CLUSTER``) → the capacity core → the node agent's sinks, loop, watchdog
and probes. Only what differs is here."""

from __future__ import annotations

from dataclasses import replace

from .. import environment
from ..agent import Core
from ..config import ClusterSettings
from ..environment import Environment
from ..model import ClusterState, Frame, SourceHealth
from ..runtime import BUILD_LABELS, Program
from ..sources import Snapshots
from ..sources.registry import CLUSTER as CLUSTER_SOURCES
from .capacity import Capacity
from .cel_budget import frame_budget
from .cel_worker import CelWorker


class CapacityCore:
    """The cluster mode's core: the capacity families of the latest cluster state.

    Ages (pending claims) are on ``object_clock`` when the objects are stamped on another clock
    than the host's (a simulated cluster); the frame's time is the host's either way."""

    def __init__(self, object_clock: environment.Clock | None = None, cel_budget: float | None = None, *,
                 every_reason: bool = False) -> None:
        # DeviceClass CEL runs in a worker process: a runaway or crashing class costs the worker,
        # never the probes or the process (see cel_worker).
        # The classes' CEL a frame may cost is bounded too: the rest waits for the next frames
        # (cel_budget), so a frame always ends and the probes hold. ``every_reason``: one frame (--once).
        self.capacity = Capacity(CelWorker(), cel_budget=cel_budget, every_reason=every_reason)
        self.object_clock = object_clock

    def __call__(self, snapshots: Snapshots, health: tuple[SourceHealth, ...], timestamp: float) -> Frame:
        state = snapshots.state if snapshots.state is not None else ClusterState()
        now = self.object_clock() if self.object_clock is not None else timestamp
        frame = self.capacity.frame(state, now, health, BUILD_LABELS)
        return frame if self.object_clock is None else replace(frame, timestamp=timestamp)


class ClusterProgram(Program[ClusterSettings]):
    """``dra-exporter cluster``: the DRA state of the whole cluster, one replica per cluster."""

    name = "cluster mode"
    registry = CLUSTER_SOURCES

    def environment(self, settings: ClusterSettings, sim_time: float | None) -> Environment:
        return environment.cluster(settings)

    def core(self, settings: ClusterSettings, env: Environment) -> Core:
        # ``--once`` has no next frame for classes past a frame's CEL budget: all in its one frame.
        budget = None if settings.once else frame_budget(settings.interval)
        return CapacityCore(env.object_clock, budget, every_reason=settings.once)

    def otlp_node_name(self, env: Environment) -> str:
        # No k8s.node.name: the series are the cluster's, not those of the node this replica runs on
        # (the series that have a node carry it as an attribute). OTEL_RESOURCE_ATTRIBUTES may add
        # k8s.cluster.name.
        return ""


CLUSTER: ClusterProgram = ClusterProgram()


class ExplainProgram(ClusterProgram):
    """``dra-exporter explain``: the cluster mode's sources, once; the allocator's questions are
    asked of their objects (``cluster.explain``), not of a frame, so the core builds none."""

    name = "explain"

    def core(self, settings: ClusterSettings, env: Environment) -> Core:
        return lambda snapshots, health, timestamp: Frame((), timestamp)


EXPLAIN: ExplainProgram = ExplainProgram()
