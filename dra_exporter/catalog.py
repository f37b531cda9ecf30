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
GPU_PROCESSES: Final = "dra_gpu_processes"

# --- per-container families (NVML processes + cgroups) -------------------------------------
CONTAINER_GPU_MEMORY_USED: Final = "dra_container_gpu_memory_used_bytes"
CONTAINER_GPU_SM_UTILIZATION: Final = "dra_container_gpu_sm_utilization_ratio"

# --- DRA identity families ------------------------------------------------------------------
CLAIM_ALLOCATION_INFO: Final = "dra_claim_allocation_info"
CLAIM_CONSUMER_INFO: Final = "dra_claim_consumer_info"
CLAIM_DEVICE_CONDITION: Final = "dra_claim_device_condition"
CLAIM_DEVICE_TOLERATION: Final = "dra_claim_device_toleration"
CLAIM_CONSUMED_CAPACITY: Final = "dra_claim_consumed_capacity"
CLAIM_DEVICE_NETWORK: Final = "dra_claim_device_network_info"

# --- ResourceSlice families (API server) ----------------------------------------------------
DEVICE_INFO: Final = "dra_device_info"
DEVICE_TAINT: Final = "dra_device_taint"
DEVICE_HEALTH: Final = "dra_device_health"
DEVICE_SHARED_CAPACITY: Final = "dra_device_shared_capacity"
DEVICE_SHARED_CONSUMPTION: Final = "dra_device_shared_consumption"

# --- cluster mode (``dra-exporter cluster``: the API server's DRA state of the whole cluster) ---------
CLUSTER_DEVICES: Final = "dra_cluster_devices"
CLUSTER_PARTITIONS_FIT: Final = "dra_cluster_partitions_fit"
CLUSTER_CLAIMS: Final = "dra_cluster_claims"
CLUSTER_CLAIM_PENDING: Final = "dra_cluster_claim_pending_seconds"
CLUSTER_CLAIM_UNRESERVED: Final = "dra_cluster_claim_unreserved_devices"
CLUSTER_CLASS_DEVICES: Final = "dra_cluster_class_devices"
CLUSTER_CLASS_EVALUABLE: Final = "dra_cluster_class_selectors_evaluable"
CLUSTER_CLASS_ERRORS: Final = "dra_cluster_class_selector_errors"
CLUSTER_POOL_INFO: Final = "dra_cluster_pool_info"
CLUSTER_POOL_SLICES: Final = "dra_cluster_pool_slices"
CLUSTER_POOL_SLICES_EXPECTED: Final = "dra_cluster_pool_slices_expected"
CLUSTER_POOL_COMPLETE: Final = "dra_cluster_pool_complete"
CLUSTER_TAINT_RULE_DEVICES: Final = "dra_cluster_taint_rule_devices"
CLUSTER_OBJECTS: Final = "dra_cluster_objects"

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
           "mig_mode", "gpu_instance_id", "compute_instance_id", "minor")),
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
    # The one activity signal NVML gives for MIG devices of GPUs without GPM (A100): the idle
    # alert needs it per device, whether or not the processes' pods can be found.
    _spec(GPU_PROCESSES, "gauge",
          "Compute and graphics processes NVML lists on this device in the last cycle.",
          otel_name="dra.gpu.processes", otel_unit="{process}"),
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
    _spec(CLAIM_DEVICE_TOLERATION, "gauge",
          "A device taint a claim's allocation tolerates (allocation results' tolerations; key=\"\" with "
          "operator=\"Exists\": every taint); value is always 1.",
          ("namespace", "claim", "request", "driver", "pool", "device", "key", "operator", "value", "effect"),
          otel_name="dra.claim.device.toleration", otel_unit="1"),
    _spec(CLAIM_CONSUMED_CAPACITY, "gauge",
          "What a claim's allocation takes of a device that allows several (consumable capacity: "
          "consumedCapacity of the allocation result, share_id its shareID), in the capacity's base unit.",
          ("namespace", "claim", "request", "driver", "pool", "device", "share_id", "capacity"),
          otel_name="dra.claim.consumed_capacity", otel_unit="1"),
    _spec(CLAIM_DEVICE_NETWORK, "gauge",
          "How a claim's network device appears in the pod, as its driver reports it (status.devices "
          "networkData; ips comma-joined); value is always 1.",
          ("namespace", "claim", "driver", "pool", "device", "interface", "hardware_address", "ips")),
    _spec(DEVICE_INFO, "gauge",
          "A device a ResourceSlice publishes for this node, allocated or not; value is always 1.",
          ("node", "driver", "pool", "device", "uuid", "type", "profile", "parent_uuid", "model")),
    _spec(DEVICE_TAINT, "gauge",
          "A taint on a device of this node: from its ResourceSlice (rule=\"\") or from the DeviceTaintRule "
          "named by rule; value is always 1.",
          ("driver", "pool", "device", "key", "value", "effect", "rule"),
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
    _spec(CLUSTER_DEVICES, "gauge",
          "Devices of the cluster's ResourceSlices (newest pool generation) by state: allocated (to a claim, "
          "admin access aside), tainted (not allocated, a NoSchedule/NoExecute taint), blocked (not allocated, "
          "its shared counters no longer fit) or free.",
          ("driver", "pool", "node", "type", "model", "profile", "state")),
    _spec(CLUSTER_PARTITIONS_FIT, "gauge",
          "Partitions of a partitionable device (a counter set: one GPU) that could still be allocated, by "
          "profile: free devices whose consumesCounters fit what allocated devices left of the counter set "
          "(the scheduler's arithmetic; each counted on its own, not all at once).",
          ("driver", "pool", "node", "counter_set", "profile")),
    _spec(CLUSTER_CLAIMS, "gauge",
          "ResourceClaims by state: pending (not allocated), allocated (but reserved by no pod) or reserved.",
          ("namespace", "state")),
    _spec(CLUSTER_CLAIM_PENDING, "gauge",
          "Seconds since a ResourceClaim that is not allocated yet was created; one series per request "
          "(and subrequest), only for pending claims.", ("namespace", "claim", "device_class", "request")),
    _spec(CLUSTER_CLAIM_UNRESERVED, "gauge",
          "Devices allocated to a ResourceClaim that no pod reserves (held, unused); only for such claims.",
          ("namespace", "claim")),
    _spec(CLUSTER_CLASS_DEVICES, "gauge",
          "Devices that match a DeviceClass's CEL selectors, by state (as dra_cluster_devices).",
          ("device_class", "state")),
    _spec(CLUSTER_CLASS_EVALUABLE, "gauge",
          "Whether the exporter could evaluate a DeviceClass's CEL selectors (1) or not (0: its capacity is "
          "not reported).", ("device_class",)),
    _spec(CLUSTER_CLASS_ERRORS, "gauge",
          "Devices for which a DeviceClass's CEL selectors failed (a missing attribute, a type error); the "
          "scheduler does not allocate them for the class either.", ("device_class",)),
    _spec(CLUSTER_POOL_INFO, "gauge",
          "A resource pool and where its devices are: placement is node, all-nodes, node-selector, per-device "
          "or counters-only (node is empty but for node); value is always 1.",
          ("driver", "pool", "node", "placement")),
    _spec(CLUSTER_POOL_SLICES, "gauge",
          "ResourceSlices of a pool seen, of its newest generation (generation=\"current\") and of older ones "
          "still published (\"older\": the pool is being replaced).", ("driver", "pool", "generation")),
    _spec(CLUSTER_POOL_SLICES_EXPECTED, "gauge",
          "resourceSliceCount of a pool's newest generation: the slices the pool is complete with.",
          ("driver", "pool")),
    _spec(CLUSTER_POOL_COMPLETE, "gauge",
          "Whether every slice of a pool's newest generation is published and no older one is left (1) or not "
          "(0): until then the scheduler sees part of the pool.", ("driver", "pool")),
    _spec(CLUSTER_TAINT_RULE_DEVICES, "gauge",
          "Devices a DeviceTaintRule taints now (0 when its selector matches none, or uses the 1.33-1.34 CEL "
          "selectors, which are not applied).", ("rule", "driver", "pool", "device", "key", "value", "effect")),
    _spec(CLUSTER_OBJECTS, "gauge", "DRA objects the cluster mode holds, by kind.", ("kind",)),
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


# --- dcgm-exporter names (``--naming dcgm|both``) ---------------------------------------------
# A second table, apart from CATALOG: these families are a renaming of native ones for the
# Prometheus endpoint only (``dra_exporter.naming`` builds them), so OTLP, the join and the
# README's native table never treat them as metrics of their own.

#: dcgm-exporter's labels on GPU series (its ``gpuMetricsFormat``, released casing ``Hostname``),
#: then its pod attributes and DRA labels; always all present, ``""`` where dcgm-exporter omits one.
DCGM_LABELS: Final = (
    "gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION",
    "GPU_I_PROFILE", "GPU_I_ID", "pod", "namespace", "container", "dra_claim_name", "dra_claim_namespace",
    "dra_driver_name", "dra_pool_name", "dra_device_name", "dra_mig_profile", "dra_mig_device_uuid",
)


@dataclass(frozen=True, slots=True)
class DcgmSpec:
    """One dcgm-exporter default counter and the native family it is computed from."""

    name: str
    """The raw DCGM field name: upper case, no unit suffix, no ``_total``."""
    dcgm_kind: Kind
    """The type dcgm-exporter declares. Exposed as ``gauge`` whatever it is: a counter's samples
    must end in ``_total`` (always in OpenMetrics, and in this renderer), which would rename them."""
    help: str
    source: str
    """Native family whose samples are converted (one DCGM series per native series)."""
    scale: float = 1.0
    """Factor from the native unit to DCGM's (bytes → MiB, Hz → MHz, J → mJ, ratio → %)."""
    select: tuple[tuple[str, str], ...] = ()
    """Native label values a sample must have (``clock=sm``); these labels are then dropped."""
    sum_over: str = ""
    """A native label summed away (NVLink ``direction``): one DCGM series per device."""
    unit: str = ""
    """DCGM's unit, for the README table."""


_MIB = 1.0 / (1 << 20)

DCGM_XID_ERRORS: Final = "DCGM_FI_DEV_XID_ERRORS"

DCGM_CATALOG: Final[tuple[DcgmSpec, ...]] = (
    DcgmSpec("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", GPU_CLOCK, 1e-6,
             (("clock", "sm"),), unit="MHz"),
    DcgmSpec("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", GPU_CLOCK, 1e-6,
             (("clock", "memory"),), unit="MHz"),
    DcgmSpec("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", GPU_MEMORY_TEMPERATURE, unit="C"),
    DcgmSpec("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", GPU_TEMPERATURE, unit="C"),
    DcgmSpec("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", GPU_POWER, unit="W"),
    DcgmSpec("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", "Total energy consumption since boot (in mJ).",
             GPU_ENERGY, 1e3, unit="mJ"),
    DcgmSpec("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.", GPU_PCIE_REPLAYS),
    DcgmSpec("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", GPU_UTILIZATION, 100.0, unit="%"),
    DcgmSpec("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", GPU_MEMORY_UTILIZATION, 100.0,
             unit="%"),
    DcgmSpec("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).", GPU_ENCODER_UTILIZATION, 100.0,
             unit="%"),
    DcgmSpec("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).", GPU_DECODER_UTILIZATION, 100.0,
             unit="%"),
    # Built by naming.py from the XID counters rather than converted sample by sample.
    DcgmSpec(DCGM_XID_ERRORS, "gauge", "Value of the last XID error encountered.", GPU_XID_ERRORS,
             unit="XID code"),
    DcgmSpec("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", GPU_MEMORY_FREE, _MIB,
             unit="MiB"),
    DcgmSpec("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", GPU_MEMORY_USED, _MIB,
             unit="MiB"),
    DcgmSpec("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).", GPU_MEMORY_RESERVED,
             _MIB, unit="MiB"),
    DcgmSpec("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter",
             "Total number of NVLink bandwidth counters for all lanes.", GPU_NVLINK_BYTES,
             sum_over="direction", unit="bytes, rx + tx, since the exporter started"),
    DcgmSpec("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter",
             "Number of remapped rows for uncorrectable errors", GPU_REMAPPED_ROWS,
             select=(("type", "uncorrectable"),)),
    DcgmSpec("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter",
             "Number of remapped rows for correctable errors", GPU_REMAPPED_ROWS,
             select=(("type", "correctable"),)),
    DcgmSpec("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed",
             GPU_ROW_REMAP_FAILURE, unit="0/1"),
    DcgmSpec("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active.",
             GPU_TENSOR_ACTIVE, unit="ratio"),
    DcgmSpec("DCGM_FI_PROF_DRAM_ACTIVE", "gauge",
             "Ratio of cycles the device memory interface is active sending or receiving data.",
             GPU_DRAM_ACTIVE, unit="ratio"),
    DcgmSpec("DCGM_FI_PROF_SM_ACTIVE", "gauge",
             "The ratio of cycles an SM has at least 1 warp assigned.", GPU_SM_ACTIVE, unit="ratio"),
    DcgmSpec("DCGM_FI_PROF_SM_OCCUPANCY", "gauge",
             "The ratio of number of warps resident on an SM.", GPU_SM_OCCUPANCY, unit="ratio"),
    DcgmSpec("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "gauge", "Ratio of cycles the fp64 pipes are active.",
             GPU_FP64_ACTIVE, unit="ratio"),
    DcgmSpec("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "gauge", "Ratio of cycles the fp32 pipes are active.",
             GPU_FP32_ACTIVE, unit="ratio"),
    DcgmSpec("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "gauge", "Ratio of cycles the fp16 pipes are active.",
             GPU_FP16_ACTIVE, unit="ratio"),
)
DCGM_BY_NAME: Final[dict[str, DcgmSpec]] = {d.name: d for d in DCGM_CATALOG}
#: Native families that ``--naming dcgm`` keeps beside their DCGM counterpart because the shipped
#: alert rules (deploy/prometheus-rules.yaml) or dashboards (dashboards/) read them: alerting and
#: every panel work under every naming. tests/test_alerts.py and tests/test_dashboards.py keep
#: this list equal to what the rules and dashboards use.
DCGM_KEPT_FOR_KIT: Final[frozenset[str]] = frozenset({
    GPU_UTILIZATION, GPU_MEMORY_USED, GPU_POWER, GPU_ENERGY, GPU_TEMPERATURE, GPU_MEMORY_TEMPERATURE,
    GPU_CLOCK, GPU_PCIE_REPLAYS, GPU_REMAPPED_ROWS, GPU_ROW_REMAP_FAILURE, GPU_XID_ERRORS, GPU_SM_ACTIVE,
    GPU_TENSOR_ACTIVE, GPU_DRAM_ACTIVE, GPU_NVLINK_BYTES,
})
#: dcgm-exporter default counters with no native source, and why (README, naming.py).
DCGM_LEFT_OUT: Final[tuple[tuple[str, str], ...]] = (
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "no native source: NVML's GPU utilisation samples kernels, GPM's SM "
     "activity is not the graphics engine; use DCGM_FI_DEV_GPU_UTIL or DCGM_FI_PROF_SM_ACTIVE"),
    ("DCGM_FI_PROF_PCIE_TX_BYTES / _RX_BYTES", "DCGM's are gauge rates; the native counter "
     "dra_gpu_pcie_bytes_total{direction} stays, use rate() on it"),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "vGPU only; not read"),
)


def _exposed(d: DcgmSpec) -> MetricSpec:
    # Labels: DCGM_LABELS; the XID family has no other. Exposed as a gauge (see DcgmSpec.dcgm_kind).
    return MetricSpec(d.name, "gauge", d.help if d.help.endswith(".") else d.help + ".", DCGM_LABELS)


BY_NAME: Final[dict[str, MetricSpec]] = {spec.name: spec for spec in CATALOG} | {
    d.name: _exposed(d) for d in DCGM_CATALOG}


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


def dcgm_markdown_table() -> str:
    """The README's ``--naming dcgm`` table: each DCGM family, its unit and native source."""
    rows = ["| dcgm-exporter name | DCGM type | unit | from | help |", "|---|---|---|---|---|"]
    for d in DCGM_CATALOG:
        source = f"`{d.source}`" + "".join(f" {{{k}=\"{v}\"}}" for k, v in d.select)
        if d.scale != 1.0:
            source += f" × {d.scale:g}"
        if d.sum_over:
            source += f", summed over `{d.sum_over}`"
        rows.append(f"| `{d.name}` | {d.dcgm_kind} | {d.unit} | {source} | {d.help} |")
    for name, why in DCGM_LEFT_OUT:
        rows.append(f"| `{name}` | — | — | *not emitted* | {why} |")
    return "\n".join(rows)


if __name__ == "__main__":  # python -m dra_exporter.catalog [dcgm] > table.md
    import sys

    print(dcgm_markdown_table() if sys.argv[1:] == ["dcgm"] else markdown_table())
