"""A DRA driver's rolling update must not blink (issue 17, item 4).

The simulated rollout (``driver_rollout`` fault): a second kubelet-plugin instance republishes
the pool under new slice names with the generation bumped, the old instance's slices are deleted
when the rollout ends, and meanwhile the kubelet's answer lacks the driver's devices. Across
every frame before, during and after it, ``dra_device_info`` and every attribution label must
stay exactly as they were: no gap, no duplicate series, no claimed GPU looking idle for a frame.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from simnode import labels_of, simulated

from dra_exporter import catalog as cat
from dra_exporter.model import (
    ClaimDevice,
    ClaimUse,
    ContainerAllocation,
    Frame,
    PodAllocation,
    PodResourcesSnapshot,
)
from dra_exporter.sources.podresources import _ClaimGapBridge
from dra_exporter.sources.registry import default_enabled, without
from dra_exporter_sim import k8s_objects as ko
from dra_exporter_sim import load_scenario

DEMO = Path(__file__).resolve().parents[1] / "dra_exporter_sim" / "scenarios" / "demo.yaml"
ROLLOUT_AT, ROLLOUT_UNTIL = 100.0, 106.0
ATTRIBUTION = ("namespace", "pod", "pod_uid", "container", "claim", "request")


def rollout_scenario(tmp_path: Path) -> Path:
    doc: dict[str, Any] = yaml.safe_load(DEMO.read_text())
    doc["faults"] = [{"kind": "driver_rollout", "at": ROLLOUT_AT, "until": ROLLOUT_UNTIL}]
    path = tmp_path / "rollout.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_the_simulated_rollout_republishes_the_pool_with_the_generation_bumped(tmp_path: Path) -> None:
    scenario = load_scenario(rollout_scenario(tmp_path))

    def pools(t: float) -> list[tuple[int, str]]:
        return sorted((s["spec"]["pool"]["generation"], s["metadata"]["name"])
                      for s in ko.cluster_objects(scenario, t).resourceslices
                      if s["spec"]["driver"] == "gpu.nvidia.com")

    before, during, after = pools(ROLLOUT_AT - 1), pools(ROLLOUT_AT), pools(ROLLOUT_UNTIL)
    assert [g for g, _ in before] == [1] and [g for g, _ in after] == [2]
    assert sorted(during) == sorted(before + after) and before[0][1] != after[0][1]  # recreated, renamed
    claimed = {u.name for p in scenario.pod_allocations_at(ROLLOUT_AT - 1).pods
               for c in p.containers for u in c.claims}
    assert claimed
    assert not {u.name for p in scenario.pod_allocations_at(ROLLOUT_AT + 1).pods
                for c in p.containers for u in c.claims}  # the kubelet briefly lacks the devices
    assert {u.name for p in scenario.pod_allocations_at(ROLLOUT_UNTIL).pods
            for c in p.containers for u in c.claims} == claimed


def _device_info(frame: Frame) -> list[tuple[tuple[str, str], ...]]:
    fam = frame.family(cat.DEVICE_INFO.name)
    return sorted(s.labels for s in fam.samples) if fam else []


def _attribution(frame: Frame) -> dict[str, tuple[str, ...]]:
    return {d["uuid"]: tuple(d[k] for k in ATTRIBUTION) for d in labels_of(frame, cat.GPU_UP.name)}


@pytest.mark.parametrize("kubeapi", [True, False], ids=["with-api-server", "node-local"])
def test_device_info_and_attribution_stay_continuous_through_a_driver_rollout(tmp_path: Path,
                                                                              kubeapi: bool) -> None:
    # With the API server the pods' claims attribute the devices whatever the kubelet says; node-local
    # (--no-kubeapi) only the kubelet's answer does, and its gap must be bridged.
    frames = []
    with simulated(str(rollout_scenario(tmp_path)), sim_time=ROLLOUT_AT - 4,
                   sources=default_enabled() if kubeapi else without("kubeapi")) as rt:
        for _ in range(16):  # t = 96 .. 111: before, during and after the rollout, frame by frame
            frames.append(rt.agent.cycle(collect_side=True))
            rt.sim.clock.advance(1.0)
    info, owners = _device_info(frames[0]), _attribution(frames[0])
    assert bool(info) == kubeapi and any(o[4] for o in owners.values())  # claimed GPUs to watch
    assert len(set(info)) == len(info)
    for i, frame in enumerate(frames):
        t = ROLLOUT_AT - 4 + i
        assert _device_info(frame) == info, f"dra_device_info changed at t={t}"
        assert _attribution(frame) == owners, f"attribution changed at t={t}"


def test_the_bridge_keeps_a_listed_containers_claim_for_the_grace_only_and_never_a_gone_pods() -> None:
    use = ClaimUse("ml", "train", (ClaimDevice("gpu.nvidia.com", "node", "gpu-0"),))
    with_claim = PodResourcesSnapshot((PodAllocation("ml", "p", (ContainerAllocation("c", (use,)),)),))
    without = PodResourcesSnapshot((PodAllocation("ml", "p", (ContainerAllocation("c"),)),))
    bridge = _ClaimGapBridge(grace=30.0)
    assert bridge.apply(with_claim, 0.0) == with_claim
    assert bridge.apply(without, 1.0) == with_claim  # the gap of a rollout: bridged
    assert bridge.apply(without, 30.9) == with_claim
    assert bridge.apply(without, 31.0) == without  # 30 s after it went missing: gone
    assert bridge.apply(with_claim, 32.0) == with_claim
    assert bridge.apply(PodResourcesSnapshot(), 33.0) == PodResourcesSnapshot()  # the pod left
    assert bridge.apply(without, 34.0) == without  # a new pod of that name starts without it
