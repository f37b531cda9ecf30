"""``--naming native|dcgm|dcgm-4.10|both``: dcgm-exporter's names, units and labels, computed from a native frame.

Contract (pure: Frame in, Frame out, no I/O):

- ``native`` returns the frame unchanged.
- ``dcgm`` adds one DCGM family per DCGM form of the catalogue (``catalog.DCGM_CATALOG``: dcgm-exporter
  4.8's names) and drops the native families they are computed from except those the shipped alerts
  and dashboards read (``catalog.DCGM_KEPT_FOR_KIT``: they must keep working under every naming);
  every other native family — DRA claims and devices, per-container shares, ECC, throttling, PCIe
  bytes, self-metrics, ``dra_gpu_info``/``dra_gpu_up`` — stays under its native name, so nothing the
  exporter knows is lost.
- ``dcgm-4.10`` does the same with dcgm-exporter 4.9/4.10's names, units and labels (DCGM 4.7/4.8's
  field names, base units: ``catalog.DCGM_CATALOG_410``, ``catalog.DCGM_LABELS_410``).
- ``both`` adds the ``dcgm`` families beside all native ones.

Each native device series gives one DCGM series (no values copied): a MIG device's series carries
its parent's ``gpu``/``UUID`` and ``GPU_I_PROFILE``/``GPU_I_ID`` as dcgm-exporter's do; board-level
values (power, temperature, clocks) stay on the parent GPU's series instead of being repeated on
every GPU instance. A shared device keeps the native attribution (``pod=""``). Every DCGM series
has the full ``catalog.DCGM_LABELS`` set, ``""`` where dcgm-exporter leaves a label out
(Prometheus stores both the same way).

The fabric fields (``DCGM_FI_DEV_FABRIC_MANAGER_STATUS``, ``_CLIQUE_ID``, ``_HEALTH_SUMMARY``) are numbers
where the native families are state sets and info labels: the current state's number, the clique id
while the GPU is registered. The NVLink error totals sum the per-link counters; like those fabric
fields they leave their native source in place (``DcgmForm.replaces``): the DCGM form says less.

``DCGM_FI_DEV_XID_ERRORS`` is dcgm's last-value gauge: per device, the code of the most recent XID
(0 when none was seen). The native counters only say how often each code happened, so "most
recent" is the code whose counter grew last as seen by an ``XidMemory`` kept across frames; when
several codes grew in the same cycle, or are already there on the first frame, the highest
count wins, then the highest code.

Values are DCGM's, not only names: an ``int64`` field (``DcgmForm.value_type``) is a whole number,
truncated as DCGM truncates; a ``rate`` field (NVLink throughput: MB/s at 4.8's name, bytes per second
at 4.10's) is the native counter's per-second rate between two frames, kept by a ``RateMemory``
across frames, 0 on the first frame, as DCGM's first sample is.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Final

from . import catalog as cat
from .model import Family, Frame, Labels, Sample

NAMINGS: Final[tuple[str, ...]] = ("native", *cat.DCGM_NAMINGS, "both")

#: Per DCGM naming, the native families it replaces by their DCGM counterpart.
REPLACED: Final[dict[str, frozenset[str]]] = {
    n.name: frozenset(source.name for source, form in n.forms if form.replaces) - cat.DCGM_KEPT_FOR_KIT
    for n in cat.DCGM_NAMINGS.values()}


@dataclass
class XidMemory:
    """Per device, the XID counts of the previous frame and the code judged most recent."""

    counts: dict[str, dict[str, float]] = field(default_factory=dict)
    last: dict[str, str] = field(default_factory=dict)

    def observe(self, uuid: str, counts: Mapping[str, float]) -> str:
        """The most recent XID code of ``uuid`` given its counters now; ``"0"`` when none."""
        before = self.counts.get(uuid, {})
        grown = {code: n - before.get(code, 0.0) for code, n in counts.items() if n > before.get(code, 0.0)}
        if grown:
            self.last[uuid] = max(grown, key=lambda code: (counts[code], _code_order(code)))
        self.counts[uuid] = dict(counts)
        return self.last.get(uuid, "0")


@dataclass
class RateMemory:
    """Per rate form, each DCGM series' native total and frame time at the previous frame."""

    last: dict[str, dict[Labels, tuple[float, float]]] = field(default_factory=dict)

    def rates(self, form: str, totals: Mapping[Labels, float], at: float) -> dict[Labels, float]:
        """Per series, the per-second growth of its total since the previous frame; 0 where there
        is none (first frame, the clock did not move, or the counter went back: a driver reload)."""
        before = self.last.get(form, {})
        self.last[form] = {labels: (total, at) for labels, total in totals.items()}  # gone series go
        out = {}
        for labels, total in totals.items():
            prev_total, prev_at = before.get(labels, (total, at))
            out[labels] = (total - prev_total) / (at - prev_at) if at > prev_at and total >= prev_total else 0.0
        return out


def _code_order(code: str) -> int:
    return int(code) if code.isdigit() else -1


def apply(frame: Frame, naming: str, *, hostname: str, xid: XidMemory | None = None,
          rates: RateMemory | None = None) -> Frame:
    """``frame`` under ``naming`` (see the module docstring); ``xid`` carries XID order, ``rates`` the
    rate fields' previous totals, across frames."""
    if naming == "native":
        return frame
    if naming not in NAMINGS:
        raise ValueError(f"unknown naming {naming!r}; expected one of {', '.join(NAMINGS)}")
    dcgm_naming = cat.DCGM_NAMINGS["dcgm" if naming == "both" else naming]
    dcgm = dcgm_families(frame, hostname=hostname, xid=xid, rates=rates, naming=dcgm_naming)
    kept = frame.families if naming == "both" else tuple(
        f for f in frame.families if f.name not in REPLACED[naming])
    return replace(frame, families=tuple(sorted(kept + dcgm, key=lambda f: f.name)))


def dcgm_families(frame: Frame, *, hostname: str, xid: XidMemory | None = None, rates: RateMemory | None = None,
                  naming: cat.DcgmNaming = cat.DCGM_NAMINGS["dcgm"]) -> tuple[Family, ...]:
    """The DCGM families of ``frame`` under ``naming`` (only those with samples)."""
    labeller = _Labeller.of(frame, hostname, naming.labels)
    out: list[Family] = []
    for source, form in naming.forms:
        if form is naming.xid:
            samples = _xid_samples(frame, labeller, xid or XidMemory())
        elif form in _FABRIC:
            samples = _fabric_samples(frame, source, form, labeller)
        else:
            samples = _converted(frame.family(source.name), form, labeller, frame.timestamp,
                                 RateMemory() if rates is None else rates)
        if samples:
            out.append(Family(form.name, samples))
    return tuple(out)


def _converted(family: Family | None, spec: cat.DcgmForm, labeller: _Labeller, at: float,
               rates: RateMemory) -> tuple[Sample, ...]:
    totals: dict[Labels, float] = defaultdict(float)
    for sample in _samples(family):
        native = dict(sample.labels)
        if any(native.get(k) != v for k, v in spec.select):
            continue
        # Summing is what ``sum_over`` asks for; for the others each key occurs once.
        totals[labeller.labels(native)] += sample.value
    values = rates.rates(spec.name, totals, at) if spec.rate else totals
    return tuple(Sample(labels, dcgm_value(spec, value)) for labels, value in sorted(values.items()))


def dcgm_value(form: cat.DcgmForm, native: float) -> float:
    """The number DCGM's field holds for ``native`` (in the native unit, per second for a rate)."""
    value = native * form.scale
    if form.value_type == "int64" and math.isfinite(value):
        # DCGM truncates to an integer; rounding to 6 places first keeps 1979.9999999999998 MHz
        # (1.98e9 Hz × 1e-6 in floating point) at 1980, as NVML's whole MHz read.
        return float(math.trunc(round(value, 6)))
    return value


def _fabric_value(form: cat.DcgmForm, native: Mapping[str, str], value: float,
                  registered: Mapping[str, float]) -> float | None:
    """The DCGM number one native fabric series stands for; None when it stands for none."""
    if form is cat.DCGM_FABRIC_CLIQUE_ID:
        clique_id = native.get("clique_id", "")
        return float(clique_id) if clique_id.isdigit() else None
    if value != 1.0:  # a state set: only the current state's series
        return None
    if form is cat.DCGM_FABRIC_HEALTH_SUMMARY:
        return cat.DCGM_FABRIC_SUMMARY_VALUES.get(native.get("summary", ""))
    state = native.get("state", "")
    if state == "completed":
        return 3.0 if registered.get(native.get("uuid", "")) == 1.0 else 4.0
    return cat.DCGM_FABRIC_STATUS_VALUES.get(state)


_FABRIC: Final = frozenset({cat.DCGM_FABRIC_STATUS, cat.DCGM_FABRIC_CLIQUE_ID, cat.DCGM_FABRIC_HEALTH_SUMMARY})


def _fabric_samples(frame: Frame, source: cat.MetricSpec, form: cat.DcgmForm,
                    labeller: _Labeller) -> tuple[Sample, ...]:
    """DCGM's fabric fields are numbers where the native families are state sets and info labels."""
    family = frame.family(source.name)
    registered = {dict(s.labels).get("uuid", ""): s.value
                  for s in _samples(frame.family(cat.GPU_FABRIC_REGISTERED.name))}
    out = []
    for sample in _samples(family):
        native = dict(sample.labels)
        number = _fabric_value(form, native, sample.value, registered)
        if number is not None:
            out.append(Sample(labeller.labels(native), number))
    return tuple(sorted(out, key=lambda s: s.labels))


def _xid_samples(frame: Frame, labeller: _Labeller, memory: XidMemory) -> tuple[Sample, ...]:
    """One series per device (every ``dra_gpu_up`` series): its last XID code, 0 when none."""
    up = frame.family(cat.GPU_UP.name)
    counts: dict[str, dict[str, float]] = defaultdict(dict)
    errors = frame.family(cat.GPU_XID_ERRORS.name)
    for sample in errors.samples if errors else ():
        native = dict(sample.labels)
        counts[native.get("uuid", "")][native.get("xid", "")] = sample.value
    out = []
    for sample in up.samples if up else ():
        native = dict(sample.labels)
        code = memory.observe(native.get("uuid", ""), counts.get(native.get("uuid", ""), {}))
        out.append(Sample(labeller.labels(native), float(code) if code.isdigit() else 0.0))
    return tuple(sorted(out, key=lambda s: s.labels))


@dataclass(frozen=True, slots=True)
class _Labeller:
    """Builds DCGM label sets from a native series' labels, with the frame's identity and allocations."""

    hostname: str
    names: tuple[str, ...]
    """The naming's label set, in its order."""
    identity: Mapping[str, Mapping[str, str]]
    """uuid → its ``dra_gpu_info`` labels."""
    allocations: Mapping[tuple[str, str, str], tuple[str, str, str]]
    """(namespace, claim, uuid) → (driver, pool, device) from ``dra_claim_allocation_info``."""

    @classmethod
    def of(cls, frame: Frame, hostname: str, names: tuple[str, ...]) -> _Labeller:
        return cls(hostname, names, _identity(frame), _allocations(frame))

    def labels(self, native: Mapping[str, str]) -> Labels:
        uuid = native.get("uuid", "")
        info = self.identity.get(uuid, {})
        parent_uuid = native.get("parent_uuid", "") or info.get("parent_uuid", "")
        parent = self.identity.get(parent_uuid, info) if parent_uuid else info
        gpu = native.get("gpu", "") or info.get("gpu", "")
        mig = bool(parent_uuid)
        namespace, claim = native.get("namespace", ""), native.get("claim", "")
        driver, pool, device = self.allocations.get((namespace, claim, uuid), ("", "", "")) if claim else ("",) * 3
        driver_version = info.get("driver_version", "") or parent.get("driver_version", "")
        values = {
            "gpu": gpu,
            "UUID": parent_uuid or uuid,
            "pci_bus_id": info.get("pci_bus_id", "") or parent.get("pci_bus_id", ""),
            # The character device is /dev/nvidia<minor>; the NVML index is only a fallback for
            # frames without the minor label.
            "device": f"nvidia{parent.get('minor') or info.get('minor') or gpu}" if gpu else "",
            "modelName": parent.get("model", "") or info.get("model", ""),
            "Hostname": self.hostname,
            "hostname": self.hostname,
            "DCGM_FI_DRIVER_VERSION": driver_version,
            "DCGM_FI_SYSTEM_DRIVER_VERSION": driver_version,
            "GPU_I_PROFILE": native.get("profile", "") if mig else "",
            "GPU_I_ID": info.get("gpu_instance_id", "") if mig else "",
            "pod": native.get("pod", ""),
            "namespace": namespace,
            "container": native.get("container", ""),
            "dra_claim_name": claim,
            "dra_claim_namespace": namespace if claim else "",
            "dra_driver_name": driver,
            "dra_pool_name": pool,
            "dra_device_name": device,
            "dra_mig_profile": native.get("profile", "") if mig and claim else "",
            "dra_mig_device_uuid": uuid if mig and claim else "",
        }
        return tuple((name, values[name]) for name in self.names)


def _identity(frame: Frame) -> dict[str, dict[str, str]]:
    info = frame.family(cat.GPU_INFO.name)
    return {d["uuid"]: d for d in (dict(s.labels) for s in _samples(info)) if d.get("uuid")}


def _allocations(frame: Frame) -> dict[tuple[str, str, str], tuple[str, str, str]]:
    out: dict[tuple[str, str, str], tuple[str, str, str]] = {}
    for sample in _samples(frame.family(cat.CLAIM_ALLOCATION_INFO.name)):
        d = dict(sample.labels)
        if d.get("uuid"):
            out[(d.get("namespace", ""), d.get("claim", ""), d["uuid"])] = (
                d.get("driver", ""), d.get("pool", ""), d.get("device", ""))
    return out


def _samples(family: Family | None) -> Iterable[Sample]:
    return family.samples if family else ()
