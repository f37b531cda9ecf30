"""A whole simulated node: fake NVML and a kubelet gRPC server, both driven by one scenario and clock."""

from __future__ import annotations

from .clock import SimClock
from .fake_nvml import FakeNvml
from .kubelet import SimulatedKubelet
from .scenario import Scenario

_KUBELET_FAULT_PREFIX = "kubelet_"


class SimulatedNode:
    """Owns the simulated parts; ``start()`` opens the kubelet socket, ``close()`` removes it."""

    def __init__(self, scenario: Scenario, clock: SimClock, *, kubelet: bool = True) -> None:
        self.scenario = scenario
        self.clock = clock
        self.nvml = FakeNvml(scenario, clock)
        self.kubelet = SimulatedKubelet(
            provider=lambda: scenario.pod_allocations_at(clock.now()),
            fault_provider=self._kubelet_faults,
        ) if kubelet else None

    def _kubelet_faults(self) -> set[str]:
        return {f.kind for f in self.scenario.active_faults(self.clock.now())
                if f.kind.startswith(_KUBELET_FAULT_PREFIX)}

    def wall_clock(self) -> float:
        """Wall time on the simulated node: deterministic for a given simulated time."""
        return self.clock.epoch + self.clock.now()

    def start(self) -> SimulatedNode:
        if self.kubelet:
            self.kubelet.start()
        return self

    def close(self) -> None:
        if self.kubelet:
            self.kubelet.stop()

    def __enter__(self) -> SimulatedNode:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
