"""Hardening IV (issue 35, items 1, 2 and 8): the code before and after, in one run, on one machine.

``python3 -m benchmarks.bench_hardening_iv --before DIR [--seconds 90] [--only NAME] [--out FILE]``

``DIR`` holds the code before (``git archive db8d9a8 | tar -x -C DIR``); the code after is this
checkout. Each scenario runs the real command line against both, one after the other, and the row
gives both figures and their ratio (after / before):

- ``slow-classes``: 100 DeviceClasses whose CEL runs past the 1 s limit (three nested ``.all()``
  over 300 elements, each different) and one ordinary class, ``cluster --interval 2`` for
  ``--seconds``: ``/readyz``, ``/healthz`` and ``/metrics`` asked every second from the first
  answer on (share answered 200), frames published (distinct
  ``dra_exporter_last_success_timestamp_seconds``), seconds to the first ready, CEL worker
  processes seen, peak RSS.
- ``ordinary-classes``: 3,000 ordinary distinct classes over 20 eight-GPU slices: seconds to the
  first ready (the first frame), frames published in ``--seconds``.
- ``endless-gpu-slices``: an endless watch of eight-GPU slices (``bench_hostile_peers``) for at least
  240 s: peak RSS up to and at the 50,000-slice cap against the chart's limit (768 MiB).
- ``auth-flood``: ``bench_auth``: wrong passwords from 300 addresses, 100 attackers each sending
  from three in turn, a new connection for every one (300 connections at once would hold the
  server's 256 and refuse good logins at connect: a connection flood, not a bcrypt one): the
  slowest correct login of 40 (target 1 s), from an address that logged in before the flood, as
  Prometheus has.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from . import bench_auth, bench_hostile_peers
from .common import REPO, child_env, free_port, machine, python_command

sys.path.insert(0, str(REPO / "tests"))  # the hostile peers: one definition, the tests'
from hostile import ApiServer, HostileServer, device_class, empty_list, gpu_slice, idle_watch, kubeconfig, object_list  # noqa: E402

CHART_MEMORY_LIMIT_MB = 768 * 2**20 / 1e6
#: The endless watch reaches the 50,000-slice cap after ~90 s here: it runs at least this long.
ENDLESS_SECONDS = 240.0
_LIST = "[" + ",".join(str(i) for i in range(300)) + "]"
_LAST_SUCCESS = re.compile(r'^dra_exporter_last_success_timestamp_seconds\{source="kubeapi"\} (\S+)$', re.M)


def _api(classes: list[dict[str, Any]], slices: list[dict[str, Any]]) -> ApiServer:
    def fixed(items: list[dict[str, Any]]) -> Any:
        return lambda req, reply: reply.json(object_list(items))
    return ApiServer(lists={"resourceslices": fixed(slices), "resourceclaims": empty_list, "pods": empty_list,
                            "deviceclasses": fixed(classes)},
                     watches={k: idle_watch for k in ("resourceslices", "resourceclaims", "deviceclasses", "pods")})


def slow_classes() -> ApiServer:
    classes = [device_class(f"slow-{i:03}", f"{_LIST}.all(x, {_LIST}.all(y, {_LIST}.all(z, x + y + z >= -{i})))")
               for i in range(100)]
    classes.append(device_class("gpu.nvidia.com", "device.driver == 'gpu.nvidia.com'"))
    return _api(classes, [gpu_slice(f"n{i}") for i in range(4)])


def ordinary_classes() -> ApiServer:
    classes = [device_class(f"team-{i:04}", f"device.driver == 'gpu.nvidia.com' && "
                                      f"device.attributes['gpu.nvidia.com'].index >= {i % 8} && {i} >= 0")
               for i in range(3000)]
    return _api(classes, [gpu_slice(f"n{i}") for i in range(20)])


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


def _children(pid: int) -> set[int]:
    """Children of every thread of ``pid`` (the CEL worker is started by the collection thread)."""
    found: set[int] = set()
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found |= {int(c) for c in (task / "children").read_text().split()}
        except OSError:
            continue
    return found


def cluster_under(api: ApiServer, tree: Path, seconds: float) -> dict[str, Any]:
    """``cluster --interval 2`` of ``tree`` against ``api`` for ``seconds``: probes, frames, RSS."""
    with HostileServer(api) as peer, tempfile.TemporaryDirectory() as scratch:
        config = Path(scratch) / "kubeconfig"
        config.write_text(kubeconfig(peer.url))
        port = free_port()
        started = time.monotonic()
        proc = subprocess.Popen(python_command("-m", "dra_exporter.cli", "cluster", "--kubeconfig", str(config),
                                               "--listen", f"127.0.0.1:{port}", "--interval", "2"),
                                cwd=tree, env=child_env(tree), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        samples: list[tuple[int, int, int]] = []
        frames: set[str] = set()
        first_ready: list[float] = []
        done = threading.Event()

        def probe() -> None:
            base = f"http://127.0.0.1:{port}"
            while not done.wait(1.0):
                ready, health = _status(base + "/readyz"), _status(base + "/healthz")
                try:
                    with urllib.request.urlopen(base + "/metrics", timeout=2) as resp:
                        page, scraped = resp.read().decode(), int(resp.status)
                except urllib.error.HTTPError as exc:
                    page, scraped = "", int(exc.code)
                except OSError:
                    page, scraped = "", 0
                frames.update(_LAST_SUCCESS.findall(page))
                if ready == 200 and not first_ready:
                    first_ready.append(time.monotonic() - started)
                if samples or ready or health or scraped:  # from the first answer: not the interpreter's start
                    samples.append((ready, health, scraped))
        prober = threading.Thread(target=probe, daemon=True)
        prober.start()
        peak, workers = 0, set()
        try:
            while time.monotonic() - started < seconds and proc.poll() is None:
                peak = max(peak, bench_hostile_peers.peak_rss_kib(proc.pid))
                workers |= _children(proc.pid)
                time.sleep(0.2)
        finally:
            done.set()
            prober.join(10)
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    count = max(1, len(samples))
    return {"readyz_200": round(sum(s[0] == 200 for s in samples) / count, 2),
            "healthz_200": round(sum(s[1] == 200 for s in samples) / count, 2),
            "metrics_200": round(sum(s[2] == 200 for s in samples) / count, 2),
            "samples": len(samples), "frames": len(frames),
            "first_ready_s": round(first_ready[0], 1) if first_ready else None,
            "cel_workers_seen": len(workers), "peak_rss_mb": round(peak * 1024 / 1e6, 1)}


def _ratio(after: Any, before: Any) -> float | None:
    if isinstance(after, (int, float)) and isinstance(before, (int, float)) and before:
        return round(after / before, 2)
    return None


def scenario(name: str, before: Path, seconds: float) -> dict[str, Any]:
    figures: dict[str, dict[str, Any]] = {}
    for label, tree in (("before", before), ("after", REPO)):
        if name == "slow-classes":
            figures[label] = cluster_under(slow_classes(), tree, seconds)
        elif name == "ordinary-classes":
            figures[label] = cluster_under(ordinary_classes(), tree, seconds)
        elif name == "endless-gpu-slices":
            attack = next(a for a in bench_hostile_peers.ATTACKS if a.name == "cluster-endless-added-gpu-slices")
            got = bench_hostile_peers.run(attack, max(seconds, ENDLESS_SECONDS), tree)
            figures[label] = {"peak_rss_mb": got["peak_rss_mb"], "cap_reached_after_s": got["log_line_after_s"],
                              "within_chart_limit": got["peak_rss_mb"] <= CHART_MEMORY_LIMIT_MB}
        elif name == "auth-flood":
            result = bench_auth.run(attackers=100, logins=40, tree=tree, spread=3).as_dict()
            row = result["rows"][1]
            figures[label] = {"slowest_login_ms": row["max_ms"], "p50_login_ms": row["p50_ms"],
                              "p99_login_ms": row["p99_ms"], "over_1s": row["over_1s"], "logins": row["logins"],
                              "not_200": row["not_200"], "statuses": row["statuses"],
                              "baseline_p50_ms": result["rows"][0]["p50_ms"], "attackers": result["notes"]}
        else:
            raise ValueError(name)
    ratios = {k: r for k, v in figures["after"].items() if (r := _ratio(v, figures["before"].get(k))) is not None}
    return {"scenario": name, **figures, "after_over_before": ratios}


SCENARIOS = ("slow-classes", "ordinary-classes", "endless-gpu-slices", "auth-flood")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.bench_hardening_iv",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="a checkout of the code before")
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--only", action="append", choices=SCENARIOS)
    parser.add_argument("--out", type=Path)
    ns = parser.parse_args(argv)
    if not (ns.before / "dra_exporter" / "cli.py").is_file():
        parser.error(f"--before {ns.before}: no dra_exporter/cli.py there")
    rows = []
    for name in SCENARIOS:
        if ns.only and name not in ns.only:
            continue
        rows.append(scenario(name, ns.before.resolve(), ns.seconds))
        print(json.dumps(rows[-1]), flush=True)
    if ns.out:
        doc = {"command": "python3 -m benchmarks.bench_hardening_iv " + " ".join(argv or sys.argv[1:]),
               "machine": machine(), "cpus": os.cpu_count(), "rows": rows}
        ns.out.write_text(json.dumps(doc, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
