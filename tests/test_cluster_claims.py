"""Claim states as an operator means them (``dra_exporter.cluster.claims`` through the capacity core):
pending only while a pod waits, unused when none does, its age from when a pod began to wait, one series
per claim, and why it waits. Pods and claims go through the one normaliser, as the API server has them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dra_exporter import catalog as cat
from dra_exporter.cluster.capacity import Capacity
from dra_exporter.model import ClusterState, Frame
from dra_exporter.sources.kubeapi_normalize import claim_from_dict, cluster_pod_from_dict, device_class_from_dict

NOW = 1767225600.0 + 600  # 2026-01-01T00:10:00Z
CLASSES = ("gpu.example.com", "mig.nvidia.com", "gpu.nvidia.com")


def claim(name: str, *, allocated: bool = False, reserved: bool = False, namespace: str = "ml",
          created: str = "2026-01-01T00:00:00Z", requests: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    status: dict[str, Any] = {}
    if allocated:
        status["allocation"] = {"devices": {"results": [
            {"request": "gpu", "driver": "gpu.example.com", "pool": "n1", "device": f"dev-{name}"}]}}
    if reserved:
        status["reservedFor"] = [{"resource": "pods", "name": f"{name}-pod", "uid": f"uid-{name}"}]
    return {"metadata": {"namespace": namespace, "name": name, "uid": f"c-{name}", "creationTimestamp": created},
            "spec": {"devices": {"requests": requests or [
                {"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}}]}},
            "status": status}


def pod(name: str, *, claims: Mapping[str, str] | None = None, templates: Mapping[str, str] | None = None,
        generated: Mapping[str, str] | None = None, phase: str = "Pending", namespace: str = "ml",
        created: str = "2026-01-01T00:00:00Z", deleting: bool = False) -> dict[str, Any]:
    """``claims``: pod claim name → claim; ``templates``: pod claim name → template, and ``generated``:
    pod claim name → the claim the resourceclaim controller made (``status.resourceClaimStatuses``)."""
    meta: dict[str, Any] = {"namespace": namespace, "name": name, "uid": f"p-{name}", "creationTimestamp": created}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:09:00Z"
    refs = [{"name": k, "resourceClaimName": v} for k, v in (claims or {}).items()]
    refs += [{"name": k, "resourceClaimTemplateName": v} for k, v in (templates or {}).items()]
    status: dict[str, Any] = {"phase": phase}
    if generated:
        status["resourceClaimStatuses"] = [{"name": k, "resourceClaimName": v} for k, v in generated.items()]
    return {"metadata": meta, "spec": {"containers": [{"name": "main"}], "resourceClaims": refs}, "status": status}


def state(claims: Sequence[dict[str, Any]], pods: Sequence[dict[str, Any]] = (),
          classes: Sequence[str] = CLASSES) -> ClusterState:
    return ClusterState("v1", claims=tuple(claim_from_dict(c, "v1") for c in claims),
                        classes=tuple(device_class_from_dict({"metadata": {"name": n}}) for n in classes),
                        pods=tuple(cluster_pod_from_dict(p) for p in pods))


def values(frame: Frame, spec: cat.MetricSpec, *keys: str) -> dict[tuple[str, ...], float]:
    fam = frame.family(spec.name)
    return {} if fam is None else {tuple(dict(s.labels)[k] for k in keys): s.value for s in fam.samples}


def states(frame: Frame) -> dict[tuple[str, ...], float]:
    return {k: v for k, v in values(frame, cat.CLUSTER_CLAIMS, "namespace", "state").items() if v}


def test_each_state_pending_unused_allocated_reserved() -> None:
    frame = Capacity().frame(state(
        [claim("running", allocated=True, reserved=True), claim("held", allocated=True),
         claim("waiting"), claim("nobody")],
        [pod("waiter", claims={"gpu": "waiting"}), pod("runner", claims={"gpu": "running"}, phase="Running")]), NOW)
    assert values(frame, cat.CLUSTER_CLAIMS, "namespace", "state") == {
        ("ml", "pending"): 1.0, ("ml", "unused"): 1.0, ("ml", "allocated"): 1.0, ("ml", "reserved"): 1.0}
    assert values(frame, cat.CLUSTER_CLAIM_PENDING, "claim") == {("waiting",): 600.0}
    assert values(frame, cat.CLUSTER_CLAIM_UNRESERVED, "claim") == {("held",): 1.0}


def test_a_claim_no_pod_references_is_unused_not_pending() -> None:
    frame = Capacity().frame(state([claim("lonely")], [pod("other", claims={"gpu": "elsewhere"})]), NOW)
    assert states(frame) == {("ml", "unused"): 1.0}
    assert frame.family(cat.CLUSTER_CLAIM_PENDING.name) is None


def test_a_pod_in_another_namespace_does_not_wait_for_a_claim_of_the_same_name() -> None:
    frame = Capacity().frame(state([claim("gpu-job")], [pod("p", claims={"gpu": "gpu-job"}, namespace="web")]), NOW)
    assert states(frame) == {("ml", "unused"): 1.0}


def test_a_claim_whose_pods_ended_is_unused() -> None:
    ended = [pod("done", claims={"gpu": "job"}, phase="Succeeded"),
             pod("crashed", claims={"gpu": "job"}, phase="Failed"),
             pod("going", claims={"gpu": "job"}, phase="Running", deleting=True)]
    frame = Capacity().frame(state([claim("job")], ended), NOW)
    assert states(frame) == {("ml", "unused"): 1.0}
    assert frame.family(cat.CLUSTER_CLAIM_PENDING.name) is None
    # One more pod that still waits: pending again, aged from that pod.
    retry = pod("retry", claims={"gpu": "job"}, created="2026-01-01T00:08:00Z")
    frame = Capacity().frame(state([claim("job")], [*ended, retry]), NOW)
    assert states(frame) == {("ml", "pending"): 1.0}
    assert values(frame, cat.CLUSTER_CLAIM_PENDING, "claim") == {("job",): 120.0}


def test_a_template_claim_is_waited_for_once_the_pod_status_names_it() -> None:
    generated = claim("trainer-gpu-x7k2")
    named = pod("trainer", templates={"gpu": "gpu-template"}, generated={"gpu": "trainer-gpu-x7k2"})
    frame = Capacity().frame(state([generated], [named]), NOW)
    assert states(frame) == {("ml", "pending"): 1.0}
    # Before the resourceclaim controller writes the status, the pod names no claim object.
    not_yet = pod("trainer", templates={"gpu": "gpu-template"})
    assert states(Capacity().frame(state([generated], [not_yet]), NOW)) == {("ml", "unused"): 1.0}


def test_pending_age_runs_from_when_a_pod_began_to_wait() -> None:
    claims = [claim("early"), claim("late", created="2026-01-01T00:07:00Z"), claim("two-pods")]
    pods = [pod("a", claims={"gpu": "early"}, created="2026-01-01T00:05:00Z"),  # the claim waited for nobody first
            pod("b", claims={"gpu": "late"}),  # the pod waited for a claim that did not exist yet
            pod("c", claims={"gpu": "two-pods"}, created="2026-01-01T00:04:00Z"),
            pod("d", claims={"gpu": "two-pods"}, created="2026-01-01T00:02:00Z")]
    capacity = Capacity()
    current = state(claims, pods)
    frame = capacity.frame(current, NOW)
    assert values(frame, cat.CLUSTER_CLAIM_PENDING, "claim") == {
        ("early",): 300.0, ("late",): 180.0, ("two-pods",): 480.0}
    later = capacity.frame(current, NOW + 60)
    assert values(later, cat.CLUSTER_CLAIM_PENDING, "claim") == {
        ("early",): 360.0, ("late",): 240.0, ("two-pods",): 540.0}


def test_one_pending_series_per_claim_even_for_a_prioritized_list() -> None:
    either = claim("either", requests=[{"name": "gpu", "firstAvailable": [
        {"name": "big", "deviceClassName": "gpu.nvidia.com"}, {"name": "small", "deviceClassName": "mig.nvidia.com"}]}])
    frame = Capacity().frame(state([either], [pod("p", claims={"gpu": "either"})]), NOW)
    assert values(frame, cat.CLUSTER_CLAIM_PENDING, "namespace", "claim") == {("ml", "either"): 600.0}
    assert values(frame, cat.CLUSTER_CLAIM_PENDING_REQUEST, "claim", "request", "device_class") == {
        ("either", "gpu/big", "gpu.nvidia.com"): 1.0, ("either", "gpu/small", "mig.nvidia.com"): 1.0}


def test_the_first_request_whose_class_is_missing_is_the_pending_reason() -> None:
    prioritized = claim("either", requests=[{"name": "gpu", "firstAvailable": [
        {"name": "mig", "deviceClassName": "mig.nvidia.com"}, {"name": "tpu", "deviceClassName": "tpu.example.com"}]}])
    two = claim("two", requests=[{"name": "a", "exactly": {"deviceClassName": "gpu.example.com"}},
                                 {"name": "b", "exactly": {"deviceClassName": "fpga.example.com"}},
                                 {"name": "c", "exactly": {"deviceClassName": "tpu.example.com"}}])
    claims = [prioritized, two, claim("fine"), claim("nobody-waits", requests=[
        {"name": "gpu", "exactly": {"deviceClassName": "tpu.example.com"}}])]
    pods = [pod("p1", claims={"g": "either"}), pod("p2", claims={"g": "two"}), pod("p3", claims={"g": "fine"})]
    frame = Capacity().frame(state(claims, pods), NOW)
    # A missing class of any subrequest fails the claim (the allocator's first answer); a class that
    # exists but has no device here is no match; a claim nobody waits for has no reason.
    assert values(frame, cat.CLUSTER_CLAIM_PENDING_REASON, "claim", "request", "reason") == {
        ("either", "gpu/tpu", "class_missing"): 1.0, ("two", "b", "class_missing"): 1.0,
        ("fine", "gpu", "no_matching_device"): 1.0}


def test_a_pod_is_read_with_what_the_cluster_mode_needs() -> None:
    raw = pod("p", claims={"a": "named"}, templates={"b": "tmpl"}, generated={"b": "p-b-1"}, phase="Running",
              created="2026-01-01T00:01:00Z")
    raw["status"]["extendedResourceClaimStatus"] = {"resourceClaimName": "p-extended-1", "requestMappings": []}
    read = cluster_pod_from_dict(raw)
    assert (read.namespace, read.name, read.created, read.ended) == ("ml", "p", 1767225660.0, False)
    assert read.claims == ("named", "p-b-1", "p-extended-1")
    assert cluster_pod_from_dict(pod("q", deleting=True)).ended
