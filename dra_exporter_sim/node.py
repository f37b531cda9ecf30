"""A whole simulated node: fake NVML, a kubelet gRPC server, the cluster's API server and a
``/proc`` with the GPU processes' cgroups, all driven by one scenario and clock."""

from __future__ import annotations

from .apiserver import SimulatedApiServer
from .cdi import SimulatedCdiRoot
from .clock import SimClock
from .fake_nvml import FakeNvml
from .kubelet import SimulatedKubelet
from .procfs import SimulatedProcfs
from .scenario import Scenario

_KUBELET_FAULT_PREFIX = "kubelet_"


class SimulatedNode:
    """Owns the simulated parts; ``start()`` opens the kubelet socket and the API server's
    port, ``close()`` removes them. ``kubelet``/``apiserver`` are None when switched off."""

    def __init__(self, scenario: Scenario, clock: SimClock, *, kubelet: bool = True,
                 apiserver: bool = True) -> None:
        self.scenario = scenario
        self.clock = clock
        self.nvml = FakeNvml(scenario, clock)
        self.kubelet = SimulatedKubelet(
            provider=lambda: scenario.pod_allocations_at(clock.now()),
            fault_provider=self._kubelet_faults,
        ) if kubelet else None
        self.apiserver = SimulatedApiServer(scenario, clock) if apiserver else None
        self.procfs: SimulatedProcfs | None = None
        self.cdi: SimulatedCdiRoot | None = None

    def _kubelet_faults(self) -> set[str]:
        return {f.kind for f in self.scenario.active_faults(self.clock.now())
                if f.kind.startswith(_KUBELET_FAULT_PREFIX)}

    def wall_clock(self) -> float:
        """Wall time on the simulated node: the host's on a running clock, reproducible on a frozen one."""
        return self.clock.epoch + self.clock.now()

    def start(self) -> SimulatedNode:
        try:
            if self.kubelet:
                self.kubelet.start()
            if self.apiserver:
                self.apiserver.start()
            self.procfs = SimulatedProcfs(self.scenario)
            self.cdi = SimulatedCdiRoot(self.scenario)
        except BaseException:
            self.close()  # nothing half-started is left behind
            raise
        return self

    def close(self) -> None:
        if self.cdi:
            self.cdi.close()
            self.cdi = None
        if self.procfs:
            self.procfs.close()
            self.procfs = None
        if self.apiserver:
            self.apiserver.stop()
        if self.kubelet:
            self.kubelet.stop()

    def __enter__(self) -> SimulatedNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
