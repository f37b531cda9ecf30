"""Hostile DeviceClass selectors cannot exhaust, wedge or crash the cluster mode (hardening III, 6/7/9).

The API server refuses selectors over 10 KiB; the scheduler stops an evaluation at its runtime cost
limit. The CEL library does neither, holds the GIL while it evaluates, and crashes on some of what
the server refuses. These tests hold the exporter to the server's bounds."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from typing import Any

import pytest
from test_cluster_capacity import EXAMPLE, NOW, device_class, example_slice, state, values

from dra_exporter import catalog as cat
from dra_exporter.cluster.capacity import Capacity
from dra_exporter.cluster.cel_worker import CelWorker
from dra_exporter.cluster.selectors import (
    MAX_EXPRESSION_BYTES,
    ClassSelector,
    InProcessEngine,
    MemoBudget,
    device_view,
)
from dra_exporter.model import DeviceClassInfo, SliceDevice

_LIST = "[" + ",".join(str(i) for i in range(300)) + "]"
#: 27 million iterations: 4-24 s in the library, under 3 KiB (the API server admits its length).
RUNAWAY = f"{_LIST}.all(x, {_LIST}.all(y, {_LIST}.all(z, x + y + z >= 0)))"
#: One tenth of the runaway (2.7 million iterations: ~0.4-2 s in the library).
RUNAWAY_SHORT = f"{_LIST}.all(x, {_LIST}.all(y, [{','.join(map(str, range(30)))}].all(z, x + y + z >= 0)))"
DEVICE = SliceDevice("gpu-0", attributes=(("model", "LATEST-GPU-MODEL"),))


@pytest.fixture
def worker() -> Any:
    engine = CelWorker(time_limit=0.5)
    yield engine
    engine.close()


def _evaluable(frame: Any) -> dict[str, float]:
    return {k[0]: v for k, v in values(frame, cat.CLUSTER_CLASS_EVALUABLE.name, "device_class").items()}


def test_a_selector_longer_than_the_api_server_admits_is_refused_before_the_library_sees_it() -> None:
    # 20,000 terms overflow the library's stack (SIGSEGV) and a syntax error past column 65,535
    # panics it: both are over the server's limit, so neither reaches it.
    classes = [device_class("sum", "+".join(["1"] * 20_000) + " > 0"),
               device_class("late-syntax-error", "true" + " " * 70_000 + "&&"),
               device_class("at-the-limit", "true" + " " * (MAX_EXPRESSION_BYTES - 4)),
               device_class("ok", f"device.driver == '{EXAMPLE}'")]
    frame = Capacity().frame(state([example_slice("n1", 2)], classes=classes), NOW)
    assert _evaluable(frame) == {"sum": 0.0, "late-syntax-error": 0.0, "at-the-limit": 1.0, "ok": 1.0}
    selector = ClassSelector(DeviceClassInfo("sum", ("+".join(["1"] * 20_000) + " > 0",)))
    assert selector.error == f"expression of 40003 bytes exceeds the API server's limit of {MAX_EXPRESSION_BYTES}"


def test_the_library_crashing_on_a_long_expression_would_take_the_process_down() -> None:
    # What the length limit protects against, shown in a child process: the library itself dies.
    code = ("import cel, threading; p = cel.compile('+'.join(['1'] * 20000)); "
            "t = threading.Thread(target=p.execute, args=({},)); t.start(); t.join()")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120, check=False)
    assert result.returncode == -signal.SIGSEGV


def test_a_runaway_evaluation_is_stopped_at_the_time_limit_and_refuses_the_class(worker: CelWorker) -> None:
    selector = ClassSelector(DeviceClassInfo("runaway", (RUNAWAY,)), worker)
    assert selector.error == ""  # it compiles: the server would admit its length
    assert selector.matches(EXAMPLE, DEVICE) is False
    assert selector.error == "evaluation took longer than 0.5 s (the scheduler's cost limit)"
    # Refused as a whole: no further device costs another half second.
    first = worker.restarts
    assert selector.matches(EXAMPLE, SliceDevice("gpu-1")) is False
    assert worker.restarts == first
    ok = ClassSelector(DeviceClassInfo("ok", (f"device.driver == '{EXAMPLE}'",)), worker)
    assert ok.matches(EXAMPLE, DEVICE) is True  # a fresh worker for the next class


def test_while_the_worker_evaluates_the_process_keeps_running(worker: CelWorker) -> None:
    # The library holds the GIL for a whole evaluation: in this process no other thread would run
    # (the probes, the scrapes). Count what another thread gets done meanwhile, each way.
    def progress_during(engine: Any) -> int:
        count, done = [0], threading.Event()

        def spin() -> None:
            while not done.is_set():
                count[0] += 1
        thread = threading.Thread(target=spin)
        thread.start()
        try:
            time.sleep(0.05)
            before = count[0]
            engine.evaluate("runaway", (RUNAWAY_SHORT,), device_view(EXAMPLE, DEVICE))
            return count[0] - before
        finally:
            done.set()
            thread.join()

    in_process = progress_during(InProcessEngine())
    in_worker = progress_during(worker)
    assert in_worker > 4 * max(in_process, 1000)



def test_a_crashing_library_costs_the_worker_not_the_process(worker: CelWorker) -> None:
    selector = ClassSelector(DeviceClassInfo("crashes", (RUNAWAY,)), CelWorker(time_limit=30))
    engine = selector._engine
    assert isinstance(engine, CelWorker)

    def crash_it() -> None:
        for _ in range(200):
            pid = engine.pid
            if pid is not None:
                time.sleep(0.2)  # into the evaluation
                os.kill(pid, signal.SIGSEGV)
                return
            time.sleep(0.01)
    killer = threading.Thread(target=crash_it)
    killer.start()
    try:
        assert selector.matches(EXAMPLE, DEVICE) is False
    finally:
        killer.join()
        engine.close()
    assert selector.error == "not supported by this exporter: the CEL library crashed evaluating it (signal 11)"
    assert selector.unsupported  # the scheduler runs it: not known whether placeable


def test_a_refused_class_is_logged_once_naming_it(worker: CelWorker, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="dra_exporter.cluster.cel_worker")
    capacity = Capacity(worker)
    classes = [device_class("bad\nclass", "device.driver ==="), device_class("ok", f"device.driver == '{EXAMPLE}'")]
    for _ in range(3):
        frame = capacity.frame(state([example_slice("n1", 2)], classes=classes), NOW)
    assert _evaluable(frame) == {"bad\nclass": 0.0, "ok": 1.0}
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "\n" not in lines[0]
    assert lines[0].startswith("DeviceClass bad\\nclass: selectors not evaluated")


def test_the_worker_gives_the_same_answers_as_the_library_in_process(worker: CelWorker) -> None:
    classes = [device_class("low-index", f"device.attributes['{EXAMPLE}'].index < 2"),
               device_class("big-memory", f"device.capacity['{EXAMPLE}'].memory.isGreaterThan(quantity('64Gi'))"),
               device_class("v1", f"device.attributes['{EXAMPLE}'].driverVersion.major() == 1"),
               device_class("needs-profile", f"device.attributes['{EXAMPLE}'].profile == '1g'"),
               device_class("unknown-function", "device.attributes['gpu.example.com'].model.frobnicate()")]
    slices = [example_slice("n1", 4)]
    in_process = Capacity().frame(state(slices, classes=classes), NOW)
    in_worker = Capacity(worker).frame(state(slices, classes=classes), NOW)
    assert in_worker.families == in_process.families


def test_memoised_results_of_all_classes_together_are_bounded() -> None:
    budget = MemoBudget(limit=50)
    # Expressions that memoise by the whole device (no literal reference): a result per device each.
    selectors = [ClassSelector(DeviceClassInfo(f"team-{i}", (f"size(device.attributes) >= 0 && {i} >= 0",)),
                               budget=budget) for i in range(5)]
    devices = [SliceDevice(f"gpu-{n}", attributes=(("index", str(n)),)) for n in range(10)]
    for sel in selectors * 2:
        assert all(sel.matches(EXAMPLE, d) is True for d in devices)  # answers stay right past the bound
    assert budget.used == 50 == sum(len(sel._memo) for sel in selectors)
    late = ClassSelector(DeviceClassInfo("late", ("size(device.attributes) >= 1",)), budget=budget)
    assert all(late.matches(EXAMPLE, d) is True for d in devices) and not late._memo
    del selectors[:2]
    assert budget.used == 30  # the dropped classes' share came back
    assert all(late.matches(EXAMPLE, d) is True for d in devices) and budget.used == 40


def test_the_worker_dies_with_its_parent(tmp_path: Any) -> None:
    script = textwrap.dedent("""
        import os, sys, time
        from dra_exporter.cluster.cel_worker import CelWorker
        from dra_exporter.cluster.selectors import device_view
        from dra_exporter.model import SliceDevice
        w = CelWorker()
        assert w.evaluate("c", ("true",), device_view("d", SliceDevice("x"))) is True
        print(w.pid, flush=True)
        time.sleep(600)
    """)
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        worker_pid = int(parent.stdout.readline())
        parent.kill()
        parent.wait(timeout=30)
        for _ in range(300):
            if not _alive(worker_pid):
                break
            time.sleep(0.1)
        assert not _alive(worker_pid)
    finally:
        if parent.poll() is None:
            parent.kill()


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][:1] not in ("Z", "X")
    except FileNotFoundError:
        return False


def test_ever_new_expressions_do_not_grow_either_engine_without_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    from dra_exporter.cluster import cel_worker, selectors

    monkeypatch.setattr(selectors, "MAX_PROGRAMS", 5)
    monkeypatch.setattr(cel_worker, "MAX_PROGRAMS", 5)
    in_process, worker = InProcessEngine(), CelWorker(time_limit=5)
    try:
        view = device_view(EXAMPLE, DEVICE)
        for i in range(12):  # classes that change again and again
            expressions = (f"{i} >= 0",)
            assert in_process.evaluate("churn", expressions, view) is True
            assert worker.evaluate("churn", expressions, view) is True
            assert len(in_process._programs) <= 5 and len(worker._ids) <= 5
        assert worker.restarts >= 2, "a fresh worker drops what the old one compiled"
    finally:
        worker.close()
