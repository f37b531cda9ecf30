"""Node-local attribution end to end: fake NVML + the real gRPC client against the
simulated kubelet on a unix socket, through the agent and the join."""

from __future__ import annotations

from simnode import ATTRIBUTION, device_labels, eventually, labels_of, simulated, source_up

from dra_exporter import catalog as cat
from dra_exporter.model import ClaimDevice, ClaimUse, ContainerAllocation, PodAllocation, PodResourcesSnapshot
from dra_exporter_sim.kubelet import SimulatedKubelet


def attribution(labels: dict[str, str]) -> tuple[str, str, str, str]:
    return (labels["namespace"], labels["pod"], labels["container"], labels["claim"])


def test_every_attribution_case_of_the_design() -> None:
    with simulated(ATTRIBUTION) as rt:
        scenario = rt.sim.scenario
        frame = rt.agent.cycle(collect_side=True)
        by_uuid = device_labels(frame)
        uuid = scenario.nvml_uuid
        assert attribution(by_uuid[uuid("gpu-0")]) == ("team-a", "solo-0", "main", "solo")
        assert attribution(by_uuid[uuid("gpu-1")]) == ("team-a", "pair-0", "main", "pair")
        assert attribution(by_uuid[uuid("gpu-2")]) == ("team-a", "pair-0", "main", "pair")
        mig_new, mig_old = uuid("gpu-3-mig-3g71gb-9-0"), uuid("gpu-3-mig-9-4-4")
        assert attribution(by_uuid[mig_new]) == ("team-b", "mig-new-0", "srv", "mig-new")
        assert attribution(by_uuid[mig_old]) == ("team-b", "mig-old-0", "srv", "mig-old")
        assert by_uuid[mig_new]["profile"] == "3g.71gb" and by_uuid[mig_new]["parent_uuid"] == uuid("gpu-3")
        assert attribution(by_uuid[uuid("gpu-3")]) == ("", "", "", ""), "MIG parent is not the claim's"
        assert attribution(by_uuid[uuid("gpu-4")]) == ("team-c", "", "", "shared")
        assert attribution(by_uuid["GPU-00000000-0000-0000-0000-000000000005"]) == ("legacy", "plugin-0", "cuda", "")
        assert attribution(by_uuid[uuid("gpu-6")]) == ("batch", "short-0", "job", "short")
        assert attribution(by_uuid[uuid("gpu-7")]) == ("", "", "", "")
        assert source_up(frame, "podresources") == 1.0

        consumers = {(c["namespace"], c["claim"], c["pod"]) for c in labels_of(frame, cat.CLAIM_CONSUMER_INFO.name)}
        assert {("team-c", "shared", "alice"), ("team-c", "shared", "bob")} <= consumers
        assert not any(c[2] == "dra-exporter-t" for c in consumers), "monitoring pod is no consumer"
        info = {lbl["uuid"]: lbl for lbl in labels_of(frame, cat.GPU_INFO.name)}
        assert info[mig_old]["gpu_instance_id"] != "" and info[mig_old]["compute_instance_id"] != ""
        allocs = {(a["claim"], a["device"]): a for a in labels_of(frame, cat.CLAIM_ALLOCATION_INFO.name)}
        solo_uid = next(c.uid for c in scenario.claims if c.name == "solo")
        assert allocs[("solo", "gpu-0")]["claim_uid"] == solo_uid
        assert allocs[("all-gpus", "gpu-7")]["admin_access"] == "true"


def test_a_pod_that_ends_leaves_the_next_frame() -> None:
    with simulated(ATTRIBUTION, sim_time=99.0) as rt:
        gpu6 = rt.sim.scenario.nvml_uuid("gpu-6")
        assert device_labels(rt.agent.cycle(collect_side=True))[gpu6]["pod"] == "short-0"
        rt.sim.clock.set(100.0)
        frame = rt.agent.cycle(collect_side=True)
        assert attribution(device_labels(frame)[gpu6]) == ("", "", "", "")
        assert not [c for c in labels_of(frame, cat.CLAIM_CONSUMER_INFO.name) if c["pod"] == "short-0"]


def test_kubelet_restart_recovers_without_restarting_the_exporter() -> None:
    with simulated(ATTRIBUTION) as rt:
        gpu0 = rt.sim.scenario.nvml_uuid("gpu-0")
        rt.agent.cycle(collect_side=True)
        rt.sim.kubelet.inject("kubelet_socket_gone")
        frame = rt.agent.cycle(collect_side=True)
        assert source_up(frame, "podresources") == 0.0
        # The last good attribution is kept while the kubelet is away.
        assert device_labels(frame)[gpu0]["pod"] == "solo-0"
        rt.sim.kubelet.inject(None)

        def recovered() -> bool:
            return source_up(rt.agent.cycle(collect_side=True), "podresources") == 1.0

        eventually(recovered)


def test_resource_exhausted_backs_off_and_is_visible() -> None:
    with simulated(ATTRIBUTION) as rt:
        rt.agent.cycle(collect_side=True)
        rt.sim.kubelet.inject("kubelet_resource_exhausted")
        calls_before = rt.sim.kubelet.calls
        frames = [rt.agent.cycle(collect_side=True) for _ in range(5)]
        assert all(source_up(f, "podresources") == 0.0 for f in frames)
        errors = {lbl["source"]: s for lbl, s in
                  ((dict(x.labels), x.value) for x in frames[-1].family(cat.COLLECT_ERRORS.name).samples)}
        assert errors["podresources"] == 5.0
        assert rt.sim.kubelet.calls - calls_before == 1, "within the backoff no RPC reaches the kubelet"
        rt.sim.kubelet.inject(None)
        eventually(lambda: source_up(rt.agent.cycle(collect_side=True), "podresources") == 1.0)


def test_explicit_kubelet_socket_replaces_the_simulated_kubelet(tmp_path) -> None:  # type: ignore[no-untyped-def]
    own = PodResourcesSnapshot((PodAllocation("mine", "p", (ContainerAllocation("c", (
        ClaimUse("mine", "claim-x", (ClaimDevice("gpu.nvidia.com", "test-node", "gpu-7"),)),)),)),))
    with SimulatedKubelet(lambda: own, socket_path=str(tmp_path / "k.sock")) as kubelet:
        with simulated(ATTRIBUTION, kubelet_socket=kubelet.socket_path) as rt:
            assert rt.sim.kubelet is None
            frame = rt.agent.cycle(collect_side=True)
            by_uuid = device_labels(frame)
            assert attribution(by_uuid[rt.sim.scenario.nvml_uuid("gpu-7")]) == ("mine", "p", "c", "claim-x")
            assert attribution(by_uuid[rt.sim.scenario.nvml_uuid("gpu-0")]) == ("", "", "", "")
        assert kubelet.calls >= 1


def test_a_claim_the_kubelet_lists_with_no_devices_is_not_prepared(tmp_path) -> None:
    """A failed NodePrepareResources (the simulator's ``prepare_failed``, as the real kubelet shows it):
    the pod's claims are listed with no devices; dra_claim_not_prepared names each, and leaves once the
    claim is prepared."""
    import yaml

    doc = yaml.safe_load(open(ATTRIBUTION))
    doc.setdefault("faults", []).append({"kind": "prepare_failed", "pod": "team-a/solo-0", "at": 0, "until": 100})
    scenario = tmp_path / "unprepared.yaml"
    scenario.write_text(yaml.safe_dump(doc))
    with simulated(str(scenario), sim_time=50.0) as rt:
        frame = rt.agent.cycle(collect_side=True)
        assert {(s["namespace"], s["claim"], s["pod"]) for s in labels_of(frame, cat.CLAIM_NOT_PREPARED.name)} == {
            ("team-a", "solo", "solo-0")}
        rt.sim.clock.set(100.0)
        assert not labels_of(rt.agent.cycle(collect_side=True), cat.CLAIM_NOT_PREPARED.name)
