"""The metric catalogue: every family the exporter publishes, described once.

Sinks, docs and tests read this table; no other module spells a metric name as
a literal except through these constants. Label tuples are the full, ordered
label set of each family's series (the join builds labels in this order).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Literal

Kind = Literal["gauge", "counter"]

#: Identity of a device series: the NVML UUID, the physical GPU's index, MIG partition.
DEVICE_ID_LABELS: Final = ("uuid", "gpu", "profile", "parent_uuid")
#: Who holds the device (DESIGN §3). Empty strings when nobody does, or where the consumers
#: disagree (a device shared by two pods keeps ``claim`` and ``request`` but not ``pod``).
#: ``pod_uid`` and ``request`` need the API server; node-local they stay empty.
ATTRIBUTION_LABELS: Final = ("namespace", "pod", "pod_uid", "container", "claim", "request")
DEVICE_LABELS: Final = DEVICE_ID_LABELS + ATTRIBUTION_LABELS
CONTAINER_LABELS: Final = ("uuid", "namespace", "pod", "pod_uid", "container", "claim")


@dataclass(frozen=True, slots=True)
class MetricSpec:
    name: str
    """Native Prometheus name; counters include ``_total``."""
    kind: Kind
    help: str
    labels: tuple[str, ...]
    otel_name: str = ""
    """OpenTelemetry instrument name; ``""`` when the family is not pushed over OTLP."""
    otel_unit: str = ""
    otel_scale: float = 1.0
    """Factor from the native value to the OTel unit (ratio → ``1`` stays 1.0)."""


def _spec(name: str, kind: Kind, help: str, labels: tuple[str, ...] = DEVICE_LABELS,
          otel_name: str = "", otel_unit: str = "") -> MetricSpec:
    return MetricSpec(name, kind, help, labels, otel_name, otel_unit)


# --- device families (NVML) -----------------------------------------------------------------
GPU_INFO: Final = "dra_gpu_info"
GPU_UP: Final = "dra_gpu_up"
GPU_UTILIZATION: Final = "dra_gpu_utilization_ratio"
GPU_MEMORY_UTILIZATION: Final = "dra_gpu_memory_utilization_ratio"
GPU_ENCODER_UTILIZATION: Final = "dra_gpu_encoder_utilization_ratio"
GPU_DECODER_UTILIZATION: Final = "dra_gpu_decoder_utilization_ratio"
GPU_MEMORY_USED: Final = "dra_gpu_memory_used_bytes"
GPU_MEMORY_FREE: Final = "dra_gpu_memory_free_bytes"
GPU_MEMORY_TOTAL: Final = "dra_gpu_memory_total_bytes"
GPU_MEMORY_RESERVED: Final = "dra_gpu_memory_reserved_bytes"
GPU_POWER: Final = "dra_gpu_power_watts"
GPU_POWER_LIMIT: Final = "dra_gpu_power_limit_watts"
GPU_ENERGY: Final = "dra_gpu_energy_joules_total"
GPU_TEMPERATURE: Final = "dra_gpu_temperature_celsius"
GPU_MEMORY_TEMPERATURE: Final = "dra_gpu_memory_temperature_celsius"
GPU_CLOCK: Final = "dra_gpu_clock_hertz"
GPU_CLOCK_EVENT: Final = "dra_gpu_clock_event_active"
GPU_PCIE_BYTES: Final = "dra_gpu_pcie_bytes_total"
GPU_PCIE_REPLAYS: Final = "dra_gpu_pcie_replays_total"
GPU_ECC_ERRORS: Final = "dra_gpu_ecc_errors_total"
GPU_REMAPPED_ROWS: Final = "dra_gpu_remapped_rows_total"
GPU_ROW_REMAP_PENDING: Final = "dra_gpu_row_remap_pending"
GPU_ROW_REMAP_FAILURE: Final = "dra_gpu_row_remap_failure"
GPU_XID_ERRORS: Final = "dra_gpu_xid_errors_total"
GPU_LAST_XID: Final = "dra_gpu_last_xid_timestamp_seconds"
GPU_SM_ACTIVE: Final = "dra_gpu_sm_active_ratio"
GPU_SM_OCCUPANCY: Final = "dra_gpu_sm_occupancy_ratio"
GPU_TENSOR_ACTIVE: Final = "dra_gpu_tensor_active_ratio"
GPU_DRAM_ACTIVE: Final = "dra_gpu_dram_active_ratio"
GPU_FP64_ACTIVE: Final = "dra_gpu_fp64_active_ratio"
GPU_FP32_ACTIVE: Final = "dra_gpu_fp32_active_ratio"
GPU_FP16_ACTIVE: Final = "dra_gpu_fp16_active_ratio"
GPU_NVLINK_BYTES: Final = "dra_gpu_nvlink_bytes_total"

# --- per-container families (NVML processes + cgroups) -------------------------------------
CONTAINER_GPU_MEMORY_USED: Final = "dra_container_gpu_memory_used_bytes"
CONTAINER_GPU_SM_UTILIZATION: Final = "dra_container_gpu_sm_utilization_ratio"

# --- DRA identity families ------------------------------------------------------------------
CLAIM_ALLOCATION_INFO: Final = "dra_claim_allocation_info"
CLAIM_CONSUMER_INFO: Final = "dra_claim_consumer_info"
CLAIM_DEVICE_CONDITION: Final = "dra_claim_device_condition"

# --- ResourceSlice families (API server) ----------------------------------------------------
DEVICE_INFO: Final = "dra_device_info"
DEVICE_TAINT: Final = "dra_device_taint"
DEVICE_HEALTH: Final = "dra_device_health"
DEVICE_SHARED_CAPACITY: Final = "dra_device_shared_capacity"
DEVICE_SHARED_CONSUMPTION: Final = "dra_device_shared_consumption"

# --- self-metrics ---------------------------------------------------------------------------
SOURCE_UP: Final = "dra_exporter_source_up"
COLLECT_DURATION: Final = "dra_exporter_collect_duration_seconds"
COLLECT_ERRORS: Final = "dra_exporter_collect_errors_total"
LAST_SUCCESS: Final = "dra_exporter_last_success_timestamp_seconds"
BUILD_INFO: Final = "dra_exporter_build_info"
UNATTRIBUTED_PROCESSES: Final = "dra_exporter_unattributed_gpu_processes"

_SOURCE = ("source",)

CATALOG: Final[tuple[MetricSpec, ...]] = (
    _spec(GPU_INFO, "gauge", "NVML identity of a GPU or MIG device; value is always 1.",
          ("uuid", "gpu", "model", "pci_bus_id", "driver_version", "profile", "parent_uuid",
           "mig_mode", "gpu_instance_id", "compute_instance_id")),
    _spec(GPU_UP, "gauge", "Whether the last cycle read this device without an NVML error (1) or not (0).",
          otel_name="hw.status", otel_unit="1"),
    _spec(GPU_UTILIZATION, "gauge", "Fraction of the last sample period during which a kernel ran on the GPU.",
          otel_name="hw.gpu.utilization", otel_unit="1"),
    _spec(GPU_MEMORY_UTILIZATION, "gauge",
          "Fraction of the last sample period during which device memory was read or written.",
          otel_name="hw.gpu.memory.activity", otel_unit="1"),
    _spec(GPU_ENCODER_UTILIZATION, "gauge", "Fraction of time the video encoder was busy.",
          otel_name="hw.gpu.utilization", otel_unit="1"),
    _spec(GPU_DECODER_UTILIZATION, "gauge", "Fraction of time the video decoder was busy.",
          otel_name="hw.gpu.utilization", otel_unit="1"),
    _spec(GPU_MEMORY_USED, "gauge", "Device memory in use, in bytes.",
          otel_name="hw.gpu.memory.usage", otel_unit="By"),
    _spec(GPU_MEMORY_FREE, "gauge", "Device memory free, in bytes.",
          otel_name="hw.gpu.memory.free", otel_unit="By"),
    _spec(GPU_MEMORY_TOTAL, "gauge", "Device memory size, in bytes.",
          otel_name="hw.gpu.memory.limit", otel_unit="By"),
    _spec(GPU_MEMORY_RESERVED, "gauge", "Device memory reserved by the driver and firmware, in bytes.",
          otel_name="hw.gpu.memory.reserved", otel_unit="By"),
    _spec(GPU_POWER, "gauge", "Power draw of the whole board, in watts.", otel_name="hw.power", otel_unit="W"),
    _spec(GPU_POWER_LIMIT, "gauge", "Enforced power limit, in watts.",
          otel_name="hw.power.limit", otel_unit="W"),
    _spec(GPU_ENERGY, "counter", "Energy used since the driver was loaded, in joules.",
          otel_name="hw.energy", otel_unit="J"),
    _spec(GPU_TEMPERATURE, "gauge", "GPU die temperature, in degrees Celsius.",
          otel_name="hw.temperature", otel_unit="Cel"),
    _spec(GPU_MEMORY_TEMPERATURE, "gauge", "HBM temperature, in degrees Celsius.",
          otel_name="hw.temperature", otel_unit="Cel"),
    _spec(GPU_CLOCK, "gauge", "Current clock frequency, in hertz.", DEVICE_LABELS + ("clock",),
          otel_name="hw.gpu.clock.frequency", otel_unit="Hz"),
    _spec(GPU_CLOCK_EVENT, "gauge",
          "Whether a clock event reason (throttling) is active now (1) or not (0).",
          DEVICE_LABELS + ("reason",), otel_name="hw.gpu.clock.event.active", otel_unit="1"),
    _spec(GPU_PCIE_BYTES, "counter", "Bytes moved over PCIe since the driver was loaded.",
          DEVICE_LABELS + ("direction",), otel_name="hw.gpu.io", otel_unit="By"),
    _spec(GPU_PCIE_REPLAYS, "counter", "PCIe replays since the driver was loaded.",
          otel_name="hw.gpu.pcie.replays", otel_unit="{replay}"),
    _spec(GPU_ECC_ERRORS, "counter", "ECC errors since the driver was loaded (volatile counters).",
          DEVICE_LABELS + ("type",), otel_name="hw.errors", otel_unit="{error}"),
    _spec(GPU_REMAPPED_ROWS, "counter", "Memory rows remapped because of ECC errors.",
          DEVICE_LABELS + ("type",), otel_name="hw.gpu.memory.remapped_rows", otel_unit="{row}"),
    _spec(GPU_ROW_REMAP_PENDING, "gauge", "Whether a row remap waits for the next GPU reset (1) or not (0).",
          otel_name="hw.gpu.memory.row_remap.pending", otel_unit="1"),
    _spec(GPU_ROW_REMAP_FAILURE, "gauge", "Whether a row remap has failed (1) or not (0).",
          otel_name="hw.gpu.memory.row_remap.failed", otel_unit="1"),
    _spec(GPU_XID_ERRORS, "counter", "XID errors seen by this exporter since it started, by XID code.",
          DEVICE_LABELS + ("xid",), otel_name="hw.errors", otel_unit="{error}"),
    _spec(GPU_LAST_XID, "gauge", "Unix time of the last XID error seen on this device.",
          otel_name="hw.gpu.xid.last_time", otel_unit="s"),
    _spec(GPU_SM_ACTIVE, "gauge", "GPM: fraction of SM cycles with at least one warp resident.",
          otel_name="hw.gpu.sm.active", otel_unit="1"),
    _spec(GPU_SM_OCCUPANCY, "gauge", "GPM: resident warps as a fraction of the SM maximum.",
          otel_name="hw.gpu.sm.occupancy", otel_unit="1"),
    _spec(GPU_TENSOR_ACTIVE, "gauge", "GPM: fraction of cycles any tensor pipe was active.",
          otel_name="hw.gpu.tensor.active", otel_unit="1"),
    _spec(GPU_DRAM_ACTIVE, "gauge", "GPM: fraction of peak DRAM bandwidth used.",
          otel_name="hw.gpu.dram.active", otel_unit="1"),
    _spec(GPU_FP64_ACTIVE, "gauge", "GPM: fraction of cycles the FP64 pipe was active.",
          otel_name="hw.gpu.fp64.active", otel_unit="1"),
    _spec(GPU_FP32_ACTIVE, "gauge", "GPM: fraction of cycles the FP32 pipe was active.",
          otel_name="hw.gpu.fp32.active", otel_unit="1"),
    _spec(GPU_FP16_ACTIVE, "gauge", "GPM: fraction of cycles the FP16 pipe was active.",
          otel_name="hw.gpu.fp16.active", otel_unit="1"),
    _spec(GPU_NVLINK_BYTES, "counter", "Bytes moved over NVLink since this exporter started (from GPM rates).",
          DEVICE_LABELS + ("direction",), otel_name="hw.gpu.nvlink.io", otel_unit="By"),
    _spec(CONTAINER_GPU_MEMORY_USED, "gauge",
          "Device memory used by the processes of one container on one device, in bytes.", CONTAINER_LABELS,
          otel_name="dra.container.gpu.memory.usage", otel_unit="By"),
    _spec(CONTAINER_GPU_SM_UTILIZATION, "gauge",
          "SM utilisation of the processes of one container on one device (0-1).", CONTAINER_LABELS,
          otel_name="dra.container.gpu.utilization", otel_unit="1"),
    _spec(CLAIM_ALLOCATION_INFO, "gauge",
          "A device allocated to a ResourceClaim on this node; value is always 1.",
          ("namespace", "claim", "claim_uid", "request", "driver", "pool", "device", "uuid", "admin_access"),
          otel_name="dra.claim.allocation", otel_unit="1"),
    _spec(CLAIM_CONSUMER_INFO, "gauge",
          "A pod (and container) that uses a ResourceClaim on this node; value is always 1.",
          ("namespace", "claim", "pod", "pod_uid", "container"),
          otel_name="dra.claim.consumer", otel_unit="1"),
    # An info family: no OTLP name (and its ``type`` label is no ``error.type``).
    _spec(CLAIM_DEVICE_CONDITION, "gauge",
          "A condition the driver reports on a claim's device (status.devices); value is always 1.",
          ("namespace", "claim", "driver", "pool", "device", "type", "status")),
    _spec(DEVICE_INFO, "gauge",
          "A device a ResourceSlice publishes for this node, allocated or not; value is always 1.",
          ("node", "driver", "pool", "device", "uuid", "type", "profile", "parent_uuid", "model")),
    _spec(DEVICE_TAINT, "gauge", "A taint on a ResourceSlice device; value is always 1.",
          ("driver", "pool", "device", "key", "value", "effect"),
          otel_name="dra.device.taint", otel_unit="1"),
    _spec(DEVICE_HEALTH, "gauge",
          "Health of a DRA device as the kubelet reports it for a container (allocatedResourcesStatus); "
          "value is always 1.",
          ("namespace", "pod", "container", "claim", "request", "driver", "pool", "device", "health"),
          otel_name="dra.device.health", otel_unit="1"),
    _spec(DEVICE_SHARED_CAPACITY, "gauge",
          "Capacity of a shared counter of partitionable devices (ResourceSlice sharedCounters), "
          "in the counter's base unit (bytes for memory).",
          ("driver", "pool", "counter_set", "counter"),
          otel_name="dra.device.shared.capacity", otel_unit="1"),
    _spec(DEVICE_SHARED_CONSUMPTION, "gauge",
          "What an allocated device takes from a shared counter (ResourceSlice consumesCounters), "
          "in the counter's base unit; sum by counter set to compare with the capacity.",
          ("driver", "pool", "device", "counter_set", "counter"),
          otel_name="dra.device.shared.consumption", otel_unit="1"),
    _spec(SOURCE_UP, "gauge", "Whether the source's last collection succeeded (1) or not (0).", _SOURCE,
          otel_name="dra.exporter.source.up", otel_unit="1"),
    _spec(COLLECT_DURATION, "gauge", "Seconds the source's last collection took.", _SOURCE,
          otel_name="dra.exporter.collect.duration", otel_unit="s"),
    _spec(COLLECT_ERRORS, "counter", "Failed collections of the source since start.", _SOURCE,
          otel_name="dra.exporter.collect.errors", otel_unit="{error}"),
    _spec(LAST_SUCCESS, "gauge", "Unix time of the source's last successful collection.", _SOURCE,
          otel_name="dra.exporter.source.last_success_time", otel_unit="s"),
    _spec(BUILD_INFO, "gauge", "Version of dra-exporter; value is always 1.", ("version", "python_version")),
    _spec(UNATTRIBUTED_PROCESSES, "gauge",
          "GPU processes of the last cycle whose pod could not be found (no host PID namespace, or not in a "
          "container); they count in device totals but in no container series.", (),
          otel_name="dra.exporter.unattributed_processes", otel_unit="{process}"),
)

BY_NAME: Final[dict[str, MetricSpec]] = {spec.name: spec for spec in CATALOG}


def spec(name: str) -> MetricSpec:
    """The catalogue entry for ``name``; a KeyError names a metric nobody declared."""
    return BY_NAME[name]


def markdown_table() -> str:
    """The README's metrics table, generated so docs and code cannot drift."""
    rows = ["| metric | type | labels | OTLP name | help |", "|---|---|---|---|---|"]
    for s in CATALOG:
        otel = f"`{s.otel_name}` ({s.otel_unit})" if s.otel_name else ""
        rows.append(f"| `{s.name}` | {s.kind} | {', '.join(s.labels)} | {otel} | {s.help} |")
    return "\n".join(rows)


if __name__ == "__main__":  # python -m dra_exporter.catalog > table.md
    print(markdown_table())
