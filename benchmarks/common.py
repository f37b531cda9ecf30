"""What every benchmark shares: its configuration, the shape of its result, and /proc readings.

A benchmark is a function ``(Config) -> Result``. A result has rows (the measurements, one
dict per configuration, each with the baseline it is compared with and the ratio between
them) and checks (a figure against its target from docs/performance.md). ``run.py`` prints
both and writes them to JSON; ``tests/test_benchmarks.py`` asserts that shape.
"""

from __future__ import annotations

import math
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Final

REPO: Final = Path(__file__).resolve().parents[1]
PAGE_SIZE: Final = os.sysconf("SC_PAGE_SIZE")
CLOCK_TICKS: Final = os.sysconf("SC_CLK_TCK")
MB: Final = 1_000_000  # decimal megabytes: the stricter reading of the targets

#: What Prometheus 2.x sends when it scrapes: OpenMetrics preferred, gzip accepted.
PROMETHEUS_HEADERS: Final = {
    "Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,"
              "text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
    "Accept-Encoding": "gzip",
}


@dataclass(frozen=True, slots=True)
class Config:
    """How much each benchmark does; ``--quick`` and the command-line overrides change it."""

    scenarios: tuple[str, ...] = ("demo", "scale")
    scrapes: int = 400
    """Timed scrapes per scraper against dra-exporter."""
    baseline_scrapes: int = 40
    """Timed scrapes per scraper against the per-scrape baseline (each one is a whole cycle)."""
    paced_scrapes: int = 20
    """Scrapes per scraper, about one a second, each the first to see a new frame (as Prometheus)."""
    concurrency: tuple[int, ...] = (1, 4)
    cycles: int = 40
    """Cycles timed by the cycle benchmark."""
    serve_seconds: float = 60.0
    serve_warmup_seconds: float = 5.0
    scrape_interval_seconds: float = 15.0
    """How often the serve benchmark scrapes, as Prometheus would."""
    drift_cycles: int = 10_000
    drift_warmup_cycles: int = 1_000
    drift_scenario: str = "scale"
    gc_cycles: int = 300
    """Cycles of the GC-pause benchmark (a full collection comes every ~12 cycles at ``scale``)."""
    apiserver_scenario: str = "scale"
    apiserver_seconds: float = 3600.0
    """Simulated seconds the API-server benchmark covers (``scale`` churns in its first ~49 minutes)."""
    apiserver_step_seconds: float = 15.0
    """Simulated seconds between the API-server benchmark's collections."""
    apiserver_polls: int = 20
    """Polls of the API-server benchmark's list-every-interval baseline."""

    @classmethod
    def quick(cls) -> Config:
        return cls(scrapes=100, baseline_scrapes=10, paced_scrapes=5, cycles=10, serve_seconds=10.0,
                   serve_warmup_seconds=2.0,
                   scrape_interval_seconds=5.0, drift_cycles=1_000, drift_warmup_cycles=200, gc_cycles=100,
                   apiserver_step_seconds=60.0, apiserver_polls=10)

    def but(self, **changes: Any) -> Config:
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


@dataclass(frozen=True, slots=True)
class Check:
    """One figure against its target."""

    target: str
    value: float
    limit: float
    unit: str
    higher_is_better: bool = False

    @property
    def met(self) -> bool:
        return self.value >= self.limit if self.higher_is_better else self.value <= self.limit

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "met": self.met}


@dataclass(slots=True)
class Result:
    description: str
    baseline: str
    rows: list[dict[str, Any]] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    status: str = "measured"
    """``measured``, or ``placeholder`` for a benchmark that cannot run yet."""

    def as_dict(self) -> dict[str, Any]:
        return {"description": self.description, "baseline": self.baseline, "status": self.status,
                "rows": self.rows, "checks": [c.as_dict() for c in self.checks], "notes": self.notes}


# --- numbers ------------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100), nearest-rank: an observed value, never an interpolation."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    rank = min(len(ordered), max(1, math.ceil(q / 100 * len(ordered))))
    return ordered[rank - 1]


def median(values: list[float]) -> float:
    return statistics.median(values)


def ratio(baseline: float, ours: float) -> float:
    """How many times ``ours`` beats ``baseline`` (for costs: baseline / ours)."""
    return round(baseline / ours, 1) if ours > 0 else float("inf")


def ms(seconds: float) -> float:
    return round(seconds * 1e3, 3)


# --- /proc ----------------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (``/proc/<pid>/stat`` utime + stime)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    # The command name (field 2) may contain spaces; fields after its ')' are plain.
    fields = stat[stat.rindex(")") + 2:].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def rss_bytes(pid: int | str = "self") -> int:
    """Resident set size from ``/proc/<pid>/statm``."""
    return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE_SIZE


def peak_rss_bytes(pid: int | str = "self") -> int:
    """The high-water mark of the resident set (``VmHWM``)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def machine() -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpus": os.cpu_count(), "cpu_model": model, "python": platform.python_version(),
            "platform": platform.platform(), "loadavg_start": list(os.getloadavg())}


# --- processes and HTTP ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http_ok(url: str, timeout: float = 60.0, alive: Any = None) -> None:
    """Poll ``url`` until it answers 200; ``alive()`` returning False aborts early."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if alive is not None and not alive():
            raise RuntimeError(f"the server behind {url} exited before it was ready")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer 200 within {timeout:g} s")


def python_command(*args: str) -> list[str]:
    return [sys.executable, *args]


def child_env(tree: Path = REPO) -> dict[str, str]:
    """The environment for child processes: the repository (or another checkout of it: ``tree``, with
    the child's working directory there too) importable, nothing else changed."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tree), env.get("PYTHONPATH", "")) if p)
    return env


def stop_process(proc: subprocess.Popen[Any]) -> None:
    """SIGTERM, up to 10 s to exit, then SIGKILL: a benchmark's child server never outlives it."""
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def simulated_exporter(*server_flags: str) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """``serve --simulate demo`` in a child process (``benchmarks.servers exporter`` with ``server_flags``,
    e.g. a baseline's) on a free loopback port, once it answers ``/metrics``: (process, port). Stopped
    at the end of the block."""
    port = free_port()
    listen = f"127.0.0.1:{port}"
    proc = subprocess.Popen(python_command("-m", "benchmarks.servers", "exporter", *server_flags, "--", "serve",
                                           "--simulate", "demo", "--listen", listen, "--log-level", "error"),
                            cwd=REPO, env=child_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http_ok(f"http://{listen}/metrics", alive=lambda: proc.poll() is None)
        yield proc, port
    finally:
        stop_process(proc)
