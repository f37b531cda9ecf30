"""The real NVML source over NVIDIA's mock libnvidia-ml: a cycle's CPU against the CPU spent inside NVML.

``python3 -m benchmarks.bench_nvml_mock [--profiles gb200,b200] [--cycles 30] [--serve-seconds 20]``

Needs the NVML test bed: ``DRA_EXPORTER_TESTBED_NVML`` names its folder (see ``tests/nvmltestbed.py``,
whose unpacking this reuses); without it the command says so in one line and exits 2. The real pynvml
loads the mock as it would the driver's library, so every ctypes conversion, struct and return code
is the real ABI's; only the C side is NVIDIA's mock instead of a GPU.

For each board profile, in a process of its own (the library reads ``MOCK_NVML_CONFIG`` at init):

- ``cycle_cpu_ms``: ``NvmlSource.collect()`` in thread CPU time, after three warm-up cycles (link
  discovery, first GPM sample), in rounds of ``CYCLES_PER_ROUND`` cycles (``--cycles`` in all): the
  median of the rounds' means;
- ``nvml_floor_ms``, the **baseline**: the C calls that one cycle made, replayed through ctypes with
  nothing around them (each call's pointer arguments restored first, that restoring measured alone
  and subtracted), as many passes after each round of cycles. Every pynvml function reaches C through
  ``pynvml._nvmlGetFunctionPointer``; the benchmark records what those pointers were called with for
  one cycle of a first source instance, and times a second one made after the recorder is removed
  (its calls pass through nothing of the benchmark's). This is the least any Python caller pays for
  the answers the source asked for;
- ``ratio``: cycle CPU over the floor, per round, the median over the rounds (the target: at most 2
  on gb200): a round's cycles and its floor run back to back, under the same load of a shared machine;
- ``pynvml_ms``: time inside pynvml's functions, wrappers included (``nvml_timing.TimedNvml`` over
  a second source instance), the figure the issue quoted as "inside NVML";
- call counts per cycle: C calls, and ``_PrintableStructure.__getattribute__`` (pynvml's per-attribute
  wrapper on its structs).

Then ``serve_cpu``: ``dra-exporter serve --no-kubeapi`` at the default 1 s interval against the same
profile (no kubelet socket: the pod-resources source fails and backs off, as on a node without pods),
``utime + stime`` over ``--serve-seconds`` after a warm-up, scraped every 5 s, as a fraction of one core.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from .common import (
    PROMETHEUS_HEADERS,
    REPO,
    child_env,
    cpu_seconds,
    free_port,
    median,
    python_command,
    stop_process,
    wait_http_ok,
)

sys.path.insert(0, str(REPO / "tests"))  # the test bed harness: one definition of its unpacking
import nvmltestbed  # noqa: E402

DEFAULT_PROFILES: Final = ("gb200", "b200")
WARMUP_CYCLES: Final = 3
REPLAYS: Final = 50
#: Cycles timed per round, and floor passes after them (the ratio is a median over rounds).
CYCLES_PER_ROUND: Final = 5
RATIO_TARGET: Final = 2.0
SERVE_TARGET: Final = 0.02
_SERVE: Final = "import sys; from dra_exporter import cli; cli.main(args=sys.argv[1:], prog_name='dra-exporter')"
#: C functions that allocate, free or change state: never replayed (none runs per cycle today).
_NOT_REPLAYED: Final = ("Alloc", "Free", "Init", "Shutdown", "Event", "Set", "Clear", "Reset")


class CallRecorder:
    """Records the C calls pynvml makes, by wrapping what ``pynvml._nvmlGetFunctionPointer`` returns."""

    def __init__(self, pynvml: Any) -> None:
        self._pynvml = pynvml
        self._original = pynvml._nvmlGetFunctionPointer
        self.recording = False
        self.calls: list[tuple[str, Any, tuple[Any, ...], list[tuple[Any, bytes]]]] = []
        wrappers: dict[str, Callable[..., Any]] = {}

        def pointer(name: str) -> Callable[..., Any]:
            wrapper = wrappers.get(name)
            if wrapper is None:
                wrapper = wrappers[name] = self._wrap(name, self._original(name))
            return wrapper

        pynvml._nvmlGetFunctionPointer = pointer

    def _wrap(self, name: str, fn: Any) -> Callable[..., Any]:
        def call(*args: Any) -> Any:
            if self.recording:
                self.calls.append((name, fn, args, _snapshot(args)))
            return fn(*args)
        return call

    def restore(self) -> None:
        self._pynvml._nvmlGetFunctionPointer = self._original


def _snapshot(args: tuple[Any, ...]) -> list[tuple[Any, bytes]]:
    """The bytes behind every pointer argument, to put back before a replayed call."""
    out = []
    for arg in args:
        target = getattr(arg, "_obj", None)  # byref()
        if target is None and isinstance(arg, (ctypes.Structure, ctypes.Array)):
            target = arg
        if target is not None:
            out.append((target, bytes(memoryview(target).cast("B"))))
    return out


def _put_back(snapshots: list[tuple[Any, bytes]]) -> None:
    for target, data in snapshots:
        ctypes.memmove(ctypes.addressof(target), data, len(data))


def replay_floor(calls: list[tuple[str, Any, tuple[Any, ...], list[tuple[Any, bytes]]]],
                 repeats: int = REPLAYS) -> float:
    """Thread CPU seconds of one pass over ``calls`` straight through ctypes (restoring excluded)."""
    replayed = [(fn, args, snaps) for name, fn, args, snaps in calls
                if not any(word in name for word in _NOT_REPLAYED)]

    def both() -> None:
        for fn, args, snaps in replayed:
            _put_back(snaps)
            fn(*args)

    def restoring() -> None:
        for _fn, _args, snaps in replayed:
            _put_back(snaps)

    def cpu(work: Callable[[], None]) -> float:
        started = time.thread_time()
        for _ in range(repeats):
            work()
        return (time.thread_time() - started) / repeats

    cpu(both)  # warm
    return max(0.0, cpu(both) - cpu(restoring))


def _profile_counter(pynvml: Any) -> tuple[Callable[[], None], Callable[[], int]]:
    """Count calls to pynvml's ``_PrintableStructure.__getattribute__`` while switched on."""
    code = pynvml._PrintableStructure.__getattribute__.__code__
    count = [0]

    def hook(frame: Any, event: str, _arg: Any) -> None:
        if event == "call" and frame.f_code is code:
            count[0] += 1

    def start() -> None:
        count[0] = 0
        sys.setprofile(hook)

    def stop() -> int:
        sys.setprofile(None)
        return count[0]

    return start, stop


def measure_child(cycles: int) -> dict[str, Any]:
    """In a process whose environment points at the mock: the figures of one profile."""
    import pynvml

    from dra_exporter.sources.nvml import NvmlSource

    from .nvml_timing import TimedNvml

    # One source's cycle is recorded; a second one, made after the recorder is gone (it binds pynvml's
    # own function lookup, nothing in between), is timed, in rounds alternating with the replay of the
    # recording: on a shared machine both see the same load, and the ratio is taken round by round.
    recorder = CallRecorder(pynvml)
    recorded = NvmlSource(pynvml, events=False)
    source = None
    try:
        for _ in range(WARMUP_CYCLES):
            recorded.collect()
        recorder.recording = True
        recorded.collect()
        recorder.recording = False
        recorder.restore()
        source = NvmlSource(pynvml, events=False)
        for _ in range(WARMUP_CYCLES):
            snapshot = source.collect()
        cpus, floors, ratios = [], [], []
        for _ in range(max(1, -(-cycles // CYCLES_PER_ROUND))):
            started = time.thread_time()
            for _ in range(CYCLES_PER_ROUND):
                snapshot = source.collect()
            cpus.append((time.thread_time() - started) / CYCLES_PER_ROUND)
            floors.append(replay_floor(recorder.calls, CYCLES_PER_ROUND))
            ratios.append(cpus[-1] / floors[-1] if floors[-1] > 0 else float("inf"))
        start, stop = _profile_counter(pynvml)
        start()
        source.collect()
        getattribute = stop()
    finally:
        recorder.restore()
        if source is not None:
            source.close()
        recorded.close()
    timed = TimedNvml(pynvml, clock=time.thread_time)
    second = NvmlSource(timed, events=False)
    try:
        pynvml_seconds = []
        for i in range(WARMUP_CYCLES + cycles):
            timed.reset()
            second.collect()
            if i >= WARMUP_CYCLES:
                pynvml_seconds.append(timed.total_seconds)
    finally:
        second.close()
    readings = sum(len(d.readings) for d in snapshot.devices)
    return {
        "devices": len(snapshot.devices), "models": sorted({d.device.model for d in snapshot.devices}),
        "readings": readings, "cycle_cpu_ms": round(median(cpus) * 1e3, 3),
        "nvml_floor_ms": round(median(floors) * 1e3, 3), "ratio": round(median(ratios), 2),
        "rounds": len(ratios),
        "pynvml_ms": round(median(pynvml_seconds) * 1e3, 3),
        "c_calls": len(recorder.calls), "c_calls_by_function": dict(Counter(n for n, *_ in recorder.calls)),
        "printable_getattribute_calls": getattribute,
    }


def _library() -> Path:
    folder = nvmltestbed.testbed_folder()
    if folder is None:
        raise SystemExit(f"bench_nvml_mock: {nvmltestbed.SKIP_HINT}")
    return nvmltestbed.library_folder(folder)


def measure_profile(library: Path, profile: str, cycles: int) -> dict[str, Any]:
    folder = nvmltestbed.testbed_folder()
    assert folder is not None
    path = nvmltestbed.profile_path(folder, profile)
    env = nvmltestbed.environment(library, path, child_env())
    proc = subprocess.run(python_command("-m", "benchmarks.bench_nvml_mock", "--child", "--cycles", str(cycles)),
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise RuntimeError(f"{profile}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    return {"profile": profile, **json.loads(proc.stdout.strip().splitlines()[-1])}


def measure_serve(library: Path, profile: str, seconds: float, warmup: float = 5.0) -> float:
    """``serve --no-kubeapi`` at 1 s against the mock: CPU over ``seconds`` as a fraction of one core."""
    from .bench_scrape import scrape_times

    folder = nvmltestbed.testbed_folder()
    assert folder is not None
    env = nvmltestbed.environment(library, nvmltestbed.profile_path(folder, profile), child_env())
    port = free_port()
    proc = subprocess.Popen(python_command("-c", _SERVE, "serve", "--no-kubeapi", "--listen",
                                           f"127.0.0.1:{port}", "--kubelet-socket", "/nonexistent/kubelet.sock",
                                           "--log-level", "error"),
                            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_http_ok(f"http://127.0.0.1:{port}/metrics", alive=lambda: proc.poll() is None)
        time.sleep(warmup)
        cpu, wall = cpu_seconds(proc.pid), time.monotonic()
        deadline = wall + seconds
        while time.monotonic() < deadline:
            scrape_times(port, 1, PROMETHEUS_HEADERS)
            time.sleep(max(0.0, min(5.0, deadline - time.monotonic())))
        return (cpu_seconds(proc.pid) - cpu) / (time.monotonic() - wall)
    finally:
        stop_process(proc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m benchmarks.bench_nvml_mock", description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", default=",".join(DEFAULT_PROFILES), help="comma-separated board profiles")
    parser.add_argument("--cycles", type=int, default=30)
    parser.add_argument("--serve-seconds", type=float, default=20.0, help="0: skip the serve measurement")
    parser.add_argument("--out", type=Path, help="write the rows as JSON here too")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ns = parser.parse_args(argv)
    if ns.child:
        print(json.dumps(measure_child(ns.cycles)))
        return 0
    try:
        library = _library()
    except SystemExit as exc:
        print(exc, file=sys.stderr)
        return 2
    rows = []
    for profile in filter(None, ns.profiles.split(",")):
        row = measure_profile(library, profile, ns.cycles)
        if ns.serve_seconds > 0:
            row["serve_cpu_core_fraction"] = round(measure_serve(library, profile, ns.serve_seconds), 4)
        rows.append(row)
        print(f"{profile:>16}: cycle {row['cycle_cpu_ms']:.2f} ms CPU, NVML floor {row['nvml_floor_ms']:.2f} ms "
              f"(ratio {row['ratio']}, target <= {RATIO_TARGET:g}), pynvml {row['pynvml_ms']:.2f} ms, "
              f"{row['c_calls']} C calls, {row['printable_getattribute_calls']} __getattribute__, "
              f"{row['readings']} readings"
              + (f", serve {row['serve_cpu_core_fraction'] * 100:.2f} % of a core (target < "
                 f"{SERVE_TARGET * 100:g} %)" if "serve_cpu_core_fraction" in row else ""))
    if ns.out:
        ns.out.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
