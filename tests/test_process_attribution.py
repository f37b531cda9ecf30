"""Per-container GPU shares on the simulated node: fake NVML processes, their cgroup files
under the simulated /proc, pod names from the simulated API server."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from simnode import ATTRIBUTION, labels_of, simulated, values_of

from dra_exporter import catalog as cat
from dra_exporter.model import Frame


def memory_by(frame: Frame, *keys: str) -> dict[tuple[str, ...], float]:
    fam = frame.family(cat.CONTAINER_GPU_MEMORY_USED.name)
    out: dict[tuple[str, ...], float] = defaultdict(float)
    for s in fam.samples if fam else ():
        labels = dict(s.labels)
        out[tuple(labels[k] for k in keys)] += s.value
    return dict(out)


def scenario_memory(scenario, t: float) -> dict[tuple[str, str], float]:  # type: ignore[no-untyped-def]
    """(pod, uuid) → process memory the scenario gives that pod's processes on that device."""
    want: dict[tuple[str, str], float] = defaultdict(float)
    for pod in scenario.pods_at(t):
        for c in pod.containers:
            for p in c.processes:
                want[(pod.name, p.uuid)] += p.memory_bytes
    return dict(want)


def test_container_shares_match_the_scenario_on_shared_and_mig_devices() -> None:
    with simulated(ATTRIBUTION) as rt:
        scenario = rt.sim.scenario
        frame = rt.agent.cycle(collect_side=True)
        assert memory_by(frame, "pod", "uuid") == scenario_memory(scenario, 50.0)
        shared = scenario.nvml_uuid("gpu-4")
        shares = {k[0]: v for k, v in memory_by(frame, "pod", "uuid").items() if k[1] == shared}
        assert shares == {"alice": 30 * 2**30, "bob": 12 * 2**30}
        series = {(d["pod"], d["uuid"]): d for d in labels_of(frame, cat.CONTAINER_GPU_MEMORY_USED.name)}
        mig = series[("mig-old-0", scenario.nvml_uuid("gpu-3-mig-9-4-4"))]
        assert (mig["namespace"], mig["container"], mig["claim"]) == ("team-b", "srv", "mig-old")
        # A process that uses two devices (pid 4242 on gpu-1 and gpu-2) counts once on each.
        assert series[("pair-0", scenario.nvml_uuid("gpu-2"))]["claim"] == "pair"
        # The device-plugin pod has no claim, but its container share is still there.
        assert series[("plugin-0", "GPU-00000000-0000-0000-0000-000000000005")]["claim"] == ""
        assert frame.family(cat.UNATTRIBUTED_PROCESSES.name).samples[0].value == 0.0  # type: ignore[union-attr]


def test_no_double_counting_container_shares_add_up_to_the_device_processes() -> None:
    with simulated("demo") as rt:
        frame = rt.agent.cycle(collect_side=True)
        by_uuid = memory_by(frame, "uuid")
        want: dict[str, float] = defaultdict(float)
        for (_, uuid), value in scenario_memory(rt.sim.scenario, 50.0).items():
            want[uuid] += value
        assert by_uuid == {(u,): v for u, v in want.items()}
        device_used = values_of(frame, cat.GPU_MEMORY_USED.name)
        for (uuid,), shares in by_uuid.items():
            assert shares <= device_used[uuid], "shares never exceed what the device reports"


def test_a_pod_that_ends_takes_its_container_series_with_it() -> None:
    with simulated(ATTRIBUTION, sim_time=99.0) as rt:
        assert ("short-0",) in memory_by(rt.agent.cycle(collect_side=True), "pod")
        rt.sim.clock.set(100.0)
        assert ("short-0",) not in memory_by(rt.agent.cycle(collect_side=True), "pod")


def test_without_host_pids_every_process_is_counted_as_unattributed(tmp_path: Path) -> None:
    with simulated(ATTRIBUTION, procfs=str(tmp_path)) as rt:  # an empty /proc: no hostPID
        frame = rt.agent.cycle(collect_side=True)
        assert frame.family(cat.CONTAINER_GPU_MEMORY_USED.name) is None
        total = len({p.pid for pod in rt.sim.scenario.pods_at(50.0) for c in pod.containers for p in c.processes})
        assert frame.family(cat.UNATTRIBUTED_PROCESSES.name).samples[0].value == total  # type: ignore[union-attr]
