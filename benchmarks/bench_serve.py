"""What ``dra-exporter serve --simulate`` costs the node: CPU (fraction of one core) and RSS.

Each server runs as a child process at the default interval (1 s) and is scraped the way
Prometheus scrapes (its headers, every ``scrape_interval_seconds``). After a warm-up, CPU is
utime + stime from ``/proc/<pid>/stat`` over the window divided by the window's wall time;
RSS is ``/proc/<pid>/statm`` at the end, with the peak (``VmHWM``) beside it.

All processes run at the same time: CPU time is per process, so they do not inflate each
other's figure on a machine with idle cores, and they see the same background load.

- ``dra-exporter``: the real command line. Under ``--simulate`` the process also runs the
  simulated node: the fake NVML (see the cycle benchmark's ``fake_nvml``), the simulated
  kubelet's gRPC server and the simulated API server are inside the figure, which a real node
  would not pay;
- ``dra-exporter --no-kubeapi``: the same without the API-server source (node-local view),
  which shows what that source and its Kubernetes client cost;
- baseline ``reference renderer``: the default command with the prometheus_client renderer;
- ``imports only``: a Python process that imports every module of the package (and so every
  library they use, the Kubernetes client included) and sleeps: what the code alone costs.
"""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass

from .bench_scrape import scrape_times
from .common import (
    MB,
    PROMETHEUS_HEADERS,
    REPO,
    Check,
    Config,
    Result,
    child_env,
    cpu_seconds,
    free_port,
    peak_rss_bytes,
    python_command,
    ratio,
    rss_bytes,
    wait_http_ok,
)

CPU_TARGET = 0.03  # of one core, demo, 1 s interval
RSS_TARGET_MB = 100.0  # at scale
#: Imports every module of the package (and so every library they import), then sleeps.
_IMPORTS = ("import importlib, pkgutil, time, dra_exporter\n"
            "for m in pkgutil.walk_packages(dra_exporter.__path__, 'dra_exporter.'):\n"
            "    importlib.import_module(m.name)\n"
            "time.sleep(3600)")
#: Server variants: the command line's extra flags, and the renderer.
VARIANTS = {
    "dra-exporter": ((), "exposition"),
    "dra-exporter --no-kubeapi": (("--no-kubeapi",), "exposition"),
    "reference renderer": ((), "reference"),
}


@dataclass(slots=True)
class _Server:
    scenario: str
    variant: str
    proc: subprocess.Popen[bytes]
    port: int | None
    cpu_start: float = 0.0
    wall_start: float = 0.0


def _start(scenario: str, variant: str) -> _Server:
    if variant == "imports only":
        return _Server(scenario, variant, subprocess.Popen(python_command("-c", _IMPORTS), cwd=REPO,
                                                           env=child_env()), None)
    port = free_port()
    flags, renderer = VARIANTS[variant]
    args = ["-m", "benchmarks.servers", "exporter", "--renderer", renderer, "--", "serve",
            "--simulate", scenario, "--listen", f"127.0.0.1:{port}", "--log-level", "warning", *flags]
    proc = subprocess.Popen(python_command(*args), cwd=REPO, env=child_env(), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    return _Server(scenario, variant, proc, port)


def run(config: Config) -> Result:
    result = Result(
        description=f"serve --simulate at a 1 s interval, scraped every {config.scrape_interval_seconds:g} "
                    f"s: CPU over {config.serve_seconds:g} s (fraction of one core) and RSS.",
        baseline="the same command with the prometheus_client renderer; a process that only imports the "
                 "exporter's modules (what the code alone costs in RSS)")
    servers = [_start(s, v) for s in config.scenarios for v in VARIANTS]
    servers.append(_start(config.scenarios[0], "imports only"))
    try:
        for server in servers:
            if server.port is not None:
                proc = server.proc
                wait_http_ok(f"http://127.0.0.1:{server.port}/readyz", alive=lambda p=proc: p.poll() is None)
        time.sleep(config.serve_warmup_seconds)
        for server in servers:
            server.cpu_start, server.wall_start = cpu_seconds(server.proc.pid), time.monotonic()
        deadline = time.monotonic() + config.serve_seconds
        next_scrape = time.monotonic()
        while (now := time.monotonic()) < deadline:
            if now >= next_scrape:
                for server in servers:
                    if server.port is not None:
                        scrape_times(server.port, 1, PROMETHEUS_HEADERS)
                next_scrape += config.scrape_interval_seconds
            time.sleep(max(0.0, min(next_scrape, deadline) - time.monotonic()))
        figures = {}
        for server in servers:
            cpu = cpu_seconds(server.proc.pid) - server.cpu_start
            wall = time.monotonic() - server.wall_start
            figures[(server.scenario, server.variant)] = (cpu / wall, rss_bytes(server.proc.pid) / MB,
                                                          peak_rss_bytes(server.proc.pid) / MB)
    finally:
        for server in servers:
            server.proc.terminate()
        for server in servers:
            try:
                server.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.proc.kill()
                server.proc.wait()
    floor = figures[(config.scenarios[0], "imports only")][1]
    for scenario in config.scenarios:
        base_cpu, base_rss, _ = figures[(scenario, "reference renderer")]
        for variant in ("dra-exporter", "dra-exporter --no-kubeapi"):
            cpu, rss, peak = figures[(scenario, variant)]
            result.rows.append({
                "scenario": scenario, "variant": variant, "cpu_core_fraction": round(cpu, 4),
                "rss_mb": round(rss, 1), "peak_rss_mb": round(peak, 1),
                "baseline_cpu_core_fraction": round(base_cpu, 4), "baseline_rss_mb": round(base_rss, 1),
                "cpu_ratio": ratio(base_cpu, cpu),
            })
        cpu, rss, _ = figures[(scenario, "dra-exporter")]
        if scenario == "demo":
            result.checks.append(Check("serve --simulate demo, CPU at a 1 s interval", round(cpu, 4),
                                       CPU_TARGET, "of one core"))
        if scenario == "scale":
            result.checks.append(Check("serve --simulate scale, RSS", round(rss, 1), RSS_TARGET_MB, "MB"))
    result.rows.append({"scenario": "-", "variant": "imports only (every module)", "rss_mb": round(floor, 1)})
    result.notes.append("the simulated node (fake NVML, simulated kubelet) runs inside the measured process")
    return result
