"""Re-record what the real node said, so a clone alone replays it (``tests/test_node_bed_replay.py``).

    DRA_EXPORTER_TESTBED_NODE=<the test beds' node/ folder> .venv/bin/python tests/record_node_bed.py

For each board (8 × H100, 4 × GB200) it starts the node test bed (``tests/nodetestbed.py``, as root),
runs every shape of ``test_testbed_node.py`` (``SHAPES`` and ``POD_LEVEL``) in namespace ``shapes``,
then a pod whose claim asks for two GPUs when one is left (``gpu-waiting``, unallocated), and writes:

- ``tests/dumps/node-bed-<board>.yaml``: the DeviceClass, the ResourceSlices NVIDIA's driver
  published, the claims and the pods, as ``kubectl get deviceclasses,resourceslices,resourceclaims,pods
  -A -o yaml`` gives them (the simulator's dump format; ``managedFields`` left out);
- ``tests/fixtures/node-bed/podresources-<board>.json``: the kubelet's pod-resources answers
  (``List``, ``GetAllocatableResources``, and ``Get`` of the pod-level claim's pod) as the bed's
  own Go client printed them.

The objects carry the names and uids of that run; the tests compare them with each other, never
with fixed values.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from nodetestbed import NodeBed, testbed_folder, unavailable_reason  # noqa: E402
from test_testbed_node import POD_LEVEL, SHAPES  # noqa: E402

BOARDS = ("h100", "gb200")
WAITING = """
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: claim-waiting}
spec:
  devices:
    requests:
    - name: gpus
      exactly: {deviceClassName: gpu.nvidia.com, allocationMode: ExactCount, count: 2}
---
apiVersion: v1
kind: Pod
metadata: {name: gpu-waiting}
spec:
  automountServiceAccountToken: false
  resourceClaims: [{name: g, resourceClaimName: claim-waiting}]
  containers:
  - {name: c, image: cuda:12, command: [sleep, infinity], resources: {claims: [{name: g}]}}
"""
NAMESPACE = "shapes"


def _clean(obj: dict[str, Any]) -> dict[str, Any]:
    obj.get("metadata", {}).pop("managedFields", None)
    return obj


def record(bed: NodeBed, board: str) -> None:
    bed.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}])
    bed.wait_for(lambda: bed.request("GET", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default")[0] == 200,
                 "the default ServiceAccount")
    for text in (SHAPES, POD_LEVEL):
        bed.apply(text, NAMESPACE)
    for pod in ("gpu-direct", "gpu-share", "gpu-tmpl", "gpu-prio", "gpu-extres", "gpu-podlevel"):
        bed.wait_running(NAMESPACE, pod, timeout=120)
    # One GPU is left: a pod whose claim asks for two waits, its claim unallocated (what `explain` is for).
    bed.apply(WAITING, NAMESPACE)
    bed.wait_for(lambda: any(c.get("type") == "PodScheduled" and c.get("status") == "False"
                             for c in bed.pod(NAMESPACE, "gpu-waiting").get("status", {}).get("conditions", [])),
                 "gpu-waiting unschedulable", timeout=60)
    items = []
    for kind, path in (("DeviceClass", "/apis/resource.k8s.io/v1/deviceclasses"),
                       ("ResourceSlice", "/apis/resource.k8s.io/v1/resourceslices"),
                       ("ResourceClaim", f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"),
                       ("Pod", f"/api/v1/namespaces/{NAMESPACE}/pods")):
        for obj in bed.items(path):
            items.append(_clean({"apiVersion": "resource.k8s.io/v1" if kind != "Pod" else "v1", "kind": kind,
                                 **obj}))
    dump = {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items}
    header = (f"# Recorded by tests/record_node_bed.py from the node test bed ({board}): a real kubelet v1.36.2 and\n"
              "# NVIDIA's gpu-kubelet-plugin on the mock NVML; every shape of tests/test_testbed_node.py.\n")
    (HERE / "dumps" / f"node-bed-{board}.yaml").write_text(header + yaml.safe_dump(dump, sort_keys=False))
    answers = bed.podresources((NAMESPACE, "gpu-podlevel"))
    out = HERE / "fixtures" / "node-bed"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"podresources-{board}.json").write_text(json.dumps(answers, indent=1, sort_keys=True) + "\n")


def main() -> int:
    folder = testbed_folder()
    if (reason := unavailable_reason(folder)) is not None or folder is None:
        print(reason, file=sys.stderr)
        return 2
    for board in BOARDS:
        with tempfile.TemporaryDirectory(prefix=f"nodebed-{board}-") as workdir:
            bed = NodeBed.start(folder, Path(workdir), board)
            try:
                record(bed, board)
            finally:
                bed.stop()
        print(f"recorded {board}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
