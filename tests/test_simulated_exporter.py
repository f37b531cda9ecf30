"""The whole exporter on the simulated node: golden exposition, cached scrapes, faults."""

from __future__ import annotations

import gzip
import os
import re
import time
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from promharness import promtool_check_metrics
from simnode import SCENARIOS, device_labels, eventually, scrape, simulated, source_up, values_of

from dra_exporter import catalog as cat
from dra_exporter import runtime
from dra_exporter.config import Settings

GOLDEN = Path(__file__).resolve().parent / "golden" / "demo.prom"
# Lines that differ between runs or machines: timings and the Python version.
VOLATILE = re.compile(r"^dra_exporter_collect_duration_seconds\{|^dra_exporter_build_info\{")


def stable(exposition: str) -> str:
    return "".join(line for line in exposition.splitlines(keepends=True) if not VOLATILE.match(line))


def demo_metrics() -> str:
    with simulated("demo", sim_time=60.0, http=True) as rt:
        rt.agent.cycle(collect_side=True)
        rt.sim.clock.advance(1.0)
        rt.agent.cycle(collect_side=True)
        return scrape(rt.prometheus.port).decode()


def test_golden_demo_exposition(promtool: str) -> None:
    """The whole /metrics of `demo` at simulated t=61 s; UPDATE_GOLDEN=1 rewrites it."""
    text = demo_metrics()
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN.write_text(stable(text))
    assert stable(text) == GOLDEN.read_text(), "regenerate with UPDATE_GOLDEN=1 if the change is intended"
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert set(families) >= {"dra_gpu_utilization_ratio", "dra_gpu_energy_joules", "dra_claim_consumer_info"}
    ok, output = promtool_check_metrics(promtool, text.encode())
    assert ok, output


def test_golden_file_shows_claim_pod_container_and_partition_labels() -> None:
    golden = GOLDEN.read_text()
    assert re.search(r'dra_gpu_memory_used_bytes\{claim="vllm-small-0-gpu",container="vllm",'
                     r'gpu="4",namespace="inference",parent_uuid="GPU-[^"]+",pod="vllm-small-0",'
                     r'pod_uid="[0-9a-f-]{36}",profile="3g.71gb",request="gpu/mig-3g"', golden)
    assert 'claim="shared-notebook-gpu",container="",gpu="6",namespace="research",parent_uuid="",pod=""' in golden


def test_scrapes_never_touch_nvml() -> None:
    with simulated("demo", http=True) as rt:
        rt.agent.cycle(collect_side=True)
        calls = sum(rt.sim.nvml.calls.values())
        kubelet_calls = rt.sim.kubelet.calls
        bodies = {scrape(rt.prometheus.port) for _ in range(25)}
        bodies |= {gzip.decompress(scrape(rt.prometheus.port, headers={"Accept-Encoding": "gzip"}))}
        assert sum(rt.sim.nvml.calls.values()) == calls, "a scrape made NVML calls"
        assert rt.sim.kubelet.calls == kubelet_calls, "a scrape called the kubelet"
        assert len(bodies) == 1, "scrapes between two cycles must serve the same bytes"
        rt.agent.cycle()
        assert sum(rt.sim.nvml.calls.values()) > calls


def test_readyz_turns_ready_after_the_first_cycle() -> None:
    import urllib.error

    with simulated("demo", http=True) as rt:
        with pytest.raises(urllib.error.HTTPError) as err:
            scrape(rt.prometheus.port, "/readyz")
        assert err.value.code == 503
        rt.agent.cycle(collect_side=True)
        assert scrape(rt.prometheus.port, "/readyz")


def test_nvml_init_failure_is_visible_then_recovers_without_restart() -> None:
    with simulated(str(SCENARIOS / "faults.yaml"), sim_time=1.0) as rt:
        frame = rt.agent.cycle(collect_side=True)
        assert source_up(frame, "nvml") == 0.0
        assert not device_labels(frame)
        rt.sim.clock.set(10.0)  # past the fault and the init backoff (simulated time)
        eventually(lambda: source_up(rt.agent.cycle(), "nvml") == 1.0)
        assert len(device_labels(rt.agent.cycle())) == 3


def test_one_lost_gpu_leaves_the_others_intact_and_recovers() -> None:
    with simulated(str(SCENARIOS / "faults.yaml"), sim_time=10.0) as rt:
        healthy = rt.agent.cycle(collect_side=True)
        assert source_up(healthy, "nvml") == 1.0
        rt.sim.clock.set(25.0)
        lost = rt.agent.cycle()
        up = values_of(lost, cat.GPU_UP.name)
        scenario = rt.sim.scenario
        gpu0, gpu1, gpu2 = (scenario.nvml_uuid(f"gpu-{i}") for i in range(3))
        assert (up[gpu0], up[gpu1], up[gpu2]) == (1.0, 0.0, 1.0)
        used = values_of(lost, cat.GPU_MEMORY_USED.name)
        assert gpu1 not in used
        assert used[gpu0] == values_of(healthy, cat.GPU_MEMORY_USED.name)[gpu0]
        assert device_labels(lost)[gpu0]["pod"] == "p0"
        assert source_up(lost, "nvml") == 1.0, "one lost GPU is not a source failure"
        # GPU 2 never answers power; it is still up and reports everything else.
        assert gpu2 not in values_of(lost, cat.GPU_POWER.name) and gpu2 in values_of(lost, cat.GPU_TEMPERATURE.name)
        rt.sim.clock.set(45.0)
        assert values_of(rt.agent.cycle(), cat.GPU_UP.name)[gpu1] == 1.0


def test_xid_events_become_counters_in_serve_mode() -> None:
    with simulated("demo", sim_time=29.0) as rt:
        rt.agent.cycle(collect_side=True)  # registers the event set before the XID at t=30
        rt.sim.clock.set(31.0)
        gpu2 = rt.sim.scenario.nvml_uuid("gpu-2")

        def counted() -> bool:
            fam = rt.agent.cycle().family(cat.GPU_XID_ERRORS.name)
            return fam is not None and any(
                dict(s.labels)["uuid"] == gpu2 and dict(s.labels)["xid"] == "13" and s.value == 1.0
                for s in fam.samples)

        eventually(counted)


def test_one_gpu_lost_on_the_8_gpu_demo_node_costs_only_that_gpu(tmp_path: Path) -> None:
    """DESIGN §6 on the realistic node: GPU 3 (part of the 4-GPU training claim) falls off the bus
    at t=70 and comes back at t=90; the other 7 GPUs and 9 MIG devices never miss a value."""
    import dra_exporter_sim

    demo = Path(dra_exporter_sim.__file__).parent / "scenarios" / "demo.yaml"
    scenario = tmp_path / "demo-lost.yaml"
    scenario.write_text(demo.read_text().replace(
        "faults:\n", "faults:\n  - {kind: gpu_lost, gpu: 3, at: 70, until: 90}\n", 1))
    with simulated(str(scenario), sim_time=60.0) as rt:
        before = rt.agent.cycle(collect_side=True)
        lost_uuid = rt.sim.scenario.nvml_uuid("gpu-3")
        rt.sim.clock.set(75.0)
        during = rt.agent.cycle(collect_side=True)
        up = values_of(during, cat.GPU_UP.name)
        assert up.pop(lost_uuid) == 0.0
        assert len(up) == 16 and set(up.values()) == {1.0}
        still_reported = set(values_of(before, cat.GPU_MEMORY_USED.name)) - {lost_uuid}
        assert set(values_of(during, cat.GPU_MEMORY_USED.name)) == still_reported
        assert device_labels(during)[lost_uuid]["claim"] == "llama-train-gpus", "still attributed while down"
        assert source_up(during, "nvml") == 1.0
        rt.sim.clock.set(95.0)
        assert values_of(rt.agent.cycle(collect_side=True), cat.GPU_UP.name)[lost_uuid] == 1.0


def test_serve_on_a_simulated_node_exports_timestamps_of_the_hosts_clock() -> None:
    # `serve --simulate` runs the clock: a real Prometheus compares these with time(), so they must
    # be the host's time, not a fixed 2027 epoch (time() - timestamp was -3.9 M s).
    rt = runtime.build(Settings(listen="127.0.0.1:0", simulate="demo"))
    try:
        before = time.time()
        frame = rt.agent.cycle(collect_side=True)
        after = time.time()
    finally:
        rt.close()
    stamps = values_of(frame, cat.LAST_SUCCESS.name, "source")
    assert stamps and all(before - 1 <= t <= after + 1 for t in stamps.values()), (before, stamps, after)
