"""Upstream's own allocator table (k8s.io/dynamic-resource-allocation/structured/internal/allocatortesting,
v1.36.2), the cases expressible as API objects, written down as data in
tests/fixtures/upstream_allocator_table.yaml: each runs on the real kube-scheduler (test bed) and on the
exporter's allocator, and the two must agree (bound with the same devices, or not bound) unless the
case is listed under ``differ`` in the fixture, with why. The cases that cannot be expressed as API
objects are listed there under ``not_expressible``, each with why.

Every case gets its own names (nodes, pools, drivers, classes, claims: prefixed), so that all run at
once in one control-plane session: all objects first, the exporter's verdicts, then one pod per case
pinned to the case's node, then every pod's outcome (testbed_batch). The cases marked ``last`` (an
invalid counter-set pool, which the scheduler sees from every node) run as a second batch.
"""

from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import yaml
from dra_layouts import GROUP, JSON
from kubetestbed import ControlPlane
from testbed_batch import ALLOCATED, Verdict, exporter_verdict, scheduler_verdicts, view

from dra_exporter.cluster.allocator import Allocator
from dra_exporter.sources.kubeapi_normalize import claim_from_dict

pytestmark = [pytest.mark.testbed_kube, pytest.mark.slow]  # ~60 cases scheduled at once

TABLE = yaml.safe_load((Path(__file__).parent / "fixtures" / "upstream_allocator_table.yaml").read_text())
CASES: list[JSON] = TABLE["cases"]
DIFFER: dict[str, str] = TABLE.get("differ") or {}
_NAMES = re.compile(r"\b(driver-[ab]|node-[12]|pool-[1-4]|class-[ab]|claim-[01]|counter-set-[12])\b")
DEFAULT_CLASSES = {"class-a": ['device.driver == "driver-a"'], "class-b": ['device.driver == "driver-b"']}
REGIONS = {"node-1": "region-1", "node-2": "region-2"}
PARALLEL_REQUESTS = 8


def localised(case: JSON, prefix: str) -> JSON:
    """The case with its own names: drivers ``driver-a.<prefix>``, the others ``<prefix>-name``."""
    def rename(m: re.Match[str]) -> str:
        return f"{m[1]}.{prefix}" if m[1].startswith("driver-") else f"{prefix}-{m[1]}"
    return dict(json.loads(_NAMES.sub(rename, json.dumps(case))))


def unlocalised(text: str, prefix: str) -> str:
    return text.replace(f".{prefix}", "").replace(f"{prefix}-", "")


def slice_api(spec: JSON, name: str) -> JSON:
    """A slice of the fixture (driver, pool, count, generation, node | allNodes | nodeSelector |
    perDeviceNodeSelection, devices | sharedCounters) as the API's object."""
    out: JSON = {"driver": spec["driver"], "pool": {"name": spec["pool"], "generation": spec.get("generation", 1),
                                                    "resourceSliceCount": spec.get("count", 1)}}
    if "node" in spec:
        out["nodeName"] = spec["node"]
    elif "nodeSelector" in spec:
        out["nodeSelector"] = spec["nodeSelector"]
    elif spec.get("perDeviceNodeSelection"):
        out["perDeviceNodeSelection"] = True
    else:
        out["allNodes"] = True
    assert not {"sharedCounters", "consumesCounters"} & set(spec), "the fixture uses the shorthands"
    if "counters" in spec:
        out["sharedCounters"] = [{"name": name, "counters": {c: {"value": v} for c, v in counters.items()}}
                                 for name, counters in spec["counters"].items()]
    else:
        out["devices"] = [device_api(d) for d in spec.get("devices", [])]
    return {"apiVersion": GROUP, "kind": "ResourceSlice", "metadata": {"name": name}, "spec": out}


def device_api(spec: str | JSON) -> JSON:
    """A device of the fixture: its name alone, or the API's fields plus two shorthands: ``consumes``
    (counter set -> counter -> amount) and ``fromCounters`` (its capacity is what it consumes, as
    upstream's table builds such devices)."""
    if isinstance(spec, str):
        return {"name": spec}
    out = {k: v for k, v in spec.items() if k not in ("consumes", "fromCounters")}
    consumes = spec.get("consumes", {})
    if consumes:
        out["consumesCounters"] = [{"counterSet": name, "counters": {c: {"value": v} for c, v in counters.items()}}
                                   for name, counters in consumes.items()]
    if spec.get("fromCounters"):
        out["capacity"] = {c: {"value": v} for counters in consumes.values() for c, v in counters.items()}
    return out


def exact(req: JSON) -> JSON:
    """A request's ExactCount/All fields as the API takes them (count 1 and ExactCount by default;
    selectors given as expressions)."""
    out = {k: v for k, v in req.items() if k != "name"}
    out.setdefault("allocationMode", "ExactCount")
    if out["allocationMode"] == "ExactCount":
        out.setdefault("count", 1)
    if "selectors" in out:
        out["selectors"] = [{"cel": {"expression": e}} for e in out["selectors"]]
    return out


def claim_api(spec: JSON, ns: str) -> JSON:
    requests = []
    for req in spec["requests"]:
        if "firstAvailable" in req:
            requests.append({"name": req["name"], "firstAvailable": [{"name": s["name"], **exact(s)}
                                                                      for s in req["firstAvailable"]]})
        else:
            requests.append({"name": req["name"], "exactly": exact(req)})
    devices: JSON = {"requests": requests}
    for key in ("constraints", "config"):
        if spec.get(key):
            devices[key] = spec[key]
    return {"apiVersion": GROUP, "kind": "ResourceClaim", "metadata": {"name": spec["name"], "namespace": ns},
            "spec": {"devices": devices}}


def exporter_allocates(allocator: Allocator, claims: list[JSON], node: str) -> Verdict:
    """The adapter: the exporter places the pod's claims together on the node (``allocate_pod``, as the
    scheduler does) and commits them when the pod fits. One allocator serves every case: their drivers
    differ, so what one case commits no other case's classes select."""
    outcomes = allocator.allocate_pod([claim_from_dict(obj, "v1") for obj in claims], node)
    verdicts = [exporter_verdict(o) for o in outcomes]
    refused = next((v for v in verdicts if v.outcome != ALLOCATED), None)
    if refused is not None:
        return refused
    for outcome in outcomes:
        allocator.commit(outcome)
    return Verdict(ALLOCATED, results=tuple(r for v in verdicts for r in v.results))


def said(verdict: Verdict, prefix: str) -> Any:
    """What a verdict says in the fixture's terms: the sorted results of each claim, or not bound."""
    if verdict.outcome != ALLOCATED:
        return "unschedulable"
    return [sorted([unlocalised(r, prefix) for r in result[:4]] + (["admin"] if result[4] else [])
                   for result in claim) for claim in verdict.results]


def expected(case: JSON) -> Any:
    if not isinstance(case["expect"], list):
        return "unschedulable"  # upstream's "error" and "no result" both leave the pod unbound
    return [sorted(list(r) for r in claim) for claim in case["expect"]]


def create_case(kube: ControlPlane, ns: str, prefix: str, original: JSON) -> tuple[str, list[JSON]]:
    """The case's objects under its own names; (its node, the claims of its pod)."""
    case = localised(original, prefix)
    nodes = {case["node"], *case.get("nodes", ()), *(s["node"] for s in case["slices"] if "node" in s)}
    for name in sorted(nodes):
        kube.ready_node(name, {"region": REGIONS[unlocalised(name, prefix)], "planet": "earth"})
    for j, spec in enumerate(case["slices"]):
        kube.create(slice_api(spec, f"{prefix}-slice-{j}"))
    classes = {} if case.get("no_default_classes") else localised(DEFAULT_CLASSES, prefix)
    for name, expressions in (classes | case.get("classes", {})).items():
        kube.create({"apiVersion": GROUP, "kind": "DeviceClass", "metadata": {"name": name},
                     "spec": {"selectors": [{"cel": {"expression": e}} for e in expressions]}})
    for j, held in enumerate(case.get("allocated", [])):
        holder = claim_api({"name": f"{prefix}-held-{j}", "requests": [
            {"name": "held", "deviceClassName": f"{prefix}-class-a"}]}, ns)
        created = kube.create(holder, ns)
        result = {"request": "held", "driver": held[0], "pool": held[1], "device": held[2]}
        if len(held) > 3:  # a share of a device that allows multiple allocations: what it consumes
            result |= {"shareID": f"00000000-0000-0000-0000-{j:012d}", "consumedCapacity": held[3]}
        kube.patch_status(created, {"allocation": {"devices": {"results": [result]}}})
    claims = [claim_api(c, ns) for c in case["claims"]]
    for obj in claims:
        kube.create(obj, ns)
    return case["node"], claims


def run_batch(kube: ControlPlane, ns: str, cases: list[JSON], first: int) -> tuple[dict[str, Verdict],
                                                                                 dict[str, Verdict], dict[str, str]]:
    """Creates the cases, asks the exporter, then the scheduler; (scheduler's, exporter's, prefixes)."""
    prefixes = {c["case"]: f"u{k}-{kube.unique('t').rsplit('-', 1)[-1]}" for k, c in enumerate(cases, first)}
    # Requests in parallel: each is a TLS connection of its own, and the API server has cores to spare.
    with ThreadPoolExecutor(max_workers=PARALLEL_REQUESTS) as pool:
        created = {c["case"]: pool.submit(create_case, kube, ns, prefixes[c["case"]], c) for c in cases}
        made = {name: (prefixes[name], *future.result()) for name, future in created.items()}
        allocator = Allocator(view(kube))
        ours = {name: exporter_allocates(allocator, claims, node) for name, (_, node, claims) in made.items()}
        pods = {f"{prefix}-pod": tuple(c["metadata"]["name"] for c in claims) for prefix, _, claims in made.values()}
        list(pool.map(lambda m: kube.pod(ns, f"{m[0]}-pod", node_name=m[1], claims={
            f"c{j}": c["metadata"]["name"] for j, c in enumerate(m[2])}), made.values()))
    theirs = scheduler_verdicts(kube, ns, pods)
    return {name: theirs[f"{prefix}-pod"] for name, (prefix, _, _) in made.items()}, ours, prefixes


def test_upstreams_allocator_table_on_the_scheduler_and_the_exporter(kube: ControlPlane) -> None:
    started = time.monotonic()
    ns = kube.namespace("upstream", admin_access=True)
    theirs, ours, prefixes = run_batch(kube, ns, [c for c in CASES if not c.get("last")], 0)
    # Cases whose invalid counter-set pools every node sees (the scheduler gathers a slice with
    # sharedCounters for every node): run after the others' verdicts, so they fail no All request there.
    their_last, our_last, last_prefixes = run_batch(kube, ns, [c for c in CASES if c.get("last")], len(CASES))
    theirs |= their_last
    ours |= our_last
    prefixes |= last_prefixes
    seconds = time.monotonic() - started

    differ, upstream_differs = {}, {}
    for case in CASES:
        prefix = prefixes[case["case"]]
        scheduler, exporter = said(theirs[case["case"]], prefix), said(ours[case["case"]], prefix)
        if scheduler != exporter:
            differ[case["case"]] = f"scheduler {scheduler}, exporter {exporter} {ours[case['case']].message[:300]}"
        if scheduler != expected(case):
            upstream_differs[case["case"]] = (f"scheduler {scheduler} ({theirs[case['case']].message[:200]}), "
                                              f"upstream's table {expected(case)}")
    print(f"\nupstream's allocator table: {len(CASES)} cases run in {seconds:.0f} s, scheduler and exporter agree on "
          f"{len(CASES) - len(differ)}, {len(DIFFER)} listed as differing; "
          f"{len(TABLE.get('not_expressible') or {})} cases not expressible as API objects")
    assert not upstream_differs, "the fixture does not say what upstream's table says:\n" + "\n".join(
        f"{k}: {v}" for k, v in upstream_differs.items())
    assert set(differ) == set(DIFFER), "\n".join(f"{k}: {v}" for k, v in differ.items())
