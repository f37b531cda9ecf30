"""CPU time of one collection cycle, stage by stage, against the prometheus_client renderer.

One cycle is what the agent does every interval: collect NVML, collect the kubelet's pod
resources, join, render the frame as text and as OpenMetrics. Each stage is timed on its own:

- ``nvml``: ``NvmlSource.collect()`` over the simulator's fake NVML (no call latency), in
  thread CPU time. The fake computes its answers in Python; that CPU time is measured per call
  (``nvml_timing.TimedNvml``) and reported apart as ``fake_nvml``, so ``nvml`` is the
  source's own work, what it would cost against a real, free NVML;
- ``podresources``: ``PodResourcesSource.collect()`` over gRPC to a simulated kubelet that runs
  in another process, in process CPU time (gRPC works on its own threads too);
- ``join``, ``render_text``, ``render_openmetrics``: thread CPU time. The renderer keeps its
  caches between cycles, as the sink's does, and every cycle renders a new frame.

The baseline renders the same frames with prometheus_client families (``baseline.py``, the
renderer this project used before ``sinks/exposition.py``); the other stages are shared.
Figures are medians over the timed cycles.
"""

from __future__ import annotations

import multiprocessing
import os
import platform
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from dra_exporter import __version__
from dra_exporter.join import JoinInput, join
from dra_exporter.model import SourceHealth
from dra_exporter.orphans import OrphanMemory
from dra_exporter.sinks.exposition import Renderer
from dra_exporter.sources.nvml import NvmlSource
from dra_exporter.sources.podresources import PodResourcesSource
from dra_exporter_sim import load_scenario
from dra_exporter_sim.clock import SimClock
from dra_exporter_sim.fake_nvml import FakeNvml

from .baseline import render_reference
from .common import Check, Config, Result, median, ms, ratio
from .nvml_timing import TimedNvml

#: Simulated time of the measured cycles: the scenarios' pods are running by then.
SIM_START = 600.0
_WARMUP_CYCLES = 3
CYCLE_TARGET_MS = 25.0
STAGES = ("nvml", "podresources", "join", "render_text", "render_openmetrics")


def _kubelet_process(scenario_name: str, at: float, socket_path: str, ready: Any, stop: Any) -> None:
    from dra_exporter_sim.kubelet import SimulatedKubelet

    scenario = load_scenario(scenario_name)
    snapshot = scenario.pod_allocations_at(at)
    # No rate limit: the benchmark calls List back to back, far above the kubelet's 100 QPS.
    with SimulatedKubelet(lambda: snapshot, socket_path, rate_limit=None):
        ready.set()
        stop.wait()


@contextmanager
def kubelet(scenario: str, at: float) -> Iterator[str]:
    """A simulated kubelet serving ``scenario`` at time ``at`` from another process; yields its socket."""
    ctx = multiprocessing.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    with tempfile.TemporaryDirectory(prefix="dra-bench-") as folder:
        path = os.path.join(folder, "kubelet.sock")
        proc = ctx.Process(target=_kubelet_process, args=(scenario, at, path, ready, stop), daemon=True)
        proc.start()
        try:
            if not ready.wait(60):
                raise RuntimeError("the simulated kubelet did not start within 60 s")
            yield path
        finally:
            stop.set()
            proc.join(10)
            if proc.is_alive():
                proc.kill()


def _cpu(clock: Callable[[], float], work: Callable[..., Any], *args: Any,
         **kwargs: Any) -> tuple[float, Any]:
    started = clock()
    value = work(*args, **kwargs)
    return clock() - started, value


def measure(scenario_name: str, cycles: int) -> dict[str, list[float]]:
    """Per-stage CPU seconds of ``cycles`` cycles (plus ``fake_nvml`` and the baseline's renders)."""
    scenario = load_scenario(scenario_name)
    clock = SimClock(SIM_START, frozen=True)
    nvml = TimedNvml(FakeNvml(scenario, clock), clock=time.thread_time)
    source = NvmlSource(nvml, wall_clock=clock.wall, monotonic=clock.now, events=False)
    renderer = Renderer()
    pod = scenario.exporter_pod
    times: dict[str, list[float]] = {k: [] for k in (*STAGES, "fake_nvml", "baseline_text",
                                                     "baseline_openmetrics")}
    with kubelet(scenario_name, SIM_START) as socket_path:
        pods_source = PodResourcesSource(socket_path)
        orphan_memory = OrphanMemory()  # as the node agent's core joins: orphans decided, first seen kept
        try:
            for i in range(_WARMUP_CYCLES + cycles):
                clock.advance(1.0)
                nvml.reset()
                nvml_cpu, snapshot = _cpu(time.thread_time, source.collect)
                fake = nvml.total_seconds
                pods_cpu, pods = _cpu(time.process_time, pods_source.collect)
                health = (SourceHealth("nvml", True, nvml_cpu, 0, clock.wall()),
                          SourceHealth("podresources", True, pods_cpu, 0, clock.wall()))
                inp = JoinInput(devices=(snapshot,), pods=pods, health=health, orphan_memory=orphan_memory,
                                self_pod=(pod.namespace, pod.name) if pod else None, version=__version__,
                                python_version=platform.python_version(), timestamp=clock.wall())
                join_cpu, frame = _cpu(time.thread_time, join, inp)
                text_cpu, _ = _cpu(time.thread_time, renderer.render, frame)
                om_cpu, _ = _cpu(time.thread_time, renderer.render, frame, openmetrics=True)
                base_text, _ = _cpu(time.thread_time, render_reference, frame)
                base_om, _ = _cpu(time.thread_time, render_reference, frame, openmetrics=True)
                if i < _WARMUP_CYCLES:
                    continue
                for key, value in (("nvml", nvml_cpu - fake), ("fake_nvml", fake), ("podresources", pods_cpu),
                                   ("join", join_cpu), ("render_text", text_cpu),
                                   ("render_openmetrics", om_cpu), ("baseline_text", base_text),
                                   ("baseline_openmetrics", base_om)):
                    times[key].append(value)
        finally:
            pods_source.close()
            source.close()
    return times


def run(config: Config) -> Result:
    result = Result(
        description="CPU time of one cycle (NVML through the fake, pod resources, join, both renders), "
                    f"median of {config.cycles} cycles, by stage.",
        baseline="the same cycle rendering with prometheus_client metric families (the renderer before "
                 "sinks/exposition.py); nvml, podresources and join are shared")
    for scenario in config.scenarios:
        times = measure(scenario, config.cycles)
        med = {k: median(v) for k, v in times.items()}
        ours = sum(med[s] for s in STAGES)
        renders = med["render_text"] + med["render_openmetrics"]
        base = ours - renders + med["baseline_text"] + med["baseline_openmetrics"]
        for stage in STAGES:
            row: dict[str, Any] = {"scenario": scenario, "stage": stage, "cpu_ms": ms(med[stage])}
            if stage.startswith("render_"):
                baseline = med["baseline_" + stage.removeprefix("render_")]
                row |= {"baseline_cpu_ms": ms(baseline), "ratio": ratio(baseline, med[stage])}
            result.rows.append(row)
        result.rows.append({"scenario": scenario, "stage": "total", "cpu_ms": ms(ours),
                            "baseline_cpu_ms": ms(base), "ratio": ratio(base, ours)})
        result.rows.append({"scenario": scenario, "stage": "(fake_nvml, not counted)",
                            "cpu_ms": ms(med["fake_nvml"])})
        if scenario == "scale":
            result.checks.append(Check("one cycle at scale (CPU, fake NVML excluded)", ms(ours),
                                       CYCLE_TARGET_MS, "ms"))
    result.notes.append("render_openmetrics reuses the sample lines render_text formatted for the same frame "
                        "(Renderer keeps the last frame's lines), as PrometheusSink.publish renders both")
    return result
