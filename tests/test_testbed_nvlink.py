"""NVLink against NVIDIA's mock NVML (the real pynvml and C ABI): which links a GPU has, and that the
source's fast field-value reader (``sources/nvml_fields``: one prebuilt batch, answers unpacked from the
array's bytes) reads what pynvml's own wrappers read for the same calls.

Each profile runs in a process of its own (the mock reads ``MOCK_NVML_CONFIG`` at init). Where the mock
differs from real NVML (tests/nvmltestbed.py's README list), the expectation follows real NVML:

- the throughput fields 138/139 (``NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX/RX``) are KiB in nvml.h; the
  mock counts bytes. Expected here: the raw value times 1024, as the source converts real NVML's;
- ``NVML_FI_DEV_NVLINK_LINK_COUNT`` counts active links in the mock, links present in real NVML:
  neither says which indices the links have, so links are expected wherever
  ``nvmlDeviceGetNvLinkState`` answers, up or down.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import NvmlTestbed
from nvmltestbed import profile_path, run_python

from dra_exporter import catalog as cat

pytestmark = pytest.mark.testbed_nvml

# Runs in the profile's process: the source's link readings of every GPU after two cycles, and for
# each link its state and the per-link fields read with pynvml's wrappers just before and just after
# the second cycle (the mock's data counters grow with time: the source's value lies between them).
_READ_BOTH = """
import json, pynvml
from dra_exporter.sources.nvml import NvmlSource

FIELDS = {name: getattr(pynvml, name) for name in (
    "NVML_FI_DEV_NVLINK_GET_STATE", "NVML_FI_DEV_NVLINK_GET_SPEED", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX",
    "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX", "NVML_FI_DEV_NVLINK_ERROR_DL_CRC", "NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY",
    "NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY", "NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS",
    "NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS", "NVML_FI_DEV_NVLINK_COUNT_RCV_ERRORS",
    "NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS", "NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS")}
MEMBERS = {pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal", pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
           pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal", pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
           pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal", pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal"}

def wrapped(handle, links):
    asked = [(fid, link) for link in links for fid in FIELDS.values()]
    names = {fid: name for name, fid in FIELDS.items()}
    out = {}
    for v in pynvml.nvmlDeviceGetFieldValues(handle, asked) if asked else []:
        ok = v.nvmlReturn == pynvml.NVML_SUCCESS
        out[f"{names[v.fieldId]}/{v.scopeId}"] = getattr(v.value, MEMBERS[v.valueType]) if ok else None
    return out

pynvml.nvmlInit()
source = NvmlSource(pynvml, events=False)
source.collect()
handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
states = []
for h in handles:
    per_link = {}
    for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
        try:
            per_link[link] = pynvml.nvmlDeviceGetNvLinkState(h, link)
        except pynvml.NVMLError:
            pass
    states.append(per_link)
before = [wrapped(h, s) for h, s in zip(handles, states)]
snapshot = source.collect()
after = [wrapped(h, s) for h, s in zip(handles, states)]
readings = [[[r.metric, dict(r.labels), r.value] for r in d.readings if r.metric.startswith("dra_gpu_nvlink")]
            for d in snapshot.devices]
source.close()
print(json.dumps({"states": states, "before": before, "after": after, "readings": readings,
                  "models": [d.device.model for d in snapshot.devices]}))
"""

#: What each field becomes in the source: (metric, own labels, scale from NVML's unit to the export's).
_EXPECTED = {
    "NVML_FI_DEV_NVLINK_GET_SPEED": (cat.GPU_NVLINK_LINK_SPEED.name, {}, 1e6),  # MBps
    "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX": (cat.GPU_NVLINK_LINK_BYTES.name, {"direction": "tx"}, 1024.0),  # KiB
    "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX": (cat.GPU_NVLINK_LINK_BYTES.name, {"direction": "rx"}, 1024.0),
    "NVML_FI_DEV_NVLINK_ERROR_DL_CRC": (cat.GPU_NVLINK_LINK_ERRORS.name, {"type": "crc_flit"}, 1.0),
    "NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY": (cat.GPU_NVLINK_LINK_ERRORS.name, {"type": "replay"}, 1.0),
    "NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY": (cat.GPU_NVLINK_LINK_ERRORS.name, {"type": "recovery"}, 1.0),
    "NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS": (cat.GPU_NVLINK_LINK_ERRORS.name, {"type": "symbol"}, 1.0),
    "NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS": (cat.GPU_NVLINK_LINK_ERRORS.name, {"type": "effective"}, 1.0),
    "NVML_FI_DEV_NVLINK_COUNT_RCV_ERRORS": (cat.GPU_NVLINK_LINK_ERRORS.name, {"type": "rcv"}, 1.0),
    "NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS": (cat.GPU_NVLINK_LINK_RECOVERIES.name,
                                                                 {"result": "successful"}, 1.0),
    "NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS": (cat.GPU_NVLINK_LINK_RECOVERIES.name,
                                                             {"result": "failed"}, 1.0),
}
_GROWING = {"NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX", "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX"}


def _run(testbed: NvmlTestbed, profile: str) -> Any:
    return run_python(testbed.library, profile_path(testbed.folder, profile), _READ_BOTH)


def _by_key(readings: list[list[Any]]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {(metric, tuple(sorted(labels.items()))): value for metric, labels, value in readings}


@pytest.mark.parametrize("profile", ["gb200", "gb300", "b200", "h100",
                                     "gb200.rich", "gb300.rich", "b200.rich", "h100.rich"])
def test_the_fast_reader_reads_what_pynvml_wrappers_read(nvml_testbed: NvmlTestbed, profile: str) -> None:
    got = _run(nvml_testbed, profile)
    checked = 0
    for gpu, (states, before, after, readings) in enumerate(zip(got["states"], got["before"], got["after"],
                                                                 got["readings"], strict=True)):
        exported = _by_key(readings)
        for link_text, state in states.items():
            link = int(link_text)
            up_key = (cat.GPU_NVLINK_LINK_UP.name, (("link", str(link)),))
            assert exported[up_key] == float(state), (gpu, link)  # NVML_FEATURE_ENABLED is 1
            for field, (metric, labels, scale) in _EXPECTED.items():
                key = (metric, tuple(sorted({"link": str(link), **labels}.items())))
                low, high = before[f"{field}/{link}"], after[f"{field}/{link}"]
                if low is None or high is None:
                    # Refused by NVML: the source exports nothing for it (on a link that is up; a down
                    # link's counter may come back with it, but is absent meanwhile).
                    assert key not in exported, (gpu, key)
                    continue
                value = exported[key]
                if field in _GROWING:
                    assert low * scale <= value <= high * scale, (gpu, key, low, value, high)
                else:
                    assert value == low * scale == high * scale, (gpu, key, low, value)
                checked += 1
    assert checked, f"{profile}: no per-link value compared"


def _link_states(profile: Path) -> tuple[int, dict[int, dict[int, bool]]]:
    """Links per GPU, and gpu -> link -> up where the profile declares a GPU's links one by one."""
    nvlink = yaml.safe_load(profile.read_text())["nvlink"]
    return nvlink["links_per_gpu"], {
        entry["index"]: {int(link["link"]): link["state"] == "active" for link in entry["links"]}
        for entry in nvlink.get("device_links", [])}


def test_with_a_link_down_every_link_appears_and_the_down_one_reads_0(nvml_testbed: NvmlTestbed) -> None:
    path = profile_path(nvml_testbed.folder, "gb200.linkdown")
    links, declared = _link_states(path)
    assert any(not up for links in declared.values() for up in links.values()), "the profile has a link down"
    got = _run(nvml_testbed, "gb200.linkdown")
    for gpu, readings in enumerate(got["readings"]):
        up = {int(labels["link"]): value for metric, labels, value in readings
              if metric == cat.GPU_NVLINK_LINK_UP.name}
        expected = declared.get(gpu) or {link: True for link in range(links)}
        # Before: the links were taken as 0..LINK_COUNT-1, and the mock counts only active links,
        # so on GPU 0 (link 3 down, 17 links active) link 17 never appeared.
        assert up == {link: 1.0 if is_up else 0.0 for link, is_up in expected.items()}, gpu


def test_the_mock_benchmark_runs_and_writes_its_figures(nvml_testbed: NvmlTestbed, tmp_path: Path) -> None:
    """``benchmarks/bench_nvml_mock.py`` does not rot: a tiny run, its JSON shape (never a timing)."""
    import subprocess
    import sys

    repo = Path(__file__).resolve().parents[1]
    out = tmp_path / "mock.json"
    subprocess.run([sys.executable, "-m", "benchmarks.bench_nvml_mock", "--profiles", "gb200", "--cycles", "2",
                    "--serve-seconds", "0", "--out", str(out)], cwd=repo, check=True, capture_output=True, timeout=120)
    (row,) = json.loads(out.read_text())
    assert row["profile"] == "gb200" and row["models"] == ["NVIDIA GB200"]
    assert row["cycle_cpu_ms"] > 0 and row["nvml_floor_ms"] > 0 and row["c_calls"] > 0
    assert row["c_calls_by_function"]["nvmlDeviceGetFieldValues"] == row["devices"]  # one per GPU per cycle
