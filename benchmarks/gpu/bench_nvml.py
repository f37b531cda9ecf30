"""dra-exporter on a real NVIDIA machine: ``python3 benchmarks/gpu/bench_nvml.py`` (no arguments needed).

Measures in one run, on the GPUs of this machine:

1. **cycle against its floor**: ``NvmlSource.collect()`` over the real pynvml, wall and CPU
   time per cycle, against the sum of the times of the NVML calls that cycle made (every
   ``nvml*`` function timed through ``benchmarks.nvml_timing.TimedNvml``). The floor is what
   NVML itself needs; the difference is the exporter's own cost.
2. **scrape latency against nvitop-exporter**: ``dra-exporter serve`` (node-local:
   ``--no-kubeapi``; no kubelet socket is needed) and, if ``nvitop-exporter`` is on the PATH,
   nvitop-exporter on the same GPUs, each scraped the same number of times (new connection,
   plain text), p50/p99. Without nvitop-exporter the output says so.

It only reads: no NVML set* call, no MIG change, no clock or power change. It prints a table
and, when ``$OUT`` is set, writes ``$OUT/bench_nvml.json``. Without NVML it says so in one line
and exits with status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

# A script, run by path: make the repository (``benchmarks``, ``dra_exporter``) importable.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.bench_scrape import scrape_times  # noqa: E402
from benchmarks.common import (  # noqa: E402
    REPO,
    child_env,
    free_port,
    median,
    percentile,
    python_command,
    wait_http_ok,
)
from benchmarks.nvml_timing import TimedNvml  # noqa: E402
from dra_exporter.sources.nvml import NvmlSource  # noqa: E402

DEFAULT_CYCLES = 20
DEFAULT_INTERVAL = 1.0
DEFAULT_SCRAPES = 200
_TOP_CALLS = 8
_READY_TIMEOUT = 90.0
_SETTLE_SECONDS = 3.0  # both exporters collect a few times before they are scraped


# --- 1. cycle against its floor -------------------------------------------------------------


def measure_cycles(nvml: Any, cycles: int, interval: float) -> dict[str, Any]:
    """Time ``cycles`` collections of ``NvmlSource`` over ``nvml`` (pynvml or a fake).

    The first collection (NVML init, device identity, first GPM sample) is not timed; it is
    reported as ``first_cycle_ms``. ``interval`` seconds pass between the timed ones, as in
    the agent (GPM rates need time between samples).
    """
    timed = TimedNvml(nvml)
    source = NvmlSource(timed, events=False)
    try:
        started = time.perf_counter()
        snapshot = source.collect()
        first = time.perf_counter() - started
        walls, cpus, floors = [], [], []
        calls: Counter[str] = Counter()
        seconds: dict[str, float] = {}
        for _ in range(cycles):
            time.sleep(interval)
            timed.reset()
            wall, cpu = time.perf_counter(), time.thread_time()
            snapshot = source.collect()
            cpus.append(time.thread_time() - cpu)
            walls.append(time.perf_counter() - wall)
            floors.append(timed.total_seconds)
            calls.update(timed.calls)
            for name, spent in timed.seconds.items():
                seconds[name] = seconds.get(name, 0.0) + spent
    finally:
        source.close()
    return {"walls": walls, "cpus": cpus, "floors": floors, "first": first, "calls": calls,
            "seconds": seconds, "devices": len(snapshot.devices),
            "gpus": sorted({d.device.model for d in snapshot.devices})}


def summarize_cycles(raw: dict[str, Any]) -> dict[str, Any]:
    """Medians of a ``measure_cycles`` result, in milliseconds, and the most expensive calls."""
    n = len(raw["walls"])
    if n == 0:
        raise ValueError("no timed cycles")
    wall, floor = median(raw["walls"]), median(raw["floors"])
    own = [w - f for w, f in zip(raw["walls"], raw["floors"], strict=True)]
    return {
        "cycles": n, "devices": raw["devices"], "models": raw["gpus"],
        "first_cycle_ms": round(raw["first"] * 1e3, 3),
        "cycle_ms": round(wall * 1e3, 3), "cycle_p99_ms": round(percentile(raw["walls"], 99) * 1e3, 3),
        "cycle_cpu_ms": round(median(raw["cpus"]) * 1e3, 3),
        "nvml_floor_ms": round(floor * 1e3, 3),
        "own_ms": round(median(own) * 1e3, 3),
        "cycle_over_floor": round(wall / floor, 3) if floor > 0 else None,
        "nvml_calls_per_cycle": round(sum(raw["calls"].values()) / n, 1),
        "top_calls": [{"call": name, "ms_per_cycle": round(s / n * 1e3, 3),
                       "calls_per_cycle": raw["calls"][name] / n}
                      for name, s in sorted(raw["seconds"].items(), key=lambda kv: -kv[1])[:_TOP_CALLS]],
    }


# --- 2. scrape latency against nvitop-exporter ----------------------------------------------


def nvitop_command(port: int) -> list[str] | None:
    """The nvitop-exporter command line for ``port``, or None when it is not installed."""
    binary = shutil.which("nvitop-exporter")
    if binary is None:
        return None
    return [binary, "--bind-address", "127.0.0.1", "--port", str(port), "--interval", "1.0"]


def dra_exporter_command(port: int) -> list[str]:
    return python_command("-m", "benchmarks.servers", "exporter", "--", "serve",
                          "--listen", f"127.0.0.1:{port}", "--no-kubeapi", "--log-level", "warning")


@contextmanager
def _running(command: list[str], ready_url: str) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(command, cwd=REPO, env=child_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        try:
            wait_http_ok(ready_url, timeout=_READY_TIMEOUT, alive=lambda: proc.poll() is None)
        except RuntimeError as err:
            proc.terminate()
            _, stderr = proc.communicate(timeout=10)
            raise RuntimeError(f"{err}: {stderr.decode(errors='replace')[-1500:]}") from None
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def scrape_figures(command: list[str], port: int, ready_path: str, scrapes: int) -> dict[str, Any]:
    """Start ``command``, let it settle, scrape it ``scrapes`` times; p50/p99 and what it served."""
    with _running(command, f"http://127.0.0.1:{port}{ready_path}"):
        time.sleep(_SETTLE_SECONDS)
        times = scrape_times(port, scrapes, {})
        body = _body(port)
    series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    return {"status": "measured", "scrapes": scrapes, "p50_ms": round(percentile(times, 50) * 1e3, 3),
            "p99_ms": round(percentile(times, 99) * 1e3, 3), "bytes": len(body), "series": series}


def _body(port: int) -> bytes:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        return response.read()


def compare_scrapes(scrapes: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    port = free_port()
    try:
        out["dra-exporter"] = scrape_figures(dra_exporter_command(port), port, "/readyz", scrapes)
    except RuntimeError as err:
        out["dra-exporter"] = {"status": f"failed: {err}"}
    port = free_port()
    command = nvitop_command(port)
    if command is None:
        out["nvitop-exporter"] = {"status": "not installed (pip install nvitop-exporter to compare)"}
    else:
        try:
            out["nvitop-exporter"] = scrape_figures(command, port, "/metrics", scrapes)
        except RuntimeError as err:
            out["nvitop-exporter"] = {"status": f"failed: {err}"}
    ours, theirs = out["dra-exporter"], out["nvitop-exporter"]
    if ours.get("status") == theirs.get("status") == "measured":
        out["p50_ratio"] = round(theirs["p50_ms"] / ours["p50_ms"], 2)
        out["p99_ratio"] = round(theirs["p99_ms"] / ours["p99_ms"], 2)
    return out


# --- the run --------------------------------------------------------------------------------


def run(nvml: Any, *, cycles: int, interval: float, scrapes: int) -> dict[str, Any]:
    """Everything this script measures; ``scrapes=0`` leaves the exporters out (tests do)."""
    result: dict[str, Any] = {
        "schema": 1, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "cycle": summarize_cycles(measure_cycles(nvml, cycles, interval)),
    }
    result["scrape"] = compare_scrapes(scrapes) if scrapes > 0 else {"status": "skipped (--scrapes 0)"}
    return result


def format_report(result: dict[str, Any]) -> str:
    c = result["cycle"]
    lines = [
        f"NVML cycle on {c['devices']} device(s) ({', '.join(c['models'])}), median of {c['cycles']} cycles:",
        f"  cycle (wall)            {c['cycle_ms']:>10.3f} ms   (p99 {c['cycle_p99_ms']:.3f} ms)",
        f"  NVML calls (the floor)  {c['nvml_floor_ms']:>10.3f} ms   ({c['nvml_calls_per_cycle']:g} calls)",
        f"  exporter's own          {c['own_ms']:>10.3f} ms   (cycle / floor = {c['cycle_over_floor']})",
        f"  cycle (CPU)             {c['cycle_cpu_ms']:>10.3f} ms",
        f"  first cycle (init)      {c['first_cycle_ms']:>10.3f} ms",
        "  most expensive calls:",
        *(f"    {t['call']:<45} {t['ms_per_cycle']:>8.3f} ms/cycle  x{t['calls_per_cycle']:g}"
          for t in c["top_calls"]),
    ]
    scrape = result["scrape"]
    if "status" in scrape:
        lines.append(f"Scrapes: {scrape['status']}")
    else:
        lines.append("Scrape latency (new connection per scrape, plain text):")
        for name in ("dra-exporter", "nvitop-exporter"):
            s = scrape[name]
            if s.get("status") == "measured":
                lines.append(f"  {name:<16} p50 {s['p50_ms']:>8.3f} ms  p99 {s['p99_ms']:>8.3f} ms  "
                             f"{s['series']} series, {s['bytes']} bytes, {s['scrapes']} scrapes")
            else:
                lines.append(f"  {name:<16} {s['status']}")
        if "p50_ratio" in scrape:
            lines.append(f"  nvitop-exporter / dra-exporter: p50 x{scrape['p50_ratio']}, "
                         f"p99 x{scrape['p99_ratio']}")
    return "\n".join(lines)


def write_json(result: dict[str, Any], out_dir: str | None) -> Path | None:
    if not out_dir:
        return None
    path = Path(out_dir) / "bench_nvml.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result, indent=2) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_nvml.py", description=__doc__.splitlines()[0])
    parser.add_argument("--cycles", type=int, default=DEFAULT_CYCLES,
                        help="timed cycles (default %(default)s)")
    parser.add_argument("--interval", type=float, default=DEFAULT_INTERVAL,
                        help="seconds between cycles (default %(default)s)")
    parser.add_argument("--scrapes", type=int, default=DEFAULT_SCRAPES,
                        help="scrapes per exporter; 0 skips the exporters (default %(default)s)")
    args = parser.parse_args(argv)
    if args.cycles < 1 or args.interval < 0 or args.scrapes < 0:
        parser.error("--cycles must be >= 1, --interval and --scrapes >= 0")
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except Exception as err:  # noqa: BLE001 - any failure here means: no usable NVML
        print(f"bench_nvml: NVML is not usable here ({err}); run it on a machine with an NVIDIA GPU "
              "and driver", file=sys.stderr)
        return 2
    result = run(pynvml, cycles=args.cycles, interval=args.interval, scrapes=args.scrapes)
    print(format_report(result))
    if path := write_json(result, os.environ.get("OUT")):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
