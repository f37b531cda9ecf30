"""Objects a dump holds twice are refused with one line naming both (issue 25, item 14): a node dump
(``parse_dump``) and a cluster dump (``load_cluster_dump``) alike."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from test_dump import dump_of, find, items

from dra_exporter_sim import ScenarioError
from dra_exporter_sim.cluster import load_cluster_dump
from dra_exporter_sim.dump import parse_dump
from dra_exporter_sim.duplicates import refuse_duplicates


def test_two_slices_of_one_name_are_refused_naming_both() -> None:
    objects = items("v1")
    twin = copy.deepcopy(next(o for o in objects if o["kind"] == "ResourceSlice"))
    objects.append(twin)
    with pytest.raises(ScenarioError, match=r"ResourceSlice '.*' is in the dump twice \(objects \d+ and \d+"):
        parse_dump(dump_of(objects), "bad.yaml", "gpu-node-a")


def test_claims_whose_namespace_and_name_join_alike_are_two_claims_but_real_twins_are_refused() -> None:
    objects = items("v1")
    train = find(objects, "ResourceClaim", "train")
    a = copy.deepcopy(train)
    a["metadata"].update(namespace="a/b", name="c")
    b = copy.deepcopy(train)
    b["metadata"].update(namespace="a", name="b/c")
    refuse_duplicates([a, b], "x.yaml")  # a/b + c and a + b/c are not one object
    with pytest.raises(ScenarioError, match=r"ResourceClaim 'a'/'b/c' is in the dump twice \(objects 2 and 3"):
        refuse_duplicates([a, b, copy.deepcopy(b)], "x.yaml")


def test_a_cluster_dump_with_two_device_classes_of_one_name_is_refused(tmp_path: Path) -> None:
    objects: list[dict[str, Any]] = items("v1")
    gpu_class = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": "gpu"},
                 "spec": {"selectors": []}}
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(dump_of([*objects, gpu_class, copy.deepcopy(gpu_class)])[0]))
    with pytest.raises(ScenarioError, match="DeviceClass 'gpu' is in the dump twice") as caught:
        load_cluster_dump(path)
    assert "\n" not in str(caught.value)
