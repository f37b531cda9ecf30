"""The metric catalogue: every family the exporter publishes, each defined once.

A family is one ``MetricSpec`` constant (``GPU_UP``, ``CLAIM_CONSUMER_INFO``, …) that holds all
there is to know about it: native name, type, unit, help, its labels in order, how it is pushed
over OTLP (``OtlpForm``), the dcgm-exporter families made from it (``DcgmForm``) and its
stability. Everything else is derived from these constants:

- the join fills a family's labels by name through the spec (``series``, ``extra``,
  ``device_series``), which refuses a missing or an unknown label, so a frame's label sets are
  the catalogue's, in its order; a ``pod_labels`` family may add, after its own, the pod labels
  an operator allowlists (``PodLabels``: ``--pod-labels``), and nothing else;
- the sources name the family of each NVML reading by its spec constant;
- the Prometheus renderer takes HELP and TYPE from here, the OTLP mapping its instruments and
  attributes, ``naming`` the dcgm-exporter families, the README its tables.

No other module spells a metric name, an OTLP name or a DCGM name as a literal.

Stability (kube-state-metrics' levels): ``stable`` families are the metric contract of DESIGN §4
— renamed or relabelled only with a deprecation; new labels may be added. Every other family is
``experimental``. HELP texts do not carry the level: the exposition stays as it is.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from itertools import zip_longest
from typing import Final, Literal

from .model import Labels

Kind = Literal["gauge", "counter"]
DcgmValueType = Literal["int64", "double"]
Stability = Literal["stable", "experimental"]

#: Identity of a device series: the NVML UUID, the physical GPU's index, MIG partition.
DEVICE_ID_LABELS: Final = ("uuid", "gpu", "profile", "parent_uuid")
#: Who holds the device (DESIGN §3). Empty strings when nobody does, or where the consumers
#: disagree (a device shared by two pods keeps ``claim`` and ``request`` but not ``pod``).
#: ``pod_uid`` and ``request`` need the API server; node-local they stay empty.
ATTRIBUTION_LABELS: Final = ("namespace", "pod", "pod_uid", "container", "claim", "request")
DEVICE_LABELS: Final = DEVICE_ID_LABELS + ATTRIBUTION_LABELS
#: A whole GPU's identity alone, for what does not change with who holds it (link and fabric identity).
GPU_ID_LABELS: Final = ("uuid", "gpu")
CONTAINER_LABELS: Final = ("uuid", "namespace", "pod", "pod_uid", "container", "claim")
_SOURCE: Final = ("source",)

#: Prometheus label -> OTel attribute, where a semantic convention (or DESIGN §4) names one; any
#: other label ``x`` is pushed as ``dra.x`` (``gpu`` -> ``dra.gpu``).
OTEL_ATTRIBUTES: Final[dict[str, str]] = {
    "uuid": "hw.id",
    "parent_uuid": "hw.parent",
    "model": "hw.model",
    "namespace": "k8s.namespace.name",
    "pod": "k8s.pod.name",
    "pod_uid": "k8s.pod.uid",
    "container": "k8s.container.name",
    "claim": "k8s.resourceclaim.name",
    "claim_uid": "k8s.resourceclaim.uid",
    "request": "k8s.resourceclaim.request",
    "driver": "dra.driver",
    "pool": "dra.pool",
    "device": "dra.device",
    "direction": "network.io.direction",
    "type": "error.type",
}
#: Label values the semantic conventions spell differently.
OTEL_VALUES: Final[dict[str, dict[str, str]]] = {"direction": {"rx": "receive", "tx": "transmit"}}


def attribute_name(label: str) -> str:
    """The OTel attribute for a Prometheus label: the convention's name, else ``dra.<label>``."""
    return OTEL_ATTRIBUTES.get(label) or f"dra.{label}"


class LabelError(ValueError):
    """A series built with a label its family does not declare, or without one it does."""


#: A Kubernetes label's Prometheus label starts with this (kube-state-metrics' ``label_<key>``).
POD_LABEL_PREFIX: Final = "label_"
#: OTel's attribute for a pod label, followed by the label's own key (semantic conventions, k8s).
POD_LABEL_ATTRIBUTE: Final = "k8s.pod.label."
_NOT_IN_A_LABEL_NAME: Final = re.compile(r"[^a-zA-Z0-9_]")


def pod_label_name(key: str) -> str:
    """The Prometheus label of the Kubernetes label ``key``, spelt as kube-state-metrics spells it
    (every character outside ``[a-zA-Z0-9_]`` becomes ``_``): ``app.kubernetes.io/name`` →
    ``label_app_kubernetes_io_name``, so the same PromQL reads either exporter's."""
    return POD_LABEL_PREFIX + _NOT_IN_A_LABEL_NAME.sub("_", key)


@dataclass(frozen=True, slots=True)
class PodLabels:
    """The pod labels an operator allowlists (``--pod-labels``): each Kubernetes label key with
    its Prometheus label (``pod_label_name``), ordered by that label. Empty: none, and every
    ``pod_labels`` family has its declared labels alone, as without the option."""

    keys: tuple[str, ...] = ()
    names: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_name: dict[str, str] = {}
        for key in self.keys:
            other = by_name.setdefault(pod_label_name(key), key)
            if other != key:
                raise ValueError(f"pod labels {other!r} and {key!r} are both the Prometheus label "
                                 f"{pod_label_name(key)!r}: allowlist one of them")
        ordered = sorted(by_name.items())
        object.__setattr__(self, "keys", tuple(k for _, k in ordered))
        object.__setattr__(self, "names", tuple(n for n, _ in ordered))

    def __bool__(self) -> bool:
        return bool(self.keys)

    def pairs(self, labels: Mapping[str, str]) -> Labels:
        """The allowlisted labels' pairs for a pod with ``labels``: ``""`` for a label it lacks."""
        return tuple([(name, labels.get(key, "")) for name, key in zip(self.names, self.keys, strict=True)])

    def attributes(self) -> tuple[tuple[str, str], ...]:
        """(Prometheus label, OTel attribute) of each: ``label_team`` → ``k8s.pod.label.team``."""
        return tuple((name, POD_LABEL_ATTRIBUTE + key) for name, key in zip(self.names, self.keys, strict=True))


@dataclass(frozen=True, slots=True)
class OtlpForm:
    """How a family is pushed over OTLP, following the OpenTelemetry semantic conventions.

    Families sharing a ``name`` become one OTLP metric, told apart by ``constant`` attributes;
    the labels become attributes through ``OTEL_ATTRIBUTES``."""

    name: str
    unit: str
    scale: float = 1.0
    """Factor from the native value to the OTel unit (ratio → ``1`` stays 1.0)."""
    updown: bool = False
    """The convention makes it an UpDownCounter (a non-monotonic sum), not a gauge."""
    constant: tuple[tuple[str, str], ...] = ()
    """Attributes on every point, telling apart families that share one OTLP name."""
    stateset: tuple[str, str] | None = None
    """``(state if 1, state if 0)``: one point per state, valued 1 or 0 (``hw.status``)."""
    attributes: tuple[tuple[str, str], ...] = ()
    """``(label, attribute)`` where this family's label means something else than ``OTEL_ATTRIBUTES``
    says (the cluster mode's device ``type`` is no ``error.type``; its ``node`` is the series' node)."""

    def attribute(self, label: str) -> str:
        """The OTel attribute of ``label`` in this family."""
        for name, attribute in self.attributes:
            if name == label:
                return attribute
        return attribute_name(label)


@dataclass(frozen=True, slots=True)
class DcgmForm:
    """One dcgm-exporter default counter made from the family it is declared on (``--naming dcgm``)."""

    name: str
    """The raw DCGM field name: upper case, no unit suffix, no ``_total``."""
    dcgm_kind: Kind
    """The type dcgm-exporter declares. Exposed as ``gauge`` whatever it is: a counter's samples
    must end in ``_total`` (always in OpenMetrics, and in this renderer), which would rename them."""
    help: str
    scale: float = 1.0
    """Factor from the native unit to DCGM's (bytes → MiB, Hz → MHz, J → mJ, ratio → %)."""
    select: tuple[tuple[str, str], ...] = ()
    """Native label values a sample must have (``clock=sm``); these labels are then dropped."""
    sum_over: str = ""
    """A native label summed away (NVLink ``direction``): one DCGM series per device."""
    unit: str = ""
    """DCGM's unit, for the README table."""
    replaces: bool = True
    """Whether ``--naming dcgm`` drops the native family for it; False where the DCGM form says less
    (a sum over links, a clique id without its cluster): the native detail then stays."""
    value_type: DcgmValueType = "int64"
    """DCGM's type of the field (``dcgm_fields``): an ``int64`` field holds whole numbers (DCGM
    truncates: 1023.9 MiB reads 1023), a ``double`` field any number."""
    rate: bool = False
    """DCGM fills the field with the per-second rate of the native counter between two readings
    (0 on the first, as DCGM's first sample), not with its running total; ``scale`` then turns
    native units per second into DCGM's."""


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric family, and the one place its label set is checked."""

    name: str
    """Native Prometheus name; counters include ``_total``."""
    kind: Kind
    help: str
    labels: tuple[str, ...] = DEVICE_LABELS
    """The full, ordered label set of every series of the family."""
    _: KW_ONLY
    unit: str = ""
    """Prometheus base unit, the name's suffix (``bytes``, ``ratio``); ``""`` for counts and info."""
    otlp: OtlpForm | None = None
    """None when the family is not pushed over OTLP."""
    dcgm: tuple[DcgmForm, ...] = ()
    """Its dcgm-exporter 4.8 forms (DCGM 4.6's field names: ``--naming dcgm``)."""
    dcgm_410: tuple[DcgmForm, ...] | None = None
    """Its forms under ``--naming dcgm-4.10`` (DCGM 4.7/4.8's names and base units, dcgm-exporter
    4.9/4.10), position by position the renamed ``dcgm`` form (``DCGM_RENAMES``); None: the
    ``dcgm`` forms, whose names DCGM 4.7/4.8 kept."""
    stability: Stability = "experimental"
    pod_labels: bool = False
    """The family names a pod (its consumer info): it carries, after ``labels``, the allowlisted
    pod labels (``PodLabels``, ``with_pod_labels``); with none allowlisted, ``labels`` alone."""
    gpu_identity: bool = False
    """A whole GPU's family whose series start with ``GPU_ID_LABELS`` alone, not with the device's
    attribution (NVLink link and fabric identity: who holds the GPU does not change them). NVML
    readings of it carry its own labels after those, as for a device family."""
    extra_labels: tuple[str, ...] | None = field(init=False, repr=False, compare=False)
    """For a device family (``DEVICE_LABELS`` first, or ``GPU_ID_LABELS`` for a ``gpu_identity``
    one), its own labels after them; else None."""

    def __post_init__(self) -> None:
        if len(set(self.labels)) != len(self.labels):
            raise ValueError(f"{self.name}: a label is declared twice in {self.labels}")
        if self.gpu_identity:
            if self.labels[:len(GPU_ID_LABELS)] != GPU_ID_LABELS:
                raise ValueError(f"{self.name}: a GPU identity family starts with {GPU_ID_LABELS}")
            object.__setattr__(self, "extra_labels", self.labels[len(GPU_ID_LABELS):])
            return
        device = self.labels[:len(DEVICE_LABELS)] == DEVICE_LABELS
        object.__setattr__(self, "extra_labels", self.labels[len(DEVICE_LABELS):] if device else None)

    # -- label builders: the join and the sources make every label set through these --------------

    def series(self, /, **values: str) -> Labels:
        """This family's label pairs, in its order, from values given by name.

        Raises ``LabelError`` when a declared label is missing or an unknown one is given."""
        names = self.labels
        if tuple(values) == names:  # given in the family's order, as the join does: the fast path
            return tuple(values.items())
        if len(values) == len(names):
            try:
                return tuple([(name, values[name]) for name in names])
            except KeyError:
                pass
        raise self._mismatch(values)

    def with_pod_labels(self, labels: Labels, pod_labels: Labels) -> Labels:
        """``labels`` (this family's, from ``series``) followed by ``pod_labels`` (``PodLabels.pairs``);
        ``LabelError`` where the family carries no pod labels or a name is not a pod label's."""
        if not pod_labels:
            return labels
        if not self.pod_labels:
            raise LabelError(f"{self.name} carries no pod labels; got {[k for k, _ in pod_labels]}")
        for name, _ in pod_labels:
            if name == POD_LABEL_PREFIX or not name.startswith(POD_LABEL_PREFIX) or _NOT_IN_A_LABEL_NAME.search(name):
                raise LabelError(f"{self.name}: {name!r} is not a pod label's Prometheus label")
        return labels + pod_labels

    def extra(self, /, **values: str) -> Labels:
        """A device family's own labels (those after ``DEVICE_LABELS``: ``clock``, ``direction``),
        as an NVML reading carries them; ``LabelError`` as ``series``."""
        own = self.extra_labels
        if own is None:
            raise LabelError(f"{self.name} is not a device family; build its labels with series()")
        if len(values) == len(own):
            try:
                return tuple([(name, values[name]) for name in own])
            except KeyError:
                pass
        raise self._mismatch(values, own)

    def device_series(self, device: Labels, extra: Labels) -> Labels:
        """A device family's labels: ``device`` (the ``DEVICE_LABELS`` pairs, from
        ``device_labels``) followed by the family's own ``extra`` pairs (from ``extra``).

        Checks ``extra``'s names against the family (cheap: it runs for every reading of every
        device each cycle); raises ``LabelError`` on a difference. A ``gpu_identity`` family keeps
        only the ``GPU_ID_LABELS`` pairs of ``device``."""
        own = self.extra_labels
        if self.gpu_identity:
            device = device[:len(GPU_ID_LABELS)]
        if not extra:
            if own == ():
                return device
        elif own is not None and len(extra) == len(own) and tuple([k for k, _ in extra]) == own:
            return device + extra
        raise self._mismatch(dict(device) | dict(extra))

    def check(self, labels: Labels) -> Labels:
        """``labels`` if their names are this family's, in its order; else ``LabelError``."""
        if tuple([k for k, _ in labels]) != self.labels:
            raise LabelError(f"{self.name}: labels {[k for k, _ in labels]} are not its labels "
                             f"{list(self.labels)} in that order")
        return labels

    def _mismatch(self, given: Iterable[str], wanted: tuple[str, ...] | None = None) -> LabelError:
        wanted = self.labels if wanted is None else wanted
        given = set(given)
        missing = [n for n in wanted if n not in given]
        unknown = sorted(given - set(wanted))
        return LabelError(f"{self.name}: missing label(s) {missing}, unknown label(s) {unknown}; "
                          f"it has {list(wanted)}")

    # -- derived forms ---------------------------------------------------------------------------

    @property
    def is_device(self) -> bool:
        """A device family: its series start with ``DEVICE_LABELS`` (identity, then attribution), or
        with ``GPU_ID_LABELS`` for a ``gpu_identity`` family."""
        return self.extra_labels is not None


def device_labels(*, uuid: str, gpu: str, profile: str, parent_uuid: str, namespace: str, pod: str,
                  pod_uid: str, container: str, claim: str, request: str) -> Labels:
    """The ``DEVICE_LABELS`` pairs every device family starts with (see ``device_series``)."""
    return (("uuid", uuid), ("gpu", gpu), ("profile", profile), ("parent_uuid", parent_uuid),
            ("namespace", namespace), ("pod", pod), ("pod_uid", pod_uid), ("container", container),
            ("claim", claim), ("request", request))


_MIB: Final = 1.0 / (1 << 20)
_STABLE: Final[Stability] = "stable"


# --- device families (NVML) -----------------------------------------------------------------

GPU_INFO: Final = MetricSpec(
    "dra_gpu_info", "gauge", "NVML identity of a GPU or MIG device; value is always 1.",
    ("uuid", "gpu", "model", "pci_bus_id", "driver_version", "profile", "parent_uuid", "mig_mode",
     "gpu_instance_id", "compute_instance_id", "minor"), stability=_STABLE)
GPU_UP: Final = MetricSpec(
    "dra_gpu_up", "gauge", "Whether the last cycle read this device without an NVML error (1) or not (0).",
    otlp=OtlpForm("hw.status", "1", updown=True, stateset=("ok", "failed")), stability=_STABLE)
GPU_UTILIZATION: Final = MetricSpec(
    "dra_gpu_utilization_ratio", "gauge",
    "Fraction of the last sample period during which a kernel ran on the GPU.", unit="ratio",
    otlp=OtlpForm("hw.gpu.utilization", "1", constant=(("hw.gpu.task", "general"),)),
    dcgm=(DcgmForm("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", 100.0, unit="%"),),
    dcgm_410=(DcgmForm("DCGM_FI_DEV_GPU_UTIL_RATIO", "gauge", "GPU utilization (ratio 0-1).",
                       unit="ratio", value_type="double"),),
    stability=_STABLE)
GPU_MEMORY_UTILIZATION: Final = MetricSpec(
    "dra_gpu_memory_utilization_ratio", "gauge",
    "Fraction of the last sample period during which device memory was read or written.", unit="ratio",
    otlp=OtlpForm("hw.gpu.memory.activity", "1"),
    dcgm=(DcgmForm("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", 100.0, unit="%"),),
    dcgm_410=(DcgmForm("DCGM_FI_DEV_MEMORY_UTIL_RATIO", "gauge", "Memory utilization (ratio 0-1).",
                       unit="ratio", value_type="double"),),
    stability=_STABLE)
GPU_ENCODER_UTILIZATION: Final = MetricSpec(
    "dra_gpu_encoder_utilization_ratio", "gauge", "Fraction of time the video encoder was busy.", unit="ratio",
    otlp=OtlpForm("hw.gpu.utilization", "1", constant=(("hw.gpu.task", "encoder"),)),
    dcgm=(DcgmForm("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).", 100.0, unit="%"),),
    dcgm_410=(DcgmForm("DCGM_FI_DEV_ENC_UTIL_RATIO", "gauge", "Encoder utilization (ratio 0-1).",
                       unit="ratio", value_type="double"),))
GPU_DECODER_UTILIZATION: Final = MetricSpec(
    "dra_gpu_decoder_utilization_ratio", "gauge", "Fraction of time the video decoder was busy.", unit="ratio",
    otlp=OtlpForm("hw.gpu.utilization", "1", constant=(("hw.gpu.task", "decoder"),)),
    dcgm=(DcgmForm("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).", 100.0, unit="%"),),
    dcgm_410=(DcgmForm("DCGM_FI_DEV_DEC_UTIL_RATIO", "gauge", "Decoder utilization (ratio 0-1).",
                       unit="ratio", value_type="double"),))
GPU_MEMORY_USED: Final = MetricSpec(
    "dra_gpu_memory_used_bytes", "gauge", "Device memory in use, in bytes.", unit="bytes",
    otlp=OtlpForm("hw.gpu.memory.usage", "By", updown=True),
    dcgm=(DcgmForm("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", _MIB, unit="MiB"),),
    dcgm_410=(DcgmForm("DCGM_FI_DEV_FB_USED_BYTES", "gauge", "Framebuffer memory used (in bytes).", unit="bytes"),),
    stability=_STABLE)
GPU_MEMORY_FREE: Final = MetricSpec(
    "dra_gpu_memory_free_bytes", "gauge", "Device memory free, in bytes.", unit="bytes",
    otlp=OtlpForm("hw.gpu.memory.free", "By", updown=True),
    dcgm=(DcgmForm("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", _MIB, unit="MiB"),),
    dcgm_410=(DcgmForm("DCGM_FI_DEV_FB_FREE_BYTES", "gauge", "Framebuffer memory free (in bytes).", unit="bytes"),),
    stability=_STABLE)
GPU_MEMORY_TOTAL: Final = MetricSpec(
    "dra_gpu_memory_total_bytes", "gauge", "Device memory size, in bytes.", unit="bytes",
    otlp=OtlpForm("hw.gpu.memory.limit", "By", updown=True),
    # dcgm-exporter 4.9 collects it by default; 4.8 had no default counter for it.
    dcgm_410=(DcgmForm("DCGM_FI_DEV_FB_CAPACITY_BYTES", "gauge", "Framebuffer memory capacity (in bytes).",
                       unit="bytes"),),
    stability=_STABLE)
GPU_MEMORY_RESERVED: Final = MetricSpec(
    "dra_gpu_memory_reserved_bytes", "gauge", "Device memory reserved by the driver and firmware, in bytes.",
    unit="bytes", otlp=OtlpForm("hw.gpu.memory.reserved", "By", updown=True),
    dcgm=(DcgmForm("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).", _MIB,
                   unit="MiB"),),
    dcgm_410=(DcgmForm("DCGM_FI_DEV_FB_RESERVED_BYTES", "gauge", "Framebuffer memory reserved (in bytes).",
                       unit="bytes"),),
    stability=_STABLE)
GPU_POWER: Final = MetricSpec(
    "dra_gpu_power_watts", "gauge", "Power draw of the whole board, in watts.", unit="watts",
    otlp=OtlpForm("hw.power", "W"),
    dcgm=(DcgmForm("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", unit="W", value_type="double"),),
    dcgm_410=(DcgmForm("DCGM_FI_DEV_BOARD_POWER_WATTS", "gauge", "Power draw of the board (in W).",
                       unit="W", value_type="double"),),
    stability=_STABLE)
GPU_POWER_LIMIT: Final = MetricSpec(
    "dra_gpu_power_limit_watts", "gauge", "Enforced power limit, in watts.", unit="watts",
    otlp=OtlpForm("hw.power.limit", "W"), stability=_STABLE)
GPU_ENERGY: Final = MetricSpec(
    "dra_gpu_energy_joules_total", "counter", "Energy used since the driver was loaded, in joules.",
    unit="joules", otlp=OtlpForm("hw.energy", "J"),
    dcgm=(DcgmForm("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter",
                   "Total energy consumption since boot (in mJ).", 1e3, unit="mJ"),),
    dcgm_410=(DcgmForm("DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL", "counter",
                       "Total energy consumption since the driver was loaded (in J).", unit="J"),),
    stability=_STABLE)
GPU_TEMPERATURE: Final = MetricSpec(
    "dra_gpu_temperature_celsius", "gauge", "GPU die temperature, in degrees Celsius.", unit="celsius",
    otlp=OtlpForm("hw.temperature", "Cel", constant=(("hw.sensor_location", "gpu"),)),
    dcgm=(DcgmForm("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", unit="C"),),
    dcgm_410=(DcgmForm("DCGM_FI_DEV_GPU_TEMP_CELSIUS", "gauge", "GPU temperature (in C).", unit="C"),),
    stability=_STABLE)
GPU_MEMORY_TEMPERATURE: Final = MetricSpec(
    "dra_gpu_memory_temperature_celsius", "gauge", "HBM temperature, in degrees Celsius.", unit="celsius",
    otlp=OtlpForm("hw.temperature", "Cel", constant=(("hw.sensor_location", "memory"),)),
    dcgm=(DcgmForm("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", unit="C"),),
    dcgm_410=(DcgmForm("DCGM_FI_DEV_MEMORY_TEMP_CELSIUS", "gauge", "Memory temperature (in C).", unit="C"),),
    stability=_STABLE)
GPU_CLOCK: Final = MetricSpec(
    "dra_gpu_clock_hertz", "gauge", "Current clock frequency, in hertz.", DEVICE_LABELS + ("clock",),
    unit="hertz", otlp=OtlpForm("hw.gpu.clock.frequency", "Hz"),
    dcgm=(DcgmForm("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", 1e-6, (("clock", "sm"),),
                   unit="MHz"),
          DcgmForm("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", 1e-6,
                   (("clock", "memory"),), unit="MHz")),
    dcgm_410=(DcgmForm("DCGM_FI_DEV_SM_CLOCK_HERTZ", "gauge", "SM clock frequency (in Hz).", select=(("clock", "sm"),),
                       unit="Hz"),
              DcgmForm("DCGM_FI_DEV_MEMORY_CLOCK_HERTZ", "gauge", "Memory clock frequency (in Hz).",
                       select=(("clock", "memory"),), unit="Hz")),
    stability=_STABLE)
GPU_CLOCK_EVENT: Final = MetricSpec(
    "dra_gpu_clock_event_active", "gauge", "Whether a clock event reason (throttling) is active now (1) or not (0).",
    DEVICE_LABELS + ("reason",), otlp=OtlpForm("hw.gpu.clock.event.active", "1"), stability=_STABLE)
GPU_PCIE_BYTES: Final = MetricSpec(
    "dra_gpu_pcie_bytes_total", "counter", "Bytes moved over PCIe since the driver was loaded.",
    DEVICE_LABELS + ("direction",), unit="bytes", otlp=OtlpForm("hw.gpu.io", "By"), stability=_STABLE)
GPU_PCIE_REPLAYS: Final = MetricSpec(
    "dra_gpu_pcie_replays_total", "counter", "PCIe replays since the driver was loaded.",
    otlp=OtlpForm("hw.gpu.pcie.replays", "{replay}"),
    dcgm=(DcgmForm("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries."),),
    dcgm_410=(DcgmForm("DCGM_FI_DEV_PCIE_REPLAY_TOTAL", "counter", "Total number of PCIe retries."),),
    stability=_STABLE)
GPU_ECC_ERRORS: Final = MetricSpec(
    "dra_gpu_ecc_errors_total", "counter", "ECC errors since the driver was loaded (volatile counters).",
    DEVICE_LABELS + ("type",), otlp=OtlpForm("hw.errors", "{error}"), stability=_STABLE)
GPU_REMAPPED_ROWS: Final = MetricSpec(
    "dra_gpu_remapped_rows_total", "counter", "Memory rows remapped because of ECC errors.",
    DEVICE_LABELS + ("type",), otlp=OtlpForm("hw.gpu.memory.remapped_rows", "{row}"),
    dcgm=(DcgmForm("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter",
                   "Number of remapped rows for uncorrectable errors", select=(("type", "uncorrectable"),)),
          DcgmForm("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter",
                   "Number of remapped rows for correctable errors", select=(("type", "correctable"),))),
    dcgm_410=(DcgmForm("DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL", "counter",
                       "Number of remapped rows for uncorrectable errors", select=(("type", "uncorrectable"),)),
              DcgmForm("DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL", "counter",
                       "Number of remapped rows for correctable errors", select=(("type", "correctable"),))),
    stability=_STABLE)
GPU_ROW_REMAP_PENDING: Final = MetricSpec(
    "dra_gpu_row_remap_pending", "gauge", "Whether a row remap waits for the next GPU reset (1) or not (0).",
    otlp=OtlpForm("hw.gpu.memory.row_remap.pending", "1"))
GPU_ROW_REMAP_FAILURE: Final = MetricSpec(
    "dra_gpu_row_remap_failure", "gauge", "Whether a row remap has failed (1) or not (0).",
    otlp=OtlpForm("hw.gpu.memory.row_remap.failed", "1"),
    dcgm=(DcgmForm("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed",
                   unit="0/1"),),
    dcgm_410=(DcgmForm("DCGM_FI_DEV_ROW_REMAP_FAILED", "gauge", "Whether remapping of rows has failed",
                       unit="0/1"),))
#: Built by ``naming`` from the XID counters rather than converted sample by sample.
DCGM_XID_ERRORS: Final = DcgmForm("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.",
                                  unit="XID code")
#: Its DCGM 4.7 name (dcgm-exporter 4.9 on), built the same way.
DCGM_XID_ERROR: Final = DcgmForm("DCGM_FI_DEV_XID_ERROR", "gauge", "Value of the last XID error encountered.",
                                 unit="XID code")
GPU_XID_ERRORS: Final = MetricSpec(
    "dra_gpu_xid_errors_total", "counter", "XID errors seen by this exporter since it started, by XID code.",
    DEVICE_LABELS + ("xid",), otlp=OtlpForm("hw.errors", "{error}", constant=(("error.type", "xid"),)),
    dcgm=(DCGM_XID_ERRORS,), dcgm_410=(DCGM_XID_ERROR,), stability=_STABLE)
GPU_LAST_XID: Final = MetricSpec(
    "dra_gpu_last_xid_timestamp_seconds", "gauge", "Unix time of the last XID error seen on this device.",
    unit="seconds", otlp=OtlpForm("hw.gpu.xid.last_time", "s"), stability=_STABLE)
GPU_SM_ACTIVE: Final = MetricSpec(
    "dra_gpu_sm_active_ratio", "gauge", "GPM: fraction of SM cycles with at least one warp resident.",
    unit="ratio", otlp=OtlpForm("hw.gpu.sm.active", "1"),
    dcgm=(DcgmForm("DCGM_FI_PROF_SM_ACTIVE", "gauge", "The ratio of cycles an SM has at least 1 warp assigned.",
                   unit="ratio", value_type="double"),),
    dcgm_410=(DcgmForm("DCGM_FI_PROF_SM_UTIL_RATIO", "gauge",
                       "The ratio of cycles an SM has at least 1 warp assigned.", unit="ratio", value_type="double"),),
    stability=_STABLE)
GPU_SM_OCCUPANCY: Final = MetricSpec(
    "dra_gpu_sm_occupancy_ratio", "gauge", "GPM: resident warps as a fraction of the SM maximum.",
    unit="ratio", otlp=OtlpForm("hw.gpu.sm.occupancy", "1"),
    dcgm=(DcgmForm("DCGM_FI_PROF_SM_OCCUPANCY", "gauge", "The ratio of number of warps resident on an SM.",
                   unit="ratio", value_type="double"),),
    dcgm_410=(DcgmForm("DCGM_FI_PROF_SM_OCCUPANCY_RATIO", "gauge",
                       "The ratio of number of warps resident on an SM.", unit="ratio", value_type="double"),),
    stability=_STABLE)
GPU_TENSOR_ACTIVE: Final = MetricSpec(
    "dra_gpu_tensor_active_ratio", "gauge", "GPM: fraction of cycles any tensor pipe was active.",
    unit="ratio", otlp=OtlpForm("hw.gpu.tensor.active", "1"),
    dcgm=(DcgmForm("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active.",
                   unit="ratio", value_type="double"),),
    dcgm_410=(DcgmForm("DCGM_FI_PROF_TENSOR_UTIL_RATIO", "gauge",
                       "Ratio of cycles the tensor (HMMA) pipe is active.", unit="ratio", value_type="double"),),
    stability=_STABLE)
GPU_DRAM_ACTIVE: Final = MetricSpec(
    "dra_gpu_dram_active_ratio", "gauge", "GPM: fraction of peak DRAM bandwidth used.",
    unit="ratio", otlp=OtlpForm("hw.gpu.dram.active", "1"),
    dcgm=(DcgmForm("DCGM_FI_PROF_DRAM_ACTIVE", "gauge",
                   "Ratio of cycles the device memory interface is active sending or receiving data.",
                   unit="ratio", value_type="double"),),
    dcgm_410=(DcgmForm("DCGM_FI_PROF_DRAM_UTIL_RATIO", "gauge",
                       "Ratio of cycles the device memory interface is active sending or receiving data.",
                       unit="ratio", value_type="double"),),
    stability=_STABLE)
GPU_FP64_ACTIVE: Final = MetricSpec(
    "dra_gpu_fp64_active_ratio", "gauge", "GPM: fraction of cycles the FP64 pipe was active.",
    unit="ratio", otlp=OtlpForm("hw.gpu.fp64.active", "1"),
    dcgm=(DcgmForm("DCGM_FI_PROF_PIPE_FP64_ACTIVE", "gauge", "Ratio of cycles the fp64 pipes are active.",
                   unit="ratio", value_type="double"),),
    dcgm_410=(DcgmForm("DCGM_FI_PROF_FP64_UTIL_RATIO", "gauge",
                       "Ratio of cycles the fp64 pipes are active.", unit="ratio", value_type="double"),),
    stability=_STABLE)
GPU_FP32_ACTIVE: Final = MetricSpec(
    "dra_gpu_fp32_active_ratio", "gauge", "GPM: fraction of cycles the FP32 pipe was active.",
    unit="ratio", otlp=OtlpForm("hw.gpu.fp32.active", "1"),
    dcgm=(DcgmForm("DCGM_FI_PROF_PIPE_FP32_ACTIVE", "gauge", "Ratio of cycles the fp32 pipes are active.",
                   unit="ratio", value_type="double"),),
    dcgm_410=(DcgmForm("DCGM_FI_PROF_FP32_UTIL_RATIO", "gauge",
                       "Ratio of cycles the fp32 pipes are active.", unit="ratio", value_type="double"),),
    stability=_STABLE)
GPU_FP16_ACTIVE: Final = MetricSpec(
    "dra_gpu_fp16_active_ratio", "gauge", "GPM: fraction of cycles the FP16 pipe was active.",
    unit="ratio", otlp=OtlpForm("hw.gpu.fp16.active", "1"),
    dcgm=(DcgmForm("DCGM_FI_PROF_PIPE_FP16_ACTIVE", "gauge", "Ratio of cycles the fp16 pipes are active.",
                   unit="ratio", value_type="double"),),
    dcgm_410=(DcgmForm("DCGM_FI_PROF_FP16_UTIL_RATIO", "gauge",
                       "Ratio of cycles the fp16 pipes are active.", unit="ratio", value_type="double"),),
    stability=_STABLE)
GPU_NVLINK_BYTES: Final = MetricSpec(
    "dra_gpu_nvlink_bytes_total", "counter",
    "Bytes moved over NVLink: the sum of the per-link data counters where NVML has them (since the driver "
    "was loaded), else integrated from GPM rates since this exporter started.",
    DEVICE_LABELS + ("direction",), unit="bytes", otlp=OtlpForm("hw.gpu.nvlink.io", "By"),
    # DCGM's NVLink "bandwidth" is a rate, whatever type dcgm-exporter declares: field 449 is an int64
    # in MB/s, NVML's KiB counters' rate divided by 1000; DCGM 4.7's field 1648 the same rate in bytes/s.
    dcgm=(DcgmForm("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter",
                   "Total number of NVLink bandwidth counters for all lanes.", 1 / (1024 * 1000),
                   sum_over="direction", unit="MB/s (KiB/s ÷ 1000), rx + tx", rate=True),),
    dcgm_410=(DcgmForm("DCGM_FI_DEV_NVLINK_THROUGHPUT_BYTES_PER_SECOND", "gauge",
                       "NVLink throughput of all lanes (in bytes per second).", sum_over="direction",
                       unit="bytes/s, rx + tx", rate=True),),
    stability=_STABLE)

# NVLink per link and the NVLink fabric: whole GPUs only (MIG devices own no links). Where NVML has
# per-link data counters (GPU_NVLINK_LINK_BYTES), GPU_NVLINK_BYTES is their sum, counted since the
# driver loaded, not GPM's integral; rate() reads both alike. Its help text stays as it was so the
# demo's golden exposition does not change.

GPU_NVLINK_LINK_UP: Final = MetricSpec(
    "dra_gpu_nvlink_link_up", "gauge",
    "Whether an NVLink of a GPU is up (1: active, or asleep in a low-power state) or not (0).",
    DEVICE_LABELS + ("link",), otlp=OtlpForm("dra.gpu.nvlink.link.up", "1"))
GPU_NVLINK_LINK_INFO: Final = MetricSpec(
    "dra_gpu_nvlink_link_info", "gauge",
    "An NVLink of a GPU: its NVLink version and the kind of device at its far end (gpu, switch, ...; "
    "\"\" where NVML does not say); value is always 1.", GPU_ID_LABELS + ("link", "version", "remote_type"),
    gpu_identity=True)
GPU_NVLINK_LINK_SPEED: Final = MetricSpec(
    "dra_gpu_nvlink_link_speed_bytes_per_second", "gauge",
    "Speed of an NVLink per direction, in bytes per second (0 while down).", GPU_ID_LABELS + ("link",),
    unit="bytes_per_second", otlp=OtlpForm("dra.gpu.nvlink.link.speed", "By/s"), gpu_identity=True)
GPU_NVLINK_LINK_BYTES: Final = MetricSpec(
    "dra_gpu_nvlink_link_bytes_total", "counter",
    "Data bytes (payload, without protocol overhead) moved over one NVLink since the driver was loaded.",
    DEVICE_LABELS + ("link", "direction"), unit="bytes", otlp=OtlpForm("dra.gpu.nvlink.link.io", "By"))
#: dcgm-exporter ships these commented out in default-counters.csv: sums over the links, so the
#: per-link family stays beside them. DCGM 4.7 dropped ``_COUNT`` from their names.
_NVLINK_ERROR_KINDS: Final = (("crc_flit", "flow-control CRC"), ("crc_data", "data CRC"), ("replay", "retries"),
                              ("recovery", "recovery"))
_NVLINK_ERROR_TOTALS, _NVLINK_ERROR_TOTALS_410 = (tuple(
    DcgmForm(f"DCGM_FI_DEV_NVLINK_{kind.upper()}_ERROR{count}_TOTAL", "counter",
             f"Total number of NVLink {what} errors.", select=(("type", kind),), sum_over="link", replaces=False)
    for kind, what in _NVLINK_ERROR_KINDS) for count in ("_COUNT", ""))
GPU_NVLINK_LINK_ERRORS: Final = MetricSpec(
    "dra_gpu_nvlink_link_errors_total", "counter",
    "NVLink errors of one link since the driver was loaded, by type: crc_flit, crc_data, replay, "
    "recovery, ecc_data up to Hopper; malformed_packet, buffer_overrun, rcv, rcv_remote, rcv_general, "
    "local_link_integrity, xmit_discards, effective, symbol on Blackwell (NVLink5).",
    DEVICE_LABELS + ("link", "type"), otlp=OtlpForm("dra.gpu.nvlink.link.errors", "{error}"),
    dcgm=_NVLINK_ERROR_TOTALS, dcgm_410=_NVLINK_ERROR_TOTALS_410)
GPU_NVLINK_LINK_RECOVERIES: Final = MetricSpec(
    "dra_gpu_nvlink_link_recovery_events_total", "counter",
    "Link recovery events of one NVLink since the driver was loaded, successful or failed (Blackwell).",
    DEVICE_LABELS + ("link", "result"), otlp=OtlpForm("dra.gpu.nvlink.link.recoveries", "{event}"))
# Opt-in DCGM fields (no shipped CSV has them), built by ``naming`` from the state sets and the info
# labels; they say less than the native families (a number for a state, a clique id without its
# cluster), which stay.
DCGM_FABRIC_STATUS: Final = DcgmForm(
    "DCGM_FI_DEV_FABRIC_MANAGER_STATUS", "gauge", "Fabric Manager status of the GPU (0 not supported, "
    "1 not started, 2 in progress, 3 success, 4 failure).", unit="dcgmFabricManagerStatus_t", replaces=False)
DCGM_FABRIC_CLIQUE_ID: Final = DcgmForm(
    "DCGM_FI_DEV_FABRIC_CLIQUE_ID", "gauge", "Fabric clique ID of the GPU.",
    unit="clique id, once registration completed", replaces=False)
DCGM_FABRIC_HEALTH_SUMMARY: Final = DcgmForm(
    "DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY", "gauge", "Fabric health summary of the GPU (0 not supported, "
    "1 healthy, 2 unhealthy, 3 limited capacity).", unit="NVML summary", replaces=False)
#: ``DCGM_FI_DEV_FABRIC_MANAGER_STATUS`` (DCGM's ``dcgmFabricManagerStatus_t``) per native fabric state;
#: ``completed`` is Success (3) when registered, Failure (4) when not.
DCGM_FABRIC_STATUS_VALUES: Final = {"not_supported": 0.0, "not_started": 1.0, "in_progress": 2.0}
#: ``DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY``: NVML's summary values.
DCGM_FABRIC_SUMMARY_VALUES: Final = {"not_supported": 0.0, "healthy": 1.0, "unhealthy": 2.0,
                                     "limited_capacity": 3.0}
GPU_FABRIC_INFO: Final = MetricSpec(
    "dra_gpu_fabric_info", "gauge",
    "The NVLink fabric a GPU is registered in: clique is <cluster_uuid>.<clique_id> as GPU Feature "
    "Discovery writes it, \"\" unless the GPU is in a multi-node clique (HGX boards: NVLink within the "
    "node only); value is always 1.", GPU_ID_LABELS + ("clique", "cluster_uuid", "clique_id"),
    dcgm=(DCGM_FABRIC_CLIQUE_ID,), gpu_identity=True)
GPU_FABRIC_STATE: Final = MetricSpec(
    "dra_gpu_fabric_state", "gauge",
    "Fabric registration state of a GPU, one series per state (not_supported, not_started, in_progress, "
    "completed): 1 for the current one, 0 for the others.", GPU_ID_LABELS + ("state",),
    dcgm=(DCGM_FABRIC_STATUS,), gpu_identity=True)
GPU_FABRIC_REGISTERED: Final = MetricSpec(
    "dra_gpu_fabric_registered", "gauge",
    "Whether the GPU's fabric registration completed successfully (1) or not (0).", GPU_ID_LABELS,
    otlp=OtlpForm("dra.gpu.fabric.registered", "1"), gpu_identity=True)
GPU_FABRIC_HEALTH: Final = MetricSpec(
    # Not ``..._health_summary``: promtool's lint takes a ``_summary`` suffix for a summary's type.
    "dra_gpu_fabric_health", "gauge",
    "Fabric health summary of a GPU, one series per value (not_supported, healthy, unhealthy, "
    "limited_capacity): 1 for the current one, 0 for the others.", GPU_ID_LABELS + ("summary",),
    dcgm=(DCGM_FABRIC_HEALTH_SUMMARY,), gpu_identity=True)
GPU_FABRIC_HEALTH_PROBLEM: Final = MetricSpec(
    "dra_gpu_fabric_health_problem", "gauge",
    "Whether a fabric health-mask field reports a problem (1) or not (0): degraded_bw, route_recovery, "
    "route_unhealthy, access_timeout_recovery, incorrect_configuration, partition_assigned (1: none "
    "assigned), gfm_state (1: disconnected); only the fields the GPU reports.", GPU_ID_LABELS + ("field",),
    otlp=OtlpForm("dra.gpu.fabric.health.problem", "1"), gpu_identity=True)
# The one activity signal NVML gives for MIG devices of GPUs without GPM (A100): the idle
# alert needs it per device, whether or not the processes' pods can be found.
GPU_MIG_COMPUTE_SLICES: Final = MetricSpec(
    "dra_gpu_mig_compute_slices", "gauge",
    "Compute slices a MIG-enabled GPU splits into (the slice count of its largest GPU-instance profile: 7 "
    "on A100, H100, H200, B200 and GB200, 4 on A30): a MIG device of N slices is N of them.",
    GPU_ID_LABELS, otlp=OtlpForm("dra.gpu.mig.compute_slices", "{slice}", updown=True), gpu_identity=True)
GPU_PROCESSES: Final = MetricSpec(
    "dra_gpu_processes", "gauge", "Compute and graphics processes NVML lists on this device in the last cycle.",
    otlp=OtlpForm("dra.gpu.processes", "{process}"))

# --- per-container families (NVML processes + cgroups) -------------------------------------

CONTAINER_GPU_MEMORY_USED: Final = MetricSpec(
    "dra_container_gpu_memory_used_bytes", "gauge",
    "Device memory used by the processes of one container on one device, in bytes.", CONTAINER_LABELS,
    unit="bytes", otlp=OtlpForm("dra.container.gpu.memory.usage", "By", updown=True), stability=_STABLE)
CONTAINER_GPU_SM_UTILIZATION: Final = MetricSpec(
    "dra_container_gpu_sm_utilization_ratio", "gauge",
    "SM utilisation of the processes of one container on one device (0-1).", CONTAINER_LABELS,
    unit="ratio", otlp=OtlpForm("dra.container.gpu.utilization", "1"), stability=_STABLE)

# --- DRA identity families ------------------------------------------------------------------

CLAIM_ALLOCATION_INFO: Final = MetricSpec(
    "dra_claim_allocation_info", "gauge", "A device allocated to a ResourceClaim on this node; value is always 1.",
    ("namespace", "claim", "claim_uid", "request", "driver", "pool", "device", "uuid", "admin_access"),
    otlp=OtlpForm("dra.claim.allocation", "1"), stability=_STABLE)
CLAIM_CONSUMER_INFO: Final = MetricSpec(
    "dra_claim_consumer_info", "gauge",
    "A pod (and container) that uses a ResourceClaim on this node; value is always 1.",
    ("namespace", "claim", "pod", "pod_uid", "container"), otlp=OtlpForm("dra.claim.consumer", "1"),
    stability=_STABLE, pod_labels=True)
CLAIM_NOT_PREPARED: Final = MetricSpec(
    "dra_claim_not_prepared", "gauge",
    "A ResourceClaim the kubelet lists for a pod on this node with no devices: allocated and reserved for "
    "the pod, but not prepared (NodePrepareResources failed or has not run; the pod waits in "
    "ContainerCreating); value is always 1.",
    ("namespace", "claim", "pod", "pod_uid"), otlp=OtlpForm("dra.claim.not_prepared", "1"))
# An info family: no OTLP form (its ``type`` label would become ``error.type``).
CLAIM_DEVICE_CONDITION: Final = MetricSpec(
    "dra_claim_device_condition", "gauge",
    "A condition the driver reports on a claim's device (status.devices); value is always 1.",
    ("namespace", "claim", "driver", "pool", "device", "type", "status"), stability=_STABLE)
CLAIM_DEVICE_TOLERATION: Final = MetricSpec(
    "dra_claim_device_toleration", "gauge",
    "A device taint a claim's allocation tolerates (allocation results' tolerations; key=\"\" with "
    "operator=\"Exists\": every taint); value is always 1.",
    ("namespace", "claim", "request", "driver", "pool", "device", "key", "operator", "value", "effect"),
    otlp=OtlpForm("dra.claim.device.toleration", "1"))
CLAIM_CONSUMED_CAPACITY: Final = MetricSpec(
    "dra_claim_consumed_capacity", "gauge",
    "What a claim's allocation takes of a device that allows several (consumable capacity: "
    "consumedCapacity of the allocation result, share_id its shareID), in the capacity's base unit.",
    ("namespace", "claim", "request", "driver", "pool", "device", "share_id", "capacity"),
    otlp=OtlpForm("dra.claim.consumed_capacity", "1"))
CLAIM_DEVICE_NETWORK: Final = MetricSpec(
    "dra_claim_device_network_info", "gauge",
    "How a claim's network device appears in the pod, as its driver reports it (status.devices "
    "networkData; ips comma-joined); value is always 1.",
    ("namespace", "claim", "driver", "pool", "device", "interface", "hardware_address", "ips"))

# --- ResourceSlice families (API server) ----------------------------------------------------

DEVICE_INFO: Final = MetricSpec(
    "dra_device_info", "gauge",
    "A device a ResourceSlice publishes for this node, allocated or not; value is always 1.",
    ("node", "driver", "pool", "device", "uuid", "type", "profile", "parent_uuid", "model"), stability=_STABLE)
DEVICE_TAINT: Final = MetricSpec(
    "dra_device_taint", "gauge",
    "A taint on a device of this node: from its ResourceSlice (rule=\"\") or from the DeviceTaintRule "
    "named by rule; value is always 1.",
    ("driver", "pool", "device", "key", "value", "effect", "rule"), otlp=OtlpForm("dra.device.taint", "1"),
    stability=_STABLE)
DEVICE_HEALTH: Final = MetricSpec(
    "dra_device_health", "gauge",
    "Health of a DRA device as the kubelet reports it for a container (allocatedResourcesStatus); "
    "value is always 1.",
    ("namespace", "pod", "container", "claim", "request", "driver", "pool", "device", "health"),
    otlp=OtlpForm("dra.device.health", "1"))
# What the node holds that no claim accounts for (``dra_exporter.orphans``): the value is when it was first
# seen, so an alert reads its age (``time() - x > 600``) whatever Prometheus restarted meanwhile.
ORPHAN_PREPARED_DEVICE: Final = MetricSpec(
    "dra_orphan_prepared_device_since_timestamp_seconds", "gauge",
    "A device a DRA driver still holds prepared (its CDI spec) for a claim the API server no longer has "
    "(reason=claim_deleted) or has deallocated (claim_deallocated); value: Unix time it was first seen.",
    ("driver", "device", "uuid", "claim_uid", "reason"), unit="seconds",
    otlp=OtlpForm("dra.orphan.prepared_device.since", "s"))
ORPHAN_MIG_DEVICE: Final = MetricSpec(
    "dra_orphan_mig_device_since_timestamp_seconds", "gauge",
    "A MIG device in NVML, on a GPU a DRA driver publishes, that no allocated claim or device-plugin allocation "
    "names and no ResourceSlice publishes; value: Unix time it was first seen.",
    ("uuid", "gpu", "parent_uuid", "profile"), unit="seconds", otlp=OtlpForm("dra.orphan.mig_device.since", "s"))
ORPHAN_GPU_PROCESS: Final = MetricSpec(
    "dra_orphan_gpu_process_since_timestamp_seconds", "gauge",
    "A process on a GPU or MIG device that no claim and no device-plugin allocation covers; value: Unix time it "
    "was first seen.", ("uuid", "gpu", "pid"), unit="seconds", otlp=OtlpForm("dra.orphan.gpu_process.since", "s"))
DEVICE_SHARED_CAPACITY: Final = MetricSpec(
    "dra_device_shared_capacity", "gauge",
    "Capacity of a shared counter of partitionable devices (ResourceSlice sharedCounters), "
    "in the counter's base unit (bytes for memory).",
    ("driver", "pool", "counter_set", "counter"), otlp=OtlpForm("dra.device.shared.capacity", "1"))
DEVICE_SHARED_CONSUMPTION: Final = MetricSpec(
    "dra_device_shared_consumption", "gauge",
    "What an allocated device takes from a shared counter (ResourceSlice consumesCounters), "
    "in the counter's base unit; sum by counter set to compare with the capacity.",
    ("driver", "pool", "device", "counter_set", "counter"), otlp=OtlpForm("dra.device.shared.consumption", "1"))

# --- ComputeDomain families (API server, resource.nvidia.com) -------------------------------

COMPUTE_DOMAIN_INFO: Final = MetricSpec(
    "dra_compute_domain_info", "gauge",
    "A ComputeDomain (resource.nvidia.com) that this node's claims hold an IMEX channel or daemon of; "
    "value is always 1.", ("namespace", "compute_domain", "uid", "allocation_mode", "num_nodes"))
COMPUTE_DOMAIN_READY: Final = MetricSpec(
    "dra_compute_domain_ready", "gauge",
    "Whether the ComputeDomain's status is Ready (1) or not (0, also while it has no status).",
    ("namespace", "compute_domain"), otlp=OtlpForm("dra.compute_domain.ready", "1"))
COMPUTE_DOMAIN_NODE_READY: Final = MetricSpec(
    "dra_compute_domain_node_ready", "gauge",
    "Whether a member node of the ComputeDomain is Ready (1) or not (0): every node of its status "
    "(else of its ComputeDomainCliques), so each member's agent shows all of them; use max by "
    "(namespace, compute_domain, node).", ("namespace", "compute_domain", "node", "clique", "index"),
    otlp=OtlpForm("dra.compute_domain.node.ready", "1"))
COMPUTE_DOMAIN_CHANNEL_INFO: Final = MetricSpec(
    "dra_compute_domain_channel_info", "gauge",
    "A pod on this node holding an IMEX channel of the ComputeDomain (its claim's "
    "ComputeDomainChannelConfig); value is always 1.", ("namespace", "claim", "pod", "compute_domain", "device"))
COMPUTE_DOMAIN_GPU_INFO: Final = MetricSpec(
    "dra_compute_domain_gpu_info", "gauge",
    "A GPU of this node allocated to a pod that holds an IMEX channel of the ComputeDomain; join "
    "on uuid to sum NVLink traffic per domain; value is always 1.",
    ("uuid", "gpu", "namespace", "pod", "compute_domain"))

# --- cluster mode (``dra-exporter cluster``: the API server, cluster-wide) -------------------------
# Pushed over OTLP as ``dra.cluster.*`` when ``cluster --otlp-endpoint`` is given. Their ``node`` is
# the series' node (``k8s.node.name``: the cluster mode's resource names no node), and a device's
# ``type`` is ``dra.device.type``, not the ``error.type`` other families' ``type`` is.
_CLUSTER_NODE: Final = (("node", "k8s.node.name"),)

CLUSTER_DEVICES: Final = MetricSpec(
    "dra_cluster_devices", "gauge",
    "Devices of the cluster's ResourceSlices (newest pool generation) by state for new claims: "
    "unavailable (its pool's newest generation is incomplete or invalid: the scheduler does not use it), "
    "allocated (to a claim, admin access aside; a shared device with no capacity left), shared (allows "
    "multiple allocations, has shares and capacity left), tainted (a NoSchedule/NoExecute taint), blocked "
    "(its shared counters no longer fit) or free. Partitions of one GPU overlap: add them up with "
    "dra_cluster_gpu_equivalents, not this.",
    ("driver", "pool", "node", "type", "model", "profile", "state"),
    otlp=OtlpForm("dra.cluster.devices", "{device}", attributes=_CLUSTER_NODE + (("type", "dra.device.type"),)))
CLUSTER_PARTITIONS_FIT: Final = MetricSpec(
    "dra_cluster_partitions_fit", "gauge",
    "Partitions of a partitionable device (a counter set: one GPU) of one profile that the scheduler could "
    "allocate now, one after another (its allocator: first fit, every counter of the pool must still fit, "
    "engine counters included: one OFA engine means one +me partition).",
    ("driver", "pool", "node", "counter_set", "profile"),
    otlp=OtlpForm("dra.cluster.partitions.fit", "{partition}", attributes=_CLUSTER_NODE))
CLUSTER_GPU_EQUIVALENTS: Final = MetricSpec(
    "dra_cluster_gpu_equivalents", "gauge",
    "GPUs by state, in whole GPUs: a whole GPU is 1; a partitionable GPU splits by the share of its counter "
    "set still free (by the counter that bounds it most) into free (or blocked, when none of its devices can "
    "be allocated now: tainted, its pool unavailable) and allocated; a static MIG device counts its compute "
    "slices of 7. Sums to the GPUs there are.", ("model", "node", "state"),
    otlp=OtlpForm("dra.cluster.gpu_equivalents", "{gpu}", attributes=_CLUSTER_NODE))
CLUSTER_DEVICE_CAPACITY_LEFT: Final = MetricSpec(
    "dra_cluster_device_capacity_remaining", "gauge",
    "What a device that allows multiple allocations (consumable capacity) has left of each capacity after "
    "its shares (base units: bytes for memory); only for such devices.",
    ("driver", "pool", "node", "device", "capacity"),
    otlp=OtlpForm("dra.cluster.device.capacity.remaining", "1", attributes=_CLUSTER_NODE))
CLUSTER_CLAIMS: Final = MetricSpec(
    "dra_cluster_claims", "gauge",
    "ResourceClaims by state: pending (not allocated, and a pod that has not ended waits for it), unused "
    "(not allocated, and no pod waits: never referenced, or its pods ended), allocated (but reserved by no "
    "pod) or reserved; unknown (not allocated, and the pods could not be read) only while pods are unread.",
    ("namespace", "state"),
    otlp=OtlpForm("dra.cluster.claims", "{claim}"))
CLUSTER_CLAIM_PENDING: Final = MetricSpec(
    "dra_cluster_claim_pending_seconds", "gauge",
    "Seconds since a pod began to wait for a ResourceClaim that is not allocated (the later of the first "
    "waiting pod's and the claim's creation); one series per pending claim, only for pending claims.",
    ("namespace", "claim"),
    unit="seconds", otlp=OtlpForm("dra.cluster.claim.pending.duration", "s"))
CLUSTER_CLAIM_PENDING_REQUEST: Final = MetricSpec(
    "dra_cluster_claim_pending_request_info", "gauge",
    "A request (or main/sub subrequest of a prioritized list) of a pending ResourceClaim and the "
    "DeviceClass it asks for; join on (namespace, claim) to group pending claims by class; value is "
    "always 1.", ("namespace", "claim", "request", "device_class"),
    otlp=OtlpForm("dra.cluster.claim.pending.request.info", "1"))
CLUSTER_CLAIM_PENDING_REASON: Final = MetricSpec(
    "dra_cluster_claim_pending_reason", "gauge",
    "Why a pending ResourceClaim cannot be allocated now, as the scheduler's allocator finds it (what "
    "`dra-exporter explain` says first): the first blocking request (or subrequest) and reason: class_missing, "
    "selector_not_supported (a selector this exporter cannot run: not known whether placeable), "
    "selector_not_evaluable, pool_incomplete, pool_invalid, taken, node_constraint, capacity_exhausted, "
    "counters_exhausted, tainted, attribute_constraint, pod_claims_together (fits alone, not on one node with "
    "its pod's other pending claims), node_filters (the pod's node selector, affinity or tolerations admit no "
    "node with its devices; Nodes read), no_matching_device or too_few_devices. The verdict is the waiting "
    "pod's: its pending claims allocated together, on one node. Pods that ask "
    "alike share one answer, asked again each minute while the cluster changes; value is always 1.",
    ("namespace", "claim", "request", "reason"),
    otlp=OtlpForm("dra.cluster.claim.pending.reason", "1"))
CLUSTER_CLAIM_UNRESERVED: Final = MetricSpec(
    "dra_cluster_claim_unreserved_devices", "gauge",
    "Devices allocated to a ResourceClaim that no pod reserves (held, unused); only for such claims.",
    ("namespace", "claim"),
    otlp=OtlpForm("dra.cluster.claim.unreserved_devices", "{device}"))
CLUSTER_CLASS_DEVICES: Final = MetricSpec(
    "dra_cluster_class_devices", "gauge",
    "Devices that match a DeviceClass's CEL selectors, by state (as dra_cluster_devices).",
    ("device_class", "state"),
    otlp=OtlpForm("dra.cluster.class.devices", "{device}"))
CLUSTER_CLASS_PLACEABLE: Final = MetricSpec(
    "dra_cluster_class_placeable_claims", "gauge",
    "Claims for one device of the class (no other selectors, no tolerations) the scheduler could allocate "
    "now, one after another, node after node (its allocator: first fit, counters, taints, shared capacity); "
    "0 when none: new claims of the class stay pending. Counts single claims, each alone in its pod: a pod "
    "with several claims needs them all on one node.", ("device_class",),
    otlp=OtlpForm("dra.cluster.class.placeable_claims", "{claim}"))
CLUSTER_CLASS_EVALUABLE: Final = MetricSpec(
    "dra_cluster_class_selectors_evaluable", "gauge",
    "Whether the exporter could evaluate a DeviceClass's CEL selectors (1) or not (0: its capacity is "
    "not reported).", ("device_class",),
    otlp=OtlpForm("dra.cluster.class.selectors.evaluable", "1"))
CLUSTER_CLASS_PENDING: Final = MetricSpec(
    "dra_cluster_class_selectors_pending", "gauge",
    "Whether a DeviceClass's CEL selectors wait to be evaluated (1: the frame's CEL time budget ran out "
    "before them, or their last evaluation was cut short by the CEL worker's death or time limit and is "
    "tried again; evaluable is 0 and its capacity is not reported meanwhile) or not (0).", ("device_class",),
    otlp=OtlpForm("dra.cluster.class.selectors.pending", "1"))
CLUSTER_CLASS_ERRORS: Final = MetricSpec(
    "dra_cluster_class_selector_errors", "gauge",
    "Devices for which a DeviceClass's CEL selectors failed (a missing attribute, a type error). The "
    "scheduler does not skip such a device: when its search reaches one, it refuses the claim on that node "
    "(CEL runtime error), so one failing device can keep the whole class from a node.", ("device_class",),
    otlp=OtlpForm("dra.cluster.class.selector.errors", "{device}"))
CLUSTER_POOL_INFO: Final = MetricSpec(
    "dra_cluster_pool_info", "gauge",
    "A resource pool and where its devices are: placement is node, all-nodes, node-selector, per-device "
    "or counters-only (node is empty but for node); value is always 1.",
    ("driver", "pool", "node", "placement"),
    otlp=OtlpForm("dra.cluster.pool.info", "1", attributes=_CLUSTER_NODE))
CLUSTER_POOL_SLICES: Final = MetricSpec(
    "dra_cluster_pool_slices", "gauge",
    "ResourceSlices of a pool seen, of its newest generation (generation=\"current\") and of older ones "
    "still published (\"older\": the pool is being replaced).", ("driver", "pool", "generation"),
    otlp=OtlpForm("dra.cluster.pool.slices", "{slice}"))
CLUSTER_POOL_SLICES_EXPECTED: Final = MetricSpec(
    "dra_cluster_pool_slices_expected", "gauge",
    "resourceSliceCount of a pool's newest generation: the slices the pool is complete with.",
    ("driver", "pool"),
    otlp=OtlpForm("dra.cluster.pool.expected_slices", "{slice}"))
CLUSTER_POOL_COMPLETE: Final = MetricSpec(
    "dra_cluster_pool_complete", "gauge",
    "Whether a pool's newest generation has all its resourceSliceCount slices and no slice of an older "
    "generation is left (1) or not (0). The scheduler ignores older generations and allocates from the "
    "newest only once it has all its slices; older ones still published mean the driver is replacing the "
    "pool.", ("driver", "pool"),
    otlp=OtlpForm("dra.cluster.pool.complete", "1"))
CLUSTER_TAINT_RULE_DEVICES: Final = MetricSpec(
    "dra_cluster_taint_rule_devices", "gauge",
    "Devices a DeviceTaintRule taints now (0 when its selector matches none, or uses the 1.33-1.34 CEL "
    "selectors, which are not applied).", ("rule", "driver", "pool", "device", "key", "value", "effect"),
    otlp=OtlpForm("dra.cluster.taint_rule.devices", "{device}"))
CLUSTER_OBJECTS: Final = MetricSpec(
    "dra_cluster_objects", "gauge", "DRA objects the cluster mode holds, by kind (and the pods that reference "
    "claims, and the Nodes: no Node series while Nodes cannot be read).", ("kind",),
    otlp=OtlpForm("dra.cluster.objects", "{object}"))

# --- self-metrics ---------------------------------------------------------------------------

SOURCE_UP: Final = MetricSpec(
    "dra_exporter_source_up", "gauge", "Whether the source's last collection succeeded (1) or not (0).", _SOURCE,
    otlp=OtlpForm("dra.exporter.source.up", "1"), stability=_STABLE)
COLLECT_DURATION: Final = MetricSpec(
    "dra_exporter_collect_duration_seconds", "gauge", "Seconds the source's last collection took.", _SOURCE,
    unit="seconds", otlp=OtlpForm("dra.exporter.collect.duration", "s"), stability=_STABLE)
COLLECT_ERRORS: Final = MetricSpec(
    "dra_exporter_collect_errors_total", "counter", "Failed collections of the source since start.", _SOURCE,
    otlp=OtlpForm("dra.exporter.collect.errors", "{error}"), stability=_STABLE)
LAST_SUCCESS: Final = MetricSpec(
    "dra_exporter_last_success_timestamp_seconds", "gauge", "Unix time of the source's last successful collection.",
    _SOURCE, unit="seconds", otlp=OtlpForm("dra.exporter.source.last_success_time", "s"), stability=_STABLE)
BUILD_INFO: Final = MetricSpec(
    "dra_exporter_build_info", "gauge", "Version of dra-exporter; value is always 1.", ("version", "python_version"),
    stability=_STABLE)
UNATTRIBUTED_PROCESSES: Final = MetricSpec(
    "dra_exporter_unattributed_gpu_processes", "gauge",
    "GPU processes of the last cycle whose pod could not be found (no host PID namespace, or not in a "
    "container); they count in device totals but in no container series.", (),
    otlp=OtlpForm("dra.exporter.unattributed_processes", "{process}"))

#: Every native family, in the order frames (and the exposition) list them.
CATALOG: Final[tuple[MetricSpec, ...]] = (
    GPU_INFO, GPU_UP, GPU_UTILIZATION, GPU_MEMORY_UTILIZATION, GPU_ENCODER_UTILIZATION, GPU_DECODER_UTILIZATION,
    GPU_MEMORY_USED, GPU_MEMORY_FREE, GPU_MEMORY_TOTAL, GPU_MEMORY_RESERVED, GPU_POWER, GPU_POWER_LIMIT,
    GPU_ENERGY, GPU_TEMPERATURE, GPU_MEMORY_TEMPERATURE, GPU_CLOCK, GPU_CLOCK_EVENT, GPU_PCIE_BYTES,
    GPU_PCIE_REPLAYS, GPU_ECC_ERRORS, GPU_REMAPPED_ROWS, GPU_ROW_REMAP_PENDING, GPU_ROW_REMAP_FAILURE,
    GPU_XID_ERRORS, GPU_LAST_XID, GPU_SM_ACTIVE, GPU_SM_OCCUPANCY, GPU_TENSOR_ACTIVE, GPU_DRAM_ACTIVE,
    GPU_FP64_ACTIVE, GPU_FP32_ACTIVE, GPU_FP16_ACTIVE, GPU_NVLINK_BYTES,
    GPU_NVLINK_LINK_UP, GPU_NVLINK_LINK_INFO, GPU_NVLINK_LINK_SPEED, GPU_NVLINK_LINK_BYTES, GPU_NVLINK_LINK_ERRORS,
    GPU_NVLINK_LINK_RECOVERIES, GPU_FABRIC_INFO, GPU_FABRIC_STATE, GPU_FABRIC_REGISTERED, GPU_FABRIC_HEALTH,
    GPU_FABRIC_HEALTH_PROBLEM, GPU_MIG_COMPUTE_SLICES, GPU_PROCESSES,
    CONTAINER_GPU_MEMORY_USED, CONTAINER_GPU_SM_UTILIZATION,
    CLAIM_ALLOCATION_INFO, CLAIM_CONSUMER_INFO, CLAIM_NOT_PREPARED, CLAIM_DEVICE_CONDITION, CLAIM_DEVICE_TOLERATION,
    CLAIM_CONSUMED_CAPACITY, CLAIM_DEVICE_NETWORK,
    DEVICE_INFO, DEVICE_TAINT, DEVICE_HEALTH, DEVICE_SHARED_CAPACITY, DEVICE_SHARED_CONSUMPTION,
    ORPHAN_PREPARED_DEVICE, ORPHAN_MIG_DEVICE, ORPHAN_GPU_PROCESS,
    COMPUTE_DOMAIN_INFO, COMPUTE_DOMAIN_READY, COMPUTE_DOMAIN_NODE_READY, COMPUTE_DOMAIN_CHANNEL_INFO,
    COMPUTE_DOMAIN_GPU_INFO,
    CLUSTER_DEVICES, CLUSTER_PARTITIONS_FIT, CLUSTER_GPU_EQUIVALENTS, CLUSTER_DEVICE_CAPACITY_LEFT, CLUSTER_CLAIMS,
    CLUSTER_CLAIM_PENDING, CLUSTER_CLAIM_PENDING_REQUEST, CLUSTER_CLAIM_PENDING_REASON, CLUSTER_CLAIM_UNRESERVED,
    CLUSTER_CLASS_DEVICES, CLUSTER_CLASS_PLACEABLE, CLUSTER_CLASS_EVALUABLE, CLUSTER_CLASS_PENDING,
    CLUSTER_CLASS_ERRORS, CLUSTER_POOL_INFO, CLUSTER_POOL_SLICES,
    CLUSTER_POOL_SLICES_EXPECTED, CLUSTER_POOL_COMPLETE, CLUSTER_TAINT_RULE_DEVICES, CLUSTER_OBJECTS,
    SOURCE_UP, COLLECT_DURATION, COLLECT_ERRORS, LAST_SUCCESS, BUILD_INFO, UNATTRIBUTED_PROCESSES,
)


# --- dcgm-exporter names (``--naming dcgm|both``) ---------------------------------------------
# Derived from the families' ``dcgm`` forms. These are a renaming of native families for the
# Prometheus endpoint only (``dra_exporter.naming`` builds them), so OTLP, the join and the
# README's native table never treat them as metrics of their own.

#: dcgm-exporter's labels on GPU series (its ``gpuMetricsFormat``, released casing ``Hostname``),
#: then its pod attributes and DRA labels; always all present, ``""`` where dcgm-exporter omits one.
DCGM_LABELS: Final = (
    "gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION",
    "GPU_I_PROFILE", "GPU_I_ID", "pod", "namespace", "container", "dra_claim_name", "dra_claim_namespace",
    "dra_driver_name", "dra_pool_name", "dra_device_name", "dra_mig_profile", "dra_mig_device_uuid",
)

#: The same under ``--naming dcgm-4.10``: dcgm-exporter 4.9 took DCGM 4.7's ``hostname`` (4.8.3 already
#: had it) and renamed the driver label to DCGM 4.7's field name.
DCGM_LABELS_410: Final = tuple({"Hostname": "hostname", "DCGM_FI_DRIVER_VERSION": "DCGM_FI_SYSTEM_DRIVER_VERSION"}
                               .get(label, label) for label in DCGM_LABELS)

#: Every DCGM family with the native family it is computed from (one DCGM series per native series).
DCGM_CATALOG: Final[tuple[tuple[MetricSpec, DcgmForm], ...]] = tuple(
    (spec, form) for spec in CATALOG for form in spec.dcgm)
#: The same for ``--naming dcgm-4.10``. Where the names come from: dcgm-exporter 4.9.0's release notes
#: (23 fields renamed to DCGM 4.7's names, eleven with a base unit; the driver label; FB capacity by
#: default) and 4.10.0's (the PCIe / NVLink profiling rates); DCGM 4.6's dcgm_fields.h, whose
#: deprecation block maps each old name to its new one at the same field id (temperatures, power,
#: remapping, XID, profiling ratios, NVLink error totals); the base-unit fields of DCGM 4.6/4.7 (go-dcgm's
#: 1600-1612: clocks in Hz, energy in J; 1613-1628: utilisation ratios, framebuffer bytes).
DCGM_CATALOG_410: Final[tuple[tuple[MetricSpec, DcgmForm], ...]] = tuple(
    (spec, form) for spec in CATALOG for form in (spec.dcgm if spec.dcgm_410 is None else spec.dcgm_410))
#: Native families that ``--naming dcgm`` keeps beside their DCGM counterpart because the shipped
#: alert rules (deploy/prometheus-rules.yaml) or dashboards (dashboards/) read them: alerting and
#: every panel work under every naming. tests/test_alerts.py and tests/test_dashboards.py keep
#: this list equal to what the rules and dashboards use.
DCGM_KEPT_FOR_KIT: Final[frozenset[str]] = frozenset(spec.name for spec in (
    GPU_UTILIZATION, GPU_MEMORY_USED, GPU_MEMORY_TOTAL, GPU_POWER, GPU_ENERGY, GPU_TEMPERATURE, GPU_MEMORY_TEMPERATURE,
    GPU_CLOCK, GPU_PCIE_REPLAYS, GPU_REMAPPED_ROWS, GPU_ROW_REMAP_FAILURE, GPU_XID_ERRORS, GPU_SM_ACTIVE,
    GPU_TENSOR_ACTIVE, GPU_DRAM_ACTIVE, GPU_NVLINK_BYTES,
))
#: dcgm-exporter default counters with no native source, and why (README, naming.py).
DCGM_LEFT_OUT: Final[tuple[tuple[str, str], ...]] = (
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", ("no native source: NVML's GPU utilisation samples kernels, GPM's SM "
                                       "activity is not the graphics engine; use DCGM_FI_DEV_GPU_UTIL or "
                                       "DCGM_FI_PROF_SM_ACTIVE")),
    ("DCGM_FI_PROF_PCIE_TX_BYTES / _RX_BYTES", (f"DCGM's are gauge rates; the native counter "
                                                f"{GPU_PCIE_BYTES.name}{{direction}} stays, use rate() on it")),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "vGPU only; not read"),
)
#: The same for ``--naming dcgm-4.10``.
DCGM_LEFT_OUT_410: Final[tuple[tuple[str, str], ...]] = (
    ("DCGM_FI_PROF_GR_ENGINE_UTIL_RATIO", ("no native source: NVML's GPU utilisation samples kernels, GPM's SM "
                                           "activity is not the graphics engine; use DCGM_FI_DEV_GPU_UTIL_RATIO or "
                                           "DCGM_FI_PROF_SM_UTIL_RATIO")),
    ("DCGM_FI_PROF_PCIE_TX_BYTES_PER_SECOND / _RX_BYTES_PER_SECOND",
     f"DCGM's are gauge rates; the native counter {GPU_PCIE_BYTES.name}{{direction}} stays, use rate() on it"),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "vGPU only; not read"),
)


@dataclass(frozen=True, slots=True)
class DcgmNaming:
    """One ``--naming`` that publishes dcgm-exporter's families: its label set and its forms."""

    name: str
    release: str
    """The dcgm-exporter releases whose names it follows."""
    labels: tuple[str, ...]
    forms: tuple[tuple[MetricSpec, DcgmForm], ...]
    left_out: tuple[tuple[str, str], ...]
    xid: DcgmForm
    """Its last-XID gauge, built from the XID counters rather than converted sample by sample."""


DCGM_NAMINGS: Final[dict[str, DcgmNaming]] = {n.name: n for n in (
    DcgmNaming("dcgm", "4.6 to 4.8 (DCGM 4.6 and earlier)", DCGM_LABELS, DCGM_CATALOG, DCGM_LEFT_OUT,
               DCGM_XID_ERRORS),
    DcgmNaming("dcgm-4.10", "4.9 and 4.10 (DCGM 4.7 and 4.8)", DCGM_LABELS_410, DCGM_CATALOG_410,
               DCGM_LEFT_OUT_410, DCGM_XID_ERROR),
)}


#: Each published DCGM name's field in DCGM (canonical name, numeric id): the dcgm-exporter names of 4.8
#: are DCGM 4.6's aliases of these (dcgm_fields.h); the 4.10 base-unit names are DCGM 4.7's fields
#: (1600 and up). Its value type and unit are the form's ``value_type`` and ``unit``; a test keeps
#: every form listed here.
DCGM_FIELDS: Final[dict[str, tuple[str, int]]] = {
    "DCGM_FI_DEV_GPU_UTIL": ("DCGM_FI_DEV_GPU_UTIL", 203),
    "DCGM_FI_DEV_MEM_COPY_UTIL": ("DCGM_FI_DEV_MEM_COPY_UTIL", 204),
    "DCGM_FI_DEV_ENC_UTIL": ("DCGM_FI_DEV_ENC_UTIL", 206),
    "DCGM_FI_DEV_DEC_UTIL": ("DCGM_FI_DEV_DEC_UTIL", 207),
    "DCGM_FI_DEV_FB_USED": ("DCGM_FI_DEV_FB_USED", 252),
    "DCGM_FI_DEV_FB_FREE": ("DCGM_FI_DEV_FB_FREE", 251),
    "DCGM_FI_DEV_FB_RESERVED": ("DCGM_FI_DEV_FB_RESERVED", 253),
    "DCGM_FI_DEV_POWER_USAGE": ("DCGM_FI_DEV_BOARD_POWER_WATTS", 155),
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 156),
    "DCGM_FI_DEV_GPU_TEMP": ("DCGM_FI_DEV_GPU_TEMP_CELSIUS", 150),
    "DCGM_FI_DEV_MEMORY_TEMP": ("DCGM_FI_DEV_MEMORY_TEMP_CELSIUS", 140),
    "DCGM_FI_DEV_SM_CLOCK": ("DCGM_FI_DEV_SM_CLOCK", 100),
    "DCGM_FI_DEV_MEM_CLOCK": ("DCGM_FI_DEV_MEM_CLOCK", 101),
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": ("DCGM_FI_DEV_PCIE_REPLAY_TOTAL", 202),
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": ("DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL", 393),
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": ("DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL", 394),
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": ("DCGM_FI_DEV_ROW_REMAP_FAILED", 395),
    "DCGM_FI_DEV_XID_ERRORS": ("DCGM_FI_DEV_XID_ERROR", 230),
    "DCGM_FI_PROF_SM_ACTIVE": ("DCGM_FI_PROF_SM_UTIL_RATIO", 1002),
    "DCGM_FI_PROF_SM_OCCUPANCY": ("DCGM_FI_PROF_SM_OCCUPANCY_RATIO", 1003),
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": ("DCGM_FI_PROF_TENSOR_UTIL_RATIO", 1004),
    "DCGM_FI_PROF_DRAM_ACTIVE": ("DCGM_FI_PROF_DRAM_UTIL_RATIO", 1005),
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": ("DCGM_FI_PROF_FP64_UTIL_RATIO", 1006),
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE": ("DCGM_FI_PROF_FP32_UTIL_RATIO", 1007),
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE": ("DCGM_FI_PROF_FP16_UTIL_RATIO", 1008),
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": ("DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL", 449),
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL", 409),
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_TOTAL", 419),
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_TOTAL", 429),
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_TOTAL", 439),
    "DCGM_FI_DEV_FABRIC_CLIQUE_ID": ("DCGM_FI_DEV_FABRIC_CLIQUE_ID", 173),
    "DCGM_FI_DEV_FABRIC_MANAGER_STATUS": ("DCGM_FI_DEV_FABRIC_MANAGER_STATUS", 170),
    "DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY": ("DCGM_FI_DEV_FABRIC_HEALTH_SUMMARY", 175),
    "DCGM_FI_DEV_GPU_UTIL_RATIO": ("DCGM_FI_DEV_GPU_UTIL_RATIO", 1613),
    "DCGM_FI_DEV_MEMORY_UTIL_RATIO": ("DCGM_FI_DEV_MEMORY_UTIL_RATIO", 1614),
    "DCGM_FI_DEV_ENC_UTIL_RATIO": ("DCGM_FI_DEV_ENC_UTIL_RATIO", 1615),
    "DCGM_FI_DEV_DEC_UTIL_RATIO": ("DCGM_FI_DEV_DEC_UTIL_RATIO", 1616),
    "DCGM_FI_DEV_FB_USED_BYTES": ("DCGM_FI_DEV_FB_USED_BYTES", 1627),
    "DCGM_FI_DEV_FB_FREE_BYTES": ("DCGM_FI_DEV_FB_FREE_BYTES", 1626),
    "DCGM_FI_DEV_FB_CAPACITY_BYTES": ("DCGM_FI_DEV_FB_CAPACITY_BYTES", 1625),
    "DCGM_FI_DEV_FB_RESERVED_BYTES": ("DCGM_FI_DEV_FB_RESERVED_BYTES", 1628),
    "DCGM_FI_DEV_BOARD_POWER_WATTS": ("DCGM_FI_DEV_BOARD_POWER_WATTS", 155),
    "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL": ("DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL", 1611),
    "DCGM_FI_DEV_GPU_TEMP_CELSIUS": ("DCGM_FI_DEV_GPU_TEMP_CELSIUS", 150),
    "DCGM_FI_DEV_MEMORY_TEMP_CELSIUS": ("DCGM_FI_DEV_MEMORY_TEMP_CELSIUS", 140),
    "DCGM_FI_DEV_SM_CLOCK_HERTZ": ("DCGM_FI_DEV_SM_CLOCK_HERTZ", 1603),
    "DCGM_FI_DEV_MEMORY_CLOCK_HERTZ": ("DCGM_FI_DEV_MEMORY_CLOCK_HERTZ", 1604),
    "DCGM_FI_DEV_PCIE_REPLAY_TOTAL": ("DCGM_FI_DEV_PCIE_REPLAY_TOTAL", 202),
    "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL": ("DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL", 393),
    "DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL": ("DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL", 394),
    "DCGM_FI_DEV_ROW_REMAP_FAILED": ("DCGM_FI_DEV_ROW_REMAP_FAILED", 395),
    "DCGM_FI_DEV_XID_ERROR": ("DCGM_FI_DEV_XID_ERROR", 230),
    "DCGM_FI_PROF_SM_UTIL_RATIO": ("DCGM_FI_PROF_SM_UTIL_RATIO", 1002),
    "DCGM_FI_PROF_SM_OCCUPANCY_RATIO": ("DCGM_FI_PROF_SM_OCCUPANCY_RATIO", 1003),
    "DCGM_FI_PROF_TENSOR_UTIL_RATIO": ("DCGM_FI_PROF_TENSOR_UTIL_RATIO", 1004),
    "DCGM_FI_PROF_DRAM_UTIL_RATIO": ("DCGM_FI_PROF_DRAM_UTIL_RATIO", 1005),
    "DCGM_FI_PROF_FP64_UTIL_RATIO": ("DCGM_FI_PROF_FP64_UTIL_RATIO", 1006),
    "DCGM_FI_PROF_FP32_UTIL_RATIO": ("DCGM_FI_PROF_FP32_UTIL_RATIO", 1007),
    "DCGM_FI_PROF_FP16_UTIL_RATIO": ("DCGM_FI_PROF_FP16_UTIL_RATIO", 1008),
    "DCGM_FI_DEV_NVLINK_THROUGHPUT_BYTES_PER_SECOND": ("DCGM_FI_DEV_NVLINK_THROUGHPUT_BYTES_PER_SECOND", 1648),
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL": ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL", 409),
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_TOTAL": ("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_TOTAL", 419),
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_TOTAL": ("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_TOTAL", 429),
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_TOTAL": ("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_TOTAL", 439),
}


def _exposed(d: DcgmForm, labels: tuple[str, ...]) -> MetricSpec:
    # Labels: the naming's; the XID family has no other. Exposed as a gauge (see DcgmForm.dcgm_kind).
    return MetricSpec(d.name, "gauge", d.help if d.help.endswith(".") else d.help + ".", labels)


#: A DCGM name both namings publish (the fabric fields, which DCGM 4.7 kept) is listed with the
#: ``dcgm`` labels; its help and type are the same under both.
BY_NAME: Final[dict[str, MetricSpec]] = {spec.name: spec for spec in CATALOG} | {
    d.name: _exposed(d, n.labels) for n in reversed(DCGM_NAMINGS.values()) for _, d in n.forms}


def spec(name: str) -> MetricSpec:
    """The catalogue entry for ``name``; a KeyError names a metric nobody declared."""
    return BY_NAME[name]


def markdown_table() -> str:
    """The README's metrics table, generated so docs and code cannot drift."""
    rows = ["| metric | type | unit | labels | OTLP name | stability | help |", "|---|---|---|---|---|---|---|"]
    for s in CATALOG:
        otel = f"`{s.otlp.name}` ({s.otlp.unit})" if s.otlp else ""
        labels = ", ".join(s.labels) + (f", {POD_LABEL_PREFIX}* (`--pod-labels`)" if s.pod_labels else "")
        rows.append(f"| `{s.name}` | {s.kind} | {s.unit} | {labels} | {otel} | {s.stability} "
                    f"| {s.help} |")
    return "\n".join(rows)


def dcgm_markdown_table(naming: str = "dcgm") -> str:
    """The README's table of a DCGM naming: each DCGM family, its unit and native source."""
    rows = ["| dcgm-exporter name | DCGM field | DCGM type | DCGM value | unit | from | help |",
            "|---|---|---|---|---|---|---|"]
    for source, d in DCGM_NAMINGS[naming].forms:
        origin = f"`{source.name}`" + "".join(f" {{{k}=\"{v}\"}}" for k, v in d.select)
        if d.sum_over:
            origin += f", summed over `{d.sum_over}`"
        if d.rate:
            origin = f"per-second rate of {origin}"
        if d.scale != 1.0:
            origin += f" × {d.scale:g}"
        value = d.value_type + (", rate" if d.rate else "")
        canonical, field_id = DCGM_FIELDS[d.name]
        field_cell = str(field_id) if canonical == d.name else f"{field_id} `{canonical}`"
        rows.append(f"| `{d.name}` | {field_cell} | {d.dcgm_kind} | {value} | {d.unit} | {origin} | {d.help} |")
    for name, why in DCGM_NAMINGS[naming].left_out:
        rows.append(f"| `{name}` | — | — | — | — | *not emitted* | {why} |")
    return "\n".join(rows)


def dcgm_renames() -> tuple[tuple[MetricSpec, DcgmForm | None, DcgmForm | None], ...]:
    """(native source, ``dcgm`` form, ``dcgm-4.10`` form) of every form either naming has; None
    where one naming has no form for it. A family's ``dcgm_410`` pairs position by position."""
    out: list[tuple[MetricSpec, DcgmForm | None, DcgmForm | None]] = []
    for spec in CATALOG:
        new = spec.dcgm if spec.dcgm_410 is None else spec.dcgm_410
        out.extend((spec, *pair) for pair in zip_longest(spec.dcgm, new))
    return tuple(out)


def dcgm_rename_markdown_table() -> str:
    """The README's table of what ``dcgm-4.10`` names and scales differently from ``dcgm``."""
    def cell(form: DcgmForm | None) -> str:
        return f"`{form.name}` ({form.unit or 'count'})" if form else "—"

    rows = ["| `dcgm` (dcgm-exporter 4.8) | `dcgm-4.10` (dcgm-exporter 4.9, 4.10) | from |", "|---|---|---|"]
    rows += [f"| label `{old}` | label `{new}` | |"
             for old, new in zip(DCGM_LABELS, DCGM_LABELS_410, strict=True) if old != new]
    for source, old, new in dcgm_renames():
        if old != new:
            rows.append(f"| {cell(old)} | {cell(new)} | `{source.name}` |")
    return "\n".join(rows)


if __name__ == "__main__":  # python -m dra_exporter.catalog [dcgm | dcgm-4.10 | dcgm-renames] > table.md
    import sys

    arg = sys.argv[1:]
    print(dcgm_rename_markdown_table() if arg == ["dcgm-renames"] else
          dcgm_markdown_table(arg[0]) if arg and arg[0] in DCGM_NAMINGS else markdown_table())
