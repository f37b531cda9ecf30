"""Child process of ``nvmltestbed.run_source``: the product's ``NvmlSource`` over the real pynvml.

argv[1] is the plan as JSON (see ``run_source``); the mock library and its profile come from the
environment (``LD_LIBRARY_PATH``, ``MOCK_NVML_CONFIG``). Prints one JSON list, one record per cycle.
The source logs to stderr, which the parent hands to the test.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

import pynvml

sys.path.insert(0, str(Path(__file__).parent))
from nvmltestbed import write_overrides  # noqa: E402

from dra_exporter.model import DeviceSnapshot  # noqa: E402
from dra_exporter.sources import SourceError  # noqa: E402
from dra_exporter.sources.nvml import NvmlSource  # noqa: E402


def record(snap: DeviceSnapshot) -> dict[str, Any]:
    return {
        "driver": snap.driver_version, "nvml": snap.library_version,
        "devices": [{"uuid": d.device.uuid, "index": d.device.index, "minor": d.device.minor,
                     "model": d.device.model, "pci_bus_id": d.device.pci_bus_id,
                     "driver_version": d.device.driver_version, "mig_mode": d.device.mig_mode,
                     "parent_uuid": d.device.parent_uuid, "up": d.up, "error": d.error,
                     "readings": [[r.metric, dict(r.labels), r.value] for r in d.readings]}
                    for d in snap.devices],
        "processes": [{"uuid": p.uuid, "pid": p.pid, "used_memory_bytes": p.used_memory_bytes,
                       "sm_utilization_ratio": p.sm_utilization_ratio} for p in snap.processes],
    }


def main() -> None:
    plan = json.loads(sys.argv[1])
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(message)s")
    profile = Path(os.environ["MOCK_NVML_CONFIG"])
    source = NvmlSource(pynvml, event_poll_ms=50, init_backoff=(0.01, 0.01))
    out: list[dict[str, Any]] = []
    try:
        for number, step in enumerate(plan["steps"]):
            if "overrides" in step:
                write_overrides(profile, step["overrides"] or None)
                time.sleep(float(step.get("settle", 0.3)))
            for _ in range(int(step.get("cycles", 1))):
                try:
                    rec = record(source.collect())
                except SourceError as exc:
                    rec = {"error": str(exc)}
                rec["step"] = number
                out.append(rec)
                time.sleep(plan["interval"])
    finally:
        source.close()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
