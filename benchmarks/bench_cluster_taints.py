"""DeviceTaintRules against the cluster mode's frame: none, 40 and 400 single-device rules over the
generated cluster of ``bench_cluster`` (5,000 nodes: 100,000 devices), in the same run.

``python3 -m benchmarks.bench_cluster_taints [--nodes 5000] [--rules 400]``

Per count of rules: the CPU of a first frame (a fresh core: every pool built, every family counted)
and of the frame after one more rule arrives (what a watch event costs). Before the rules were
indexed (``dra_exporter.taints``) a frame cost rules x devices: 0.23 s with none, 4.1 s with 40,
41-62 s with 400 at 100,000 devices (issue 25, item 8).
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace
from typing import Any

from dra_exporter.cluster.capacity import Capacity
from dra_exporter.model import ClusterState, DeviceTaint, DeviceTaintRule
from dra_exporter.sources.kubeapi_normalize import claim_from_dict, device_class_from_dict, slice_from_dict

from .bench_cluster import generate


def _state(nodes: int) -> ClusterState:
    objects = generate(nodes)
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for o in objects:
        by_kind.setdefault(o["kind"], []).append(o)
    return ClusterState("v1", tuple(slice_from_dict(o, "v1") for o in by_kind["ResourceSlice"]),
                        tuple(claim_from_dict(o, "v1") for o in by_kind["ResourceClaim"]),
                        tuple(device_class_from_dict(o) for o in by_kind["DeviceClass"]))


def _rules(state: ClusterState, count: int) -> tuple[DeviceTaintRule, ...]:
    devices = [(s.driver, s.pool, d.name) for s in state.slices for d in s.devices]
    step = max(1, len(devices) // max(1, count))
    return tuple(DeviceTaintRule(f"bad-{i}", DeviceTaint("example.com/bad", "", "NoSchedule"),
                                 *devices[(i * step) % len(devices)]) for i in range(count))


def _cpu(step: Any) -> float:
    start = time.process_time()
    step()
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--rules", type=int, default=400)
    args = parser.parse_args()
    base = _state(args.nodes)
    out: dict[str, Any] = {"nodes": args.nodes, "devices": sum(len(s.devices) for s in base.slices)}
    for count in sorted({0, min(40, args.rules), args.rules}):
        rules = _rules(base, count + 1)
        state = replace(base, taint_rules=rules[:count])
        capacity = Capacity()
        first = _cpu(lambda: capacity.frame(state, time.time()))  # noqa: B023 - run here, at once
        one_more = replace(state, taint_rules=rules)
        added = _cpu(lambda: capacity.frame(one_more, time.time()))  # noqa: B023
        out[f"{count} rules"] = {"first_frame_cpu_s": round(first, 3), "one_more_rule_cpu_s": round(added, 3)}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
