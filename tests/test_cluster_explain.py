"""``dra-exporter explain``: why a claim is pending, from the allocator's outcome (cluster/explain.py)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from dra_layouts import (
    EXAMPLE,
    EXAMPLE_GPU,
    H100,
    NVIDIA,
    NVIDIA_GPU,
    NVIDIA_MIG,
    claim_obj,
    cluster_state,
    device_class,
    example_gpus,
    partitionable_gpus,
    request,
    taint_rule,
)

from dra_exporter.cluster.explain import (
    ClaimNotFound,
    explain,
    first_blocking,
    parse_target,
    render_json,
    render_text,
)
from dra_exporter.model import ClusterPod


def _one(state, name: str = "waiting"):  # type: ignore[no-untyped-def]
    """The outcome for ml/<name>, a pod waiting for it (as a pending claim has)."""
    state = replace(state, pods=(*state.pods, ClusterPod("ml", f"{name}-pod", claims=(name,))))
    (outcome,) = explain(state, [("ml", name)])
    assert outcome.pod_waits is True
    return outcome


def test_devices_held_by_other_claims_are_the_blocking_reason_with_their_holders() -> None:
    state = cluster_state(EXAMPLE_GPU, example_gpus("n1", 2),
                          claim_obj("a", results=[(EXAMPLE, "n1", "gpu-0")]),
                          claim_obj("b", results=[(EXAMPLE, "n1", "gpu-1")]), claim_obj("waiting"))
    outcome = _one(state)
    assert not outcome.placeable and first_blocking(outcome) == ("gpu", "taken")
    text = render_text([outcome])
    assert text.splitlines()[:2] == [
        "ml/waiting: NOT placeable (1 node tried)",
        "  blocked first by: request gpu: 2 of 2 matching devices: allocated to other claims (ml/a, ml/b) [taken]"]


def test_a_placeable_claim_says_where() -> None:
    state = cluster_state(EXAMPLE_GPU, example_gpus("n1", 2), claim_obj("a", results=[(EXAMPLE, "n1", "gpu-0")]),
                          claim_obj("waiting"))
    outcome = _one(state)
    assert outcome.placeable and first_blocking(outcome) is None
    assert render_text([outcome]) == "ml/waiting: placeable now, on node n1: n1/gpu-1\n"
    got = json.loads(render_json([outcome], single=True))
    assert (got["placeable"], got["node"], got["devices"], got["blocking"]) == (True, "n1", [f"{EXAMPLE}/n1/gpu-1"],
                                                                             None)


def test_a_missing_class_blocks_first() -> None:
    state = cluster_state(EXAMPLE_GPU, example_gpus("n1", 1), claim_obj("waiting", [request("gpu", "no-such-class")]))
    outcome = _one(state)
    assert first_blocking(outcome) == ("gpu", "class_missing")
    assert "device class no-such-class does not exist" in render_text([outcome]).splitlines()[1]


def test_an_untolerated_taint_names_the_taint() -> None:
    state = cluster_state(EXAMPLE_GPU, example_gpus("n1", 1),
                          taint_rule("drain", EXAMPLE, "n1", "gpu-0", "maintenance", "NoSchedule"),
                          claim_obj("waiting"))
    outcome = _one(state)
    assert first_blocking(outcome) == ("gpu", "tainted")
    assert "maintenance" in render_text([outcome]).splitlines()[1]


def test_partitions_of_a_gpu_in_use_block_the_whole_gpu_by_its_counters() -> None:
    state = cluster_state(NVIDIA_GPU, NVIDIA_MIG, partitionable_gpus("n1", H100),
                          claim_obj("small", [request("gpu", "mig.nvidia.com")], results=[
                              (NVIDIA, "n1", "gpu-0-mig-1g10gb-19-0")]),
                          claim_obj("waiting", [request("gpu", "gpu.nvidia.com")]))
    outcome = _one(state)
    assert first_blocking(outcome) == ("gpu", "counters_exhausted")
    assert "(n1/gpu-0-counter-set: " in render_text([outcome])  # its node: every node has a GPU 0


def test_counter_sets_of_two_nodes_are_told_apart() -> None:
    state = cluster_state(NVIDIA_GPU, NVIDIA_MIG, partitionable_gpus("n1", H100), partitionable_gpus("n2", H100),
                          *(claim_obj(f"small-{n}", [request("gpu", "mig.nvidia.com")],
                                      results=[(NVIDIA, n, "gpu-0-mig-1g10gb-19-0")]) for n in ("n1", "n2")),
                          claim_obj("waiting", [request("gpu", "gpu.nvidia.com")]))
    text = render_text([_one(state)])
    assert "n1/gpu-0-counter-set" in text and "n2/gpu-0-counter-set" in text, text


def test_a_whole_gpu_allocated_is_not_called_other_partitions() -> None:
    state = cluster_state(NVIDIA_GPU, NVIDIA_MIG, partitionable_gpus("n1", H100),
                          claim_obj("whole", [request("gpu", "gpu.nvidia.com")], results=[(NVIDIA, "n1", "gpu-0")]),
                          claim_obj("waiting", [request("gpu", "mig.nvidia.com")]))
    outcome = _one(state)
    assert first_blocking(outcome) == ("gpu", "counters_exhausted")
    text = render_text([outcome])
    assert "other partitions" not in text and "the whole GPU or partitions" in text, text


def test_devices_a_selector_fails_on_are_not_counted_as_of_the_matching_ones() -> None:
    by_profile = device_class("one-g", f"device.driver == '{NVIDIA}' && "
                                       f"device.attributes['{NVIDIA}'].profile == '1g.10gb'")
    state = cluster_state(partitionable_gpus("n1", H100), by_profile,
                          claim_obj("waiting", [request("gpu", "one-g")]))
    outcome = _one(state)
    assert first_blocking(outcome) == ("gpu", "selector_not_evaluable")
    line = render_text([outcome]).splitlines()[1]
    assert "matching devices" not in line and "1 device: the class's or the request's CEL fails" in line, line


def test_a_missing_class_names_the_nearest_one_there_is() -> None:
    state = cluster_state(NVIDIA_GPU, NVIDIA_MIG, EXAMPLE_GPU, example_gpus("n1", 1),
                          claim_obj("waiting", [request("gpu", "gpu.nvidia.con")]),
                          claim_obj("far", [request("gpu", "tpu.google.com")]))
    typo, far = explain(state, [("ml", "waiting"), ("ml", "far")])
    assert "does not exist: did you mean gpu.nvidia.com? [class_missing]" in render_text([typo])
    assert "did you mean" not in render_text([far])  # nothing near: no guess


def test_too_few_matching_devices() -> None:
    state = cluster_state(EXAMPLE_GPU, example_gpus("n1", 1), claim_obj("waiting", [request("gpu", EXAMPLE, 2)]))
    assert first_blocking(_one(state)) == ("gpu", "too_few_devices")
    none = cluster_state(device_class("tpu", "device.driver == 'tpu.example.com'"), example_gpus("n1", 1),
                         claim_obj("waiting", [request("gpu", "tpu")]))
    assert first_blocking(_one(none)) == ("gpu", "no_matching_device")


def test_all_explains_every_unallocated_claim_in_order_and_an_allocated_one_says_so() -> None:
    state = cluster_state(EXAMPLE_GPU, example_gpus("n1", 1), claim_obj("z"), claim_obj("a", namespace="dev"),
                          claim_obj("done", results=[(EXAMPLE, "n1", "gpu-0")]))
    assert [(o.namespace, o.claim) for o in explain(state)] == [("dev", "a"), ("ml", "z")]
    assert render_text(explain(state, [("ml", "done")])) == "ml/done: already allocated (nothing to explain)\n"
    assert "no pod waits for it" in render_text(explain(state, [("ml", "z")]))
    assert json.loads(render_json(explain(state), single=False))[0]["claim"] == "a"
    assert render_text([]) == "no unallocated ResourceClaims in the cluster\n"


def test_a_claim_that_does_not_exist_and_bad_names_are_errors() -> None:
    state = cluster_state(EXAMPLE_GPU, example_gpus("n1", 1))
    with pytest.raises(ClaimNotFound, match="no ResourceClaim or Pod ml/nope"):
        explain(state, [("ml", "nope")])
    for bad in ("nope", "/x", "ml/", "a/b/c"):
        with pytest.raises(ValueError, match="expected NAMESPACE/CLAIM"):
            parse_target(bad)
    assert parse_target("ml/train") == ("ml", "train")


# --- the examples in docs/operating.md ("Why is my claim pending?") are what explain prints -----------

def _waiting(state, *names: str):  # type: ignore[no-untyped-def]
    return replace(state, pods=tuple(ClusterPod("ml", f"{n}-0", claims=(n,)) for n in names))


def _docs_examples() -> dict[str, Any]:
    held = [(EXAMPLE, "node-a", f"gpu-{i}") for i in range(2)]
    slices = example_gpus("node-a", 2)
    incomplete = example_gpus("node-b", 2, count=2)  # one slice of two published: a driver mid-update
    return {
        "taken": _waiting(cluster_state(
            EXAMPLE_GPU, slices, claim_obj("train-a", results=held[:1]), claim_obj("train-b", results=held[1:]),
            claim_obj("train-c")), "train-c"),
        "counters": _waiting(cluster_state(
            NVIDIA_GPU, NVIDIA_MIG, partitionable_gpus("node-h", H100),
            claim_obj("notebook", [request("gpu", "mig.nvidia.com")],
                      results=[(NVIDIA, "node-h", "gpu-0-mig-3g40gb-9-0")]),
            claim_obj("big-job", [request("gpu", "gpu.nvidia.com")])), "big-job"),
        "tainted": _waiting(cluster_state(
            EXAMPLE_GPU, example_gpus("node-a", 1),
            taint_rule("drain-node-a", EXAMPLE, "node-a", "gpu-0", "example.com/maintenance", "NoSchedule"),
            claim_obj("eval")), "eval"),
        "class-missing": _waiting(cluster_state(
            EXAMPLE_GPU, NVIDIA_GPU, slices, claim_obj("typo", [request("gpu", "gpu.nvidia.con")])), "typo"),
        "pool-incomplete": _waiting(cluster_state(
            EXAMPLE_GPU, incomplete, claim_obj("four", [request("gpu", EXAMPLE, 2)])), "four"),
    }


def test_the_examples_in_the_operating_docs_are_what_explain_prints() -> None:
    text = (Path(__file__).resolve().parents[1] / "docs" / "operating.md").read_text()
    for name, state in _docs_examples().items():
        marker = f"<!-- explain:{name} -->\n```\n"
        assert marker in text, f"docs/operating.md lacks the {name} example"
        start = text.index(marker) + len(marker)
        shown = text[start:text.index("```", start)]
        claim = next(c for c in state.claims if not c.allocated)
        assert shown == render_text(explain(state, [(claim.namespace, claim.name)])), name


def test_pending_reasons_ask_a_few_claim_shapes_a_frame_until_every_one_has_an_answer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from dra_exporter import catalog as cat
    from dra_exporter.cluster import explain as why
    from dra_exporter.cluster.capacity import Capacity

    monkeypatch.setattr(why, "MAX_SHAPES_PER_FRAME", 2)
    names = [f"c{n}" for n in range(5)]
    asks = [claim_obj(name, [request("gpu", EXAMPLE, n + 2)]) for n, name in enumerate(names)]
    state = _waiting(cluster_state(EXAMPLE_GPU, example_gpus("node-a", 1), *asks), *names)  # 2 … 6 GPUs of 1
    capacity = Capacity()
    answered = []
    for t in range(4):  # the same state each frame
        frame = capacity.frame(state, 1_000.0 + t)
        answered.append(len(frame.family(cat.CLUSTER_CLAIM_PENDING_REASON.name).samples))
    assert answered == [2, 4, 5, 5]


def test_one_frame_of_cluster_once_has_every_pending_claims_reason() -> None:
    from dra_exporter import catalog as cat
    from dra_exporter.cluster.capacity import Capacity
    from dra_exporter.cluster.explain import MAX_SHAPES_PER_FRAME
    from dra_exporter.cluster.runtime import CLUSTER
    from dra_exporter.config import ClusterSettings
    from dra_exporter.environment import Environment

    names = [f"c{n}" for n in range(MAX_SHAPES_PER_FRAME + 7)]  # 10 pending claims, each its own shape
    asks = [claim_obj(name, [request("gpu", EXAMPLE, n + 2)]) for n, name in enumerate(names)]
    state = _waiting(cluster_state(EXAMPLE_GPU, example_gpus("node-a", 1), *asks), *names)

    def reasons(capacity: Capacity) -> int:
        frame = capacity.frame(state, 1_000.0)
        return len(frame.family(cat.CLUSTER_CLAIM_PENDING_REASON.name).samples)

    assert reasons(Capacity()) == MAX_SHAPES_PER_FRAME  # serving: a few shapes a frame, the rest next frames
    assert reasons(Capacity(every_reason=True)) == len(names)
    core = CLUSTER.core(ClusterSettings(once=True), Environment(context=None))  # type: ignore[arg-type]
    assert reasons(core.capacity) == len(names)  # type: ignore[attr-defined]  # what `cluster --once` prints


def test_cluster_once_evaluates_every_class_in_its_one_frame() -> None:
    """The CEL time budget spreads classes over frames; ``--once`` has one frame: no budget there."""
    from dra_exporter.cluster.runtime import CLUSTER
    from dra_exporter.config import ClusterSettings
    from dra_exporter.environment import Environment

    def budget(once: bool) -> float | None:
        core = CLUSTER.core(ClusterSettings(once=once), Environment(context=None))  # type: ignore[arg-type]
        return core.capacity._matches.queue.budget  # type: ignore[attr-defined,no-any-return]

    assert budget(once=False) is not None, "serving: a frame's class CEL is bounded"
    assert budget(once=True) is None


# --- what a verdict covers of the scheduler's filters ------------------------------------------------------


def test_the_verdict_names_the_scheduler_filters_it_covers_and_those_it_does_not() -> None:
    from dra_exporter.cluster import explain as why

    read, unread = why.coverage(True), why.coverage(False)
    for covers in (read, unread):
        assert set(why.NEVER_COVERED) <= set(covers.not_covered), "CPU, memory, pod affinity, spread, volumes: never"
        assert not set(covers.covered) & set(covers.not_covered)
        assert covers.covered[0].startswith("DynamicResources")
    assert "Nodes not read" in unread.covered[0], "a slice's node selector is then taken as met"
    assert set(why.NODE_FILTERS) <= set(unread.not_covered), "no Nodes: node filters cannot be covered"
    assert (set(why.NODE_FILTERS) <= set(read.covered)) is why.POD_NODE_FILTERS_APPLIED
    state = cluster_state(EXAMPLE_GPU, example_gpus("n1", 1), claim_obj("waiting"))
    outcomes = explain(state, [("ml", "waiting")])
    assert render_text(outcomes, read).splitlines()[-1] == f"({read.line()})"
    got = json.loads(render_json(outcomes, single=True, covers=read))
    assert got["scheduler_filters"] == {"covered": list(read.covered), "not_covered": list(read.not_covered)}
