"""Garbage-collector pauses during collection cycles, with and without ``runtime.settle_gc``.

A pause of CPython's cyclic collector holds the GIL: every scrape that arrives meanwhile
waits it out, so the longest pause bounds the scrape latency tail from below. In a fresh
process per variant: the runtime ``serve`` builds for ``scale`` (simulated node included, as
under ``--simulate``), one cycle, then ``gc_cycles`` cycles on a simulated clock advanced 1 s
after each, timing every collection with ``gc.callbacks``:

- ``default``: CPython's collector as it comes (the baseline);
- ``settled``: ``runtime.settle_gc()`` after the first cycle, as ``serve`` does.
"""

from __future__ import annotations

import gc
import multiprocessing
import time
from typing import Any, Final

from dra_exporter import runtime
from dra_exporter.config import Settings

from .common import Check, Config, Result, ratio

SCENARIO: Final = "scale"
VARIANTS: Final = ("default", "settled")
#: The longest pause must be this many times shorter than the default collector's: the full
#: collections that walk every start-up object are what a scrape can wait tens of ms for. Young
#: collections stay (~14 in 300 cycles at ``scale``), and one that lands while a frame is being
#: built walks its ~10,000 live objects: the longest took 4-11 ms across runs.
PAUSE_RATIO_TARGET: Final = 3.0
#: Time in pauses per 1 s cycle: a scrape lands in a pause with this probability, so it must stay
#: well under the 1 % that a p99 can absorb.
GC_SHARE_TARGET_MS: Final = 5.0


def measure(variant: str, cycles: int) -> dict[str, Any]:
    """Runs in a fresh process: pauses by generation, and process CPU per cycle."""
    rt = runtime.build(Settings(listen="127.0.0.1:0", simulate=SCENARIO), sim_time=0.0, publish=True)
    pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
    started: list[float] = [0.0]

    def timed(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.perf_counter()
        else:
            pauses[info["generation"]].append(time.perf_counter() - started[0])

    try:
        rt.agent.cycle(collect_side=True)
        if variant == "settled":
            runtime.settle_gc()
        gc.callbacks.append(timed)
        cpu = time.process_time()
        for _ in range(cycles):
            rt.sim.clock.advance(1.0)
            rt.agent.cycle(collect_side=True)
        cpu = time.process_time() - cpu
        gc.callbacks.remove(timed)
    finally:
        rt.close()
    every = [p for gen in pauses.values() for p in gen]
    return {
        "variant": variant, "cycles": cycles,
        "collections": len(every), "full_collections": len(pauses[2]),
        "max_pause_ms": round(max(every, default=0.0) * 1e3, 2),
        "max_full_pause_ms": round(max(pauses[2], default=0.0) * 1e3, 2),
        "gc_ms_per_cycle": round(sum(every) / cycles * 1e3, 3),
        "cpu_ms_per_cycle": round(cpu / cycles * 1e3, 2),
        "tracked_objects": len(gc.get_objects()),
    }


def run(config: Config) -> Result:
    result = Result(
        description=f"Cyclic-GC pauses over {config.gc_cycles} cycles of '{SCENARIO}' (simulated node in the "
                    "same process, fresh process per variant); CPU per cycle includes the simulated node.",
        baseline="the same run with CPython's default collector settings ('default')")
    ctx = multiprocessing.get_context("spawn")
    rows = {}
    for variant in VARIANTS:
        with ctx.Pool(1) as pool:
            rows[variant] = pool.apply(measure, (variant, config.gc_cycles))
    base, ours = rows["default"], rows["settled"]
    ours["max_pause_ratio"] = ratio(base["max_pause_ms"], ours["max_pause_ms"])
    ours["gc_time_ratio"] = ratio(base["gc_ms_per_cycle"], ours["gc_ms_per_cycle"])
    result.rows += [base, ours]
    result.checks.append(Check("longest GC pause, times shorter with settle_gc than by default",
                               ours["max_pause_ratio"], PAUSE_RATIO_TARGET, "x", higher_is_better=True))
    result.checks.append(Check("GC pauses per 1 s cycle with settle_gc (0.5 % of the time)", ours["gc_ms_per_cycle"],
                               GC_SHARE_TARGET_MS, "ms"))
    return result
