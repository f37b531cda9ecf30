"""Many independent allocation cases on the test bed's real scheduler at once: each case gets a node
of its own (its pod is pinned there by node selector), all objects are created first, then all pods,
then every pod's outcome is read. One control-plane session for a whole table instead of one
scheduling round trip after another.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kubetestbed import ControlPlane

from dra_exporter.cluster.allocator import Outcome
from dra_exporter.cluster.explain import undecided
from dra_exporter.model import ClusterState
from dra_exporter.sources.kubeapi_normalize import (
    claim_from_dict,
    cluster_node_from_dict,
    device_class_from_dict,
    slice_from_dict,
)

ALLOCATED, UNSCHEDULABLE, ERROR, REFUSED, UNSUPPORTED = "allocated", "unschedulable", "error", "refused", "unsupported"
#: Seconds a pod's first verdict is given to turn into a binding (the scheduler retries a pod whose
#: first attempt raced its claim's informer).
SETTLE = 3.0


@dataclass(frozen=True)
class Verdict:
    outcome: str
    devices: tuple[str, ...] = ()
    """``driver/pool/device`` of what was allocated, in result order."""
    message: str = ""
    results: tuple[tuple[tuple[str, str, str, str, bool], ...], ...] = ()
    """Per claim (in the pod's order), its allocation results: (request, driver, pool, device, admin access)."""


def view(kube: ControlPlane) -> ClusterState:
    """What the exporter's cluster source would read: every slice, claim and class of the cluster, and
    its Nodes (a slice for a node selector is for the Nodes whose labels meet it, as the scheduler sees it)."""
    def items(path: str) -> list[dict[str, Any]]:
        return list(kube.get(f"/apis/resource.k8s.io/v1/{path}")["items"])
    return ClusterState("v1", tuple(slice_from_dict(o, "v1") for o in items("resourceslices")),
                        tuple(claim_from_dict(o, "v1") for o in items("resourceclaims")),
                        tuple(device_class_from_dict(o) for o in items("deviceclasses")),
                        nodes=tuple(cluster_node_from_dict(o) for o in kube.get("/api/v1/nodes")["items"]))


def exporter_verdict(outcome: Outcome) -> Verdict:
    """The exporter's allocator outcome in the scheduler's terms."""
    if outcome.placeable:
        return Verdict(ALLOCATED, tuple("/".join(p.device) for p in outcome.picks),
                       results=(tuple((p.request, *p.device, p.admin_access) for p in outcome.picks),))
    if undecided(outcome):
        return Verdict(UNSUPPORTED, message=outcome.error)
    errors = " ".join([outcome.error, *(r.error for r in outcome.requests)])
    return Verdict(ERROR if "CEL" in errors else UNSCHEDULABLE, message=errors.strip())


def scheduler_verdicts(kube: ControlPlane, ns: str, pods: Mapping[str, Sequence[str]], timeout: float = 120.0
                       ) -> dict[str, Verdict]:
    """Per pod (pod name -> the names of its claims): bound with the claim's devices, or pending with the
    scheduler's reason: ``error`` when its filter failed with an error (a CEL run-time error and the
    like: the pod's condition says the scheduler erred), else ``unschedulable``."""
    deadline = time.monotonic() + timeout
    settled_at: float | None = None
    while True:
        listed = {p["metadata"]["name"]: p for p in kube.get(f"/api/v1/namespaces/{ns}/pods")["items"]}
        verdicts: dict[str, Verdict] = {}
        for name in pods:
            pod = listed.get(name)
            if pod is None:
                continue
            if pod["spec"].get("nodeName"):
                verdicts[name] = Verdict(ALLOCATED)
                continue
            for cond in pod.get("status", {}).get("conditions", []):
                if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                    message = str(cond.get("message", ""))
                    erred = cond.get("reason") == "SchedulerError" or "runtime error" in message
                    verdicts[name] = Verdict(ERROR if erred else UNSCHEDULABLE, message=message)
        if len(verdicts) == len(pods):
            if settled_at is None:
                settled_at = time.monotonic()
            elif time.monotonic() - settled_at >= SETTLE:
                break
        if time.monotonic() > deadline:
            missing = sorted(set(pods) - set(verdicts))
            raise AssertionError(f"no verdict from the scheduler for {len(missing)} pods: {missing[:5]}")
        time.sleep(0.25)
    listed_claims = kube.get(f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims")["items"]
    claims = {c["metadata"]["name"]: c for c in listed_claims}
    out = {}
    for name, verdict in verdicts.items():
        if verdict.outcome == ALLOCATED:
            per_claim = tuple(tuple(claims[c].get("status", {}).get("allocation", {}).get("devices", {})
                                    .get("results", [])) for c in pods[name])
            devices = tuple(f"{r['driver']}/{r['pool']}/{r['device']}" for rs in per_claim for r in rs)
            verdict = Verdict(ALLOCATED, devices,
                              results=tuple(tuple((r["request"], r["driver"], r["pool"], r["device"],
                                                   bool(r.get("adminAccess"))) for r in rs) for rs in per_claim))
        out[name] = verdict
    return out
