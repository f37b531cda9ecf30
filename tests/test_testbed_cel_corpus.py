"""The CEL conformance corpus (tests/fixtures/cel_corpus.yaml): every selector run by the real
kube-scheduler v1.36 (test bed) and by the exporter's allocator, which must agree on each one:
allocated (and the same device), unschedulable, or a run-time error; and what the API server refuses
is what the corpus says it refuses. One node per expression, all created at once (testbed_batch).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from dra_layouts import JSON, claim_obj, device_class, request, slice_obj
from kubetestbed import ControlPlane
from testbed_batch import ALLOCATED, REFUSED, UNSUPPORTED, Verdict, exporter_verdict, scheduler_verdicts, view

from dra_exporter.cluster.allocator import Allocator
from dra_exporter.sources.kubeapi_normalize import claim_from_dict

pytestmark = [pytest.mark.testbed_kube, pytest.mark.slow]  # ~80 pods scheduled at once

CORPUS = yaml.safe_load((Path(__file__).parent / "fixtures" / "cel_corpus.yaml").read_text())["corpus"]


def node_slices(node: str) -> list[JSON]:
    """The devices every expression runs over (the corpus's header says what they are)."""
    def gpu(i: int, model: str, healthy: bool, version: str) -> JSON:
        attributes: JSON = {"model": {"string": model}, "index": {"int": i}, "healthy": {"bool": healthy},
                            "driverVersion": {"version": version}}
        if i == 1:
            attributes["example.com/numa"] = {"int": 1}
        return {"name": f"gpu-{i}", "attributes": attributes, "capacity": {"memory": {"value": "80Gi"}}}
    nic = {"name": "nic-0", "attributes": {"speed": {"int": 100}, "vendor": {"string": "Mellanox"},
                                           "ipv4": {"string": "10.1.2.3"}}}
    return [slice_obj(f"{node}-gpu", "gpu.example.com", node, [gpu(0, "A100-SXM4-80GB", True, "535.104.5"),
                                                                 gpu(1, "H100 80GB HBM3", False, "550.54.15")],
                      node=node),
            slice_obj(f"{node}-nic", "nic.example.com", f"{node}-nic", [nic], node=node)]


def test_the_scheduler_and_the_exporter_agree_on_every_selector_of_the_corpus(kube: ControlPlane) -> None:
    ns = kube.namespace("cel")
    cases: dict[str, tuple[int, str, JSON]] = {}  # pod -> (corpus index, node, claim)
    refused: dict[int, str] = {}
    for i, case in enumerate(CORPUS):
        cls = device_class(kube.unique("corpus"), case["expression"])
        status, message = kube.try_create(cls)
        if status != 201:
            refused[i] = message
            continue
        node = kube.ready_node()
        for obj in node_slices(node):
            kube.create(obj)
        name = f"case-{i}"
        obj = claim_obj(name, [request(device_class_name=cls["metadata"]["name"])], namespace=ns)
        kube.create(obj, ns)
        cases[name] = (i, node, obj)
    state = view(kube)  # before any pod: every claim is pending
    allocator = Allocator(state)
    ours = {name: exporter_verdict(allocator.allocate(claim_from_dict(obj, "v1"), node))
            for name, (_, node, obj) in cases.items()}
    for name, (_, node, _) in cases.items():
        kube.pod(ns, name, claims={"gpu": name}, node_name=node)
    theirs = scheduler_verdicts(kube, ns, {name: (name,) for name in cases})

    def said(v: Verdict, node: str) -> tuple[str, str]:
        device = v.devices[0].rsplit("/", 1)[-1] if v.devices else ""
        return v.outcome, device

    differ: list[tuple[Any, ...]] = []
    for name, (i, node, _) in cases.items():
        expected = (CORPUS[i]["outcome"], CORPUS[i].get("device", ""))
        ours_expected = (UNSUPPORTED, "") if CORPUS[i].get("exporter") == UNSUPPORTED else expected
        if not (said(theirs[name], node) == expected and said(ours[name], node) == ours_expected):
            differ.append((CORPUS[i]["expression"], "corpus", expected, "scheduler", said(theirs[name], node),
                           theirs[name].message[:160], "exporter", said(ours[name], node), ours[name].message[:160]))
    for i, message in refused.items():
        if CORPUS[i]["outcome"] != REFUSED:
            differ.append((CORPUS[i]["expression"], "refused by the API server", message[:200]))
    wrongly_admitted = [CORPUS[i]["expression"] for name, (i, _, _) in cases.items() if CORPUS[i]["outcome"] == REFUSED]
    agreed = len(cases) - len([d for d in differ if len(d) > 3])
    unsupported = sum(v.outcome == UNSUPPORTED for v in ours.values())
    print(f"\nCEL corpus: {len(CORPUS)} expressions, {len(refused)} refused by the API server; of the "
          f"{len(cases)} admitted, the exporter runs all but {unsupported} (not supported by it) and agrees with the "
          f"scheduler on {agreed - unsupported} of the others "
          f"({sum(v.outcome == ALLOCATED for v in theirs.values())} allocated by the scheduler)")
    assert not differ and not wrongly_admitted, "\n".join(map(repr, differ + wrongly_admitted))
