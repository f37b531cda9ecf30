"""Peak memory of one hostile kubelet ``List`` answer in the pod-resources source.

    python3 -m benchmarks.kubelet_answer_memory            # every shape, one fresh process each

A kubelet stand-in in a child process serves raw bytes; the measuring process connects a
``PodResourcesSource``, takes its RSS, calls ``collect()`` once and reports the growth of its
peak RSS (``ru_maxrss``), whether the answer was refused, and why. Shapes:

- ``100k-pods``: 100 000 pods of one container and one DRA device, realistic names, built to
  fit under 16 MiB (the old receive limit);
- ``100k-bare-pods``: 100 000 pods with a name and nothing else (1.7 MB: under any byte limit);
- ``empty-containers``: one pod and as many empty ``containers {}`` (2 bytes each) as fit under
  the receive limit, the cheapest wire bytes to decode into the most sub-messages;
- ``real-node``: 110 pods (the default ``--max-pods``), for comparison.

Not part of ``benchmarks.run``: it measures a bound, not a speed. Run it against another
checkout with ``PYTHONPATH=<that checkout>`` to compare.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import resource
import sys
import tempfile
from concurrent import futures
from typing import Any

SHAPES = ("real-node", "100k-pods", "100k-bare-pods", "empty-containers")
OLD_LIMIT = 16 << 20


def _varint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes(out) + bytes([n])


def build(shape: str, limit: int) -> bytes:
    from dra_exporter.proto import api_pb2

    if shape == "empty-containers":
        pod = api_pb2.PodResources(name="p", namespace="n").SerializeToString()
        pod += b"\x1a\x00" * ((limit - 64 - len(pod)) // 2)
        return b"\x0a" + _varint(len(pod)) + pod
    count = 110 if shape == "real-node" else 100_000
    resp = api_pb2.ListPodResourcesResponse()
    if shape == "100k-bare-pods":
        for i in range(count):
            resp.pod_resources.add(name=f"pod-{i}", namespace="n")
        return resp.SerializeToString()
    for i in range(count):
        pod = resp.pod_resources.add(name=f"job-{i:06d}-worker", namespace="team-a")
        ctr = pod.containers.add(name="main")
        dyn = ctr.dynamic_resources.add(claim_name=f"job-{i:06d}-gpu", claim_namespace="team-a")
        dyn.claim_resources.add(driver_name="gpu.nvidia.com", pool_name="node-1", device_name=f"gpu-{i % 8}")
    return resp.SerializeToString()


def _serve(socket_path: str, shape: str, limit: int, ready: Any, stop: Any) -> None:
    import grpc

    answer = build(shape, limit)  # here, so building it never counts in the measuring process

    def handler(request: bytes, context: Any) -> bytes:
        return answer

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2),
                         options=[("grpc.max_send_message_length", -1)])
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler("v1.PodResourcesLister", {
        "List": grpc.unary_unary_rpc_method_handler(handler, request_deserializer=None,
                                                    response_serializer=None)})])
    server.add_insecure_port("unix://" + socket_path)
    server.start()
    ready.set()
    stop.wait()
    server.stop(0)


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def measure(shape: str) -> dict[str, Any]:
    """Runs in a fresh process, so ``ru_maxrss`` is this shape's alone."""
    from dra_exporter.sources import SourceError, podresources

    limit = getattr(podresources, "MAX_ANSWER_BYTES", OLD_LIMIT)
    ctx = multiprocessing.get_context("spawn")
    ready, stop = ctx.Event(), ctx.Event()
    with tempfile.TemporaryDirectory() as tmp:
        sock = os.path.join(tmp, "kubelet.sock")
        child = ctx.Process(target=_serve, args=(sock, shape, min(limit, OLD_LIMIT), ready, stop), daemon=True)
        child.start()
        ready.wait(30)
        source = podresources.PodResourcesSource(sock, timeout=60)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        start_rss = _rss_mib()
        try:
            pods = len(source.collect().pods)
            outcome = f"accepted ({pods} pods)"
        except SourceError as exc:
            outcome = f"refused: {exc}"
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        source.close()
        stop.set()
        child.join(10)
    return {"shape": shape, "limit_bytes": limit, "rss_before_mib": round(start_rss),
            "peak_growth_mib": round(peak - max(before, start_rss)), "outcome": outcome[:160]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=SHAPES, help="measure one shape in this process")
    ns = parser.parse_args()
    if ns.shape:
        print(json.dumps(measure(ns.shape)))
        return
    import subprocess

    for shape in SHAPES:
        subprocess.run([sys.executable, "-m", "benchmarks.kubelet_answer_memory", "--shape", shape], check=True)


if __name__ == "__main__":
    main()
