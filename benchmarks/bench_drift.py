"""RSS drift: does memory stay flat over many cycles while pods come and go?

In this process: the runtime ``serve`` builds (simulated node, NVML and pod-resources
sources, agent, Prometheus sink with its HTTP server), on a frozen simulated clock that is
advanced after every cycle. The step spreads the cycles over the scenario's churn window
(from 0 to the last pod's end), so every cycle sees pods starting and ending; at the default
size, 10,000 cycles cross the ``scale`` scenario's ~2,900 s of churn.

RSS is read from ``/proc/self/statm`` after a ``gc.collect()`` at the start, after the
warm-up (the baseline: caches, interned strings and allocator arenas have grown to their
working size by then) and at the end. Python's allocated block count is reported beside it:
it moves only with live objects, so it tells a leak from allocator noise.
"""

from __future__ import annotations

import gc
import sys

from dra_exporter import runtime
from dra_exporter.config import Settings
from dra_exporter.sim.scenario import load_scenario

from .common import MB, Check, Config, Result, rss_bytes

DRIFT_TARGET_MB = 2.0
_SAMPLES = 10  # RSS readings between warm-up and end, for the table


def churn_window(scenario_name: str) -> float:
    """Seconds from 0 to the last pod end of the scenario (its churn); 0 when no pod ends."""
    return max((pod.end for pod in load_scenario(scenario_name).pods if pod.end is not None), default=0.0)


def _reading() -> tuple[float, int]:
    gc.collect()
    return rss_bytes() / MB, sys.getallocatedblocks()


def run(config: Config) -> Result:
    scenario = config.drift_scenario
    window = churn_window(scenario)
    step = window / config.drift_cycles if window else 1.0
    result = Result(
        description=f"RSS over {config.drift_cycles} in-process cycles of '{scenario}' with churn "
                    f"(simulated clock advanced {step:.3f} s per cycle, across {window:g} s of pod churn).",
        baseline=f"RSS after {config.drift_warmup_cycles} warm-up cycles of the same run")
    rt = runtime.build(Settings(listen="127.0.0.1:0", simulate=scenario), sim_time=0.0, publish=True)
    try:
        clock = rt.sim.clock
        start_rss, start_blocks = _reading()
        result.rows.append({"cycle": 0, "sim_time_s": 0.0, "rss_mb": round(start_rss, 2),
                            "allocated_blocks": start_blocks})
        every = max(1, (config.drift_cycles - config.drift_warmup_cycles) // _SAMPLES)
        marks = {config.drift_cycles, *range(config.drift_warmup_cycles, config.drift_cycles + 1, every)}
        warm_rss, warm_blocks = start_rss, start_blocks
        for cycle in range(1, config.drift_cycles + 1):
            rt.agent.cycle(collect_side=True)
            clock.advance(step)
            if cycle in marks:
                rss, blocks = _reading()
                if cycle == config.drift_warmup_cycles:
                    warm_rss, warm_blocks = rss, blocks
                result.rows.append({"cycle": cycle, "sim_time_s": round(clock.now(), 1),
                                    "rss_mb": round(rss, 2), "allocated_blocks": blocks})
        end_rss, end_blocks = result.rows[-1]["rss_mb"], result.rows[-1]["allocated_blocks"]
    finally:
        rt.close()
    drift = round(end_rss - warm_rss, 2)
    result.rows.append({"cycle": "drift (end - warm-up)", "rss_mb": drift,
                        "allocated_blocks": end_blocks - warm_blocks})
    result.checks.append(Check(f"RSS drift over {config.drift_cycles} churning cycles after warm-up", drift,
                               DRIFT_TARGET_MB, "MB"))
    return result
