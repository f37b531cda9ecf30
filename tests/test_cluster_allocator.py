"""The scheduler's allocator as the exporter models it (``cluster/allocator.py``): one test per rule of
``k8s.io/dynamic-resource-allocation/structured``, on layouts shaped as drivers publish them
(``dra_layouts``). Fixes of issue 26 (1, 3, 4, 5, 6) each have a test that fails on the arithmetic
the exporter had before (devices counted free one by one)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from dra_layouts import (
    EXAMPLE,
    EXAMPLE_GPU,
    H100,
    H200,
    NVIDIA,
    NVIDIA_GPU,
    NVIDIA_MIG,
    claim_obj,
    cluster_state,
    device_class,
    example_gpus,
    partitionable_gpus,
    request,
    shared_gpu,
    slice_obj,
    taint_rule,
)

from dra_exporter import catalog as cat
from dra_exporter.cluster import allocator as al
from dra_exporter.cluster.allocator import Allocator, consumed_amount
from dra_exporter.cluster.capacity import Capacity
from dra_exporter.model import CapacityRequestPolicy, ClaimInfo, ClusterState, Frame
from dra_exporter.sources.kubeapi_normalize import claim_from_dict

GIB = 2.0**30


def pending(*requests: dict[str, Any], constraints: list[dict[str, Any]] | None = None,
            name: str = "waiting") -> ClaimInfo:
    return claim_from_dict(claim_obj(name, list(requests) or None, constraints=constraints), "v1")


def values(frame: Frame, family: str, *keys: str) -> dict[tuple[str, ...], float]:
    fam = frame.family(family)
    return {} if fam is None else {tuple(dict(s.labels)[k] for k in keys): s.value for s in fam.samples}


def placeable(state: ClusterState, device_class_name: str) -> int:
    return Allocator(state).placeable_claims(device_class_name)


def reasons(outcome: al.Outcome, request_name: str = "gpu") -> dict[str, int]:
    (req,) = [r for r in outcome.requests if r.request == request_name]
    return {b.reason: b.devices for b in req.blocked}


# --- pools: only complete and valid ones (fix 1) -------------------------------------------------------------


def test_an_incomplete_pool_is_not_allocated_from_and_its_devices_are_unavailable() -> None:
    # The built-in cluster's case: 8 example GPUs (one allocated) and a pool whose second slice is missing.
    state = cluster_state(example_gpus("full", 8), example_gpus("partial", 4, count=2), EXAMPLE_GPU,
                          claim_obj("a", results=[(EXAMPLE, "full", "gpu-0")]))
    assert placeable(state, "gpu.example.com") == 7  # devices counted one by one said 11
    frame = Capacity().frame(state, 0.0)
    assert values(frame, cat.CLUSTER_DEVICES.name, "node", "state") == {
        ("full", "allocated"): 1.0, ("full", "free"): 7.0, ("partial", "unavailable"): 4.0}
    outcome = Allocator(state).allocate(pending(), "partial")
    assert not outcome.placeable and reasons(outcome) == {al.POOL_INCOMPLETE: 4}
    assert outcome.requests[0].blocked[0].details == ("partial: 1 of 2 slices",)


def test_the_newest_generation_is_used_as_soon_as_it_is_complete() -> None:
    state = cluster_state(example_gpus("n1", 8, generation=1), example_gpus("n1", 2, generation=2, count=2),
                          example_gpus("n1", 2, generation=2, count=2, first=2), EXAMPLE_GPU)
    assert placeable(state, "gpu.example.com") == 4  # generation 2's four devices; generation 1 is ignored


@pytest.mark.parametrize(("objects", "why"), [
    # The same device name in two slices of the pool.
    ([example_gpus("n1", 2, count=2), example_gpus("n1", 2, count=2, first=1)], "duplicate device name gpu-1"),
    # A device consumes a counter set the pool does not publish.
    ([slice_obj("s", EXAMPLE, "n1", [{"name": "p0", "consumesCounters": [
        {"counterSet": "nope", "counters": {"memory": {"value": "1Gi"}}}]}], node="n1")],
     "counter set nope not found"),
    # ... or a counter its set does not have.
    ([slice_obj("c", EXAMPLE, "n1", node="n1", count=2, counters=[{"name": "cs", "counters": {"memory": {
        "value": "8Gi"}}}]),
      slice_obj("s", EXAMPLE, "n1", [{"name": "p0", "consumesCounters": [
          {"counterSet": "cs", "counters": {"compute": {"value": "1"}}}]}], node="n1", count=2)],
     "counter compute not found in counter set cs"),
])
def test_an_invalid_pool_is_not_allocated_from(objects: list[dict[str, Any]], why: str) -> None:
    state = cluster_state(objects, EXAMPLE_GPU)
    assert placeable(state, "gpu.example.com") == 0
    (pool,) = Allocator(state).pools
    assert pool.invalid == why
    frame = Capacity().frame(state, 0.0)
    assert {st for (st,) in values(frame, cat.CLUSTER_DEVICES.name, "state")} == {"unavailable"}


# --- first fit, one after another (fix 4) --------------------------------------------------------------------


def test_exclusive_partitions_are_not_added_up_placeable_claims_are_counted_one_after_another() -> None:
    # The whole GPU and its 7g in one class: two devices each GPU, one claim each.
    both = device_class("big", f"device.driver == '{NVIDIA}' && (device.attributes['{NVIDIA}'].type == 'gpu' || "
                               f"device.attributes['{NVIDIA}'].profile == '7g.80gb')")
    state = cluster_state(partitionable_gpus("n1", H100, gpus=2), both, NVIDIA_MIG)
    frame = Capacity().frame(state, 0.0)
    assert values(frame, cat.CLUSTER_CLASS_DEVICES.name, "device_class", "state")[("big", "free")] == 4.0
    assert values(frame, cat.CLUSTER_CLASS_PLACEABLE.name, "device_class") == {("big",): 2.0, ("mig.nvidia.com",): 14.0}


def test_first_fit_gives_a_large_gpu_class_the_whole_h200_not_two_partitions() -> None:
    large = device_class("large-gpu", f"device.driver == '{NVIDIA}' && "
                                      f"device.capacity['{NVIDIA}'].memory.compareTo(quantity('60Gi')) >= 0")
    state = cluster_state(partitionable_gpus("n1", H200), large)
    allocator = Allocator(state)
    outcome = allocator.allocate(pending(request(device_class_name="large-gpu")))
    assert outcome.placeable and outcome.devices == ((NVIDIA, "n1", "gpu-0"),)
    # The whole GPU takes every counter: nothing else of that GPU is left for the class.
    assert allocator.placeable_claims("large-gpu") == 1


def test_claims_are_placed_one_after_another_with_commit() -> None:
    state = cluster_state(example_gpus("n1", 2), EXAMPLE_GPU)
    allocator = Allocator(state)
    first = allocator.allocate(pending(name="a"))
    allocator.commit(first)
    second = allocator.allocate(pending(name="b"))
    allocator.commit(second)
    third = allocator.allocate(pending(name="c"))
    assert [first.devices, second.devices] == [((EXAMPLE, "n1", "gpu-0"),), ((EXAMPLE, "n1", "gpu-1"),)]
    assert not third.placeable and reasons(third) == {al.TAKEN: 2}
    assert third.requests[0].blocked[0].details == ("ml/a", "ml/b")


# --- counters: engines too (fix 5) ---------------------------------------------------------------------------


def test_one_ofa_engine_means_one_me_partition_per_gpu() -> None:
    frame = Capacity().frame(cluster_state(partitionable_gpus("n1", H100)), 0.0)
    fits = {p: v for (p,), v in values(frame, cat.CLUSTER_PARTITIONS_FIT.name, "profile").items()}
    # Counted device by device, every 1g.10gb+me placement fits (7); the scheduler places one.
    assert fits == {"gpu": 1.0, "1g.10gb": 7.0, "1g.10gb+me": 1.0, "1g.20gb": 4.0, "2g.20gb": 3.0, "3g.40gb": 2.0,
                    "4g.40gb": 1.0, "7g.80gb": 1.0}


def test_every_counter_of_the_pool_must_still_fit() -> None:
    # A 4g at 0 and a 1g at 4: three memory slices are left, and 3 x 16 of 132 multiprocessors.
    claims = [claim_obj("a", results=[(NVIDIA, "n1", "gpu-0-mig-4g40gb-5-0")]),
              claim_obj("b", results=[(NVIDIA, "n1", "gpu-0-mig-1g10gb-19-4")])]
    allocator = Allocator(cluster_state(partitionable_gpus("n1", H100), claims, NVIDIA_MIG, NVIDIA_GPU))
    assert allocator.placeable_claims("mig.nvidia.com") == 2  # 1g at 5 and at 6 (1g.20gb at 6 is after them)
    outcome = allocator.allocate(pending(request(device_class_name="gpu.nvidia.com")))
    assert not outcome.placeable and reasons(outcome) == {al.COUNTERS: 1}
    assert outcome.requests[0].blocked[0].details[0].startswith("n1/gpu-0-counter-set: ")  # node, then set


# --- CEL run-time errors fail the claim on the node (fix 6) --------------------------------------------------


def test_a_cel_runtime_error_on_a_device_the_search_reaches_fails_the_claim_on_that_node() -> None:
    by_profile = device_class("one-g", f"device.driver == '{NVIDIA}' && "
                                       f"device.attributes['{NVIDIA}'].profile == '1g.10gb'")
    state = cluster_state(partitionable_gpus("n1", H100), by_profile)
    # The whole GPU, first in the slice, has no profile attribute: the scheduler stops there.
    assert placeable(state, "one-g") == 0  # device by device, 7 placements looked free
    outcome = Allocator(state).allocate(pending(request(device_class_name="one-g")))
    assert not outcome.placeable and "CEL runtime error" in outcome.error and "gpu-0" in outcome.error
    assert reasons(outcome)[al.SELECTOR_ERROR] == 1
    frame = Capacity().frame(state, 0.0)
    assert values(frame, cat.CLUSTER_CLASS_ERRORS.name, "device_class") == {("one-g",): 1.0}


def test_an_allocated_device_is_skipped_before_cel_runs() -> None:
    by_profile = device_class("one-g", f"device.attributes['{NVIDIA}'].profile == '1g.10gb'")
    whole_taken = claim_obj("whole", results=[(NVIDIA, "n1", "gpu-0")])
    # The whole GPU is taken (its counters too: no partition of it fits), and the search no longer fails on it.
    state = cluster_state(partitionable_gpus("n1", H100), whole_taken, by_profile)
    assert placeable(state, "one-g") == 0
    outcome = Allocator(state).allocate(pending(request(device_class_name="one-g")))
    assert outcome.error == "" and reasons(outcome) == {al.COUNTERS: 7}


# --- shared capacity (fix 3) ---------------------------------------------------------------------------------


def test_a_shared_device_takes_a_second_share_and_refuses_the_third() -> None:
    policy = {"default": "30Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}
    device = slice_obj("s", EXAMPLE, "n1", [shared_gpu("n1", policy=policy)], node="n1")
    one_share = claim_obj("first", results=[(EXAMPLE, "n1", "gpu-0")], consumed={"memory": "30Gi"})
    state = cluster_state(device, one_share, EXAMPLE_GPU)
    assert placeable(state, "gpu.example.com") == 1
    frame = Capacity().frame(state, 0.0)
    assert values(frame, cat.CLUSTER_DEVICES.name, "state") == {("shared",): 1.0}
    assert values(frame, cat.CLUSTER_DEVICE_CAPACITY_LEFT.name, "capacity") == {("memory",): 50 * GIB}
    assert placeable(cluster_state(device, EXAMPLE_GPU), "gpu.example.com") == 2
    allocator = Allocator(state)
    second = allocator.allocate(pending(name="second"))
    assert second.placeable and second.picks[0].consumed_capacity == (("memory", 30 * GIB),)
    allocator.commit(second)
    third = allocator.allocate(pending(name="third"))
    assert not third.placeable and reasons(third) == {al.CAPACITY: 1}
    assert allocator.allocate(pending(request(capacity={"requests": {"memory": "20Gi"}}))).placeable


@pytest.mark.parametrize(("asked", "policy", "taken"), [
    (None, CapacityRequestPolicy(default=30 * GIB), 30 * GIB),
    (None, None, 80 * GIB),  # no policy: the whole capacity
    (10 * GIB, CapacityRequestPolicy(min=1 * GIB, step=4 * GIB), 13 * GIB),  # steps from min
    (0.5 * GIB, CapacityRequestPolicy(min=1 * GIB, step=4 * GIB), 1 * GIB),
    (10 * GIB, CapacityRequestPolicy(valid_values=(8 * GIB, 16 * GIB, 32 * GIB)), 16 * GIB),
    (10 * GIB, None, 10 * GIB),
])
def test_what_a_share_takes_by_request_policy(asked: float | None, policy: CapacityRequestPolicy | None,
                                             taken: float) -> None:
    assert consumed_amount(asked, 80 * GIB, policy) == taken


def test_a_share_over_the_policy_maximum_is_refused() -> None:
    policy = {"default": "10Gi", "validRange": {"min": "1Gi", "max": "40Gi"}}
    state = cluster_state(slice_obj("s", EXAMPLE, "n1", [shared_gpu("n1", policy=policy)], node="n1"), EXAMPLE_GPU)
    allocator = Allocator(state)
    assert not allocator.allocate(pending(request(capacity={"requests": {"memory": "50Gi"}}))).placeable
    assert allocator.allocate(pending(request(capacity={"requests": {"memory": "40Gi"}}))).placeable
    assert allocator.placeable_claims("gpu.example.com") == 8


# --- taints, admin access ------------------------------------------------------------------------------------


def test_taints_not_tolerated_skip_a_device_tolerated_ones_do_not() -> None:
    sl = example_gpus("n1", 3)
    sl["spec"]["devices"][0]["taints"] = [{"key": "ecc", "value": "bad", "effect": "NoSchedule"}]
    sl["spec"]["devices"][1]["taints"] = [{"key": "note", "effect": "None"}]
    rule = taint_rule("drain", EXAMPLE, "n1", "gpu-2", "maintenance", "NoExecute")
    state = cluster_state(sl, rule, EXAMPLE_GPU)
    allocator = Allocator(state)
    assert allocator.placeable_claims("gpu.example.com") == 1
    allocator.commit(allocator.allocate(pending(name="a")))
    outcome = allocator.allocate(pending(name="b"))
    assert reasons(outcome) == {al.TAINTED: 2, al.TAKEN: 1}
    assert set(outcome.requests[0].blocked[0].details) == {"ecc=bad:NoSchedule", "maintenance:NoExecute"}
    tolerant = allocator.allocate(pending(request(tolerations=[{"key": "ecc", "operator": "Exists"}])))
    assert tolerant.devices == ((EXAMPLE, "n1", "gpu-0"),)
    everything = allocator.allocate(pending(request(count=2, tolerations=[{"operator": "Exists"}])))
    assert everything.devices == ((EXAMPLE, "n1", "gpu-0"), (EXAMPLE, "n1", "gpu-2"))


def test_admin_access_uses_a_taken_device_and_takes_nothing() -> None:
    state = cluster_state(example_gpus("n1", 1), EXAMPLE_GPU, claim_obj("owner", results=[(EXAMPLE, "n1", "gpu-0")]),
                          claim_obj("monitor", results=[(EXAMPLE, "n1", "gpu-0")], admin=True))
    allocator = Allocator(state)
    assert not allocator.allocate(pending()).placeable
    admin = allocator.allocate(pending(request(adminAccess=True)))
    assert admin.placeable and admin.picks[0].admin_access
    assert placeable(cluster_state(example_gpus("n1", 1), EXAMPLE_GPU, claim_obj(
        "monitor", results=[(EXAMPLE, "n1", "gpu-0")], admin=True)), "gpu.example.com") == 1


# --- requests: modes, prioritized lists, constraints, classes ------------------------------------------------


def test_all_mode_takes_every_matching_device_and_refuses_an_incomplete_pool() -> None:
    state = cluster_state(example_gpus("n1", 3), EXAMPLE_GPU)
    outcome = Allocator(state).allocate(pending(request(allocationMode="All")))
    assert outcome.placeable and len(outcome.devices) == 3
    taken = cluster_state(example_gpus("n1", 3), EXAMPLE_GPU, claim_obj("a", results=[(EXAMPLE, "n1", "gpu-1")]))
    assert not Allocator(taken).allocate(pending(request(allocationMode="All"))).placeable
    incomplete = cluster_state(example_gpus("n1", 3, count=2), EXAMPLE_GPU)
    refused = Allocator(incomplete).allocate(pending(request(allocationMode="All")), "n1")
    assert "currently being updated" in refused.error


_SET = [{"name": "cs", "counters": {"memory": {"value": "8Gi"}}}]
_USES = [{"name": "p0", "consumesCounters": [{"counterSet": "cs", "counters": {"memory": {"value": "1Gi"}}}]}]


@pytest.mark.parametrize(("counter_pool", "fails"), [
    # Incomplete: the pool says two slices, only the counter set is published (on n2).
    ([slice_obj("c", NVIDIA, "n2", node="n2", count=2, counters=_SET)], "being updated"),
    # Invalid: the counter set published twice.
    ([slice_obj(f"c{i}", NVIDIA, "n2", node="n2", count=2, counters=_SET) for i in range(2)], "invalid"),
    # Complete, but a device on n2 consumes a counter set the pool does not publish.
    ([slice_obj("c", NVIDIA, "n2", node="n2", count=2, counters=[{"name": "other", "counters": {}}]),
      slice_obj("d", NVIDIA, "n2", _USES, node="n2", count=2)], "invalid"),
    # Two slices where the pool says one: incomplete on n2, but n1 gathers the counter set alone, one
    # slice as the pool says, so the pool is complete there.
    ([slice_obj("c", NVIDIA, "n2", node="n2", counters=_SET), slice_obj("d", NVIDIA, "n2", _USES, node="n2")], ""),
], ids=["incomplete", "invalid", "invalid-consumption", "complete-as-n1-sees-it"])
def test_a_pool_with_shared_counters_is_judged_on_every_node(counter_pool: list[dict[str, Any]], fails: str) -> None:
    """The scheduler gathers a slice of shared counters for every node, so such a pool, though of
    another driver and without a device on n1, fails an All request on n1 when it is incomplete or
    invalid as n1 sees it (by its counter-set slices; all its slices when those are too few); an
    ExactCount request passes it by, and a pool without counters elsewhere is not seen at all."""
    state = cluster_state(example_gpus("n1", 2), EXAMPLE_GPU, counter_pool)
    outcome = Allocator(state).allocate(pending(request(allocationMode="All")), "n1")
    if fails:
        assert not outcome.placeable and f"resource pool {NVIDIA}/n2 is currently {fails}" in outcome.error
    else:
        assert outcome.placeable and len(outcome.devices) == 2
    assert Allocator(state).allocate(pending(request()), "n1").placeable
    elsewhere = cluster_state(example_gpus("n1", 2), EXAMPLE_GPU, example_gpus("n2", 1, pool="other", count=2))
    assert Allocator(elsewhere).allocate(pending(request(allocationMode="All")), "n1").placeable


def test_a_prioritized_list_takes_the_first_subrequest_that_fits() -> None:
    state = cluster_state(partitionable_gpus("n1", H100), NVIDIA_GPU, NVIDIA_MIG,
                          claim_obj("whole", results=[(NVIDIA, "n1", "gpu-0-mig-1g10gb-19-0")]))
    claim = pending({"name": "gpu", "firstAvailable": [{"name": "big", "deviceClassName": "gpu.nvidia.com"},
                                                       {"name": "small", "deviceClassName": "mig.nvidia.com"}]})
    outcome = Allocator(state).allocate(claim)
    assert outcome.placeable and [(p.request, p.device[2]) for p in outcome.picks] == [
        ("gpu/small", "gpu-0-mig-1g10gb-19-1")]
    free = Allocator(cluster_state(partitionable_gpus("n1", H100), NVIDIA_GPU, NVIDIA_MIG)).allocate(claim)
    assert [(p.request, p.device[2]) for p in free.picks] == [("gpu/big", "gpu-0")]


def test_match_and_distinct_attribute_constraints() -> None:
    sl = example_gpus("n1", 4)
    for i, d in enumerate(sl["spec"]["devices"]):
        d["attributes"]["numa"] = {"int": i // 2 + (1 if i == 0 else 0)}  # numa: 1, 0, 1, 1
    state = cluster_state(sl, EXAMPLE_GPU)
    allocator = Allocator(state)
    same = allocator.allocate(pending(request(count=3), constraints=[{"matchAttribute": f"{EXAMPLE}/numa"}]))
    assert [d[2] for d in same.devices] == ["gpu-0", "gpu-2", "gpu-3"]  # backtracks past gpu-1
    distinct = allocator.allocate(pending(request(count=2), constraints=[{"distinctAttribute": f"{EXAMPLE}/numa"}]))
    assert [d[2] for d in distinct.devices] == ["gpu-0", "gpu-1"]
    # As kube-scheduler 1.36 does it: a request's device is compared with the one before it, not all.
    three = allocator.allocate(pending(request(count=3), constraints=[{"distinctAttribute": f"{EXAMPLE}/numa"}]))
    assert [d[2] for d in three.devices] == ["gpu-0", "gpu-1", "gpu-2"]
    # Across requests it holds: a second request finds no value the first one's device does not have.
    indexed = cluster_state(example_gpus("n1", 2), EXAMPLE_GPU)
    two = Allocator(indexed).allocate(pending(request("a"), request("b"),
                                           constraints=[{"distinctAttribute": f"{EXAMPLE}/index"}]))
    assert two.placeable
    sl = example_gpus("n1", 2)
    for d in sl["spec"]["devices"]:
        d["attributes"]["numa"] = {"int": 0}
    impossible = Allocator(cluster_state(sl, EXAMPLE_GPU)).allocate(pending(
        request("a"), request("b"), constraints=[{"distinctAttribute": f"{EXAMPLE}/numa"}]))
    assert not impossible.placeable and reasons(impossible, "a") == {al.CONSTRAINT: 2}


def test_request_selectors_and_a_missing_class() -> None:
    state = cluster_state(example_gpus("n1", 4), EXAMPLE_GPU)
    allocator = Allocator(state)
    picked = allocator.allocate(pending(request(selectors=[{"cel": {"expression": f"device.attributes['{EXAMPLE}']"
                                                                                   ".index >= 2"}}])))
    assert picked.devices == ((EXAMPLE, "n1", "gpu-2"),) and picked.requests[0].matching == 2
    missing = allocator.allocate(pending(request(device_class_name="nope")))
    assert not missing.placeable and "device class nope not found" in missing.error
    assert reasons(missing) == {al.CLASS_MISSING: 0}


def test_a_class_the_library_cannot_compile_is_not_evaluable() -> None:
    state = cluster_state(example_gpus("n1", 2), device_class("broken", "device.driver ==="))
    outcome = Allocator(state).allocate(pending(request(device_class_name="broken")))
    assert not outcome.placeable and "CEL compile error" in outcome.error
    assert placeable(state, "broken") == 0


# --- node selection ------------------------------------------------------------------------------------------


def test_node_selection_node_name_all_nodes_selector_and_per_device() -> None:
    local = example_gpus("n1", 1)
    everywhere = slice_obj("net", EXAMPLE, "net", [{"name": "shared-0"}], allNodes=True)
    by_label = slice_obj("rack", EXAMPLE, "rack", [{"name": "rack-0"}], nodeSelector={"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "rack", "operator": "In", "values": ["r1"]}]}]})
    per_device = slice_obj("pd", EXAMPLE, "pd", [{"name": "mine", "nodeName": "n2"}, {"name": "yours",
                                                                                      "nodeName": "n3"}],
                           perDeviceNodeSelection=True)
    state = cluster_state(local, everywhere, by_label, per_device, example_gpus("n2", 0), EXAMPLE_GPU)
    allocator = Allocator(state, node_labels={"n1": {"rack": "r1"}, "n2": {"rack": "r2"}, "n3": {}})
    seen = {n: sorted(d.key[2] for d in allocator.view(n)) for n in ("n1", "n2", "n3")}
    # A per-device slice is seen whole where one of its devices is; the others fail on the node check.
    assert seen == {"n1": ["gpu-0", "rack-0", "shared-0"], "n2": ["mine", "shared-0", "yours"],
                    "n3": ["mine", "shared-0", "yours"]}
    claim = pending(request(count=2))
    assert {d[2] for d in allocator.allocate(claim, "n2").devices} == {"mine", "shared-0"}
    assert not allocator.allocate(pending(request(count=3)), "n2").placeable
    assert allocator.placeable_claims("gpu.example.com") == 5


def test_counts_follow_commits_and_new_states_through_the_shared_cache() -> None:
    cache = al.AllocatorCache()
    state = cluster_state(example_gpus("n1", 3), EXAMPLE_GPU)
    allocator = Allocator(state, cache)
    assert allocator.placeable_claims("gpu.example.com") == 3
    allocator.commit(allocator.allocate(pending()))
    assert allocator.placeable_claims("gpu.example.com") == 2
    again = Allocator(state, cache)  # the same objects: counted from the cache, without the commit
    assert again.placeable_claims("gpu.example.com") == 3
    taken = cluster_state(example_gpus("n1", 3), EXAMPLE_GPU, claim_obj("a", results=[(EXAMPLE, "n1", "gpu-2")]))
    assert Allocator(replace(taken, slices=state.slices), cache).placeable_claims("gpu.example.com") == 2


# --- GPU-equivalents ----------------------------------------------------------------------------------------


def test_gpu_equivalents_add_up_to_the_gpus_and_split_a_partitioned_one_by_its_scarcest_counter() -> None:
    # GPU 0: a 3g at 0 and a 1g at 4 take 5 of 8 memory slices (the scarcest: 3/8 left); GPU 1 whole, taken;
    # an example GPU tainted; an incomplete example pool.
    claims = [claim_obj("a", results=[(NVIDIA, "n1", "gpu-0-mig-3g40gb-9-0")]),
              claim_obj("b", results=[(NVIDIA, "n1", "gpu-0-mig-1g10gb-19-4")]),
              claim_obj("c", results=[(NVIDIA, "n1", "gpu-1")])]
    tainted = example_gpus("n2", 2)
    tainted["spec"]["devices"][0]["taints"] = [{"key": "ecc", "effect": "NoSchedule"}]
    state = cluster_state(partitionable_gpus("n1", H100, gpus=2), claims, tainted,
                          example_gpus("n3", 2, count=2))
    got = values(Capacity().frame(state, 0.0), cat.CLUSTER_GPU_EQUIVALENTS.name, "node", "state")
    assert got == {("n1", "free"): 0.375, ("n1", "allocated"): 1.625, ("n1", "blocked"): 0.0,
                   ("n2", "free"): 1.0, ("n2", "blocked"): 1.0, ("n3", "blocked"): 2.0}


# --- the simulator's built-in cluster ---------------------------------------------------------------------


def test_the_builtin_cluster_counts_as_the_scheduler_would() -> None:
    from dra_exporter_sim.cluster import builtin_cluster

    state = cluster_state([o for o in builtin_cluster() if o["kind"] != "Pod"])
    frame = Capacity().frame(state, 0.0)
    placeable_by_class = {c: v for (c,), v in values(frame, cat.CLUSTER_CLASS_PLACEABLE.name, "device_class").items()}
    # The example driver: 7 free GPUs of sim-example-1 (none of the incomplete sim-example-2) and one more
    # 30Gi share of the shared GPU.
    assert placeable_by_class["gpu.example.com"] == 8
    assert placeable_by_class["tpu.example.com"] == 0
    # DynamicMIG on sim-node-2: the driver's counter sets carry one OFA engine, so one +me partition per
    # free GPU (GPU 1 is allocated whole).
    me = {gpu: v for (gpu, profile), v in values(frame, cat.CLUSTER_PARTITIONS_FIT.name, "counter_set",
                                                   "profile").items() if profile == "1g.18gb+me"}
    assert me == {f"gpu-{g}-counter-set": (0.0 if g == 1 else 1.0) for g in range(8)}


def test_shares_are_counted_not_placed_one_by_one() -> None:
    # A 1-byte default share of 80Gi: 85,899,345,920 claims, counted in no time (bounded work).
    device = slice_obj("s", EXAMPLE, "n1", [shared_gpu("n1", policy={"default": "1"})], node="n1")
    assert placeable(cluster_state(device, EXAMPLE_GPU), "gpu.example.com") == 80 * 2**30


def test_a_subrequest_over_the_result_limit_gives_way_to_a_smaller_one_without_a_search() -> None:
    """Upstream's prioritized-list-max-allocation-limit-request: two requests, each first asking 32 of 64
    devices, then 16. The scheduler drops a subrequest that would pass the 32-result limit as a whole
    (not device combination by device combination) and takes 16 + 16."""
    first_32_then_16 = [{"name": "sub32", "deviceClassName": "gpu.example.com", "allocationMode": "ExactCount",
                         "count": 32},
                        {"name": "sub16", "deviceClassName": "gpu.example.com", "allocationMode": "ExactCount",
                         "count": 16}]
    state = cluster_state(example_gpus("n1", 64), EXAMPLE_GPU, claim_obj("waiting", [
        {"name": "a", "firstAvailable": first_32_then_16}, {"name": "b", "firstAvailable": first_32_then_16}]))
    outcome = Allocator(state).allocate(state.claims[0], "n1")
    assert outcome.placeable, outcome.error
    assert [p.request for p in outcome.picks] == ["a/sub16"] * 16 + ["b/sub16"] * 16


def test_all_does_not_take_a_share_an_earlier_request_of_the_claim_used_up() -> None:
    """Upstream's consumable-capacity-...-allocation-mode-all-allocating-insufficient: two shareable
    devices of capacity 1; one request takes 1 of the first, then All (1 each) cannot have it."""
    devices = [{"name": f"gpu-{i}", "allowMultipleAllocations": True, "capacity": {"memory": {"value": "1"}}}
               for i in range(2)]
    one_each = {"requests": {"memory": "1"}}
    state = cluster_state(slice_obj("n1", EXAMPLE, "n1", devices, node="n1"), EXAMPLE_GPU, claim_obj("waiting", [
        request("a", capacity=one_each), request("b", allocationMode="All", capacity=one_each)]))
    outcome = Allocator(state).allocate(state.claims[0], "n1")
    assert not outcome.placeable and not outcome.error, outcome
