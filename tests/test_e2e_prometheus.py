"""`dra-exporter serve --simulate` scraped by a real Prometheus every second, checked
over Prometheus' HTTP API against values computed from the scenario itself."""

from __future__ import annotations

import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator

import pytest
from promharness import free_port
from simnode import ATTRIBUTION, eventually, scrape

from dra_exporter_sim import load_scenario
from dra_exporter_sim.clock import SimClock
from dra_exporter_sim.fake_nvml import FakeNvml

pytestmark = [pytest.mark.prometheus, pytest.mark.slow]  # ~6 s each: a real Prometheus queried over time


@pytest.fixture(scope="module")
def exporter() -> Iterator[int]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "dra_exporter.cli", "serve", "--simulate", ATTRIBUTION,
         "--listen", f"127.0.0.1:{port}", "--interval", "0.5"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        def ready() -> bool:
            try:
                return bool(scrape(port, "/readyz"))
            except OSError:
                assert proc.poll() is None, proc.stdout.read() if proc.stdout else ""
                return False

        eventually(ready, timeout=30)
        yield port
    finally:
        proc.terminate()
        out, _ = proc.communicate(timeout=15)
        assert proc.returncode == 0, out
        assert "Traceback" not in out, out


def expected_device_values() -> tuple[dict[str, float], dict[str, float]]:
    """Memory used and utilisation per device, read straight from the fake NVML.

    The scenario's workloads are constants, so these do not depend on the time of the scrape.
    """
    scenario = load_scenario(ATTRIBUTION)
    nvml = FakeNvml(scenario, SimClock(50.0, frozen=True))
    nvml.nvmlInit()
    used, util = {}, {}
    for i in range(nvml.nvmlDeviceGetCount()):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        uuid = nvml.nvmlDeviceGetUUID(h)
        used[uuid] = float(nvml.nvmlDeviceGetMemoryInfo(h, version=nvml.nvmlMemory_v2).used)
        if not nvml.nvmlDeviceGetMigMode(h)[0]:
            util[uuid] = nvml.nvmlDeviceGetUtilizationRates(h).gpu / 100
        for m in range(nvml.nvmlDeviceGetMaxMigDeviceCount(h)):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, m)
            except nvml.NVMLError:
                continue
            memory = nvml.nvmlDeviceGetMemoryInfo(mig, version=nvml.nvmlMemory_v2)
            used[nvml.nvmlDeviceGetUUID(mig)] = float(memory.used)
    return used, util


def by_uuid(result: list[dict]) -> dict[str, float]:  # type: ignore[type-arg]
    return {r["metric"]["uuid"]: float(r["value"][1]) for r in result}


def test_prometheus_sees_the_scenarios_utilisation_and_memory(exporter: int, prometheus) -> None:  # type: ignore[no-untyped-def]
    prom = prometheus([f"127.0.0.1:{exporter}"])
    used, util = expected_device_values()
    got_used = by_uuid(prom.wait_for("dra_gpu_memory_used_bytes",
                                     lambda r: len(r) == len(used), timeout=60))
    assert got_used == used
    got_util = by_uuid(prom.wait_for("dra_gpu_utilization_ratio", lambda r: len(r) == len(util)))
    assert got_util == pytest.approx(util)
    assert any(v > 0 for v in util.values()) and any(v == 0 for v in util.values())


def test_sum_by_claim_matches_the_scenario(exporter: int, prometheus) -> None:  # type: ignore[no-untyped-def]
    prom = prometheus([f"127.0.0.1:{exporter}"])
    scenario = load_scenario(ATTRIBUTION)
    used, _ = expected_device_values()
    want: dict[tuple[str, str], float] = defaultdict(float)
    for claim in scenario.claims:
        if claim.admin_access:
            continue
        for device in claim.devices:
            want[(claim.namespace, claim.name)] += used[scenario.nvml_uuid(device)]
    # batch/short ends at simulated t=100; the exporter started at 0 and runs in real time.
    del want[("batch", "short")]
    query = 'sum by (namespace, claim) (dra_gpu_memory_used_bytes{claim!="", claim!="short"})'
    result = prom.wait_for(query, lambda r: len(r) == len(want), timeout=60)
    got = {(r["metric"]["namespace"], r["metric"]["claim"]): float(r["value"][1]) for r in result}
    assert got == want
    sources = {"nvml", "cdi", "podresources", "kubeapi", "procs"}
    health = prom.wait_for('dra_exporter_source_up == 1', lambda r: len(r) == len(sources))
    assert {r["metric"]["source"] for r in health} == sources
    assert all(t["health"] == "up" for t in prom.targets())


def test_sum_by_pod_of_container_memory_matches_the_scenario(exporter: int, prometheus) -> None:  # type: ignore[no-untyped-def]
    prom = prometheus([f"127.0.0.1:{exporter}"])
    scenario = load_scenario(ATTRIBUTION)
    want: dict[str, float] = defaultdict(float)
    for pod in scenario.pods:
        if pod.end is None:  # short-0 ends at simulated t=100; the exporter runs in real time from 0
            for container in pod.containers:
                want[pod.name] += sum(p.memory_bytes for p in container.processes)
    want = {pod: v for pod, v in want.items() if v}
    query = 'sum by (pod) (dra_container_gpu_memory_used_bytes{pod!="short-0"})'
    result = prom.wait_for(query, lambda r: len(r) == len(want), timeout=60)
    assert {r["metric"]["pod"]: float(r["value"][1]) for r in result} == want
    # The shared GPU's two notebooks: different, correct shares.
    assert (want["alice"], want["bob"]) == (30 * 2**30, 12 * 2**30)
