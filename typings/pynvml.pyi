# The part of pynvml (nvidia-ml-py, untyped) that the project names, typed: the error, NVML's
# integer constants and ctypes structs. Functions (nvmlInit, nvmlDeviceGet...) stay Any through
# __getattr__: the sources reach them through an injected NVML object (pynvml or the simulator's
# fake), never by name. tests/test_typing_stubs.py checks every name here against the library.
import ctypes
from typing import Any

class NVMLError(Exception):
    value: int
    def __init__(self, value: int) -> None: ...

class nvmlFriendlyObject:
    def __init__(self, dictionary: dict[str, Any]) -> None: ...

class _PrintableStructure(ctypes.Structure): ...

# A pointer type to the GPM sample struct in pynvml, not the struct itself.
c_nvmlGpmSample_t: type[ctypes._Pointer[Any]]

class c_nvmlFieldValue_t(_PrintableStructure): ...
class c_nvmlGpmMetricsGet_t(_PrintableStructure): ...
class c_nvmlGpmSupport_t(_PrintableStructure): ...
class c_nvmlGpuInstanceInfo_t(ctypes.Structure): ...
class c_nvmlMemory_t(_PrintableStructure): ...
class c_nvmlMemory_v2_t(_PrintableStructure): ...
class c_nvmlProcessUtilizationSample_t(_PrintableStructure): ...
class c_nvmlUtilization_t(_PrintableStructure): ...
class nvmlPciInfo_t(_PrintableStructure): ...

NVML_CLOCK_GRAPHICS: int
NVML_CLOCK_MEM: int
NVML_CLOCK_SM: int
NVML_CLOCK_VIDEO: int
NVML_DEVICE_MIG_DISABLE: int
NVML_DEVICE_MIG_ENABLE: int
NVML_ERROR_ARGUMENT_VERSION_MISMATCH: int
NVML_ERROR_DRIVER_NOT_LOADED: int
NVML_ERROR_GPU_IS_LOST: int
NVML_ERROR_INVALID_ARGUMENT: int
NVML_ERROR_LIBRARY_NOT_FOUND: int
NVML_ERROR_NOT_FOUND: int
NVML_ERROR_NOT_READY: int
NVML_ERROR_NOT_SUPPORTED: int
NVML_ERROR_TIMEOUT: int
NVML_ERROR_UNINITIALIZED: int
NVML_FEATURE_DISABLED: int
NVML_FEATURE_ENABLED: int
NVML_FI_DEV_ENERGY: int
NVML_FI_DEV_MEMORY_TEMP: int
NVML_FI_DEV_NVLINK_COUNT_BUFFER_OVERRUN_ERRORS: int
NVML_FI_DEV_NVLINK_COUNT_EFFECTIVE_ERRORS: int
NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS: int
NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS: int
NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS: int
NVML_FI_DEV_NVLINK_COUNT_LOCAL_LINK_INTEGRITY_ERRORS: int
NVML_FI_DEV_NVLINK_COUNT_MALFORMED_PACKET_ERRORS: int
NVML_FI_DEV_NVLINK_COUNT_RCV_ERRORS: int
NVML_FI_DEV_NVLINK_COUNT_RCV_GENERAL_ERRORS: int
NVML_FI_DEV_NVLINK_COUNT_RCV_REMOTE_ERRORS: int
NVML_FI_DEV_NVLINK_COUNT_SYMBOL_ERRORS: int
NVML_FI_DEV_NVLINK_COUNT_XMIT_DISCARDS: int
NVML_FI_DEV_NVLINK_ERROR_DL_CRC: int
NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY: int
NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY: int
NVML_FI_DEV_NVLINK_GET_SPEED: int
NVML_FI_DEV_NVLINK_GET_STATE: int
NVML_FI_DEV_NVLINK_GET_VERSION: int
NVML_FI_DEV_NVLINK_LINK_COUNT: int
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: int
NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: int
NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX: int
NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX: int
NVML_FI_DEV_PCIE_COUNT_RX_BYTES: int
NVML_FI_DEV_PCIE_COUNT_TX_BYTES: int
NVML_FI_DEV_POWER_AVERAGE: int
NVML_FI_DEV_POWER_INSTANT: int
NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION: int
NVML_GPM_METRICS_GET_VERSION: int
NVML_GPM_METRIC_MAX: int
NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: int
NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: int
NVML_GPM_METRIC_PCIE_RX_PER_SEC: int
NVML_GPM_METRIC_PCIE_TX_PER_SEC: int
NVML_GPM_SUPPORT_VERSION: int
NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_TRUE: int
NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY: int
NVML_GPU_FABRIC_STATE_IN_PROGRESS: int
NVML_NVLINK_STATE_ACTIVE: int
NVML_NVLINK_STATE_INACTIVE: int
NVML_SUCCESS: int
NVML_TEMPERATURE_GPU: int
NVML_VALUE_TYPE_UNSIGNED_INT: int
NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: int
nvmlEventTypeXidCriticalError: int
nvmlGpuFabricInfo_v2: int
nvmlGpuFabricInfo_v3: int
nvmlMemory_v2: int

def _nvmlGetFunctionPointer(name: str) -> Any: ...
def __getattr__(name: str) -> Any: ...
