"""Derive the simulated H200's device profile from the real NVML recordings.

    python dra_exporter_sim/profiles/make_profile.py [--fixtures DIR] [--out FILE]

Reads ``h200-idle.json`` and ``h200-under-load.json`` (written by the fixtures'
``record_nvml.py`` on a real H200) and writes ``h200.json`` next to this script:
the idle and loaded operating points the fake NVML interpolates between, which
field values and GPM metrics answer (and with what NVML return code), identity
strings, and recorded per-call latencies. The MIG profile table is not in the
recording (MIG was disabled on that GPU); it is NVIDIA's published H200 table,
written out below. Re-run this script when the recordings change; the fake NVML
reads only the generated file.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

_HERE = Path(__file__).resolve().parent
# The recordings the repository carries for its tests.
_DEFAULT_FIXTURES = _HERE.parents[1] / "tests" / "fixtures" / "nvml"
_MIB = 1 << 20

# NVIDIA's published H200 MIG profiles: GPU-instance profile id, memory slices
# (the placement size), compute slices, valid placement starts, most instances.
_MIG_PROFILES = (
    ("1g.18gb", 19, 1, 1, (0, 1, 2, 3, 4, 5, 6), 7),
    ("1g.18gb+me", 20, 1, 1, (0, 1, 2, 3, 4, 5, 6), 1),
    ("1g.35gb", 15, 2, 1, (0, 2, 4, 6), 4),
    ("2g.35gb", 14, 2, 2, (0, 2, 4), 3),
    ("3g.71gb", 9, 4, 3, (0, 4), 2),
    ("4g.71gb", 5, 4, 4, (0,), 1),
    ("7g.141gb", 0, 8, 7, (0,), 1),
)

# Not in the recording (no event arrived); Hopper supports these event types.
_SUPPORTED_EVENT_TYPES = 0x1 | 0x2 | 0x4 | 0x8 | 0x10  # SBE, DBE, PState, XID, Clock

# Extra PCIe traffic at 100 % utilisation. The recording's load (a matmul loop on
# resident tensors) moved almost nothing over PCIe, so this is an assumption: a
# training job streaming input batches.
_PCIE_EXTRA_BYTES_PER_S_AT_FULL_LOAD = 256 * _MIB


def _ok(entry: dict[str, Any], what: str) -> Any:
    if "ok" not in entry:
        raise SystemExit(f"make_profile: the recording has no value for {what}: {entry}")
    return entry["ok"]


def _device(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    data = json.loads(path.read_text())
    return data["meta"], data["devices"][0]


def _field_table(idle: dict[str, Any], load: dict[str, Any]) -> list[dict[str, Any]]:
    loaded = {f["fieldId"]: f for f in load["fields"] if "fieldId" in f}
    rows = []
    for f in idle["fields"]:
        if "fieldId" not in f:
            continue
        under_load = loaded.get(f["fieldId"], f)
        rows.append({"id": f["fieldId"], "name": f["name"], "ret": f["ret"], "value_type": f["valueType"],
                     "idle": f["value"], "load": under_load["value"]})
    return rows


def _gpm_table(idle: dict[str, Any], load: dict[str, Any]) -> list[dict[str, Any]]:
    loaded = {m["id"]: m for m in load["gpm"]["metrics"]}
    return [{"id": m["id"], "name": m["name"], "ret": m["ret"], "idle": m["value"],
             "load": loaded.get(m["id"], m)["value"]} for m in idle["gpm"]["metrics"]]


def _latencies(load: dict[str, Any]) -> dict[str, float]:
    lat = {name: v["median_us"] for name, v in load["latency"].items() if name != "process_utilization"}
    lat["nvmlDeviceGetProcessUtilization"] = load["latency"]["process_utilization"]["median_us"]
    lat["nvmlDeviceGetFieldValues"] = load["strategy"]["fieldvalues_16"]["median_us"]
    lat["nvmlGpmSampleGet"] = load["gpm"]["sample_get_us"]
    lat["nvmlGpmMigSampleGet"] = load["gpm"]["sample_get_us"]
    lat["nvmlGpmMetricsGet"] = load["gpm"]["metrics_get_us_last_batch"]
    return dict(sorted(lat.items()))


def _gpm_value(dev: dict[str, Any], name: str) -> float:
    return float(next(m["value"] for m in dev["gpm"]["metrics"] if m["name"] == name))


def build_profile(fixtures: Path) -> dict[str, Any]:
    meta, idle = _device(fixtures / "h200-idle.json")
    _, load = _device(fixtures / "h200-under-load.json")
    ig, lg = idle["getters"], load["getters"]
    mem_idle, mem_load = _ok(ig["memory_v2"], "memory_v2"), _ok(lg["memory_v2"], "memory_v2")
    load_procs = _ok(lg["nvmlDeviceGetComputeRunningProcesses"], "processes")
    proc_util = _ok(lg["process_utilization"], "process utilisation")[0]
    util_idle = _ok(ig["nvmlDeviceGetUtilizationRates"], "utilisation")
    util_load = _ok(lg["nvmlDeviceGetUtilizationRates"], "utilisation")
    pci = _ok(ig["nvmlDeviceGetPciInfo_v3"], "PCI info")
    fields = {f["name"]: f for f in idle["fields"] if "name" in f}
    load_fields = {f["name"]: f for f in load["fields"] if "name" in f}
    clocks = {key: {"idle": _ok(idle["clocks"][name]["cur"], name),
                    "load": _ok(load["clocks"][name]["cur"], name),
                    "max": _ok(idle["clocks"][name]["max"], name)}
              for key, name in (("graphics", "NVML_CLOCK_GRAPHICS"), ("sm", "NVML_CLOCK_SM"),
                                ("mem", "NVML_CLOCK_MEM"), ("video", "NVML_CLOCK_VIDEO"))}
    return {
        "model": _ok(ig["nvmlDeviceGetName"], "name"),
        "generated_from": ["h200-idle.json", "h200-under-load.json"],
        "driver_version": _ok(meta["driver"], "driver"),
        "nvml_version": _ok(meta["nvml_version"], "NVML version"),
        # NVML's answers; the simulated driver publishes them as NVIDIA's does (architecture name, semver).
        "cuda_driver_version": _ok(meta["cuda_driver_version"], "CUDA driver version"),
        "architecture": _ok(ig["nvmlDeviceGetArchitecture"], "architecture"),
        "cuda_compute_capability": _ok(ig["nvmlDeviceGetCudaComputeCapability"], "compute capability"),
        "pci": {"device_id": pci["pciDeviceId"], "subsystem_id": pci["pciSubSystemId"]},
        "memory": {
            "total_bytes": mem_idle["total"],
            "reserved_bytes": mem_idle["reserved"],
            # What the device reports beyond the sum of its processes' memory.
            "context_overhead_bytes": mem_load["used"] - sum(p["usedGpuMemory"] for p in load_procs),
        },
        "power_limit_mw": _ok(ig["nvmlDeviceGetEnforcedPowerLimit"], "power limit"),
        "energy_start_mj": fields["NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]["value"],
        "idle": {"gpu_util": util_idle["gpu"], "memory_util": util_idle["memory"],
                 "power_mw": _ok(ig["nvmlDeviceGetPowerUsage"], "power")},
        "load": {"gpu_util": util_load["gpu"], "memory_util": util_load["memory"],
                 "power_mw": _ok(lg["nvmlDeviceGetPowerUsage"], "power")},
        "process_mem_util_per_sm_util": proc_util["memUtil"] / proc_util["smUtil"],
        "temperature": {
            "gpu": {"idle": _ok(ig["nvmlDeviceGetTemperature"], "temperature"),
                    "load": _ok(lg["nvmlDeviceGetTemperature"], "temperature")},
            "memory": {"idle": fields["NVML_FI_DEV_MEMORY_TEMP"]["value"],
                       "load": load_fields["NVML_FI_DEV_MEMORY_TEMP"]["value"]},
        },
        "clocks": clocks,
        "clock_event_reasons": {"idle": _ok(ig["nvmlDeviceGetCurrentClocksEventReasons"], "clock events"),
                                "load": _ok(lg["nvmlDeviceGetCurrentClocksEventReasons"], "clock events")},
        "encoder": _ok(ig["nvmlDeviceGetEncoderUtilization"], "encoder"),
        "decoder": _ok(ig["nvmlDeviceGetDecoderUtilization"], "decoder"),
        "pcie": {
            "tx_bytes_start": fields["NVML_FI_DEV_PCIE_COUNT_TX_BYTES"]["value"],
            "rx_bytes_start": fields["NVML_FI_DEV_PCIE_COUNT_RX_BYTES"]["value"],
            "tx_idle_bytes_per_s": round(_gpm_value(idle, "NVML_GPM_METRIC_PCIE_TX_PER_SEC") * _MIB),
            "rx_idle_bytes_per_s": round(_gpm_value(idle, "NVML_GPM_METRIC_PCIE_RX_PER_SEC") * _MIB),
            "extra_bytes_per_s_at_full_load": _PCIE_EXTRA_BYTES_PER_S_AT_FULL_LOAD,
        },
        "gpm_supported": bool(_ok(idle["gpm"]["support"], "GPM support")["isSupportedDevice"]),
        "supported_event_types": _SUPPORTED_EVENT_TYPES,
        "mig": {
            "memory_slices": 8,
            "compute_slices": 7,
            "max_devices": 7,
            "profiles": [{"name": n, "gi_profile_id": gid, "memory_slices": ms, "compute_slices": cs,
                          "starts": list(starts), "max_instances": mx}
                         for n, gid, ms, cs, starts, mx in _MIG_PROFILES],
        },
        "latency_us": _latencies(load),
        "fields": _field_table(idle, load),
        "gpm": _gpm_table(idle, load),
    }


def render(profile: dict[str, Any]) -> str:
    """JSON with one table row per line, so diffs of the generated file stay readable."""
    lines = ["{"]
    items = list(profile.items())
    for i, (key, value) in enumerate(items):
        sep = "," if i < len(items) - 1 else ""
        if isinstance(value, list) and value and isinstance(value[0], dict):
            rows = ",\n".join("  " + json.dumps(row) for row in value)
            lines.append(f" {json.dumps(key)}: [\n{rows}\n ]{sep}")
        else:
            text = json.dumps(value, indent=1) if isinstance(value, dict) else json.dumps(value)
            lines.append(f" {json.dumps(key)}: {text.replace(chr(10), chr(10) + ' ')}{sep}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fixtures", type=Path, default=_DEFAULT_FIXTURES,
                        help="directory holding h200-idle.json and h200-under-load.json")
    parser.add_argument("--out", type=Path, default=_HERE / "h200.json")
    args = parser.parse_args(argv)
    for name in ("h200-idle.json", "h200-under-load.json"):
        if not (args.fixtures / name).is_file():
            print(f"make_profile: {args.fixtures / name} not found (pass --fixtures DIR)", file=sys.stderr)
            return 2
    args.out.write_text(render(build_profile(args.fixtures)))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
