"""GPM (GPU Performance Monitoring, Hopper and later) for the NVML source.

GPM metrics are rates over an interval, so one reader per device keeps two NVML sample
buffers: each cycle fills one, diffs it against the other (last cycle's) and swaps them.
There is nothing to report on the first cycle. Ratios come back from NVML in percent and
leave here as 0-1; NVLink bytes are integrated from GPM's per-second rates (MiB/s, nvml.h) times
the seconds between the two samples, into a counter of bytes that only grows.

NVML errors propagate (the caller marks the device down and calls ``reset()``); a metric
that answers NOT_SUPPORTED is dropped from this device's request for good.

Cost: the request (pynvml's ``c_nvmlGpmMetricsGet_t``) is built once per order of the two buffers
(they alternate, so two requests) and its bytes copied back before each call, and the answers are
unpacked from its bytes in one ``struct`` call: filling and reading it through pynvml's
``_PrintableStructure`` attributes cost ~30 Python calls per metric, several times the C call.
A ratio NVML answers unchanged gives last cycle's reading again.
"""

from __future__ import annotations

import ctypes
import struct
from typing import Any, Final

from .. import catalog as cat
from ..model import Labels, Reading

#: (NVML constant, catalogue family) for GPM ratios NVML reports in percent.
_RATIO_METRICS: Final = (
    ("NVML_GPM_METRIC_SM_UTIL", cat.GPU_SM_ACTIVE),
    ("NVML_GPM_METRIC_SM_OCCUPANCY", cat.GPU_SM_OCCUPANCY),
    ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", cat.GPU_TENSOR_ACTIVE),
    ("NVML_GPM_METRIC_DRAM_BW_UTIL", cat.GPU_DRAM_ACTIVE),
    ("NVML_GPM_METRIC_FP64_UTIL", cat.GPU_FP64_ACTIVE),
    ("NVML_GPM_METRIC_FP32_UTIL", cat.GPU_FP32_ACTIVE),
    ("NVML_GPM_METRIC_FP16_UTIL", cat.GPU_FP16_ACTIVE),
)
#: (NVML constant, direction) for NVLink rates; nvml.h: "in MiB/sec".
_NVLINK_METRICS: Final = (
    ("NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC", "rx"),
    ("NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC", "tx"),
)
_MIB: Final = float(1 << 20)


def gpm_supported(nvml: Any, handle: Any) -> bool:
    """Whether the GPU supports GPM; NOT_SUPPORTED (old GPU or driver) means no."""
    try:
        return bool(nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
    except nvml.NVMLError as err:
        if err.value in (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_FUNCTION_NOT_FOUND):
            return False
        raise


def _metrics_get_type(nvml: Any) -> Any:
    """The ctypes request struct: from the given object, else pynvml's (only the type, never a call)."""
    struct = getattr(nvml, "c_nvmlGpmMetricsGet_t", None)
    if struct is None:
        import pynvml  # the struct layout is NVML's ABI; the fake re-uses it too

        struct = pynvml.c_nvmlGpmMetricsGet_t
    return struct


class GpmReader:
    """GPM for one device: a whole GPU (``gi_id=None``) or one GPU instance of a MIG GPU.

    ``handle`` is always the physical GPU's handle; MIG instances are sampled through it.
    """

    def __init__(self, nvml: Any, handle: Any, gi_id: int | None = None) -> None:
        self._nvml = nvml
        self._handle = handle
        self._gi_id = gi_id
        self._struct = _metrics_get_type(nvml)
        self._not_supported = int(nvml.NVML_ERROR_NOT_SUPPORTED)
        self._success = int(nvml.NVML_SUCCESS)
        # metric id -> (family name, labels, is_rate); constants missing from an old pynvml are skipped.
        self._wanted: dict[int, tuple[str, Labels, bool]] = {}
        for const, family in _RATIO_METRICS:
            if (mid := getattr(nvml, const, None)) is not None:
                self._wanted[int(mid)] = (family.name, (), False)
        for const, direction in _NVLINK_METRICS:
            if (mid := getattr(nvml, const, None)) is not None:
                self._wanted[int(mid)] = (cat.GPU_NVLINK_BYTES.name, cat.GPU_NVLINK_BYTES.extra(direction=direction),
                                          True)
        self._samples: list[Any] = []
        self._prev_at: float | None = None
        self._nvlink_bytes: dict[str, float] = {}
        self._requests: dict[int, tuple[Any, bytes, struct.Struct]] = {}
        """``id`` of the first sample -> the request for that order, its bytes before NVML answers,
        and how to unpack its answers; rebuilt when the metrics asked change."""
        self._ratios: dict[int, tuple[float, Reading]] = {}
        """Metric id -> the last value NVML answered, and the reading made of it."""
        metric_type = dict(self._struct._fields_)["metrics"]._type_
        mid, ret, value = (getattr(metric_type, name).offset for name in ("metricId", "nvmlReturn", "value"))
        if not mid + 4 <= ret and ret + 4 <= value:
            raise ValueError(f"unexpected layout of {metric_type.__name__}: {(mid, ret, value)}")
        size = ctypes.sizeof(metric_type)
        # One metric's (metricId, nvmlReturn, value), the rest of its struct (metricInfo) skipped.
        self._answer_format = f"{mid}xI{ret - mid - 4}xI{value - ret - 4}xd{size - value - 8}x"
        self._metrics_offset = self._struct.metrics.offset

    def read(self, now: float) -> list[Reading]:
        """Take this cycle's sample and return the readings over the interval since the last one."""
        if not self._wanted:
            return []
        if not self._samples:
            self._samples = [self._nvml.nvmlGpmSampleAlloc(), self._nvml.nvmlGpmSampleAlloc()]
        prev, cur = self._samples
        self._take(cur)
        prev_at, self._prev_at = self._prev_at, now
        self._samples.reverse()  # this cycle's sample is the next cycle's "previous"
        if prev_at is None:
            return []
        return self._readings(prev, cur, max(0.0, now - prev_at))

    def drop_nvlink(self) -> None:
        """Ask no more for the NVLink rates (the GPU's per-link counters count its traffic; their sum
        replaces the integral of GPM's rates)."""
        rates = [mid for mid, (_metric, _labels, is_rate) in self._wanted.items() if is_rate]
        for mid in rates:
            del self._wanted[mid]
        if rates:
            self._requests.clear()

    def reset(self) -> None:
        """Forget the previous sample (after a device error its contents are not to be trusted)."""
        self._prev_at = None

    def free(self) -> None:
        """Release the NVML sample buffers; errors are ignored (used on teardown)."""
        samples, self._samples = self._samples, []
        self._requests.clear()
        for sample in samples:
            try:
                self._nvml.nvmlGpmSampleFree(sample)
            except self._nvml.NVMLError:
                pass
        self._prev_at = None

    def _take(self, sample: Any) -> None:
        if self._gi_id is None:
            self._nvml.nvmlGpmSampleGet(self._handle, sample)
        else:
            self._nvml.nvmlGpmMigSampleGet(self._handle, self._gi_id, sample)

    def _readings(self, prev: Any, cur: Any, seconds: float) -> list[Reading]:
        request, template, answers = self._request(prev, cur)
        ctypes.memmove(ctypes.addressof(request), template, len(template))
        self._nvml.nvmlGpmMetricsGet(request)
        values = answers.unpack_from(request, self._metrics_offset)
        out: list[Reading] = []
        dropped: list[int] = []
        success, ratios = self._success, self._ratios
        for i in range(0, len(values), 3):
            mid, ret, value = values[i:i + 3]
            if ret != success:
                if ret == self._not_supported:
                    dropped.append(mid)
                continue
            metric, labels, is_rate = self._wanted[mid]
            if is_rate:
                out.append(Reading(metric, self._integrate(labels, value * _MIB * seconds), labels))
                continue
            last = ratios.get(mid)
            if last is None or last[0] != value:
                last = ratios[mid] = (value, Reading(metric, value / 100.0, labels))
            out.append(last[1])
        for mid in dropped:
            del self._wanted[mid]
        if dropped:
            self._requests.clear()
        return out

    def _request(self, prev: Any, cur: Any) -> tuple[Any, bytes, struct.Struct]:
        """The request for this order of the two buffers (built on first use)."""
        built = self._requests.get(id(prev))
        if built is None:
            request = self._struct()
            request.version = self._nvml.NVML_GPM_METRICS_GET_VERSION
            request.numMetrics = len(self._wanted)
            request.sample1 = prev
            request.sample2 = cur
            for i, mid in enumerate(self._wanted):
                request.metrics[i].metricId = mid
            built = self._requests[id(prev)] = (request, bytes(memoryview(request).cast("B")),
                                                struct.Struct("=" + self._answer_format * len(self._wanted)))
        return built

    def _integrate(self, labels: Labels, delta: float) -> float:
        direction = labels[0][1]
        total = self._nvlink_bytes.get(direction, 0.0) + max(0.0, delta)
        self._nvlink_bytes[direction] = total
        return total

