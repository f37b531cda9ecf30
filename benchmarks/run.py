"""Run the benchmarks: ``python3 -m benchmarks.run [--quick] [--only NAME] [--out FILE]``.

Prints one table per benchmark and the targets met or missed, and writes everything as JSON
(default ``benchmarks/results/latest.json``). Every figure sits beside a baseline measured in
the same run, so a noisy or slower machine moves both. docs/performance.md explains each
benchmark and records the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, Final

from . import bench_apiserver, bench_cycle, bench_drift, bench_gc, bench_scrape, bench_serve
from .common import REPO, Config, Result, machine

BENCHMARKS: Final[dict[str, Callable[[Config], Result]]] = {
    "scrape": bench_scrape.run,
    "cycle": bench_cycle.run,
    "serve": bench_serve.run,
    "drift": bench_drift.run,
    "gc": bench_gc.run,
    "apiserver": bench_apiserver.run,
}
DEFAULT_OUT: Final = REPO / "benchmarks" / "results" / "latest.json"


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.run", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true",
                        help="fewer samples and shorter windows (about 2 minutes)")
    parser.add_argument("--only", action="append", choices=sorted(BENCHMARKS), metavar="NAME",
                        help=f"run only this benchmark (repeatable): {', '.join(BENCHMARKS)}")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"JSON output (default {DEFAULT_OUT})")
    small = parser.add_argument_group("overrides (the smoke test uses them to run everything in seconds)")
    small.add_argument("--scenarios", help="comma-separated scenarios (default demo,scale)")
    small.add_argument("--scrapes", type=_positive_int, help="timed scrapes per scraper against dra-exporter")
    small.add_argument("--baseline-scrapes", type=_positive_int, help="timed scrapes per scraper, baseline")
    small.add_argument("--paced-scrapes", type=_positive_int,
                       help="scrapes per scraper at about one a second (Prometheus's pattern)")
    small.add_argument("--concurrency", help="comma-separated numbers of concurrent scrapers (default 1,4)")
    small.add_argument("--cycles", type=_positive_int, help="cycles timed by the cycle benchmark")
    small.add_argument("--serve-seconds", type=_positive_float,
                       help="measuring window of the serve benchmark")
    small.add_argument("--serve-warmup-seconds", type=_positive_float, help="warm-up before that window")
    small.add_argument("--scrape-interval-seconds", type=_positive_float,
                       help="how often the serve benchmark scrapes (default 15)")
    small.add_argument("--drift-cycles", type=_positive_int, help="cycles of the drift benchmark")
    small.add_argument("--drift-warmup-cycles", type=_positive_int, help="cycles before the drift baseline")
    small.add_argument("--drift-scenario", help="scenario of the drift benchmark (default scale)")
    small.add_argument("--gc-cycles", type=_positive_int, help="cycles of the GC-pause benchmark")
    small.add_argument("--apiserver-seconds", type=_positive_float,
                       help="simulated seconds of the apiserver benchmark (default 3600)")
    small.add_argument("--apiserver-step-seconds", type=_positive_float,
                       help="simulated seconds between its collections (default 15)")
    small.add_argument("--apiserver-polls", type=_positive_int, help="polls of its baseline (default 20)")
    ns = parser.parse_args(argv)
    if ns.drift_cycles and ns.drift_warmup_cycles and ns.drift_warmup_cycles >= ns.drift_cycles:
        parser.error("--drift-warmup-cycles must be below --drift-cycles")
    return ns


def config_from(ns: argparse.Namespace) -> Config:
    base = Config.quick() if ns.quick else Config()
    return base.but(
        scenarios=tuple(ns.scenarios.split(",")) if ns.scenarios else None,
        concurrency=tuple(int(c) for c in ns.concurrency.split(",")) if ns.concurrency else None,
        scrapes=ns.scrapes, baseline_scrapes=ns.baseline_scrapes, paced_scrapes=ns.paced_scrapes, cycles=ns.cycles,
        serve_seconds=ns.serve_seconds, serve_warmup_seconds=ns.serve_warmup_seconds,
        scrape_interval_seconds=ns.scrape_interval_seconds,
        drift_cycles=ns.drift_cycles, drift_warmup_cycles=ns.drift_warmup_cycles,
        drift_scenario=ns.drift_scenario, gc_cycles=ns.gc_cycles,
        apiserver_seconds=ns.apiserver_seconds, apiserver_step_seconds=ns.apiserver_step_seconds,
        apiserver_polls=ns.apiserver_polls,
    )


def format_table(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "  (no rows)"
    columns = list(dict.fromkeys(key for row in rows for key in row))
    cells = [[_cell(row.get(c, "")) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  " + "  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    for row in cells:
        aligned = (v.rjust(w) if _numeric(v) else v.ljust(w) for v, w in zip(row, widths, strict=True))
        lines.append("  " + "  ".join(aligned))
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3f}".rstrip("0").rstrip(".") if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def _numeric(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def report(name: str, result: Result) -> str:
    out = [f"== {name}: {result.description}", f"   baseline: {result.baseline}"]
    if result.status != "measured":
        out.append(f"   [{result.status}]")
    out.append(format_table(result.rows))
    for check in result.checks:
        verdict = "met   " if check.met else "MISSED"
        op = ">=" if check.higher_is_better else "<="
        out.append(f"   {verdict} {check.target}: {check.value:g} {check.unit} (target {op} {check.limit:g})")
    out += [f"   note: {note}" for note in result.notes]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    config = config_from(ns)
    selected = ns.only or list(BENCHMARKS)
    doc: dict[str, Any] = {
        "schema": 1,
        "command": "python3 -m benchmarks.run " + " ".join(sys.argv[1:] if argv is None else argv),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(),
        "config": asdict(config),
        "benchmarks": {},
    }
    for name in selected:
        started = time.monotonic()
        load_before = os.getloadavg()[0]
        result = BENCHMARKS[name](config)
        entry = result.as_dict()
        entry["seconds"] = round(time.monotonic() - started, 1)
        # Other work on the machine shows here: a high load average makes every figure suspect.
        entry["loadavg_1m"] = [round(load_before, 2), round(os.getloadavg()[0], 2)]
        doc["benchmarks"][name] = entry
        print(report(name, result), flush=True)
        print(flush=True)
    doc["machine"]["loadavg_end"] = list(os.getloadavg())
    ns.out.parent.mkdir(parents=True, exist_ok=True)
    ns.out.write_text(json.dumps(doc, indent=2) + "\n")
    missed = [c["target"] for e in doc["benchmarks"].values() for c in e["checks"] if not c["met"]]
    print(f"wrote {ns.out}; {len(missed)} target(s) missed" + (": " + "; ".join(missed) if missed else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
