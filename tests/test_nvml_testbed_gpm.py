"""GPM over the real pynvml against NVIDIA's mock NVML: the units nvml.h gives the GPM metrics.

The source exports GPM's NVLink bytes wherever a device has no per-link counters (every MIG device, GPUs
whose links NVML does not count); the mock has no MIG devices, so the GPM reader is driven directly here,
on a whole gb200 GPU, whose 18 switch links the mock keeps busy at a known rate.
"""

from __future__ import annotations

import pytest
from conftest import NvmlTestbed
from nvmltestbed import load_profile, profile_path, run_python

pytestmark = pytest.mark.testbed_nvml

READ_GPM_TWICE = """
import json, time, pynvml
from dra_exporter.sources.nvml_gpm import GpmReader
pynvml.nvmlInit()
reader = GpmReader(pynvml, pynvml.nvmlDeviceGetHandleByIndex(0))
start = time.monotonic()
reader.read(start)
time.sleep(0.5)
end = time.monotonic()
readings = reader.read(end)
print(json.dumps({"seconds": end - start,
                  "readings": [[r.metric, dict(r.labels), r.value] for r in readings]}))
"""


def test_gpm_nvlink_rates_are_mib_per_second_integrated_to_bytes(nvml_testbed: NvmlTestbed) -> None:
    profile = profile_path(nvml_testbed.folder, "gb200")
    nvlink = load_profile(profile)["nvlink"]
    # The mock moves line rate x duty cycle (default 0.05, engine/topology.go) on every active link and
    # answers NVML_GPM_METRIC_NVLINK_TOTAL_*_PER_SEC in MiB/s, as nvml.h defines them.
    duty = (nvlink.get("defaults") or {}).get("duty_cycle", 0.05)
    bytes_per_second = nvlink["links_per_gpu"] * nvlink["bandwidth_per_link_mbps"] * 1e6 * duty
    out = run_python(nvml_testbed.library, profile, READ_GPM_TWICE)
    moved = {labels["direction"]: value for metric, labels, value in out["readings"]
             if metric == "dra_gpu_nvlink_bytes_total"}
    assert set(moved) == {"rx", "tx"}
    for direction, total in moved.items():
        # Our interval and the mock's sample timestamps differ by a few milliseconds of 500.
        assert total == pytest.approx(bytes_per_second * out["seconds"], rel=0.1), direction
