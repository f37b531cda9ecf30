"""Hardening IV, items 1-2: the classes' CEL has a time budget per frame, and a failure of the run
(the worker killed, an evaluation cut at the time limit on a busy CPU) is retried, never kept as
the class's answer (``cluster/cel_budget.py``).

Before: 100 classes whose CEL takes just over the 1 s limit were evaluated one after another in one
frame, which never ended in time (``/readyz`` and ``/metrics`` 503, ``/healthz`` 503 after 60 s);
a class whose evaluation met a killed worker stayed "selectors not evaluated" until it changed."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import pytest
from hostile import ApiServer, HostileServer, empty_list, idle_watch, kubeconfig, object_list, resource_slice
from hostile import device_class as class_object
from test_cel_limits import _LIST, RUNAWAY, RUNAWAY_SHORT
from test_cluster_capacity import NOW, device_class, example_slice, state, values

from dra_exporter import catalog as cat
from dra_exporter.cluster.allocator import AllocatorCache
from dra_exporter.cluster.capacity import Capacity
from dra_exporter.cluster.cel_budget import MAX_TRIES, WAITING
from dra_exporter.cluster.cel_worker import CelWorker
from dra_exporter.cluster.selectors import Interrupted, Verdict
from dra_exporter.model import DeviceClassInfo


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class TimedEngine:
    """An engine on a fake clock: ``slow`` classes cost 1.5 s and are cut at the time limit (as the
    worker cuts them), the others cost 10 ms; ``interrupt`` names classes whose next evaluation
    meets a killed worker."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.evaluations: list[str] = []
        self.interrupt: set[str] = set()

    def check(self, name: str, expressions: tuple[str, ...]) -> str:
        return ""

    def evaluate(self, name: str, expressions: tuple[str, ...], view: dict[str, Any]) -> Verdict:
        self.evaluations.append(name)
        if name in self.interrupt:
            self.interrupt.discard(name)
            return Interrupted("the CEL library crashed evaluating it (signal 9)")
        if "slow" in expressions[0]:
            self.clock.now += 1.5
            return Interrupted("evaluation took longer than 1 s (the scheduler's cost limit)")
        self.clock.now += 0.01
        return True


def _cache(budget: float = 1.0) -> tuple[AllocatorCache, TimedEngine, FakeClock]:
    clock = FakeClock()
    engine = TimedEngine(clock)
    cache = AllocatorCache(engine, frame_budget=budget)
    cache.queue.clock = clock
    return cache, engine, clock


def _slices() -> Any:
    return state([example_slice("n1", 2)]).slices


def test_a_frame_stops_starting_evaluations_once_its_budget_is_spent_and_the_oldest_go_first() -> None:
    cache, engine, clock = _cache()
    classes = [DeviceClassInfo(f"slow-{i}", (f"slow {i}",)) for i in range(5)] + [
        DeviceClassInfo("z-ordinary", ("ordinary",))]
    slices = _slices()
    tried_per_frame = []
    for _ in range(2 * MAX_TRIES * 5):
        before = len(engine.evaluations)
        cache.update(classes, slices)
        tried_per_frame.append(engine.evaluations[before:])
        clock.now += 10  # the interval
    # One slow class a frame: past the budget no other evaluation starts, so every frame ends.
    assert all(len([n for n in tried if n.startswith("slow")]) <= 1 for tried in tried_per_frame)
    # The ordinary class waited since the first frame like the others: its turn came after theirs,
    # and the slow ones that failed went to the back of the queue.
    first_ordinary = next(i for i, tried in enumerate(tried_per_frame) if "z-ordinary" in tried)
    assert first_ordinary == 5
    assert [tried[0] for tried in tried_per_frame[:5]] == [f"slow-{i}" for i in range(5)]
    ordinary = cache.selector("z-ordinary")
    assert ordinary is not None and ordinary.error == ""
    # Every slow class was tried MAX_TRIES times, then refused as too slow (its answer from then on).
    for i in range(5):
        assert engine.evaluations.count(f"slow-{i}") == MAX_TRIES
        refused = cache.selector(f"slow-{i}")
        assert refused is not None and refused.error.endswith(f"({MAX_TRIES} tries in a row)")
    assert cache.waiting == frozenset()


def test_a_class_evaluated_over_part_of_the_devices_keeps_that_part() -> None:
    cache, engine, clock = _cache(budget=0.025)  # room for three evaluations of 10 ms
    # No literal attribute reference: one evaluation per distinct device.
    classes = [DeviceClassInfo("per-device", ("size(device.attributes) > 0",))]
    slices = state([example_slice("n1", 8)]).slices
    frames = 0
    while cache.waiting or frames == 0:
        cache.update(classes, slices)
        frames += 1
        clock.now += 10
        assert frames < 10
    assert frames == 3 and len(engine.evaluations) == 8  # nothing evaluated twice


def test_a_class_is_cached_by_its_content_not_its_object() -> None:
    cache, engine, _ = _cache()
    slices = _slices()
    cache.update([DeviceClassInfo("a", ("ordinary",))], slices)
    evaluated = len(engine.evaluations)
    # Listed again (a new object), renamed, copied under another name: no CEL runs.
    cache.update([DeviceClassInfo("a", ("ordinary",)), DeviceClassInfo("b", ("ordinary",))], slices)
    cache.update([DeviceClassInfo("c", ("ordinary",))], slices)
    assert len(engine.evaluations) == evaluated
    assert cache.selector("c") is not None and cache.waiting == frozenset()


def test_an_interrupted_evaluation_of_an_evaluated_class_is_retried_first() -> None:
    cache, engine, clock = _cache()
    classes = [DeviceClassInfo("a", ("size(device.attributes) > 0",))]  # one evaluation per device
    cache.update(classes, _slices())
    engine.interrupt.add("a")
    more = state([example_slice("n1", 2), example_slice("n2", 2)]).slices
    cache.update(classes, more)  # the new slice's devices meet a killed worker
    assert cache.waiting == {"a"}
    sel = cache.selector("a")
    assert sel is not None and sel.error == WAITING
    clock.now += 10
    cache.update(classes, more)
    sel = cache.selector("a")
    assert cache.waiting == frozenset() and sel is not None and sel.error == ""


class KillsItsWorker(CelWorker):
    """The worker killed (``kill -9``: the OOM killer, an operator) 0.1 s into the evaluation of
    ``victim``, once (its CEL takes 0.4-2 s)."""

    def __init__(self, victim: str) -> None:
        super().__init__(time_limit=30)
        self.victim = victim

    def evaluate(self, name: str, expressions: tuple[str, ...], view: dict[str, Any]) -> Verdict:
        if name == self.victim and self.pid is not None:
            self.victim = ""
            threading.Timer(0.1, os.kill, (self.pid, signal.SIGKILL)).start()
        return super().evaluate(name, expressions, view)


def test_a_killed_worker_costs_a_retry_never_the_innocent_class(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    worker = KillsItsWorker("innocent")
    try:
        capacity = Capacity(worker)
        classes = [device_class("innocent", RUNAWAY_SHORT)]
        st = state([example_slice("n1", 2)], classes=classes)
        frames = [capacity.frame(st, NOW) for _ in range(3)]
    finally:
        worker.close()
    evaluable = [values(f, cat.CLUSTER_CLASS_EVALUABLE.name, "device_class")[("innocent",)] for f in frames]
    pending = [values(f, cat.CLUSTER_CLASS_PENDING.name, "device_class")[("innocent",)] for f in frames]
    assert evaluable == [0.0, 1.0, 1.0] and pending == [1.0, 0.0, 0.0]
    free = values(frames[-1], cat.CLUSTER_CLASS_DEVICES.name, "device_class", "state")[("innocent", "free")]
    assert free == 2.0  # its capacity is back
    assert not [r for r in caplog.records if "innocent" in r.getMessage()]  # not refused, not logged


def test_an_honest_class_cut_by_a_loaded_cpu_is_retried_then_reported_too_slow(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    # A 1 ms time limit stands in for a CPU so loaded that an honest class runs past 1 s.
    worker = CelWorker(time_limit=0.001)
    try:
        capacity = Capacity(worker, cel_budget=30)
        classes = [device_class("honest", f"{_LIST}.all(x, x >= 0)")]
        st = state([example_slice("n1", 1)], classes=classes)
        frames = [capacity.frame(st, NOW) for _ in range(MAX_TRIES + 1)]
    finally:
        worker.close()
    pending = [values(f, cat.CLUSTER_CLASS_PENDING.name, "device_class")[("honest",)] for f in frames]
    assert pending == [1.0] * (MAX_TRIES - 1) + [0.0, 0.0]
    lines = [r.getMessage() for r in caplog.records if "honest" in r.getMessage()]
    assert len(lines) == 1 and lines[0].endswith(f"took longer than 0.001 s (the scheduler's cost limit) "
                                                 f"({MAX_TRIES} tries in a row)"), lines


# --- the cluster mode, whole, against an API server that serves slow classes -----------------------

#: 20 classes whose CEL runs past the 1 s limit (27 million iterations), each different.
SLOW_CLASSES = 20


def slow_classes_api(count: int = SLOW_CLASSES) -> ApiServer:
    classes = [class_object(f"slow-{i:03}", RUNAWAY.replace(">= 0", f">= -{i}")) for i in range(count)]
    classes.append(class_object("gpu.nvidia.com", "device.driver == 'gpu.nvidia.com'"))
    slices = [resource_slice(f"s{i}", node=f"n{i}", devices=4) for i in range(4)]
    return ApiServer(lists={"resourceslices": lambda req, reply: reply.json(object_list(slices)),
                            "resourceclaims": empty_list,
                            "deviceclasses": lambda req, reply: reply.json(object_list(classes))},
                     watches={"resourceslices": idle_watch, "resourceclaims": idle_watch,
                              "deviceclasses": idle_watch})


def probe(port: int, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return 0


@pytest.mark.slow  # ~15 s: the cluster mode starts, becomes ready, then is watched for 6 s
def test_slow_classes_cannot_keep_the_cluster_mode_from_being_ready(tmp_path: Any) -> None:
    from test_hardening_peers import free_port

    with HostileServer(slow_classes_api()) as api:
        config = tmp_path / "kubeconfig"
        config.write_text(kubeconfig(api.url))
        port = free_port()
        proc = subprocess.Popen([sys.executable, "-m", "dra_exporter.cli", "cluster", "--kubeconfig", str(config),
                                 "--listen", f"127.0.0.1:{port}", "--interval", "1"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            # Before: the first frame tried all 20 classes, 1 s and a worker restart each: 25-40 s.
            started = time.monotonic()
            while probe(port, "/readyz") != 200:
                assert proc.poll() is None and time.monotonic() - started < 15, "never ready"
                time.sleep(0.2)
            answers = []
            for _ in range(12):
                answers.append((probe(port, "/readyz"), probe(port, "/healthz"), probe(port, "/metrics")))
                time.sleep(0.5)
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                page = resp.read().decode()
        finally:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    assert answers == [(200, 200, 200)] * 12
    assert 'dra_cluster_class_selectors_pending{device_class="slow-019"} 1.0' in page
    assert 'dra_cluster_class_selectors_evaluable{device_class="gpu.nvidia.com"}' in page
