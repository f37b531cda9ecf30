"""The scheduler's node filters (``cluster/nodes.py``) as Kubernetes defines them, which node a slice or a
device is for, Nodes and pods' node filters as the cluster mode reads them, and the allocator's nodes
once Nodes are read. The same semantics against the real scheduler: tests/test_testbed_nodes.py."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from dra_layouts import (
    EXAMPLE,
    EXAMPLE_GPU,
    claim_obj,
    cluster_state,
    example_gpus,
    node_obj,
    request,
    slice_obj,
)
from simnode import eventually
from test_cluster_mode import cluster_server, cluster_source

from dra_exporter import catalog as cat
from dra_exporter.cluster import nodes as nf
from dra_exporter.cluster.allocator import Allocator
from dra_exporter.cluster.capacity import Capacity
from dra_exporter.model import (
    NO_NODE_FILTERS,
    ClusterNode,
    DeviceTaint,
    DeviceToleration,
    NodePlacement,
    PodNodeFilters,
)
from dra_exporter.sources.kubeapi_cluster import NODES_UNKNOWN
from dra_exporter.sources.kubeapi_normalize import (
    claim_from_dict,
    cluster_node_from_dict,
    cluster_pod_from_dict,
    node_selector,
    pod_node_filters,
)
from dra_exporter_sim.cluster import builtin_cluster

JSON = dict[str, Any]


def node(name: str = "n1", labels: dict[str, str] | None = None, taints: list[JSON] | None = None,
         unschedulable: bool = False) -> ClusterNode:
    return cluster_node_from_dict(node_obj(name, labels, taints=taints, unschedulable=unschedulable))


def pod(**spec: Any) -> PodNodeFilters:
    return pod_node_filters(spec)


def affinity(*terms: JSON) -> JSON:
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": list(terms)}}}


def expr(key: str, operator: str, *values: str) -> JSON:
    return {"key": key, "operator": operator, **({"values": list(values)} if values else {})}


def refused(filters: PodNodeFilters, n: ClusterNode) -> str | None:
    why = nf.refusal(filters, n)
    return None if why is None else f"{why.plugin}: {why.message}"


AFFINITY = f"{nf.NODE_AFFINITY}: {nf.AFFINITY_MESSAGE}"


# --- NodeAffinity: nodeSelector and required node affinity ------------------------------------------------


def test_a_pod_without_filters_goes_anywhere_and_shares_one_record() -> None:
    assert pod() is NO_NODE_FILTERS
    assert pod(nodeSelector={}, tolerations=[]) is NO_NODE_FILTERS
    assert refused(pod(), node()) is None


def test_node_selector_needs_every_label_with_its_value() -> None:
    filters = pod(nodeSelector={"gpu": "h100", "zone": "a"})
    assert refused(filters, node(labels={"gpu": "h100", "zone": "a", "more": "x"})) is None
    assert refused(filters, node(labels={"gpu": "h100"})) == AFFINITY
    assert refused(filters, node(labels={"gpu": "h100", "zone": "b"})) == AFFINITY


def test_terms_are_ored_and_a_terms_expressions_anded() -> None:
    filters = pod(affinity=affinity({"matchExpressions": [expr("gpu", "In", "h100", "h200"), expr("zone", "In", "a")]},
                                    {"matchExpressions": [expr("spare", "Exists")]}))
    assert refused(filters, node(labels={"gpu": "h200", "zone": "a"})) is None  # first term
    assert refused(filters, node(labels={"spare": ""})) is None  # second term
    assert refused(filters, node(labels={"gpu": "h200", "zone": "b"})) == AFFINITY  # first term half met


def test_node_selector_and_affinity_must_both_hold() -> None:
    filters = pod(nodeSelector={"zone": "a"}, affinity=affinity({"matchExpressions": [expr("gpu", "Exists")]}))
    assert refused(filters, node(labels={"zone": "a", "gpu": "x"})) is None
    assert refused(filters, node(labels={"zone": "a"})) == AFFINITY
    assert refused(filters, node(labels={"gpu": "x"})) == AFFINITY


@pytest.mark.parametrize(("requirement", "labels", "admitted"), [
    (expr("gpu", "In", "a", "b"), {"gpu": "b"}, True),
    (expr("gpu", "In", "a"), {}, False),
    (expr("gpu", "NotIn", "a"), {"gpu": "b"}, True),
    (expr("gpu", "NotIn", "a"), {}, True),  # absent: not in
    (expr("gpu", "NotIn", "a"), {"gpu": "a"}, False),
    (expr("gpu", "Exists"), {"gpu": ""}, True),
    (expr("gpu", "Exists"), {}, False),
    (expr("gpu", "DoesNotExist"), {}, True),
    (expr("gpu", "DoesNotExist"), {"gpu": "a"}, False),
    (expr("count", "Gt", "4"), {"count": "8"}, True),
    (expr("count", "Gt", "8"), {"count": "8"}, False),
    (expr("count", "Lt", "8"), {"count": "4"}, True),
    (expr("count", "Gt", "4"), {"count": "many"}, False),  # not an integer: no match
    (expr("count", "Gt", "4"), {}, False),
], ids=lambda v: str(v))
def test_match_expression_operators(requirement: JSON, labels: dict[str, str], admitted: bool) -> None:
    filters = pod(affinity=affinity({"matchExpressions": [requirement]}))
    assert (refused(filters, node(labels=labels)) is None) == admitted


def test_match_fields_select_the_node_by_name_and_an_empty_term_selects_nothing() -> None:
    by_name = pod(affinity=affinity({"matchFields": [expr("metadata.name", "NotIn", "n2")]}))
    assert refused(by_name, node("n1")) is None
    assert refused(by_name, node("n2")) == AFFINITY
    assert refused(pod(affinity=affinity({})), node()) == AFFINITY


def test_terms_that_name_nodes_leave_the_others_unfiltered_in_words_of_their_own() -> None:
    # As the scheduler's PreFilter: the cordoned n3 is not "unschedulable" but left out.
    by_name = pod(affinity=affinity({"matchFields": [expr("metadata.name", "In", "n1", "n2")]},
                                    {"matchFields": [expr("metadata.name", "In", "n4")]}))
    assert nf.prefilter_names(by_name) == {"n1", "n2", "n4"}
    assert refused(by_name, node("n2")) is None
    assert refused(by_name, node("n3", unschedulable=True)) == f"{nf.NODE_AFFINITY}: {nf.PREFILTER_MESSAGE}"
    assert refused(by_name, node("n4", unschedulable=True)) == f"{nf.NODE_UNSCHEDULABLE}: {nf.UNSCHEDULABLE_MESSAGE}"
    # One term that names no node: every node may match, no narrowing.
    either = pod(affinity=affinity({"matchFields": [expr("metadata.name", "In", "n1")]},
                                   {"matchExpressions": [expr("gpu", "Exists")]}))
    assert nf.prefilter_names(either) is None
    assert refused(either, node("n3")) == AFFINITY
    admitted = nf.NodeFilters([node("n1"), node("n2", unschedulable=True), node("n3", unschedulable=True),
                               node("n5")]).admission(by_name)
    assert admitted.nodes == {"n1"}
    assert dict(admitted.refused) == {nf.UNSCHEDULABLE_MESSAGE: 1, nf.PREFILTER_MESSAGE: 2}


# --- TaintToleration and NodeUnschedulable ------------------------------------------------------------------


def taint(key: str, effect: str, value: str = "") -> JSON:
    return {"key": key, "value": value, "effect": effect}


@pytest.mark.parametrize(("effect", "refuses"), [("NoSchedule", True), ("NoExecute", True),
                                                 ("PreferNoSchedule", False)])
def test_only_no_schedule_and_no_execute_taints_refuse(effect: str, refuses: bool) -> None:
    n = node(taints=[taint("gpu", effect, "broken")])
    expected = f"{nf.TAINT_TOLERATION}: node(s) had untolerated taint(s)" if refuses else None
    assert refused(pod(), n) == expected
    if refuses:
        assert nf.refusal(pod(), n) == nf.Refusal(nf.TAINT_TOLERATION, nf.TAINT_MESSAGE, f"gpu=broken:{effect}")


@pytest.mark.parametrize(("toleration", "tolerated"), [
    ({"key": "gpu", "operator": "Exists"}, True),
    ({"key": "gpu", "operator": "Equal", "value": "broken"}, True),
    ({"key": "gpu", "value": "broken"}, True),  # no operator: Equal
    ({"key": "gpu", "operator": "Equal", "value": "fine"}, False),
    ({"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}, True),
    ({"key": "gpu", "operator": "Exists", "effect": "NoExecute"}, False),  # another effect
    ({"operator": "Exists"}, True),  # empty key with Exists: every taint
    ({"key": "other", "operator": "Exists"}, False),
], ids=lambda v: str(v))
def test_tolerations(toleration: JSON, tolerated: bool) -> None:
    n = node(taints=[taint("gpu", "NoSchedule", "broken")])
    assert (refused(pod(tolerations=[toleration]), n) is None) == tolerated


def test_every_refusing_taint_must_be_tolerated_the_first_untolerated_is_named() -> None:
    n = node(taints=[taint("a", "NoSchedule"), taint("b", "NoExecute", "x"), taint("c", "PreferNoSchedule")])
    assert nf.refusal(pod(tolerations=[{"key": "a", "operator": "Exists"}]), n) == \
        nf.Refusal(nf.TAINT_TOLERATION, nf.TAINT_MESSAGE, "b=x:NoExecute")
    both = pod(tolerations=[{"key": "a", "operator": "Exists"}, {"key": "b", "operator": "Exists"}])
    assert refused(both, n) is None


def test_a_cordoned_node_refuses_unless_the_pod_tolerates_the_unschedulable_taint() -> None:
    cordoned = node(unschedulable=True)
    assert refused(pod(), cordoned) == f"{nf.NODE_UNSCHEDULABLE}: {nf.UNSCHEDULABLE_MESSAGE}"
    tolerant = pod(tolerations=[{"key": "node.kubernetes.io/unschedulable", "operator": "Exists",
                                 "effect": "NoSchedule"}])
    assert refused(tolerant, cordoned) is None
    assert refused(pod(tolerations=[{"operator": "Exists"}]), cordoned) is None
    # A NoExecute-only toleration of the key does not cover the NoSchedule the cordon stands for.
    assert refused(pod(tolerations=[{"key": "node.kubernetes.io/unschedulable", "operator": "Exists",
                                     "effect": "NoExecute"}]), cordoned) is not None


def test_filters_run_in_the_schedulers_order_first_refusal_wins() -> None:
    n = node(labels={}, taints=[taint("gpu", "NoSchedule")], unschedulable=True)
    filters = pod(nodeSelector={"zone": "a"})
    assert refused(filters, n) == f"{nf.NODE_UNSCHEDULABLE}: {nf.UNSCHEDULABLE_MESSAGE}"
    assert refused(filters, node(taints=[taint("gpu", "NoSchedule")])).startswith(nf.TAINT_TOLERATION)  # type: ignore[union-attr]


def test_admission_over_many_nodes_counts_refusals_as_the_scheduler_sums_them() -> None:
    nodes = [node("a", {"gpu": "yes"}), node("b", {"gpu": "yes"}, taints=[taint("t", "NoSchedule")]),
             node("c"), node("d", unschedulable=True)]
    filters = nf.NodeFilters(nodes)
    gpu = pod(nodeSelector={"gpu": "yes"})
    admitted = filters.admission(gpu)
    assert admitted.nodes == {"a"}
    assert dict(admitted.refused) == {nf.AFFINITY_MESSAGE: 1, nf.TAINT_MESSAGE: 1, nf.UNSCHEDULABLE_MESSAGE: 1}
    assert filters.admission(gpu) is admitted, "one answer per distinct filters"
    assert filters.admission(pod()).nodes == {"a", "c"}
    assert nf.summary(dict(admitted.refused), 4) == (
        "0/4 nodes are available: 1 node(s) didn't match Pod's node affinity/selector, "
        "1 node(s) had untolerated taint(s), 1 node(s) were unschedulable.")


# --- which node a slice is for --------------------------------------------------------------------------------


SELECTOR = node_selector({"nodeSelectorTerms": [{"matchExpressions": [expr("rack", "In", "r1")]}]})


def test_a_slices_node_selector_is_judged_on_the_nodes_labels_and_taken_as_met_when_unknown() -> None:
    placement = NodePlacement(node_selector=SELECTOR)
    assert nf.placement_serves(placement, "n1", {"rack": "r1"})
    assert not nf.placement_serves(placement, "n1", {"rack": "r2"})
    assert nf.placement_serves(placement, "n1", None), "labels unknown: never counted out"
    by_name = NodePlacement(node_selector=node_selector({"nodeSelectorTerms": [
        {"matchFields": [expr("metadata.name", "In", "n1")]}]}))
    assert nf.placement_serves(by_name, "n1", None) and not nf.placement_serves(by_name, "n2", None)
    assert not nf.placement_serves(NodePlacement(), "n1", {}), "nothing set: a future field, skipped"


def test_the_allocator_sees_a_label_selected_slice_only_on_nodes_with_the_label_once_nodes_are_read() -> None:
    by_label = slice_obj("rack", EXAMPLE, "rack", [{"name": "rack-0"}, {"name": "rack-1"}], nodeSelector={
        "nodeSelectorTerms": [{"matchExpressions": [expr("rack", "In", "r1")]}]})
    objects = [by_label, example_gpus("n2", 1), EXAMPLE_GPU]
    unknown = Allocator(cluster_state(*objects))
    assert unknown.nodes == ("n2",) and {d.key[2] for d in unknown.view("n2")} == {"gpu-0", "rack-0", "rack-1"}
    known = Allocator(cluster_state(*objects, node_obj("n1", {"rack": "r1"}), node_obj("n2", {"rack": "r2"})))
    assert known.nodes == ("n1", "n2")
    assert {d.key[2] for d in known.view("n1")} == {"rack-0", "rack-1"}
    assert {d.key[2] for d in known.view("n2")} == {"gpu-0"}
    two = claim_from_dict(claim_obj("two", [request(count=2)]), "v1")
    three = claim_from_dict(claim_obj("three", [request(count=3)]), "v1")
    assert unknown.allocate(three).placeable, "labels unknown: the rack counts for n2 too"
    assert not known.allocate(three).placeable, "n1 has the rack's two, n2 its own one"
    assert known.allocate(two).node == "n1"
    assert known.placeable_claims("gpu.example.com") == 3


def test_with_nodes_read_the_allocator_places_only_on_nodes_that_exist() -> None:
    objects = [example_gpus("gone", 2), example_gpus("here", 1), EXAMPLE_GPU]
    assert Allocator(cluster_state(*objects)).placeable_claims("gpu.example.com") == 3
    allocator = Allocator(cluster_state(*objects, node_obj("here")))
    assert allocator.nodes == ("here",)
    assert allocator.placeable_claims("gpu.example.com") == 1
    assert not allocator.allocate(claim_from_dict(claim_obj("two", [request(count=2)]), "v1")).placeable


def test_per_device_node_selection_by_label() -> None:
    per_device = slice_obj("pd", EXAMPLE, "pd", [
        {"name": "r1-dev", "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [expr("rack", "In", "r1")]}]}},
        {"name": "all-dev", "allNodes": True}], perDeviceNodeSelection=True)
    state = cluster_state(per_device, EXAMPLE_GPU, node_obj("n1", {"rack": "r1"}), node_obj("n2"))
    allocator = Allocator(state)
    one = claim_from_dict(claim_obj("one", [request(count=2)]), "v1")
    assert allocator.allocate(one, "n1").placeable
    outcome = allocator.allocate(one, "n2")
    assert not outcome.placeable
    assert {b.reason for b in outcome.requests[0].blocked} == {"node_constraint"}


# --- what the cluster mode reads ---------------------------------------------------------------------------------


def test_a_node_keeps_its_name_labels_taints_and_cordon_only() -> None:
    raw = node_obj("n1", {"gpu": "h100"}, taints=[taint("gpu", "NoSchedule", "x")], unschedulable=True)
    raw["status"] = {"capacity": {"cpu": "64"}, "images": [{"names": ["big"] * 50}]}
    got = cluster_node_from_dict(raw)
    assert got == ClusterNode("n1", (("gpu", "h100"), ("kubernetes.io/hostname", "n1")),
                              (DeviceTaint("gpu", "x", "NoSchedule"),), True)


def test_a_pod_keeps_its_node_selector_required_affinity_and_tolerations() -> None:
    preferred = {"preferredDuringSchedulingIgnoredDuringExecution": [
        {"weight": 1, "preference": {"matchExpressions": [expr("zone", "In", "a")]}}]}
    raw = {"metadata": {"namespace": "ml", "name": "p"},
           "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": "c"}], "nodeSelector": {"gpu": "h100"},
                    "affinity": {"nodeAffinity": {**affinity({"matchExpressions": [expr("rack", "Exists")]})[
                        "nodeAffinity"], **preferred}},
                    "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule",
                                     "tolerationSeconds": 30}]}}
    filters = cluster_pod_from_dict(raw).node_filters
    assert filters.node_selector == (("gpu", "h100"),)
    assert filters.affinity is not None and filters.affinity.terms[0].match_expressions[0].key == "rack"
    assert filters.tolerations == (DeviceToleration("gpu", "Exists", "", "NoSchedule"),)
    only_preferred = {**raw, "spec": {**raw["spec"], "nodeSelector": {}, "tolerations": [],
                                      "affinity": {"nodeAffinity": preferred}}}
    assert cluster_pod_from_dict(only_preferred).node_filters is NO_NODE_FILTERS, "preferred terms only score"


def test_the_simulated_cluster_serves_its_nodes_and_the_source_reads_them() -> None:
    extra = node_obj("cordoned", {"gpu": "none"}, taints=[taint("maintenance", "NoExecute")], unschedulable=True)
    with cluster_server((*builtin_cluster(), extra)) as server, cluster_source(server) as src:
        state = src.collect()
    assert state.nodes is not None
    served = sorted(o["metadata"]["name"] for o in (*builtin_cluster(), extra) if o["kind"] == "Node")
    assert [n.name for n in state.nodes] == served
    (cordoned,) = [n for n in state.nodes if n.name == "cordoned"]
    assert cordoned.unschedulable and cordoned.taints == (DeviceTaint("maintenance", "", "NoExecute"),)
    frame = Capacity().frame(state, 0.0)
    objects = {dict(s.labels)["kind"]: s.value for s in frame.family(cat.CLUSTER_OBJECTS.name).samples}  # type: ignore[union-attr]
    assert objects["Node"] == len(served)


def test_nodes_forbidden_the_rest_is_read_node_filters_unknown_one_warning(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    with cluster_server(forbidden=("nodes",)) as server, cluster_source(server) as src:
        state = src.collect()  # no PartialSnapshot: the source is up
        assert state.nodes is None and state.slices and state.pods
        # Listed again after a backoff, and still one warning.
        eventually(lambda: src.collect() is not None and server.requests[("list", "nodes")] >= 3, timeout=5)
    warnings = [r.getMessage() for r in caplog.records if "Nodes not read" in r.getMessage()]
    assert len(warnings) == 1, warnings
    assert "forbidden (403)" in warnings[0] and NODES_UNKNOWN in warnings[0]
    frame = Capacity().frame(state, 0.0)
    kinds = {dict(s.labels)["kind"] for s in frame.family(cat.CLUSTER_OBJECTS.name).samples}  # type: ignore[union-attr]
    assert "Node" not in kinds


def test_a_dump_without_nodes_is_served_without_them_node_filters_unknown_not_an_empty_cluster() -> None:
    objects = tuple(o for o in builtin_cluster() if o["kind"] != "Node")
    with cluster_server(objects) as server, cluster_source(server) as src:
        state = src.collect()
        assert server.forbidden == {"nodes"}
    assert state.nodes is None
    allocator = Allocator(state)
    assert allocator.nodes, "the nodes its slices name, as before Nodes were read"
    assert allocator.placeable_claims("gpu.nvidia.com") > 0


@pytest.mark.parametrize("spec", [
    {}, {"nodeSelector": {"rack": "r1"}}, {"nodeSelector": {"rack": "r1", "gpu": "yes"}},
    {"nodeSelector": {"kubernetes.io/hostname": "n3"}}, {"nodeSelector": {"rack": "nowhere"}},
    {"affinity": affinity({"matchFields": [expr("metadata.name", "In", "n1", "n5")]})},
    {"affinity": affinity({"matchExpressions": [expr("rack", "In", "r2")]},
                          {"matchExpressions": [expr("gpu", "DoesNotExist")]})},
    {"affinity": affinity({"matchExpressions": [expr("rack", "In", "r1", "r2"), expr("gpu", "Exists")]}),
     "nodeSelector": {"gpu": "yes"}},
    {"affinity": affinity({})},
    {"nodeSelector": {"rack": "r1"}, "tolerations": [{"operator": "Exists"}]},
], ids=str)
def test_admission_through_the_label_index_equals_checking_every_node(spec: JSON) -> None:
    nodes = [node(f"n{i}", {"rack": f"r{i % 3}", **({"gpu": "yes"} if i % 2 else {})},
                  taints=[taint("t", "NoSchedule")] if i % 4 == 0 else None, unschedulable=i % 5 == 0)
             for i in range(12)]
    filters = pod(**spec)
    admitted = nf.NodeFilters(nodes).admission(filters)
    every: dict[str, int] = {}
    for n in nodes:
        why = nf.refusal(filters, n)
        if why is not None:
            every[why.message] = every.get(why.message, 0) + 1
    assert admitted.nodes == {n.name for n in nodes if nf.refusal(filters, n) is None}
    assert dict(admitted.refused) == every
