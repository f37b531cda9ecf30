"""A node where NVML cannot be used (no library, no driver): what each command tells the operator.

``snapshot`` says why and exits 1 ("ran but found nothing usable"); ``/readyz`` is not ready while NVML
has never answered; ``serve`` logs one line per backoff step, not one per cycle.
"""

from __future__ import annotations

import logging

import pynvml
import pytest
from click.testing import CliRunner
from nvml_replay import ReplayNvml

from dra_exporter import cli
from dra_exporter.agent import Agent, SourceRunner
from dra_exporter.runtime import JoinCore
from dra_exporter.sources import SourceError
from dra_exporter.sources.nvml import NvmlSource


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_snapshot_without_nvml_says_why_and_exits_1(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_library() -> None:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)

    monkeypatch.setattr(pynvml, "nvmlInit", no_library)
    result = CliRunner().invoke(cli.main, ["snapshot", "--no-kubeapi", "--interval", "0.05"])
    assert result.exit_code == 1, result.output
    lines = [line for line in result.stderr.splitlines() if "NVML" in line or "nvml" in line]
    assert len(lines) == 1 and "libnvidia-ml.so.1" in lines[0], result.stderr


class Failing:
    name = "nvml"

    def __init__(self) -> None:
        self.fail = True

    def collect(self) -> object:
        if self.fail:
            raise SourceError("nvml: init failed: NVML Shared Library Not Found")
        from dra_exporter.model import DeviceSnapshot

        return DeviceSnapshot()

    def close(self) -> None:
        pass


def test_readyz_is_not_ready_while_nvml_has_never_answered() -> None:
    source = Failing()
    agent = Agent([SourceRunner(source, keep_last_good=False)], [], [], core=JoinCore(), interval=1.0)
    agent.cycle()
    health = agent.health()
    assert not health.ready and "nvml" in health.reason and "Not Found" in health.reason
    source.fail = False
    agent.cycle()
    assert agent.health().ready
    source.fail = True  # once it has answered, a later failure is source_up 0, not "not ready"
    agent.cycle()
    assert agent.health().ready


def test_serve_without_nvml_logs_once_per_backoff_step_not_every_cycle(caplog: pytest.LogCaptureFixture) -> None:
    nvml = ReplayNvml()
    nvml.init_failures = 10_000
    clock = Clock()
    source = NvmlSource(nvml, monotonic=clock, events=False, init_backoff=(1.0, 60.0), random=lambda: 0.5)
    runner = SourceRunner(source, keep_last_good=False, monotonic=clock)
    with caplog.at_level(logging.WARNING):
        for _ in range(75):  # 75 s of 1 s cycles
            runner.collect_once()
            clock.t += 1.0
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    attempts = source.init_attempts
    assert attempts <= 8  # 1, 2, 4, ... 60 s apart
    assert len(warnings) <= attempts + 1, warnings
