"""Hardening of the API-server path, at the level of the whole exporter: a simulated node whose
API server answers 500, expires every watch (410), cuts every watch, hangs, or goes away, and
answers that are too big. Each test checks that the devices and the kubelet keep reporting, the
fault shows in the self-metrics of ``source="kubeapi"``, and the exporter heals without a restart.

The API source's timeouts are shortened (``FAST``) so that backoffs and request deadlines take
fractions of a second; the promises do not depend on the values (``Timeouts`` defaults: 10 s per
request, backoff 1-60 s).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families
from simnode import eventually, scrape, simulated

from dra_exporter import catalog as cat
from dra_exporter import runtime
from dra_exporter.sources import SourceError, kubeapi, reflector
from dra_exporter.sources.kubeapi import MAX_LIST_BYTES, MAX_OBJECT_BYTES, KubeApiSource, Timeouts
from dra_exporter_sim.apiserver import ERROR, GONE, GONE_410, WATCH_DROP

FAST = Timeouts(request=1.0, backoff=(0.05, 0.5))

#: gpu-0: a pod from the start; gpu-1: `late-0` starts at t=200 (a watch event and a claim GET);
#: gpu-2 idle. The API server hangs for 30 s of wall time on [240, 260).
SCENARIO = """
node: hard-node
seed: 4
gpus: [{index: 0}, {index: 1}, {index: 2}]
claims:
  - {namespace: ml, name: steady, devices: [gpu-0]}
  - {namespace: ml, name: late, devices: [gpu-1]}
pods:
  - namespace: ml
    name: steady-0
    containers: [{name: c, claims: [steady], processes: [{device: gpu-0, memory: 1Gi, sm: 0.5}]}]
  - namespace: ml
    name: late-0
    start: 200
    containers: [{name: c, claims: [late], processes: [{device: gpu-1, memory: 2Gi, sm: 0.3}]}]
faults:
  - {kind: apiserver_slow, at: 240, until: 260, delay: 30}
"""


@pytest.fixture
def scenario(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    class FastKubeApiSource(KubeApiSource):
        def __init__(self, *args: Any, **kw: Any) -> None:
            kw.setdefault("timeouts", FAST)
            super().__init__(*args, **kw)

    # runtime imports the class when it builds the source: the whole exporter gets short timeouts.
    monkeypatch.setattr(kubeapi, "KubeApiSource", FastKubeApiSource)
    path = tmp_path / "hard.yaml"
    path.write_text(SCENARIO)
    return str(path)


@pytest.fixture
def serving(scenario: str) -> Iterator[runtime.Runtime]:
    """The exporter with its agent, side-source threads and /metrics running in the background."""
    with simulated(scenario, http=True, interval=0.2) as rt:
        rt.agent.start()
        eventually(lambda: rt.agent.ready.is_set())
        eventually(lambda: metrics(rt)[cat.SOURCE_UP.name]["kubeapi"] == 1.0)
        yield rt


def metrics(rt: runtime.Runtime) -> dict[str, dict[str, float]]:
    """name → {source or uuid or pod: value} of the series the tests read, from a real scrape."""
    found: dict[str, dict[str, float]] = {}
    text = scrape(rt.prometheus.port).decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            key = s.labels.get("source") or s.labels.get("uuid", "")
            if s.name == cat.GPU_UP.name:
                key = s.labels["uuid"] + "/" + s.labels["pod_uid"]
            found.setdefault(s.name, {})[key] = s.value
    return found


def kube(rt: runtime.Runtime, name: str) -> float:
    return metrics(rt)[name]["kubeapi"]


def api_source(rt: runtime.Runtime) -> KubeApiSource:
    (source,) = [r.source for r in rt.agent.side if isinstance(r.source, KubeApiSource)]
    return source


def pod_uid(rt: runtime.Runtime, name: str) -> str:
    return next(p.uid for p in rt.sim.scenario.pods if p.name == name)


def attributed(rt: runtime.Runtime, gpu: str, pod: str) -> bool:
    """The GPU's dra_gpu_up series carries the pod's UID, which only the API server knows."""
    return f"{rt.sim.scenario.nvml_uuid(gpu)}/{pod_uid(rt, pod)}" in metrics(rt).get(cat.GPU_UP.name, {})


def assert_node_still_reports(rt: runtime.Runtime) -> None:
    found = metrics(rt)
    assert found[cat.SOURCE_UP.name]["nvml"] == found[cat.SOURCE_UP.name]["podresources"] == 1.0
    assert sorted(found[cat.GPU_UP.name].values()) == [1.0, 1.0, 1.0], "every device keeps reporting"
    assert attributed(rt, "gpu-0", "steady-0"), "the last good cluster view stays in use"


# --- 500 -----------------------------------------------------------------------------------------


def test_api_server_500s_keep_the_last_view_are_counted_and_heal(scenario: str) -> None:
    with simulated(scenario) as rt:
        api = rt.sim.apiserver

        def kube_values(frame: Any, name: str) -> float:
            return next(s.value for s in frame.family(name).samples if dict(s.labels)["source"] == "kubeapi")

        frame = rt.agent.cycle(collect_side=True)
        assert kube_values(frame, cat.SOURCE_UP.name) == 1.0
        good_success = kube_values(frame, cat.LAST_SUCCESS.name)
        api.inject(ERROR)
        rt.sim.clock.set(220.0)  # late-0 starts: its claim must be fetched, and every GET is a 500
        eventually(lambda: kube_values(rt.agent.cycle(collect_side=True), cat.SOURCE_UP.name) == 0.0)
        for _ in range(3):
            frame = rt.agent.cycle(collect_side=True)
        assert kube_values(frame, cat.COLLECT_ERRORS.name) >= 1
        assert kube_values(frame, cat.LAST_SUCCESS.name) == good_success, "no success while failing"
        ups = {dict(s.labels)["uuid"]: dict(s.labels)["pod_uid"] for s in frame.family(cat.GPU_UP.name).samples}
        assert len(ups) == 3 and ups[rt.sim.scenario.nvml_uuid("gpu-0")] == pod_uid(rt, "steady-0")
        assert api.requests[("get", "resourceclaims")] >= 2

        api.inject(None)

        def healed() -> bool:
            frame = rt.agent.cycle(collect_side=True)
            ups = {dict(s.labels)["uuid"]: dict(s.labels)["pod_uid"] for s in frame.family(cat.GPU_UP.name).samples}
            return (kube_values(frame, cat.SOURCE_UP.name) == 1.0
                    and ups[rt.sim.scenario.nvml_uuid("gpu-1")] == pod_uid(rt, "late-0"))

        eventually(healed)
        assert kube_values(rt.agent.cycle(), cat.LAST_SUCCESS.name) > good_success
        assert api.requests[("list", "pods")] == 1, "a 500 on a GET costs no re-list"


# --- watches that cannot stay open ---------------------------------------------------------------


@pytest.mark.parametrize("fault", [GONE_410, WATCH_DROP])
def test_watches_that_expire_or_are_cut_at_once_cost_no_request_storm(
        fault: str, serving: runtime.Runtime) -> None:
    rt, api = serving, serving.sim.apiserver
    before = dict(api.requests)
    api.inject(fault)
    # Persistently: after a few short watches in a row the source says it is down.
    eventually(lambda: kube(rt, cat.SOURCE_UP.name) == 0.0, timeout=20.0)
    rt.sim.clock.set(220.0)  # late-0 starts while the watches cannot deliver it
    assert_node_still_reports(rt)
    during = {key: api.requests[key] - before.get(key, 0) for key in api.requests}
    api.inject(None)
    eventually(lambda: kube(rt, cat.SOURCE_UP.name) == 1.0 and attributed(rt, "gpu-1", "late-0"), timeout=20.0)
    # Without backoff this was ~200 requests a second per kind; with it, one per backoff period.
    for kind in ("pods", "resourceslices"):
        assert 2 <= during[("watch", kind)] <= 20, during
        if fault == GONE_410:
            # Counted while the reflector runs: a list may have been answered and its watch not yet sent.
            assert during[("list", kind)] - during[("watch", kind)] in (0, 1), f"410: list again, then watch: {during}"
        else:
            assert during.get(("list", kind), 0) == 0, f"a cut watch resumes, no re-list: {during}"
    assert kube(rt, cat.COLLECT_ERRORS.name) >= 1


# --- hanging -------------------------------------------------------------------------------------


def test_a_hanging_api_server_blocks_neither_cycles_nor_scrapes_and_the_source_gives_up(
        serving: runtime.Runtime, caplog: pytest.LogCaptureFixture) -> None:
    rt = serving
    with caplog.at_level(logging.WARNING, logger="dra_exporter.agent"):
        cycles = rt.agent.cycles
        # t=250: every answer waits 30 s (the request timeout is 1 s); late-0 starts, so its claim
        # must be fetched. Had the source waited for the answer, it would have stayed up.
        rt.sim.clock.set(250.0)
        eventually(lambda: kube(rt, cat.SOURCE_UP.name) == 0.0, timeout=20.0)
        assert_node_still_reports(rt)  # scrapes are answered while the source hangs
        assert rt.agent.cycles - cycles >= 3, "NVML cycles go on while the API source waits"
        found = metrics(rt)
        assert found[cat.LAST_SUCCESS.name]["kubeapi"] < found[cat.LAST_SUCCESS.name]["nvml"]
        rt.sim.clock.set(270.0)  # the API server answers again
        eventually(lambda: kube(rt, cat.SOURCE_UP.name) == 1.0 and attributed(rt, "gpu-1", "late-0"), timeout=20.0)
    failures = [r.getMessage() for r in caplog.records if "kubeapi" in r.getMessage()]
    assert any("no answer in time" in m for m in failures), failures


# --- gone ----------------------------------------------------------------------------------------


def test_api_server_gone_for_a_while_then_back_resumes_without_a_relist(serving: runtime.Runtime) -> None:
    rt, api = serving, serving.sim.apiserver
    source = api_source(rt)
    lists = (api.requests[("list", "pods")], api.requests[("list", "resourceslices")])
    api.inject(GONE)
    eventually(lambda: kube(rt, cat.SOURCE_UP.name) == 0.0)
    tried = sum(source.requests.values())
    rt.sim.clock.set(220.0)  # late-0 starts while the API server is away
    eventually(lambda: kube(rt, cat.COLLECT_ERRORS.name) >= 3)
    assert_node_still_reports(rt)
    tried = sum(source.requests.values()) - tried
    assert tried <= 30, f"backoff: {tried} attempts"
    api.inject(None)
    eventually(lambda: kube(rt, cat.SOURCE_UP.name) == 1.0 and attributed(rt, "gpu-1", "late-0"), timeout=20.0)
    assert (api.requests[("list", "pods")], api.requests[("list", "resourceslices")]) == lists, \
        "the watches resume from their resourceVersion"


# --- oversized answers ---------------------------------------------------------------------------


def padded(body: dict[str, Any], size: int) -> dict[str, Any]:
    return {**body, "metadata": {**body.get("metadata", {}), "annotations": {"pad": "x" * size}}}


def test_a_list_over_the_limit_is_refused_and_the_last_view_kept(serving: runtime.Runtime,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    rt, api = serving, serving.sim.apiserver
    real = api.list_objects
    monkeypatch.setattr(api, "list_objects", lambda request: padded(real(request), MAX_LIST_BYTES + 1))
    api.inject(GONE_410)  # the watches must list again, and every list is too big
    eventually(lambda: kube(rt, cat.SOURCE_UP.name) == 0.0, timeout=20.0)
    assert_node_still_reports(rt)
    source = api_source(rt)
    assert "32 MiB limit" in f"{source._slices.error} {source._pods.error}"  # type: ignore[union-attr]
    monkeypatch.setattr(api, "list_objects", real)
    api.inject(None)
    eventually(lambda: kube(rt, cat.SOURCE_UP.name) == 1.0, timeout=20.0)


def test_a_watch_event_over_the_limit_is_refused_and_the_watch_heals(serving: runtime.Runtime,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    rt, api = serving, serving.sim.apiserver
    real = api.watch
    huge = {"type": "MODIFIED", "object": padded({"kind": "Pod", "metadata": {"name": "x", "namespace": "y"}},
                                                 10 * 2**20)}

    def watch(request: Any, timeout_s: float, alive: Any = lambda: True) -> Iterator[Any]:
        yield huge  # a 10 MiB object: no API server stores one (its limit is 3 MiB)
        yield from real(request, timeout_s, alive)

    monkeypatch.setattr(api, "watch", watch)
    api.inject(WATCH_DROP)  # end the current watches; the next ones start with the huge event
    eventually(lambda: kube(rt, cat.SOURCE_UP.name) == 0.0, timeout=20.0)
    api.inject(None)
    assert_node_still_reports(rt)
    source = api_source(rt)
    # Eventually: a watch that retries clears its error when its request is answered, and sets
    # it again once the huge event arrives; both watches may be in that window at one moment.
    eventually(lambda: "4 MiB limit" in f"{source._slices.error} {source._pods.error}")  # type: ignore[union-attr]
    monkeypatch.setattr(api, "watch", real)
    rt.sim.clock.set(220.0)
    eventually(lambda: kube(rt, cat.SOURCE_UP.name) == 1.0 and attributed(rt, "gpu-1", "late-0"), timeout=20.0)


class _Endless:
    """A response whose body never ends and never has a newline; counts what was read."""

    headers: dict[str, str] = {}

    def __init__(self) -> None:
        self.read_bytes = 0
        self.closed = False

    def read1(self, amt: int, decode_content: bool = False) -> bytes:
        self.read_bytes += amt
        return b"x" * amt

    def close(self) -> None:
        self.closed = True

    def release_conn(self) -> None:
        pass


def test_endless_answers_are_read_only_up_to_the_limit() -> None:
    endless = _Endless()
    with pytest.raises(SourceError, match="4 MiB limit"):
        for _ in reflector.watch_lines(endless, MAX_OBJECT_BYTES, "watch pods", 60.0):
            pass
    assert endless.closed and endless.read_bytes <= MAX_OBJECT_BYTES + 128 * 1024
    endless = _Endless()
    with pytest.raises(SourceError, match="32 MiB limit"):
        reflector.read_json(endless, "list pods", MAX_LIST_BYTES)
    assert endless.closed and endless.read_bytes <= MAX_LIST_BYTES + 64 * 1024
    announced = _Endless()
    announced.headers = {"Content-Length": str(MAX_OBJECT_BYTES + 1)}
    with pytest.raises(SourceError, match="4 MiB limit"):
        reflector.read_json(announced, "get resourceclaims", MAX_OBJECT_BYTES)
    assert announced.read_bytes == 0, "refused from its Content-Length, unread"
