"""A hostile DeviceClass against the cluster mode's probes: the CEL library in this process (the
baseline: what the cluster mode did) against the worker process (what it does).

``python3 -m benchmarks.bench_cel [--seconds 20]``: a probe server (``http.server`` on loopback,
answering ``/healthz`` as the exporter's HTTP thread does: from another thread than the cycle's) is
polled every 20 ms from another process with the kubelet's 1 s timeout, while the capacity core builds a frame with a
class the API server admits (under 3 KiB: three nested ``.all()`` over 300 elements, 27 million
iterations). Reported per engine: the frame's wall time, the worst probe latency meanwhile, and (the
worker only: in this process it runs for minutes) the evaluation time of the largest admitted
expression (10 KiB of the same shape).
"""

from __future__ import annotations

import argparse
import http.server
import json
import subprocess
import sys
import threading
import time
from typing import Any

from dra_exporter.cluster.capacity import Capacity
from dra_exporter.cluster.cel_worker import CelWorker
from dra_exporter.cluster.selectors import MAX_EXPRESSION_BYTES, CelEngine, InProcessEngine, device_view
from dra_exporter.model import ClusterState, DeviceClassInfo, ResourceSliceInfo, SliceDevice

_LIST = "[" + ",".join(str(i) for i in range(300)) + "]"
RUNAWAY = f"{_LIST}.all(x, {_LIST}.all(y, {_LIST}.all(z, x + y + z >= 0)))"


def largest_admitted() -> str:
    """The longest expression of the runaway's shape the API server admits (≤ 10 KiB)."""
    size = 300
    while True:
        longer = "[" + ",".join(str(i) for i in range(size + 10)) + "]"
        candidate = f"{longer}.all(x, {longer}.all(y, {longer}.all(z, x + y + z >= 0)))"
        if len(candidate) > MAX_EXPRESSION_BYTES:
            items = "[" + ",".join(str(i) for i in range(size)) + "]"
            return f"{items}.all(x, {items}.all(y, {items}.all(z, x + y + z >= 0)))"
        size += 10


class _Probe(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = b"ok\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


#: The prober: another process, as the kubelet is (a thread here would stall with the cycle).
_PROBER = """
import sys, time, urllib.request
url, worst, failed, count = sys.argv[1], 0.0, 0, 0
end = time.monotonic() + float(sys.argv[2])
while time.monotonic() < end:
    start = time.perf_counter()
    try:
        with urllib.request.urlopen(url, timeout=1) as answer:  # the kubelet's default timeoutSeconds
            answer.read()
    except OSError:
        failed += 1
    worst, count = max(worst, time.perf_counter() - start), count + 1
    time.sleep(0.02)
print(worst, failed, count)
"""


def _state() -> ClusterState:
    devices = tuple(SliceDevice(f"gpu-{i}", attributes=(("index", str(i)),)) for i in range(8))
    sl = ResourceSliceInfo(name="node-a-gpu", driver="gpu.example.com", pool="node-a", node_name="node-a",
                           devices=devices)
    return ClusterState(slices=(sl,), classes=(DeviceClassInfo("runaway", (RUNAWAY,)),
                                               DeviceClassInfo("ok", ("device.driver == 'gpu.example.com'",))))


def measure(engine: CelEngine, url: str, largest: bool, seconds: float) -> dict[str, float]:
    engine.check("warm-up", ("true",))  # a worker's start is not what is measured
    prober = subprocess.Popen([sys.executable, "-c", _PROBER, url, str(seconds)], stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)
    start = time.perf_counter()
    Capacity(engine).frame(_state(), time.time())
    frame_s = time.perf_counter() - start
    worst, failed, count = prober.communicate(timeout=seconds + 600)[0].split()
    out = {"frame_s": round(frame_s, 3), "probe_worst_ms": round(float(worst) * 1000, 1),
           "probes_failed": int(failed), "probes": int(count)}
    if largest:  # in this process it would run for minutes (~600 million iterations)
        engine.check("warm-up", ("true",))
        start = time.perf_counter()
        engine.evaluate("largest", (largest_admitted(),), device_view("gpu.example.com", SliceDevice("gpu-0")))
        out["largest_admitted_eval_s"] = round(time.perf_counter() - start, 3)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="how long the prober probes, each engine")
    args = parser.parse_args()
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Probe)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/healthz"
    worker = CelWorker()
    try:
        result = {"in-process (baseline)": measure(InProcessEngine(), url, False, args.seconds),
                  "worker process": measure(worker, url, True, args.seconds)}
    finally:
        worker.close()
        server.shutdown()
    base, ours = result["in-process (baseline)"], result["worker process"]
    result["probe_worst_ratio"] = {"x": round(base["probe_worst_ms"] / max(ours["probe_worst_ms"], 0.1), 1)}
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
