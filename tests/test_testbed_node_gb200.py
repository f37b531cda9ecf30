"""The node agent on a real GB200 node: the same real kubelet and NVIDIA plugin as
``test_testbed_node.py``, over the mock NVML's GB200 board (8 × GB200, Blackwell). One bed start for
the module: the session's H100 bed is stopped first (one bed per machine)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from nodetestbed import TIMINGS, Exporter, NodeBed, NodeBeds
from test_testbed_node import POD_LEVEL, SHAPES, Workload, expected_devices, exported_devices, wait_labels

pytestmark = [pytest.mark.testbed_node, pytest.mark.slow]


@pytest.fixture(scope="module")
def gb200(node_beds: NodeBeds) -> NodeBed:
    return node_beds.bed("gb200")


@pytest.fixture(scope="module")
def gb200_exporter(gb200: NodeBed) -> Iterator[Exporter]:
    with gb200.exporter() as running:
        yield running


def test_every_shape_on_gb200_is_labelled_as_the_real_objects_say(gb200: NodeBed, gb200_exporter: Exporter) -> None:
    load = Workload(gb200, gb200.namespace("gb"))
    try:
        load.run(SHAPES)
        load.run(POD_LEVEL)
        TIMINGS.append(("GB200: labels right after the last pod runs (7 GPUs, 7 pods)",
                        wait_labels(gb200, gb200_exporter, load.namespace, "every shape on GB200")))
        real = expected_devices(gb200, load.namespace)
        assert len(real) == 7
        # The prioritized list's first choice exists here: Blackwell.
        assert {v["request"] for v in real.values() if v["claim"] == "claim-prio"} == {"acc/b200", "extra"}
        models = {lab["model"] for _, lab, _ in gb200_exporter.series("dra_gpu_info")}
        assert models == {"NVIDIA GB200"}
        assert exported_devices(gb200_exporter, load.namespace)
    finally:
        load.clean()
