"""DeviceTaintRules applied to the node agent's devices: the index (``dra_exporter.taints``) against
every rule tested on every device (the join before it), in the same run.

``python3 -m benchmarks.bench_taints [--devices 100000] [--rules 400]``

Single-device rules (the common kind: an admin taints one bad GPU) over a pool of devices; prints the
seconds per pass of each way and their ratio, and checks that both select the same (rule, device) pairs.
"""

from __future__ import annotations

import argparse
import json
import time

from dra_exporter.model import DeviceTaint, DeviceTaintRule
from dra_exporter.taints import TaintRuleIndex


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, default=100_000)
    parser.add_argument("--rules", type=int, default=400)
    args = parser.parse_args()
    devices = [("gpu.nvidia.com", f"node-{i // 8}", f"gpu-{i % 8}") for i in range(args.devices)]
    step = max(1, args.devices // max(1, args.rules))
    rules = [DeviceTaintRule(f"r{i}", DeviceTaint("bad", "", "NoSchedule"), *devices[(i * step) % args.devices])
             for i in range(args.rules)]
    rules.append(DeviceTaintRule("driver-wide", DeviceTaint("drain", "", "NoExecute"), "gpu.nvidia.com"))

    started = time.perf_counter()
    brute = [(r.name, key) for key in devices for r in rules if r.selects(*key)]
    brute_s = time.perf_counter() - started

    started = time.perf_counter()
    index = TaintRuleIndex(rules)
    indexed = [(r.name, key) for key in devices for r in index.matching(*key)]
    index_s = time.perf_counter() - started

    assert indexed == brute, "the index selects what every rule's own test selects"
    print(json.dumps({"devices": args.devices, "rules": len(rules), "matches": len(indexed),
                      "every_rule_s": round(brute_s, 3), "index_s": round(index_s, 3),
                      "ratio": round(brute_s / index_s, 1)}))


if __name__ == "__main__":
    main()
