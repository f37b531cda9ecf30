"""A wedged collection cycle must not look healthy (issue 13, item 14).

A cycle that never returns (a hung NVML call, a FIFO under ``--procfs``) cannot report
itself: the agent's watchdog notices that no cycle has finished for ``stall_after``
seconds, fails /readyz at once and /healthz ``liveness_grace`` seconds later, reports
NVML (and the source the cycle is stuck in) down, and logs one line per episode.

The agent's tests run real threads but measure the stall on an injected clock, so every
bound is checked at its exact second; the last test hangs the simulated NVML of a
simulated node behind the real HTTP server.
"""

from __future__ import annotations

import copy
import logging
import os
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families
from simnode import SCENARIOS, eventually

from dra_exporter import catalog as cat
from dra_exporter import cli, runtime
from dra_exporter.agent import Agent, Core, SourceRunner
from dra_exporter.cluster.runtime import CLUSTER as CLUSTER_PROGRAM
from dra_exporter.cluster.runtime import CapacityCore
from dra_exporter.config import ClusterSettings, Settings, default_stall_timeout
from dra_exporter.model import Frame, LoopHealth
from dra_exporter.runtime import JoinCore
from dra_exporter.sinks.prometheus import PrometheusSink
from dra_exporter.sources.procs import ProcsSource
from dra_exporter.sources.registry import without
from dra_exporter_sim import load_scenario
from dra_exporter_sim.clock import SimClock
from dra_exporter_sim.fake_nvml import FakeNvml
from dra_exporter_sim.scenario_builder import parse_scenario

STALL = 30.0
GRACE = 30.0
#: A real-time guard against a test that would otherwise hang for ever; never a speed claim.
GUARD_S = 20.0


class FakeClock:
    """The agent's monotonic clock: stands still until the test moves it."""

    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


class GatedSource:
    """A source whose collections from the ``block_from``-th on wait while ``release`` is clear.

    ``blocked`` counts the collections that did wait: once it grows after ``release.clear()``,
    the cycle is stuck in this source until the test sets ``release`` again.
    """

    def __init__(self, name: str, block_from: int | None = None) -> None:
        self.name = name
        self.block_from = block_from
        self.calls = 0
        self.blocked = 0
        self.release = threading.Event()

    def collect(self) -> object:
        self.calls += 1
        if self.block_from is not None and self.calls >= self.block_from and not self.release.is_set():
            self.blocked += 1
            self.release.wait(GUARD_S)
        return object()

    def wait_blocked(self, more_than: int = 0) -> None:
        eventually(lambda: self.blocked > more_than, GUARD_S)

    def close(self) -> None:
        self.release.set()


class ListSink:
    def __init__(self) -> None:
        self.frames: list[Frame] = []

    def publish(self, frame: Frame) -> None:
        self.frames.append(frame)


class BlockingSink(ListSink):
    """A sink whose second publish never returns until released: a cycle stuck in a sink."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.release = threading.Event()

    def publish(self, frame: Frame) -> None:
        super().publish(frame)
        if len(self.frames) >= 2:
            self.entered.set()
            self.release.wait(GUARD_S)


def by_source(frame: Frame, family: str) -> dict[str, float]:
    fam = frame.family(family)
    return {dict(s.labels)["source"]: s.value for s in fam.samples} if fam else {}


@dataclass(frozen=True)
class Program:
    """What the watchdog tests need of a program of the runtime: its core, its primary source's
    name and its side sources' names."""

    name: str
    core: Callable[[], Core]
    primary: str
    side: tuple[str, ...]


NODE = Program("serve", JoinCore, "nvml", ("podresources",))
CLUSTER = Program("cluster", CapacityCore, "kubeapi", ())


@pytest.fixture(params=[NODE, CLUSTER], ids=lambda p: p.name)
def program(request: pytest.FixtureRequest) -> Program:
    """Each watchdog test runs against both programs: the same loop, the same bounds and probes."""
    return request.param  # type: ignore[no-any-return]


@contextmanager
def watched(primary: Any, *, program: Program = NODE, followers: tuple[Any, ...] = (), sink: ListSink | None = None,
            startup_wait: float = GUARD_S) -> Iterator[tuple[Agent, FakeClock, ListSink]]:
    """A started agent of ``program`` (interval 10 ms, bounds 30 s + 30 s on a fake clock) with its
    side sources, whose first cycle waits up to ``startup_wait`` for them (they answer at once)."""
    clock = FakeClock()
    sink = sink or ListSink()

    def runner(source: Any) -> SourceRunner:
        return SourceRunner(source, keep_last_good=False, interval=0.01, monotonic=clock)

    side = [SourceRunner(GatedSource(name), keep_last_good=True, interval=0.01, monotonic=clock)
            for name in program.side]
    agent = Agent([runner(primary)], side, [sink], core=program.core(), interval=0.01,
                  followers=[runner(f) for f in followers], stall_after=STALL, liveness_grace=GRACE, monotonic=clock)
    agent.start(startup_wait=startup_wait)
    try:
        yield agent, clock, sink
    finally:
        for source in (primary, *followers):
            source.close()
        agent.stop()


# --- the bounds -------------------------------------------------------------------------------------


def test_a_wedged_cycle_fails_readyz_at_the_bound_and_healthz_after_the_grace(program: Program) -> None:
    nvml = GatedSource(program.primary, block_from=2)
    with watched(nvml, program=program) as (agent, clock, _):
        eventually(agent.ready.is_set, GUARD_S)
        nvml.wait_blocked()
        assert agent.health() == LoopHealth(ready=True, live=True)
        clock.advance(STALL - 0.5)
        assert agent.health() == LoopHealth(ready=True, live=True), "a slow cycle is no stall"
        clock.advance(0.5)
        health = agent.health()
        assert (health.ready, health.live) == (False, True), "readiness fails at once, liveness not yet"
        assert "no collection cycle has finished for 30 s" in health.reason
        clock.advance(GRACE - 0.5)
        assert agent.health().live
        clock.advance(0.5)
        assert not agent.health().live, "after the grace the kubelet must restart the pod"
        nvml.release.set()
        eventually(lambda: agent.health() == LoopHealth(ready=True, live=True), GUARD_S)


def test_a_first_cycle_that_never_ends_fails_healthz_too(program: Program) -> None:
    # NVML hangs in its first call (nvmlInit), the cluster mode in its first list.
    nvml = GatedSource(program.primary, block_from=1)
    startup_wait = 10.0
    # The first cycle may wait for the side sources on top of the bound; with none, it does not.
    allowance = startup_wait if program.side else 0.0
    with watched(nvml, program=program, startup_wait=startup_wait) as (agent, clock, sink):
        nvml.wait_blocked()
        assert agent.health() == LoopHealth(ready=False, live=True)
        clock.advance(STALL + allowance - 0.5)
        assert agent.health().reason == ""
        clock.advance(0.5)
        assert agent.health().reason.startswith("stalled")
        clock.advance(GRACE - 0.5)
        assert agent.health().live
        clock.advance(0.5)
        assert not agent.health().live
        agent.watch()
        assert sink.frames and by_source(sink.frames[-1], cat.SOURCE_UP.name)[program.primary] == 0.0


def test_the_default_bound_is_ten_intervals_and_never_under_30_s() -> None:
    assert default_stall_timeout(1.0) == 30.0
    assert default_stall_timeout(0.05) == 30.0
    assert default_stall_timeout(10.0) == 100.0
    nvml = SourceRunner(GatedSource("nvml"), keep_last_good=False)
    agent = Agent([nvml], [], [], core=JoinCore(), interval=5.0)
    assert (agent.stall_after, agent.liveness_grace) == (50.0, 50.0)
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="stall_after must be positive"):
            Agent([nvml], [], [], core=JoinCore(), stall_after=bad)


@pytest.mark.parametrize("args, needle", [
    (["--stall-timeout", "nan"], "'nan' is not a finite number"),
    (["--stall-timeout", "inf"], "'inf' is not a finite number"),
    (["--stall-timeout", "1.5", "--interval", "1"], "at least twice --interval (2 s)"),
    (["--stall-timeout", "-3"], "-3"),
])
def test_a_stall_timeout_that_cannot_tell_a_stall_from_a_cycle_is_refused(args: list[str], needle: str) -> None:
    result = CliRunner().invoke(cli.main, ["serve", "--simulate", *args])
    assert result.exit_code == 2, result.output
    assert needle in result.output and "Traceback" not in result.output


# --- what the watchdog publishes and logs -------------------------------------------------------------


def test_while_stalled_the_frames_say_the_primary_is_down_and_keep_the_rest(program: Program) -> None:
    nvml = GatedSource(program.primary, block_from=2)
    with watched(nvml, program=program) as (agent, clock, sink):
        eventually(agent.ready.is_set, GUARD_S)
        nvml.wait_blocked()
        healthy = sink.frames[-1]
        assert by_source(healthy, cat.SOURCE_UP.name) == dict.fromkeys((program.primary, *program.side), 1.0)
        agent.watch()
        assert sink.frames[-1] is healthy, "no stall frame before the bound"
        clock.advance(STALL + 1)
        agent.watch()
        stalled = sink.frames[-1]
        assert by_source(stalled, cat.SOURCE_UP.name) == {program.primary: 0.0, **dict.fromkeys(program.side, 1.0)}
        assert by_source(stalled, cat.COLLECT_DURATION.name)[program.primary] == STALL + 1, \
            "how long the call has hung"
        assert by_source(stalled, cat.COLLECT_ERRORS.name) == by_source(healthy, cat.COLLECT_ERRORS.name), \
            "a counter must not jump now and fall back when the call returns"
        assert agent.cycles == 1, "a stall frame is no cycle"
        nvml.release.set()
        eventually(lambda: agent.cycles >= 3, GUARD_S)
        agent.watch()
        assert by_source(sink.frames[-1], cat.SOURCE_UP.name)[program.primary] == 1.0


def test_one_log_line_per_episode_names_the_source_and_how_long(program: Program,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    nvml = GatedSource(program.primary, block_from=2)
    caplog.set_level(logging.INFO, logger="dra_exporter.agent")
    with watched(nvml, program=program) as (agent, clock, _):
        eventually(agent.ready.is_set, GUARD_S)
        nvml.wait_blocked()
        clock.advance(STALL)
        for _ in range(5):
            agent.watch()
            clock.advance(1)
        stalls = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(stalls) == 1, stalls
        assert f"the {program.primary} source has been collecting for 30 s" in stalls[0]
        assert "/readyz fails" in stalls[0] and "/healthz fails" in stalls[0]
        nvml.release.set()
        eventually(lambda: "finish again" in caplog.text, GUARD_S)
        assert f"after a 35 s stall in {program.primary}" in caplog.text
        # A second episode is a second line.
        blocked = nvml.blocked
        nvml.release.clear()
        nvml.wait_blocked(blocked)
        clock.advance(STALL)
        agent.watch()
        assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 2
        nvml.release.set()


def test_a_fifo_under_procfs_names_procs_and_nvml_goes_down_too(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """``open()`` of a FIFO with no writer blocks in the kernel: the cycle is stuck after NVML."""
    (tmp_path / "4242").mkdir()
    stat = tmp_path / "4242" / "stat"
    os.mkfifo(stat)
    nvml = GatedSource("nvml")
    procs = ProcsSource(lambda: [4242], str(tmp_path))
    with watched(nvml, followers=(procs,), startup_wait=0.0) as (agent, clock, sink):
        # The first cycle's /proc lookup opens the FIFO, and never returns.
        eventually(lambda: agent.followers[0].collecting_for() is not None, GUARD_S)
        assert agent.side[0].attempted.wait(GUARD_S)
        clock.advance(STALL)
        agent.watch()
        assert not agent.health().ready
        assert "the procs source has been collecting for 30 s" in caplog.text
        up = by_source(sink.frames[-1], cat.SOURCE_UP.name)
        assert (up["procs"], up["nvml"], up["podresources"]) == (0.0, 0.0, 1.0), \
            "NVML values are not fresh while the cycle is stuck, whichever source it is stuck in"
        # A writer lets the blocked open() through; a regular file in its place keeps later cycles going.
        # The source is marked as collecting just before its thread reaches open(): until it is blocked
        # there, a non-blocking writer finds no reader (ENXIO), so try until it does.
        writers: list[int] = []
        eventually(lambda: bool(writers) or _open_writer(stat, writers), GUARD_S)
        (writer,) = writers
        (tmp_path / "stat.tmp").write_text("4242 (python) S 1")
        os.replace(tmp_path / "stat.tmp", stat)
        os.close(writer)
        eventually(lambda: agent.health().ready, GUARD_S)


def _open_writer(fifo: Path, opened: list[int]) -> bool:
    try:
        opened.append(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
    except OSError:  # ENXIO: nobody has the FIFO open for reading yet
        return False
    return True


def test_a_cycle_stuck_inside_a_sink_never_blocks_the_watchdog(program: Program,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    sink = BlockingSink()
    with watched(GatedSource(program.primary), program=program, sink=sink) as (agent, clock, _):
        assert sink.entered.wait(GUARD_S)
        clock.advance(STALL + GRACE)
        done = threading.Thread(target=agent.watch)
        done.start()
        done.join(GUARD_S)
        assert not done.is_alive(), "the watchdog waited for the wedged sink"
        assert agent.health() == LoopHealth(False, False, "stalled: no collection cycle has finished for 60 s")
        assert "stuck after collecting (in the core or a sink)" in caplog.text
        sink.release.set()


# --- the probes -----------------------------------------------------------------------------------


def get(port: int, path: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def test_the_probes_answer_from_the_health_callback() -> None:
    sink = PrometheusSink("127.0.0.1:0")
    health = LoopHealth(ready=True, live=True)
    sink.answer_probes_from(lambda: health)
    sink.start()
    try:
        assert get(sink.port, "/readyz")[0] == 503, "still no frame"
        sink.publish(Frame())
        assert get(sink.port, "/readyz") == (200, b"ok\n")
        health = LoopHealth(ready=False, live=True, reason="stalled: no collection cycle has finished for 31 s")
        assert get(sink.port, "/readyz") == (503, b"stalled: no collection cycle has finished for 31 s\n")
        assert get(sink.port, "/healthz") == (200, b"ok\n")
        health = LoopHealth(ready=False, live=False, reason="stalled: no collection cycle has finished for 61 s")
        assert get(sink.port, "/healthz") == (503, b"stalled: no collection cycle has finished for 61 s\n")
        assert get(sink.port, "/metrics")[0] == 200, "the last frame is still served"
    finally:
        sink.stop()


# --- the simulated NVML's hang fault ---------------------------------------------------------------


def hanging_nvml(fault: dict[str, Any]) -> tuple[FakeNvml, SimClock]:
    doc = {"node": "n", "gpus": [{"index": 0}, {"index": 1}], "faults": [fault]}
    clock = SimClock(0.0, frozen=True)
    return FakeNvml(parse_scenario(copy.deepcopy(doc)), clock), clock


def in_thread(call: Any, *args: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(call(*args)), daemon=True)
    thread.start()
    return thread, out


def test_an_nvml_hang_on_one_gpu_blocks_its_calls_until_the_fault_ends() -> None:
    fake, clock = hanging_nvml({"kind": "nvml_hang", "gpu": 1, "at": 10, "until": 20})
    fake.nvmlInit()
    gpu0: Any = fake.nvmlDeviceGetHandleByIndex(0)
    gpu1: Any = fake.nvmlDeviceGetHandleByIndex(1)
    clock.set(10)
    call, out = in_thread(fake.nvmlDeviceGetPowerUsage, gpu1)
    assert fake.nvmlDeviceGetPowerUsage(gpu0) > 0, "the other GPU answers meanwhile"
    call.join(0.5)
    assert call.is_alive() and not out, "the call on the hung GPU returned"
    clock.set(19.9)
    call.join(0.2)
    assert call.is_alive()
    clock.set(20)
    call.join(GUARD_S)
    assert out and out[0] > 0


def test_an_nvml_hang_without_a_gpu_blocks_every_call_and_without_until_for_ever() -> None:
    fake, clock = hanging_nvml({"kind": "nvml_hang", "at": 5})
    fake.nvmlInit()
    clock.set(5)
    call, out = in_thread(fake.nvmlDeviceGetCount)
    call.join(0.5)
    assert call.is_alive() and not out
    clock.set(1e6)
    call.join(0.5)
    assert call.is_alive(), "a hang without 'until' never ends"


def test_the_scenario_format_knows_the_hang_fault() -> None:
    scenario = load_scenario(str(SCENARIOS / "nvml_hang.yaml"))
    (fault,) = scenario.faults
    assert (fault.kind, fault.at, fault.until, fault.gpu) == ("nvml_hang", 20.0, 30.0, None)


# --- end to end: a simulated node whose NVML hangs, behind the real HTTP server -----------------------


def source_up_on_metrics(port: int) -> dict[str, float]:
    text = get(port, "/metrics")[1].decode()
    return {s.labels["source"]: s.value for fam in text_string_to_metric_families(text)
            if fam.name == cat.SOURCE_UP.name for s in fam.samples}


def test_a_simulated_nvml_hang_fails_the_probes_reports_nvml_down_and_recovers(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="dra_exporter.agent")
    settings = Settings(listen="127.0.0.1:0", simulate=str(SCENARIOS / "nvml_hang.yaml"), interval=0.1,
                        sources=without("kubeapi"), stall_timeout=1.0)
    # The simulated clock stands at t=10 until the test moves it; the watchdog counts real seconds.
    rt = runtime.build(settings, sim_time=10.0, publish=True)
    try:
        port = rt.prometheus.port
        rt.agent.start()
        eventually(lambda: get(port, "/readyz")[0] == 200, GUARD_S)
        assert source_up_on_metrics(port)["nvml"] == 1.0
        rt.sim.clock.set(20.0)  # the scenario's NVML hangs from t=20 to t=30
        eventually(lambda: get(port, "/readyz")[0] == 503, GUARD_S)
        eventually(lambda: source_up_on_metrics(port)["nvml"] == 0.0, GUARD_S)
        assert source_up_on_metrics(port)["podresources"] == 1.0
        eventually(lambda: get(port, "/healthz")[0] == 503, GUARD_S)
        assert b"no collection cycle has finished" in get(port, "/healthz")[1]
        stalls = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(stalls) == 1 and "the nvml source has been collecting" in stalls[0], stalls
        rt.sim.clock.set(30.0)  # the hang ends
        eventually(lambda: get(port, "/readyz")[0] == get(port, "/healthz")[0] == 200, GUARD_S)
        eventually(lambda: source_up_on_metrics(port)["nvml"] == 1.0, GUARD_S)
        assert "collection cycles finish again" in caplog.text
    finally:
        rt.sim.clock.set(30.0)
        rt.close()


# --- a failing core: one traceback per episode, for both programs ---------------------------------------


class FailingCore:
    """The program's core, failing while ``failing`` is set (a bug, an object it cannot take)."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.failing = threading.Event()
        self.calls = 0

    def __call__(self, *args: Any) -> Frame:
        self.calls += 1
        if self.failing.is_set():
            raise RuntimeError("the core cannot take this")
        return self.core(*args)


def test_a_failing_core_logs_one_traceback_per_episode(program: Program, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="dra_exporter.agent")
    core = FailingCore(program.core())
    runner = SourceRunner(GatedSource(program.primary), keep_last_good=False, interval=0.01)
    agent = Agent([runner], [], [ListSink()], core=core, interval=0.01, stall_after=STALL)
    agent.start()
    try:
        eventually(agent.ready.is_set, GUARD_S)
        for episode in (1, 2):
            core.failing.set()
            calls = core.calls
            eventually(lambda calls=calls: core.calls > calls + 20, GUARD_S)  # many failed cycles
            core.failing.clear()
            eventually(lambda n=episode: caplog.text.count("cycles work again") == n, GUARD_S)
            errors = [r for r in caplog.records if r.levelno == logging.ERROR]
            assert len(errors) == episode, [r.getMessage() for r in errors]
            assert errors[-1].exc_info is not None, "the traceback, once"
    finally:
        agent.stop()


# --- end to end: the cluster mode against an API server that never answers ----------------------------


class SilentServer:
    """A TCP server that accepts connections and never answers, until ``release`` closes them all
    (and itself: later connections are refused)."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            self._held.append(conn)

    def release(self) -> None:
        self._listener.close()
        for conn in self._held:
            conn.close()
        self._thread.join(GUARD_S)

    def kubeconfig(self, path: Path) -> str:
        path.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: silent\n"
            f"clusters: [{{name: silent, cluster: {{server: 'http://127.0.0.1:{self.port}'}}}}]\n"
            "users: [{name: nobody, user: {}}]\n"
            "contexts: [{name: silent, context: {cluster: silent, user: nobody}}]\n")
        return str(path)


def test_a_cluster_mode_whose_first_list_never_ends_fails_the_probes_and_recovers(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="dra_exporter.agent")
    server = SilentServer()
    # Bounds far below the CLI's (at least twice an interval of 1 s) keep the test short.
    settings = ClusterSettings(listen="127.0.0.1:0", kubeconfig=server.kubeconfig(tmp_path / "kubeconfig"),
                               interval=0.1, stall_timeout=0.5)
    rt = runtime.build(settings, CLUSTER_PROGRAM, publish=True)
    try:
        assert rt.prometheus is not None
        port = rt.prometheus.port
        rt.agent.start()
        eventually(lambda: get(port, "/healthz")[0] == 503, GUARD_S)
        assert b"no collection cycle has finished" in get(port, "/healthz")[1]
        assert get(port, "/readyz")[0] == 503
        stalls = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        assert len(stalls) == 1 and "the kubeapi source has been collecting" in stalls[0], stalls
        server.release()  # the discovery request fails now: the cycle finishes, with the source down
        eventually(lambda: get(port, "/healthz")[0] == 200, GUARD_S)
        assert source_up_on_metrics(port)["kubeapi"] == 0.0
        # Live again, but not ready: the primary source has never answered (as the node agent without NVML).
        status, body = get(port, "/readyz")
        assert status == 503 and b"kubeapi has never answered" in body, body
        assert "collection cycles finish again" in caplog.text
    finally:
        server.release()
        rt.close()


@pytest.mark.parametrize("settings, program", [
    (Settings(listen="127.0.0.1:0", simulate="demo", sources=without("kubeapi")), runtime.NODE),
    (ClusterSettings(listen="127.0.0.1:0", simulate="cluster", interval=1.0), CLUSTER_PROGRAM),
], ids=["serve", "cluster"])
def test_both_programs_probes_say_ready_and_live_once_a_frame_is_out(settings: Any, program: Any) -> None:
    rt = runtime.build(settings, program, publish=True)
    try:
        assert rt.prometheus is not None
        port = rt.prometheus.port
        assert get(port, "/readyz")[0] == 503, "no frame yet"
        assert get(port, "/healthz")[0] == 200, "alive: no cycle has stalled"
        rt.agent.start()
        eventually(lambda: get(port, "/readyz")[0] == 200, GUARD_S)
        assert get(port, "/healthz") == (200, b"ok\n")
        assert all(source_up_on_metrics(port)[r.name] == 1.0 for r in rt.agent.primaries)
    finally:
        rt.close()
