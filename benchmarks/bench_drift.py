"""RSS drift: does memory stay flat over many cycles while pods come and go?

In a fresh process per variant: the runtime ``serve`` builds (simulated node, sources,
agent, Prometheus sink with its HTTP server), on a frozen simulated clock that is advanced
after every cycle. The step spreads the cycles over the scenario's churn window
(from 0 to the last pod's end), so every cycle sees pods starting and ending; at the default
size, 10,000 cycles cross the ``scale`` scenario's ~2,900 s of churn.

RSS is read from ``/proc/self/statm`` after a ``gc.collect()`` at the start, after the
warm-up (the baseline: caches, interned strings and allocator arenas have grown to their
working size by then) and at the end. Python's allocated block count is reported beside it:
it moves only with live objects, so it tells a leak from allocator noise.
"""

from __future__ import annotations

import gc
import multiprocessing
import sys
from typing import Any, Final

from dra_exporter import runtime
from dra_exporter.config import Settings
from dra_exporter.sources import registry
from dra_exporter_sim import load_scenario

from .common import MB, Check, Config, Result, rss_bytes

DRIFT_TARGET_MB = 2.0
_SAMPLES = 10  # RSS readings between warm-up and end, for the table
#: Each variant runs in its own process: the default, and the node-local one without the
#: API-server source (and without the simulated API server it talks to).
VARIANTS: Final = {"dra-exporter": True, "dra-exporter --no-kubeapi": False}


def churn_window(scenario_name: str) -> float:
    """Seconds from 0 to the last pod end of the scenario (its churn); 0 when no pod ends."""
    return max((pod.end for pod in load_scenario(scenario_name).pods if pod.end is not None), default=0.0)


def _reading() -> tuple[float, int]:
    gc.collect()
    return rss_bytes() / MB, sys.getallocatedblocks()


def measure(scenario: str, cycles: int, warmup: int, step: float, kubeapi: bool) -> list[dict[str, Any]]:
    """RSS and allocated blocks at the start, after ``warmup`` cycles, every tenth after, and at the end.

    Meant to run in a fresh process (``run`` spawns one per variant), so that no variant
    inherits another's heap.
    """
    sources = registry.default_enabled() if kubeapi else registry.without("kubeapi")
    rt = runtime.build(Settings(listen="127.0.0.1:0", simulate=scenario, sources=sources), sim_time=0.0,
                       publish=True)
    try:
        clock = rt.sim.clock
        rss, blocks = _reading()
        rows = [{"cycle": 0, "sim_time_s": 0.0, "rss_mb": round(rss, 2), "allocated_blocks": blocks}]
        every = max(1, (cycles - warmup) // _SAMPLES)
        marks = {cycles, *range(warmup, cycles + 1, every)}
        for cycle in range(1, cycles + 1):
            rt.agent.cycle(collect_side=True)
            if cycle == 1:
                runtime.settle_gc()  # as serve does once the first frame is out
            clock.advance(step)
            if cycle in marks:
                rss, blocks = _reading()
                rows.append({"cycle": cycle, "sim_time_s": round(clock.now(), 1), "rss_mb": round(rss, 2),
                             "allocated_blocks": blocks})
    finally:
        rt.close()
    return rows


def run(config: Config) -> Result:
    scenario = config.drift_scenario
    window = churn_window(scenario)
    step = window / config.drift_cycles if window else 1.0
    result = Result(
        description=f"RSS over {config.drift_cycles} in-process cycles of '{scenario}' with churn "
                    f"(simulated clock advanced {step:.3f} s per cycle, across {window:g} s of pod churn).",
        baseline=f"RSS after {config.drift_warmup_cycles} warm-up cycles of the same run")
    ctx = multiprocessing.get_context("spawn")
    for variant, kubeapi in VARIANTS.items():
        with ctx.Pool(1) as pool:
            args = (scenario, config.drift_cycles, config.drift_warmup_cycles, step, kubeapi)
            rows = pool.apply(measure, args)
        warm = next(r for r in rows if r["cycle"] == config.drift_warmup_cycles)
        drift = round(rows[-1]["rss_mb"] - warm["rss_mb"], 2)
        result.rows += [{"variant": variant, **row} for row in rows]
        result.rows.append({"variant": variant, "cycle": "drift (end - warm-up)", "rss_mb": drift,
                            "allocated_blocks": rows[-1]["allocated_blocks"] - warm["allocated_blocks"]})
        result.checks.append(Check(f"RSS drift over {config.drift_cycles} churning cycles after warm-up "
                                   f"({variant})", drift, DRIFT_TARGET_MB, "MB"))
    result.notes.append("the default variant's process also holds the simulated API server, whose watch "
                        "history keeps up to 10,000 change events (objects included) and grows with churn")
    return result
