"""Peak RSS and time to a clear log line for each attack of a hostile peer (issue 25): the exporter's
own processes (``serve``, ``cluster``, ``report``) against the loopback servers of ``tests/hostile.py``.

``python3 -m benchmarks.bench_hostile_peers [--only NAME] [--seconds 30]``

Each attack runs the real command line in a child process for ``--seconds`` (or until it exits),
samples its peak RSS (``VmHWM``), notes when the first log line naming the fault appeared, then
sends SIGTERM and notes how long the process took to end. One JSON line per attack. The figures
before the fixes are issue 25's (measured the same way, on the same kind of machine); they are in
docs/reliability.md next to these.
"""

from __future__ import annotations

import argparse
import json
import resource
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from .common import REPO, child_env, free_port, python_command

sys.path.insert(0, str(REPO / "tests"))  # the hostile peers: one definition, the tests'
from hostile import (  # noqa: E402
    ApiServer,
    HostileServer,
    ManySeries,
    Reply,
    Request,
    empty_list,
    forever,
    gpu_slice,
    idle_watch,
    kubeconfig,
    object_list,
    resource_slice,
    trickle,
    watch_event,
)


@dataclass
class Attack:
    name: str
    behaviour: Any
    command: Callable[[str, Path], list[str]]
    """The exporter's arguments, given the hostile server's URL and a scratch directory."""
    words: str
    """What the clear log line says."""


def _otlp(url: str, _: Path) -> list[str]:
    return ["serve", "--simulate", "--listen", f"127.0.0.1:{free_port()}", "--otlp-endpoint", url,
            "--otlp-protocol", "http/protobuf", "--otlp-interval", "2", "--otlp-timeout", "10"]


def _cluster(url: str, scratch: Path) -> list[str]:
    config = scratch / "kubeconfig"
    config.write_text(kubeconfig(url))
    return ["cluster", "--kubeconfig", str(config), "--listen", f"127.0.0.1:{free_port()}", "--interval", "2"]


def _node(url: str, scratch: Path) -> list[str]:
    config = scratch / "kubeconfig"
    config.write_text(kubeconfig(url))
    return ["serve", "--simulate", "--kubeconfig", str(config), "--listen", f"127.0.0.1:{free_port()}"]


def _report(url: str, _: Path) -> list[str]:
    return ["report", "--prometheus", url, "--since", "1h", "--step", "60s", "--timeout", "10"]


def _endless_adds(req: Request, reply: Reply) -> None:
    reply.chunked(watch_event("ADDED", resource_slice(f"s{i}-{time.monotonic_ns()}")) for i in range(10**9))


def _endless_gpu_slices(req: Request, reply: Reply) -> None:
    reply.chunked(watch_event("ADDED", gpu_slice(f"g{i}-{time.monotonic_ns()}")) for i in range(10**9))


def _pages_for_ever(req: Request, reply: Reply) -> None:
    n = int(req.query.get("continue") or 0)
    reply.json(object_list([resource_slice(f"p{n}-{i}") for i in range(500)], token=str(n + 1)))


def _endless_pods(req: Request, reply: Reply) -> None:
    def pods() -> Iterator[bytes]:
        for i in range(10**9):
            yield watch_event("ADDED", {"apiVersion": "v1", "kind": "Pod", "metadata": {
                "namespace": "ml", "name": f"p{i}", "uid": f"u{i}", "resourceVersion": str(i + 20)},
                "spec": {"nodeName": "x", "resourceClaims": [{"name": "c", "resourceClaimName": f"claim-{i}"}],
                         "containers": [{"name": "c", "resources": {"claims": [{"name": "c"}]}}]},
                "status": {"phase": "Running"}})
    reply.chunked(pods())


def _big_answer(size: int) -> Any:
    point = b'[1700000000.5,"0.25"],'
    head = b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"claim":"a"},"values":['
    count = size // len(point)

    def behaviour(req: Request, reply: Reply) -> None:
        reply.chunked(_pieces(head, point, count, b'[1700000000.5,"0.25"]]}]}}'))
    return behaviour


def _pieces(head: bytes, point: bytes, count: int, tail: bytes) -> Iterator[bytes]:
    yield head
    block = point * 4096
    for _ in range(count // 4096):
        yield block
    yield tail


def _report_window(url: str, _: Path) -> list[str]:
    """A 1 h window at 240 s: 15 points a series, so 150,000 series make ~55 MB answers (under the cap)."""
    return ["report", "--prometheus", url, "--since", "1h", "--step", "240s", "--timeout", "60", "--format", "csv"]


def _redirect_elsewhere(req: Request, reply: Reply) -> None:
    reply.whole(302, b"", headers={"Location": "http://127.0.0.2:9/api/v1/query"})


ATTACKS = [
    Attack("otlp-endless-chunked", lambda req, reply: reply.chunked(forever(b"x" * 65536)), _otlp,
           "reply was refused: the answer is over the 64 KiB"),
    Attack("otlp-content-length-4GB",
           lambda req, reply: (reply.head(200, {"Content-Length": "4000000000"}), reply.body(b"x" * 2**20)),
           _otlp, "reply was refused: the answer is over the 64 KiB limit (it announced"),
    Attack("otlp-a-byte-a-second", lambda req, reply: reply.chunked(trickle(b"x" * 10**6, 1.0)), _otlp,
           "reply was refused: the answer did not arrive within"),
    Attack("cluster-endless-added-slices",
           ApiServer(lists={"resourceslices": empty_list, "resourceclaims": empty_list, "deviceclasses": empty_list},
                     watches={"resourceslices": _endless_adds, "resourceclaims": idle_watch,
                              "deviceclasses": idle_watch}), _cluster, "objects, the limit"),
    Attack("cluster-endless-added-gpu-slices",
           ApiServer(lists={"resourceslices": empty_list, "resourceclaims": empty_list, "deviceclasses": empty_list},
                     watches={"resourceslices": _endless_gpu_slices, "resourceclaims": idle_watch,
                              "deviceclasses": idle_watch}), _cluster, "objects, the limit"),
    Attack("cluster-first-list-a-byte-a-second",
           ApiServer(lists={k: (lambda req, reply: reply.chunked(trickle(b" " * 10**6, 1.0)))
                            for k in ("resourceslices", "resourceclaims", "deviceclasses")}), _cluster,
           "did not arrive within 10 s"),
    Attack("cluster-continue-token-never-ends",
           ApiServer(lists={"resourceslices": _pages_for_ever, "resourceclaims": empty_list,
                            "deviceclasses": empty_list}), _cluster, "objects, the limit"),
    Attack("node-endless-pod-watch",
           ApiServer(lists={"resourceslices": empty_list, "pods": empty_list},
                     watches={"resourceslices": idle_watch, "pods": _endless_pods}), _node, "objects, the limit"),
    Attack("report-250MB-answer", _big_answer(250 << 20), _report, "answer over"),
    Attack("report-60MB-answer", _big_answer(60 << 20), _report, "dra-exporter"),
    Attack("report-a-byte-a-second", lambda req, reply: reply.chunked(trickle(b" " * 10**6, 1.0)), _report,
           "did not arrive within 10 s"),
    Attack("report-redirect-elsewhere", _redirect_elsewhere, _report, "another host"),
    Attack("report-10-series", ManySeries(10), _report_window, "claim-9"),  # the baseline of the next
    Attack("report-150k-series", ManySeries(150_000), _report_window, "claim-149999"),
]


def peak_rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def run(attack: Attack, seconds: float, tree: Path = REPO) -> dict[str, Any]:
    """``attack`` on the exporter of ``tree`` (this checkout, or another for a before/after run)."""
    with HostileServer(attack.behaviour) as peer, tempfile.TemporaryDirectory() as scratch:
        started = time.monotonic()
        proc = subprocess.Popen(python_command("-m", "dra_exporter.cli", *attack.command(peer.url, Path(scratch))),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env(tree),
                                cwd=tree)
        seen: dict[str, Any] = {}

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                seen["last"] = line.strip()[:300]
                if attack.words in line and "at" not in seen:
                    seen["at"], seen["line"] = time.monotonic() - started, line.strip()[:300]
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        peak = 0
        while time.monotonic() - started < seconds and proc.poll() is None:
            peak = max(peak, peak_rss_kib(proc.pid))
            time.sleep(0.2)
        exited_by_itself = proc.poll() is not None
        peak = max(peak, peak_rss_kib(proc.pid))
        stop_started = time.monotonic()
        if not exited_by_itself:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        reader.join(5)
        return {"attack": attack.name, "peak_rss_mb": round(peak / 1024, 1),
                "log_line_after_s": round(seen["at"], 1) if "at" in seen else None, "line": seen.get("line"),
                "last_line": seen.get("last"),
                "exit_code": proc.returncode, "exited_by_itself": exited_by_itself,
                "sigterm_to_exit_s": None if exited_by_itself else round(time.monotonic() - stop_started, 1),
                "requests": len(peer.requests), "bytes_sent": peer.sent}


#: Address space the serving exporter may grow by once it is up: a few thread stacks (8 MiB each), so that
#: a flood of connections soon finds no thread to start (what a pids limit does in a pod).
THREAD_HEADROOM: Final = 48 << 20
#: Silent connections the flood keeps open (each holds a thread, or a place, until its deadline).
FLOOD_CONNECTIONS: Final = 40


def thread_starvation(seconds: float, tree: Path = REPO) -> dict[str, Any]:
    """``serve --simulate`` with its address space capped just above its size once up, a flood of silent
    connections, and a scrape and a probe every half second: scrapes lost, log lines about threads."""
    env = child_env(tree)
    port = free_port()
    proc = subprocess.Popen(python_command("-m", "dra_exporter.cli", "serve", "--simulate", "--listen",
                                           f"127.0.0.1:{port}"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tree)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + 60
        while _get(port, "/metrics") != 200:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError("the exporter did not come up")
            time.sleep(0.2)
        size = _vm_size(proc.pid)
        _, hard = resource.prlimit(proc.pid, resource.RLIMIT_AS)
        resource.prlimit(proc.pid, resource.RLIMIT_AS, (size + THREAD_HEADROOM, hard))
        stop = threading.Event()
        flood = threading.Thread(target=_flood, args=(port, stop), daemon=True)
        flood.start()
        asked = answered = probes_answered = 0
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            asked += 1
            answered += _get(port, "/metrics") == 200
            probes_answered += _get(port, "/healthz") == 200
            time.sleep(0.5)
        stop.set()
        flood.join(10)
        thread_lines = [line for line in lines if "thread" in line]
        return {"attack": "serve-threads-cannot-start", "scrapes": asked, "scrapes_lost": asked - answered,
                "probes_lost": asked - probes_answered, "thread_log_lines": len(thread_lines),
                "line": thread_lines[0].strip()[:300] if thread_lines else None,
                "peak_rss_mb": round(peak_rss_kib(proc.pid) / 1024, 1), "alive": proc.poll() is None}
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _vm_size(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize")


def _get(port: int, path: str) -> int:
    """The status of one GET on a new connection; 0 when none came within 5 s."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
            head = s.recv(64)
        return int(head.split(b" ")[1]) if head.startswith(b"HTTP/") else 0
    except (OSError, ValueError, IndexError):
        return 0


def _flood(port: int, stop: threading.Event) -> None:
    """Keep ``FLOOD_CONNECTIONS`` silent connections open, opening a new one for each the server closes."""
    held: list[socket.socket] = []
    while not stop.is_set():
        for s in list(held):
            try:
                s.setblocking(False)
                if s.recv(1) == b"":
                    held.remove(s)
                    s.close()
            except BlockingIOError:
                pass
            except OSError:
                held.remove(s)
                s.close()
        while len(held) < FLOOD_CONNECTIONS:
            try:
                held.append(socket.create_connection(("127.0.0.1", port), timeout=2))
            except OSError:
                break
        time.sleep(0.05)
    for s in held:
        s.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", help="attack names (repeatable); default: all")
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--code", help="run the dra_exporter of this directory (e.g. an export of main, for the "
                                       "figures before a fix) against this tree's peers")
    args = parser.parse_args()
    tree = Path(args.code) if args.code else REPO
    for attack in ATTACKS:
        if args.only and attack.name not in args.only:
            continue
        print(json.dumps(run(attack, args.seconds, tree)), flush=True)
    if not args.only or "serve-threads-cannot-start" in args.only:
        print(json.dumps(thread_starvation(args.seconds, tree)), flush=True)


if __name__ == "__main__":
    main()
