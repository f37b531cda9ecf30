"""Pods, not claims (issue 36): the allocator places a pod's pending claims together on one node, an
error of the scheduler's filter stops the pod's attempt, an admin-access pick is in use within its
claim, pools with binding conditions come last; ``explain`` takes a pod and gives a claim its pod's
verdict; pending reasons come from the waiting pod. The same cases run on the real scheduler in
tests/test_testbed_pods.py."""

from __future__ import annotations

from dataclasses import replace

import pytest
from dra_layouts import EXAMPLE, EXAMPLE_GPU, claim_obj, cluster_state, device_class, example_gpus, request

from dra_exporter.cluster import allocator as al
from dra_exporter.cluster.allocator import Allocator
from dra_exporter.cluster.explain import ClaimNotFound, PendingReasons, explain, first_blocking
from dra_exporter.model import ClusterPod


def _pod(state, name: str, *claims: str):  # type: ignore[no-untyped-def]
    return replace(state, pods=(*state.pods, ClusterPod("ml", name, claims=claims)))


def test_a_pods_claims_must_fit_together_on_one_node() -> None:
    state = _pod(cluster_state(EXAMPLE_GPU, example_gpus("n1", 2),
                               claim_obj("two", [request(count=2)]), claim_obj("one")), "p", "two", "one")
    allocator = Allocator(state)
    assert allocator.allocate(state.claims[0]).placeable and allocator.allocate(state.claims[1]).placeable
    two, one = allocator.allocate_pod(state.claims, pod="ml/p")
    assert not two.placeable and not one.placeable and two.together and one.together
    assert first_blocking(two) == ("gpu", al.TOGETHER)
    # explain: a claim's verdict is its pod's; the pod's name gives both claims
    assert [o.placeable for o in explain(state, [("ml", "one")])] == [False]
    assert [(o.claim, o.pod) for o in explain(state, [("ml", "p")])] == [("two", "ml/p"), ("one", "ml/p")]
    reasons = PendingReasons()(allocator, state.claims, 0.0, state.pods)
    assert reasons == {("ml", "two"): ("gpu", al.TOGETHER), ("ml", "one"): ("gpu", al.TOGETHER)}


def test_a_pods_claims_that_fit_together_share_one_node_and_distinct_devices() -> None:
    state = cluster_state(EXAMPLE_GPU, example_gpus("n1", 1), example_gpus("n2", 3),
                          claim_obj("two", [request(count=2)]), claim_obj("one"))
    two, one = Allocator(state).allocate_pod(state.claims)
    assert two.placeable and one.placeable and two.node == one.node == "n2"
    assert not set(two.devices) & set(one.devices)


def test_explain_names_a_pod_or_a_claim_and_refuses_a_name_that_is_both_or_neither() -> None:
    state = _pod(cluster_state(EXAMPLE_GPU, example_gpus("n1", 2), claim_obj("x"), claim_obj("y")), "x", "y")
    with pytest.raises(ClaimNotFound, match="both a ResourceClaim and a Pod that does not use it"):
        explain(state, [("ml", "x")])
    # A pod named as the claim it uses: one answer, the pod's.
    same = _pod(cluster_state(EXAMPLE_GPU, example_gpus("n1", 2), claim_obj("z")), "z", "z")
    assert [(o.claim, o.pod) for o in explain(same, [("ml", "z")])] == [("z", "ml/z")]
    with pytest.raises(ClaimNotFound, match="no ResourceClaim or Pod ml/w"):
        explain(state, [("ml", "w")])


def test_a_cel_error_on_one_node_stops_the_attempt_though_another_node_fits() -> None:
    # n1's device has no 'model' attribute: the class's CEL fails there; n2's fits.
    gpus = example_gpus("n1", 1)
    del gpus["spec"]["devices"][0]["attributes"]["model"]
    cls = device_class("gpu.example.com", f"device.attributes['{EXAMPLE}'].model == 'LATEST-GPU-MODEL'")
    state = cluster_state(cls, gpus, example_gpus("n2", 1), claim_obj("c"))
    outcome = Allocator(state).allocate(state.claims[0])
    assert not outcome.placeable and outcome.attempt_fails and "CEL runtime error" in outcome.error


def test_more_than_32_devices_is_an_error_not_a_misfit() -> None:
    state = cluster_state(EXAMPLE_GPU, example_gpus("n1", 40), claim_obj("c", [request(count=33)]))
    outcome = Allocator(state).allocate(state.claims[0])
    assert not outcome.placeable and outcome.attempt_fails and "more than the claim limit of 32" in outcome.error


def test_an_admin_access_pick_is_in_use_within_its_claim() -> None:
    claim = claim_obj("c", [request("admin", adminAccess=True), request("normal")])
    state = cluster_state(EXAMPLE_GPU, example_gpus("n1", 1), claim)
    assert not Allocator(state).allocate(state.claims[0]).placeable
    two = cluster_state(EXAMPLE_GPU, example_gpus("n1", 2), claim)
    outcome = Allocator(two).allocate(two.claims[0])
    assert outcome.placeable and len(set(outcome.devices)) == 2


def test_a_pool_whose_devices_carry_binding_conditions_is_tried_last() -> None:
    first = example_gpus("n1", 1, pool="a-bound")
    first["spec"]["devices"][0]["bindingConditions"] = ["attached"]
    first["spec"]["devices"][0]["bindingFailureConditions"] = ["failed"]
    state = cluster_state(EXAMPLE_GPU, first, example_gpus("n1", 1, pool="b-plain"), claim_obj("c"))
    assert state.slices[0].devices[0].binding_conditions == ("attached",)
    assert Allocator(state).allocate(state.claims[0]).devices == ((EXAMPLE, "b-plain", "gpu-0"),)


def test_a_pod_goes_only_to_nodes_its_node_filters_admit() -> None:
    from dra_exporter.model import ClusterNode, PodNodeFilters

    state = replace(cluster_state(EXAMPLE_GPU, example_gpus("n1", 1), claim_obj("c")),
                    nodes=tuple(ClusterNode(n, labels=(("kubernetes.io/hostname", n),)) for n in ("n1", "cpu-only")))
    elsewhere = PodNodeFilters(node_selector=(("kubernetes.io/hostname", "cpu-only"),))
    state = replace(state, pods=(ClusterPod("ml", "p", claims=("c",), node_filters=elsewhere),))
    allocator = Allocator(state)
    assert allocator.allocate(state.claims[0]).placeable  # alone, no pod: placeable on n1
    (outcome,) = allocator.allocate_pod(state.claims, filters=elsewhere)
    assert not outcome.placeable and outcome.node_filtered
    assert "didn't match Pod's node affinity/selector" in outcome.error
    pinned_here = PodNodeFilters(node_selector=(("kubernetes.io/hostname", "n1"),))
    assert allocator.allocate_pod(state.claims, filters=pinned_here)[0].node == "n1"
    (explained,) = explain(state, [("ml", "c")])
    assert first_blocking(explained) == ("gpu", al.NODE_FILTERED)
    assert PendingReasons()(allocator, state.claims, 0.0, state.pods) == {("ml", "c"): ("gpu", al.NODE_FILTERED)}


def test_the_schedulers_version_decides_whether_a_rejected_devices_counters_stay_used() -> None:
    from dra_exporter.cluster.scheduler_versions import Behaviours, minor_version

    assert minor_version("v1.36.2-gke.100") == (1, 36) and minor_version("garbage") is None
    assert Behaviours.of("v1.36.2").rejected_device_keeps_counters
    assert not Behaviours.of("v1.37.0").rejected_device_keeps_counters
    assert not Behaviours.of("").rejected_device_keeps_counters  # unknown: the newest
    # Two devices on one counter (1 unit), the first tainted: 1.36 keeps its counter for the search.
    sl = example_gpus("n1", 2)
    sl["spec"]["sharedCounters"] = [{"name": "set", "counters": {"units": {"value": "1"}}}]
    for d in sl["spec"]["devices"]:
        d["consumesCounters"] = [{"counterSet": "set", "counters": {"units": {"value": "1"}}}]
    sl["spec"]["devices"][0]["taints"] = [{"key": "broken", "effect": "NoSchedule"}]
    state = cluster_state(EXAMPLE_GPU, sl, claim_obj("c"))
    assert Allocator(replace(state, server_version="v1.37.1")).allocate(state.claims[0]).placeable
    assert Allocator(replace(state, server_version="v1.37.1")).placeable_claims("gpu.example.com") == 1
    assert not Allocator(replace(state, server_version="v1.36.2")).allocate(state.claims[0]).placeable
    assert Allocator(replace(state, server_version="v1.36.2")).placeable_claims("gpu.example.com") == 0


def test_the_pending_reason_is_the_one_that_would_unblock_the_claim_on_one_node() -> None:
    from dra_layouts import EXAMPLE as DRIVER

    # 5 GPUs asked, nodes of 4, two GPUs taken: not "taken" (freeing them never helps) but too few per node.
    state = _pod(cluster_state(EXAMPLE_GPU, example_gpus("n1", 4), example_gpus("n2", 4),
                               claim_obj("a", results=[(DRIVER, "n1", "gpu-0")]),
                               claim_obj("b", results=[(DRIVER, "n2", "gpu-0")]),
                               claim_obj("five", [request(count=5)])), "p", "five")
    (outcome,) = explain(state, [("ml", "five")])
    assert first_blocking(outcome) == ("gpu", "too_few_devices") and outcome.fits_when_free is False
    # 3 GPUs asked, two nodes of 4 with 2 taken on each: on one node 2 usable, so "taken" is what unblocks.
    state = _pod(cluster_state(EXAMPLE_GPU, example_gpus("n1", 4), example_gpus("n2", 4),
                               claim_obj("a", results=[(DRIVER, "n1", "gpu-0"), (DRIVER, "n1", "gpu-1")]),
                               claim_obj("b", results=[(DRIVER, "n2", "gpu-0"), (DRIVER, "n2", "gpu-1")]),
                               claim_obj("three", [request(count=3)])), "p", "three")
    (outcome,) = explain(state, [("ml", "three")])
    assert first_blocking(outcome) == ("gpu", "taken") and outcome.fits_when_free is True


def test_partitions_that_never_fit_together_are_too_few_not_counters() -> None:
    from dra_layouts import H100, NVIDIA, NVIDIA_MIG, partitionable_gpus

    three_g = device_class("three-g", f"device.driver == '{NVIDIA}' && 'profile' in device.attributes['{NVIDIA}'] "
                                      f"&& device.attributes['{NVIDIA}'].profile == '3g.40gb'")
    # A driver that also publishes a 3g placement at memory slice 2: three 3g devices, two at once at most.
    objects = partitionable_gpus("n1", H100)
    devices = objects[1]["spec"]["devices"]
    at_zero = next(d for d in devices if d["name"] == "gpu-0-mig-3g40gb-9-0")
    at_two = {**at_zero, "name": "gpu-0-mig-3g40gb-9-2", "consumesCounters": [
        {**at_zero["consumesCounters"][0], "counters": {
            **{k: v for k, v in at_zero["consumesCounters"][0]["counters"].items() if not k.startswith("memory-slice")},
            **{f"memory-slice-{i}": {"value": "1"} for i in range(2, 6)}}}]}
    devices.append(at_two)
    state = _pod(cluster_state(NVIDIA_MIG, three_g, objects,
                               claim_obj("c", [request(device_class_name="three-g", count=3)])), "p", "c")
    (outcome,) = explain(state, [("ml", "c")])
    assert outcome.requests[0].matching == 3 and outcome.fits_when_free is False
    assert first_blocking(outcome) == ("gpu", "too_few_devices")


def test_a_pod_with_an_allocated_claim_goes_where_that_claim_is() -> None:
    from dra_layouts import EXAMPLE as DRIVER

    state = _pod(cluster_state(EXAMPLE_GPU, example_gpus("n1", 1), example_gpus("n2", 1),
                               claim_obj("held", results=[(DRIVER, "n1", "gpu-0")]), claim_obj("new")),
                 "p", "held", "new")
    allocator = Allocator(state)
    assert allocator.allocate(state.claims[1]).node == "n2"  # alone: on n2
    held, new = allocator.allocate_pod(state.claims)
    assert held.error == "already allocated" and not new.placeable and new.nodes_tried == 1


def test_all_over_an_incomplete_pool_on_another_node_stops_the_attempt() -> None:
    state = cluster_state(EXAMPLE_GPU, example_gpus("n1", 1), example_gpus("n2", 1, count=2),
                          claim_obj("c", [request(allocationMode="All")]))
    outcome = Allocator(state).allocate(state.claims[0])
    assert not outcome.placeable and outcome.attempt_fails and "currently being updated" in outcome.error
