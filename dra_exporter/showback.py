"""Showback: GPU-equivalents held and busy per namespace and claim (DESIGN §7). Pure core.

Two halves, both free of I/O:

- **The recording rules** (``RULES``): the only definition of how node series become showback
  figures. ``deploy/recording-rules.yaml`` is rendered from them (``python -m dra_exporter.showback``;
  a test keeps the file in step), and ``dra-exporter report`` inlines the same expressions when the
  rules are not installed, so both ways count alike.
- **The report**: query results (``Series``) in, ``Report`` out, rendered as a table, CSV or JSON.
  ``dra_exporter.report`` does the HTTP at the edge.

What is counted (docs/operating.md "Showback"): a device held by a claim counts its *compute share*
of the physical GPU, 1 for a whole GPU and ``N/S`` for a MIG device whose profile starts with ``N``
compute slices (``1g.18gb``, ``1c.3g.71gb``: its compute instance has one slice) on a GPU of ``S``
(``dra_gpu_mig_compute_slices``: 7 on A100 to GB200, 4 on an A30; 7 where no series says). A device
shared by several pods has one series (``pod=""``), so a shared claim is counted once; only the
per-pod rules split it evenly between its pods. Busy is NVML utilisation for whole GPUs and GPM SM
activity for MIG devices (NVML has no utilisation for them), the mean of every sample, times the
share; a device with neither (A100 and A30 MIG devices) is held with its busy share unknown.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from array import array
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Final

from . import catalog as cat
from . import printable

COMPUTE_SLICES: Final = 7
"""The most compute slices a MIG profile's name starts with, and the denominator of a MIG
device's share where its parent does not say (``dra_gpu_mig_compute_slices``: 7, or 4 on an A30)."""
RULE_INTERVAL: Final = "1m"
"""The rules' evaluation interval: the step of every recorded figure."""
RULE_GROUP: Final = "dra-exporter-showback"
IDLE_BELOW: Final = 0.01
"""A claim whose busy share of what it holds stays under this is idle (the DraClaimedGpuIdle alert's 1 %)."""

# --- the recording rules ----------------------------------------------------------------------

SHARE: Final = "uuid:dra_gpu_compute_share:ratio"
HELD_DEVICE: Final = "namespace_claim_uuid:dra_gpus_held:weighted"
BUSY_DEVICE: Final = "namespace_claim_uuid:dra_gpus_busy:weighted"
HELD_CLAIM: Final = "namespace_claim:dra_gpus_held:sum"
BUSY_CLAIM: Final = "namespace_claim:dra_gpus_busy:sum"
MEASURED_CLAIM: Final = "namespace_claim:dra_gpus_measured:sum"
MEASURED_NAMESPACE: Final = "namespace:dra_gpus_measured:sum"
HELD_NAMESPACE: Final = "namespace:dra_gpus_held:sum"
BUSY_NAMESPACE: Final = "namespace:dra_gpus_busy:sum"
HELD_POD: Final = "namespace_claim_pod:dra_gpus_held:split"
BUSY_POD: Final = "namespace_claim_pod:dra_gpus_busy:weighted"
PRICE: Final = "model:dra_gpu_hour_price:configured"
"""A price file as series (``price_rules``): one per priced model (label ``model``), the default
without one, each with its ``currency`` where the file names one; the dashboards' cost panels read them."""
PRICE_GROUP: Final = "dra-exporter-showback-prices"

# Aggregations say what they drop (``without``), never what they keep, so labels the operator adds
# (``cluster`` from external labels or a global view) survive every level.
_INFO_ONLY = ("gpu", "pci_bus_id", "driver_version", "parent_uuid", "mig_mode", "gpu_instance_id",
              "compute_instance_id", "minor")
_HOLDER_DETAIL = ("gpu", "parent_uuid", "pod", "pod_uid", "container", "request")
_DEVICE_LEVEL = ("instance", "job", "uuid", "profile", "model")


def _without(labels: Sequence[str]) -> str:
    return f"without ({', '.join(labels)})"


def _share_expr() -> str:
    # PromQL cannot turn a label into a number, so each slice count of a profile name has its own
    # branch; the parent's slice count comes from its dra_gpu_mig_compute_slices, and is 7 where
    # no series says (an exporter before it, or a driver that cannot tell).
    info = f"max {_without(_INFO_ONLY)}"
    slices_of = " or ".join(f'{n} * {cat.GPU_INFO.name}{{profile=~"{n}[cg]\\\\..+"}}'
                            for n in range(1, COMPUTE_SLICES + 1))
    parents = (f'max by (instance, parent_uuid) (label_replace({cat.GPU_MIG_COMPUTE_SLICES.name}, '
               f'"parent_uuid", "$1", "uuid", "(.+)"))\n    or\n    '
               f'{COMPUTE_SLICES} * max by (instance, parent_uuid) ({cat.GPU_INFO.name}{{parent_uuid!=""}})')
    return (f'{info} ({cat.GPU_INFO.name}{{profile=""}})\n  or\n'
            f'{info} (\n  (\n    {slices_of}\n  )\n  / on (instance, parent_uuid) group_left ()\n'
            f'  (\n    {parents}\n  )\n)')


_HELD_BY = f'{cat.GPU_UP.name}{{claim!=""}}'
_BUSY_SIGNALS = (f'{cat.GPU_UTILIZATION.name}{{claim!="", profile=""}}',
                 f'{cat.GPU_SM_ACTIVE.name}{{claim!="", profile!=""}}')


def _busy_by(window: str) -> str:
    """Each claimed device's busy ratio over the ``window`` before each evaluation: the mean of every
    sample in it, so periodic load counts as it ran, not as it stood at the evaluation's instant.
    A window holding no sample (scrapes sparser than the window) takes the latest sample instead."""
    return "\n  or\n  ".join(f"avg_over_time({signal}[{window}])\n  or\n  {signal}" for signal in _BUSY_SIGNALS)


def _busy_device_expr(window: str) -> str:
    return (f"max {_without(_HOLDER_DETAIL)} (\n  {_busy_by(window)}\n)\n"
            f"* on (instance, uuid) group_left (model) {SHARE}")


_POD_DETAIL: Final = ("instance", "job", "container", "pod_uid")
_PODS = f"group {_without(_POD_DETAIL)} ({cat.CLAIM_CONSUMER_INFO.name})"


@dataclass(frozen=True, slots=True)
class Rule:
    record: str
    expr: str
    why: str
    """One line for the rules file: what the figure is."""
    over: Callable[[str], str] | None = None
    """The expression for another window than the rules' interval, where it averages over one: the
    report's raw-series form takes its step."""

    def expr_over(self, window: str) -> str:
        return self.over(window) if self.over is not None else self.expr


RULES: Final[tuple[Rule, ...]] = (
    Rule(SHARE, _share_expr(),
         "Share of its physical GPU each device stands for: 1 for a whole GPU, N/S for a MIG device of "
         "N compute slices on a GPU of S (7; 4 on an A30; 7 where the GPU does not say)."),
    Rule(HELD_DEVICE,
         f"group {_without(_HOLDER_DETAIL)} ({_HELD_BY})\n"
         f"* on (instance, uuid) group_left (model) {SHARE}",
         "GPU-equivalents each claimed device stands for (a shared device once, whoever uses it)."),
    Rule(BUSY_DEVICE, _busy_device_expr(RULE_INTERVAL),
         "GPU-equivalents busy on each claimed device: NVML utilisation (whole GPUs) or GPM SM "
         f"activity (MIG), the mean of every sample in the last {RULE_INTERVAL}, times the share.",
         over=_busy_device_expr),
    Rule(HELD_CLAIM, f"sum {_without(_DEVICE_LEVEL)} ({HELD_DEVICE})", "GPU-equivalents each claim holds."),
    Rule(BUSY_CLAIM, f"sum {_without(_DEVICE_LEVEL)} ({BUSY_DEVICE})", "GPU-equivalents each claim keeps busy."),
    Rule(MEASURED_CLAIM,
         f"sum {_without(_DEVICE_LEVEL)} ({HELD_DEVICE} and on (instance, uuid) {BUSY_DEVICE})",
         "GPU-equivalents each claim holds on devices with a busy signal (A100 and A30 MIG devices have "
         "none): the denominator of its idle share."),
    Rule(HELD_NAMESPACE, f"sum without (claim) ({HELD_CLAIM})", "GPU-equivalents each namespace holds."),
    Rule(BUSY_NAMESPACE, f"sum without (claim) ({BUSY_CLAIM})", "GPU-equivalents each namespace keeps busy."),
    Rule(MEASURED_NAMESPACE, f"sum without (claim) ({MEASURED_CLAIM})",
         "GPU-equivalents each namespace holds on devices with a busy signal."),
    Rule(HELD_POD,
         f"(\n  {HELD_CLAIM}\n  / count without (pod) ({_PODS})\n)\n* ignoring (pod) group_right {_PODS}",
         "Per-pod view: a claim's GPU-equivalents split evenly between the pods that use it."),
    Rule(BUSY_POD,
         f"sum without (instance, job, uuid, container, pod_uid) (\n"
         f"  {cat.CONTAINER_GPU_SM_UTILIZATION.name}\n  * on (instance, uuid) group_left {SHARE}\n)",
         "Per-pod view: GPU-equivalents the processes of each pod keep busy (NVML per-process SM use)."),
)
BY_RECORD: Final = {r.record: r for r in RULES}

RULES_FILE_HEADER: Final = """\
# Recording rules for GPU showback (a plain rules file: `rule_files:` in prometheus.yml).
# Generated from dra_exporter/showback.py: do not edit; run
# `python -m dra_exporter.showback > deploy/recording-rules.yaml`.
# The Helm chart installs them with the alerts (prometheusRule.enabled=true); its copy in
# deploy/helm/dra-exporter/files/ is kept identical by `python3 tests/deploy_tools.py`.
# `dra-exporter report` reads these series, and computes the same expressions from the raw
# series where they are missing. Names: level:metric:operations. Docs: docs/operating.md#showback
# Unit tests: promtool test rules deploy/recording-rules.test.yaml
"""


_NO_POD_LABELS: Final = cat.PodLabels()


def with_pod_labels(expr: str, pod_labels: cat.PodLabels) -> str:
    """``expr`` for exporters run with ``--pod-labels``: consumer info then carries the pods'
    ``label_*`` labels, which differ between the pods of one claim and are on no other series, so
    the per-pod split drops them too (PromQL cannot drop labels by a pattern: they are named)."""
    if not pod_labels:
        return expr
    return expr.replace(_PODS, f"group {_without(_POD_DETAIL + pod_labels.names)} ({cat.CLAIM_CONSUMER_INFO.name})")


def rules_yaml(pod_labels: cat.PodLabels = _NO_POD_LABELS, prices: Prices | None = None) -> str:
    """The text of ``deploy/recording-rules.yaml``; for exporters run with ``--pod-labels``, the rules
    that drop those labels; with ``prices``, a second group that records them (``PRICE``):
    ``dra-exporter recording-rules --pod-labels team --price-file prices.yaml``."""
    lines = [RULES_FILE_HEADER.rstrip("\n"), "groups:", f"  - name: {RULE_GROUP}",
             f"    interval: {RULE_INTERVAL}", "    rules:"]
    for rule in RULES:
        lines.append(f"      # {rule.why}")
        lines.append(f"      - record: {rule.record}")
        lines.append("        expr: |")
        lines.extend(f"          {line}" for line in with_pod_labels(rule.expr, pod_labels).splitlines())
    if prices is not None:
        lines += [f"  - name: {PRICE_GROUP}", f"    interval: {RULE_INTERVAL}", "    rules:"]
        for labels, price in price_rules(prices):
            lines += [f"      - record: {PRICE}", f"        expr: vector({promql_number(price)})"]
            if labels:
                lines += ["        labels:", *(f"          {k}: {yaml_string(v)}" for k, v in labels.items())]
    return "\n".join(lines) + "\n"


#: What a YAML reader takes raw inside a double-quoted scalar: YAML's printable characters less the line
#: breaks (folded into spaces), the BOM (Go's yaml refuses it inside a document) and the quote and
#: backslash; anything else is written as an escape.
_YAML_RAW: Final = re.compile(r"[\x20\x21\x23-\x5b\x5d-\x7e\xa0-\u2027\u202a-\ud7ff\ue000-\ufefe\uff00-\ufffd"
                              r"\U00010000-\U0010ffff]")


def yaml_string(value: str) -> str:
    """``value`` as a YAML double-quoted scalar that every reader (PyYAML, Go's yaml under Prometheus)
    takes back exactly: characters outside the BMP stay themselves (JSON would write a surrogate pair,
    which YAML refuses), the rest that YAML cannot hold raw are escapes. ``value`` holds no lone
    surrogate (``prices_from_doc`` refuses them)."""
    def escaped(c: str) -> str:
        if _YAML_RAW.match(c):
            return c
        code = ord(c)
        return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"

    return '"' + "".join(map(escaped, value)) + '"'


def price_rules(prices: Prices) -> list[tuple[dict[str, str], float]]:
    """``prices`` as the labels and value of each ``PRICE`` series: the models in name order, then
    the default (no ``model`` label: the dashboards fall back to it on ``model=""``)."""
    money = {"currency": prices.currency} if prices.currency else {}
    rules = [({"model": model, **money}, price) for model, price in sorted(prices.by_model.items())]
    if prices.default is not None:
        rules.append((money, prices.default))
    return rules


def promql_number(value: float) -> str:
    """``value`` as a short PromQL literal: ``3``, ``4.5``, ``1e-07``."""
    return repr(float(value)).removesuffix(".0")


def inline(expr: str, window: str = RULE_INTERVAL) -> str:
    """``expr`` with every recorded series replaced by its expression: the raw-series form. A rule
    that averages over its interval averages over ``window`` instead (the report's step), so each
    point stands for every sample of its step, as a recorded point does for its minute."""
    for rule in reversed(RULES):  # later rules only reference earlier ones
        name = re.compile(rf"(?<![\w:]){re.escape(rule.record)}(?![\w:])")
        if name.search(expr):
            body = f"({inline(rule.expr_over(window), window)})"
            expr = name.sub(body.replace("\\", "\\\\"), expr)  # the regexes' backslashes stay
    return expr


# --- the report's queries ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Queries:
    held: str
    """GPU-equivalents held by (namespace, claim, model): model prices the hours."""
    busy: str
    measured: str
    """GPU-equivalents held on devices with a busy signal, by (namespace, claim)."""
    devices: str
    """Each claimed device with its share (instant, at the end): the idle list's devices."""
    pods: str = f"group by (namespace, claim, pod) ({cat.CLAIM_CONSUMER_INFO.name})"
    probe: str = SHARE
    """A recorded series that exists wherever the rules run."""


def queries(*, recorded: bool, step: float = 60.0) -> Queries:
    """The report's queries over the recorded series, or the same figures from raw series at
    ``step`` seconds apart."""
    held = f"sum by (namespace, claim, model) ({HELD_DEVICE})"
    busy = f"sum by (namespace, claim) ({BUSY_DEVICE})"
    measured = f"sum by (namespace, claim) ({MEASURED_CLAIM})"
    devices = HELD_DEVICE
    if not recorded:
        window = f"{round(step)}s" if step == round(step) else f"{round(step * 1000)}ms"
        held, busy, measured, devices = (inline(q, window) for q in (held, busy, measured, devices))
    return Queries(held, busy, measured, devices)


# --- grouping by a pod label -------------------------------------------------------------------

_LABEL_NAME = re.compile(r"[A-Za-z0-9_./-]+")


def group_by(text: str) -> str:
    """``namespace``, ``claim`` or ``label:<key>`` (a pod label) checked; the pod label's key as its
    Prometheus label ``label_<key>`` (kube-state-metrics' spelling: other characters become ``_``)."""
    if text in ("namespace", "claim"):
        return text
    kind, _, key = text.partition(":")
    if kind != "label" or not _LABEL_NAME.fullmatch(key):
        raise ShowbackError(f"--group-by {text!r}: give namespace, claim or label:<pod label key> (label:team)")
    return cat.pod_label_name(key)


def claim_labels_query(label: str, window: float) -> str:
    """Each claim's value of the pod label ``label`` (``label_team``) over the window: from its
    consumer info where the exporter puts it there, else from kube-state-metrics' ``kube_pod_labels``
    of its pods (``--metric-labels-allowlist=pods=[team]``)."""
    w = f"[{round(window)}s]"
    consumers = f"last_over_time({cat.CLAIM_CONSUMER_INFO.name}{w})"
    pod_label = (f"topk by (namespace, pod) (1, group by (namespace, pod, {label}) "
                 f'(last_over_time(kube_pod_labels{{{label}!=""}}{w})))')
    return (f"group by (namespace, claim, {label}) (\n"
            f'  last_over_time({cat.CLAIM_CONSUMER_INFO.name}{{{label}!=""}}{w})\n  or\n'
            f"  group by (namespace, claim, pod) ({consumers})\n"
            f"  * on (namespace, pod) group_left ({label}) {pod_label}\n)")


# --- durations and windows --------------------------------------------------------------------

_UNITS: Final = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
_DURATION = re.compile(r"(\d+)(ms|s|m|h|d|w|y)")
MAX_POINTS: Final = 11000
"""Prometheus refuses a range query of more points per series than this."""


class ShowbackError(ValueError):
    """Bad input to the report (a window, a price file); the message says what to fix."""


class NothingToReport(Exception):
    """The server answered but holds no dra-exporter series in the window: nothing usable (exit 1,
    not a report of zeros)."""


def parse_duration(text: str) -> float:
    """Seconds of a Prometheus duration (``90s``, ``1h30m``, ``7d``, ``2w``)."""
    parts = _DURATION.findall(text)
    if not text or "".join(a + b for a, b in parts) != text:
        raise ShowbackError(f"{text!r} is not a duration (examples: 30m, 12h, 7d, 1h30m)")
    seconds = sum(int(n) * _UNITS[u] for n, u in parts)
    if seconds <= 0:
        raise ShowbackError(f"duration {text!r} must be more than zero")
    return float(seconds)


def parse_time(text: str) -> float:
    """Unix seconds from RFC 3339 (``2025-06-01T00:00:00Z``, a date alone is midnight UTC) or a number."""
    try:
        return float(text)
    except ValueError:
        pass
    try:
        when = datetime.fromisoformat(text)  # Python 3.11 reads "Z" and dates alone
    except ValueError:
        raise ShowbackError(f"{text!r} is neither RFC 3339 (2025-06-01T12:00:00Z) nor Unix seconds") from None
    return (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()


def default_step(window: float) -> float:
    """The rules' 60 s; finer for windows under an hour (60 points at least), coarser where the
    window would exceed Prometheus's point limit."""
    return float(max(min(60.0, max(window / 60, 1.0)), math.ceil(window / MAX_POINTS)))


# --- the report -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Series:
    """One series of a query result: its labels and (unix seconds, value) points."""

    labels: Mapping[str, str]
    points: tuple[tuple[float, float], ...]


_CURRENCY = re.compile(r"[A-Z]{3}")


def currency(text: str) -> str:
    """``text`` checked as a currency: an ISO 4217 code (``EUR``, ``USD``), three capital letters."""
    if not _CURRENCY.fullmatch(text):
        raise ShowbackError(f"currency {text!r}: give an ISO 4217 code, three capital letters (EUR, USD)")
    return text


@dataclass(frozen=True, slots=True)
class Prices:
    """Price of one GPU-hour of a whole GPU, per model (``dra_gpu_info``'s ``model``), or flat."""

    by_model: Mapping[str, float] = field(default_factory=dict)
    default: float | None = None
    currency: str | None = None
    """ISO 4217 code the prices are in; None: not said (the outputs name none)."""

    def of(self, model: str) -> float:
        price = self.by_model.get(model, self.default)
        if price is None:
            known = ", ".join(sorted(self.by_model)) or "none"
            raise ShowbackError(f"no price for GPU model {model!r} (priced: {known}); add it or a 'default'")
        return price

    def in_currency(self, code: str | None) -> Prices:
        """These prices said to be in ``code`` (``report --currency``); a price file that names
        another currency is a contradiction, not something to pick a side in."""
        if code is None:
            return self
        code = currency(code)
        if self.currency not in (None, code):
            raise ShowbackError(f"--currency {code}: the price file says its prices are in {self.currency}")
        return Prices(self.by_model, self.default, code)


PRICE_FILE_KEYS: Final = ("default", "currency")
"""The price file's keys that are not GPU models."""


def _characters(name: str, where: str) -> str:
    """``name`` with its surrogate pairs joined (the JSON form of a price file writes a character
    outside the BMP as ``"\\ud83d\\ude80"``, which the YAML reader leaves as two halves); a lone
    surrogate is not a character and no series can carry it: refused."""
    if not any("\ud800" <= c <= "\udfff" for c in name):
        return name
    try:
        return name.encode("utf-16", "surrogatepass").decode("utf-16")
    except UnicodeDecodeError:
        raise ShowbackError(f"{where}: the model name {name!r} holds a lone surrogate (half of a UTF-16 pair), "
                            "which is not a character: write the model's name as it is") from None


def prices_from_doc(doc: object, where: str) -> Prices:
    """A parsed price file (YAML or JSON): ``{model: price per GPU-hour of a whole GPU}``, optionally
    ``default`` (any other model) and ``currency`` (an ISO 4217 code). ``where`` prefixes errors."""
    if not isinstance(doc, dict) or not doc:
        raise ShowbackError(f"{where}: expected a mapping of GPU model to price per GPU-hour, "
                            'e.g. {"NVIDIA H200": 4.5, "default": 3.0, "currency": "EUR"}')
    code = doc.get("currency")
    if code is not None and not isinstance(code, str):
        raise ShowbackError(f"{where}: currency must be an ISO 4217 code such as EUR, not {code!r}")
    prices: dict[str, float] = {}
    for model, price in doc.items():
        if model == "currency":
            continue
        if isinstance(price, bool) or not isinstance(price, (int, float)) or not price >= 0 or math.isinf(price):
            raise ShowbackError(f"{where}: the price of {str(model)!r} must be a number >= 0, not {price!r}")
        prices[_characters(str(model), where)] = float(price)
    default = prices.pop("default", None)
    if not prices and default is None:
        raise ShowbackError(f"{where}: it names a currency but no price")
    try:
        return Prices(prices, default, currency(code) if code is not None else None)
    except ShowbackError as exc:
        raise ShowbackError(f"{where}: {exc}") from None


@dataclass(frozen=True, slots=True)
class Usage:
    namespace: str
    claim: str
    held_hours: float
    busy_hours: float
    """Busy GPU-hours of the devices with a busy signal."""
    cost: float | None
    measured_hours: float
    """GPU-hours held on devices with a busy signal: A100 and A30 MIG devices have none (no
    utilisation, no GPM), so how busy they were is unknown, never zero."""

    @property
    def busy_known(self) -> bool:
        return self.measured_hours > 0

    @property
    def unmeasured_hours(self) -> float:
        return max(self.held_hours - self.measured_hours, 0.0)

    @property
    def idle_share(self) -> float | None:
        """Idle share of the GPU-hours whose busy share is measured; None where none is."""
        return 1.0 - self.busy_hours / self.measured_hours if self.busy_known else None


@dataclass(frozen=True, slots=True)
class IdleClaim:
    namespace: str
    claim: str
    pods: tuple[str, ...]
    devices: str
    """Like ``4 × GPU`` or ``1 × GPU, 2 × 1g.18gb``."""
    gpu_equivalents: float
    idle_since: float
    idle_since_before_window: bool
    """Idle for the whole window: it may have been idle longer."""


@dataclass(frozen=True, slots=True)
class Report:
    start: float
    end: float
    step: float
    source: str
    """``recording rules`` or ``raw series``."""
    namespaces: tuple[Usage, ...]
    claims: tuple[Usage, ...]
    idle: tuple[IdleClaim, ...]
    total: Usage
    priced: bool
    idle_below: float = IDLE_BELOW
    grouping: str = "namespace"
    """``namespace``, ``claim`` (the claims alone) or ``label_<key>`` (by a pod label): ``group_by``."""
    groups: tuple[Usage, ...] = ()
    """Per value of ``group_label`` (in ``Usage.namespace``; ``""``: no pod of the claim has it)."""
    claim_groups: Mapping[tuple[str, str], str] = field(default_factory=dict)
    currency: str | None = None
    """What the costs are in (``Prices.currency``); None where the prices do not say."""

    @property
    def group_label(self) -> str:
        return self.grouping if self.grouping.startswith("label_") else ""


def _hours(points: Iterable[tuple[float, float]], step: float) -> float:
    # Each point stands for the step that starts at it (the report asks for start … end - step): a
    # series seen first at t was there from t on, and one last seen at t until t + step.
    return sum(v for _, v in points if math.isfinite(v)) * step / 3600


def _devices_text(devices: Sequence[tuple[str, float]]) -> tuple[str, float]:
    """``devices``: (profile, share) of each device a claim holds."""
    counts: dict[str, int] = defaultdict(int)
    share = 0.0
    for profile, held in devices:
        counts[profile] += 1
        share += held
    order = sorted(counts, key=lambda p: (p != "GPU", p))
    return ", ".join(f"{counts[p]} × {p}" for p in order), share


def build(
    *,
    start: float,
    end: float,
    step: float,
    source: str,
    held: Sequence[Series],
    busy: Sequence[Series],
    measured: Sequence[Series] | None = None,
    devices: Sequence[Series] = (),
    pods: Sequence[Series] = (),
    prices: Prices | None = None,
    idle_below: float = IDLE_BELOW,
    top: int = 10,
    grouping: str = "namespace",
    claim_labels: Sequence[Series] = (),
) -> Report:
    """Turn the query results at ``start, start + step, …, end - step`` into the report (``Tally``).

    ``measured``: what of ``held`` is on devices with a busy signal (``Queries.measured``); None
    when every held device has one."""
    tally = Tally(start=start, end=end, step=step, source=source, prices=prices, idle_below=idle_below, top=top,
                  grouping=grouping, measured=measured is not None)
    for feed, results in ((tally.held, held), (tally.busy, busy), (tally.measured, measured or ()),
                          (tally.device, devices), (tally.pod, pods), (tally.claim_label, claim_labels)):
        for s in results:
            feed(s)
    return tally.report()


def _key(s: Series) -> tuple[str, str]:
    return s.labels.get("namespace", ""), s.labels.get("claim", "")


class Tally:
    """The report's figures, taken in one series at a time (``report`` hands each over as the answer is
    parsed, so no answer is ever held as a list of series): what is kept is what the report shows.

    Per claim: its hours and cost (arrays indexed by claim), and of its held points only the run that
    reaches the window's last point with nothing positive breaking it, as (time, value) pairs; busy and
    measured points only move each claim's ``_bad`` time (the latest point that ends an idle run:
    busy, not measured, or nothing held). Once measured is in, the idle claims are chosen and the
    points dropped; devices and pods are then kept for those ``top`` claims alone.

    Feed ``held``, then ``busy``, then ``measured``, then ``device``/``pod``/``claim_label``, then
    ``report``. Busy and measured are one series per claim (sums by namespace and claim). ``measured``:
    False where every held device has a busy signal (no measured series come: held is measured)."""

    def __init__(self, *, start: float, end: float, step: float, source: str, prices: Prices | None = None,
                 idle_below: float = IDLE_BELOW, top: int = 10, grouping: str = "namespace",
                 measured: bool = True) -> None:
        self._measured_given = measured
        self._start, self._end, self._step, self._source = start, end, step, source
        self._prices, self._idle_below, self._top, self._grouping = prices, idle_below, top, grouping
        self._index: dict[tuple[str, str], int] = {}
        self._held_hours = array("d")
        self._busy_hours = array("d")
        self._measured_hours = array("d")
        self._cost = array("d")
        self._bad = array("d")
        """Per claim: the latest time that ends an idle run; -inf where none does."""
        self._measured_seen = bytearray()
        self._runs: list[array[float] | None] = []
        """Per claim: held (time, value) pairs flat, in the order received; after ``_close_held`` the
        run back from the last point, newest first; None: not held at the last point."""
        self._last: float | None = None
        self._held_closed = False
        self._idle: dict[tuple[str, str], float] | None = None
        self._devices: dict[tuple[str, str], list[tuple[str, float]]] = defaultdict(list)
        self._pods: dict[tuple[str, str], list[str]] = defaultdict(list)
        self._claim_values: dict[tuple[str, str], set[str]] = defaultdict(set)

    def held(self, s: Series) -> None:
        k = _key(s)
        i = self._index.get(k)
        if i is None:
            i = self._index[k] = len(self._runs)
            for column in (self._held_hours, self._busy_hours, self._measured_hours, self._cost):
                column.append(0.0)
            self._bad.append(-math.inf)
            self._measured_seen.append(0)
            self._runs.append(None)
        hours = _hours(s.points, self._step)
        self._held_hours[i] += hours
        if self._prices is not None:
            self._cost[i] += hours * self._prices.of(s.labels.get("model", ""))
        run = self._runs[i]
        if run is None:
            run = self._runs[i] = array("d")
        for t, v in s.points:
            run.append(t)
            run.append(v)
            if self._last is None or t > self._last:
                self._last = t

    def _close_held(self) -> None:
        """Sum each claim's held points by time and keep the run back from the last point."""
        if self._held_closed:
            return
        self._held_closed = True
        for i, flat in enumerate(self._runs):
            if flat is None:
                continue
            summed: dict[float, float] = defaultdict(float)
            for j in range(0, len(flat), 2):
                summed[flat[j]] += flat[j + 1]
            run = array("d")
            if self._last is not None and summed.get(self._last, 0.0) > 0:
                for t in sorted(summed, reverse=True):
                    if summed[t] <= 0:
                        self._bad[i] = t
                        break
                    run.append(t)
                    run.append(summed[t])
            self._runs[i] = run if run else None

    def _run_of(self, s: Series) -> tuple[int | None, dict[float, float]]:
        self._close_held()
        i = self._index.get(_key(s))
        run = self._runs[i] if i is not None else None
        return i, ({run[j]: run[j + 1] for j in range(0, len(run), 2)} if run else {})

    def busy(self, s: Series) -> None:
        i, run = self._run_of(s)
        if i is None:
            return  # not held: the report shows held claims only
        self._busy_hours[i] += _hours(s.points, self._step)
        for t, v in s.points:
            held = run.get(t)
            if held is not None and v >= self._idle_below * held and t > self._bad[i]:
                self._bad[i] = t

    def measured(self, s: Series) -> None:
        i, run = self._run_of(s)
        if i is None:
            return
        self._measured_hours[i] += _hours(s.points, self._step)
        self._measured_seen[i] = 1
        measured = dict(s.points)
        for t in sorted(run, reverse=True):
            if measured.get(t, 0.0) < run[t] - 1e-9:  # sums of the same shares: equal but for rounding
                self._bad[i] = max(self._bad[i], t)
                break

    def _choose_idle(self) -> dict[tuple[str, str], float]:
        """The ``top`` claims idle longest: ``{claim: idle since}``; the held points are dropped."""
        if self._idle is not None:
            return self._idle
        self._close_held()
        found = []
        for k, i in self._index.items():
            run = self._runs[i]
            if run is None or self._idle_below <= 0 or (self._measured_given and not self._measured_seen[i]):
                continue  # not held at the end, never idle, or no busy signal: not known to be idle
            since = None
            for j in range(0, len(run), 2):  # newest first
                if run[j] <= self._bad[i]:
                    break
                since = run[j]
            if since is not None:
                found.append((since, k))
        found.sort(key=lambda item: (item[0], item[1]))
        self._idle = {k: since for since, k in found[:self._top]}
        self._runs = []
        return self._idle

    def device(self, s: Series) -> None:
        k = _key(s)
        if k in self._choose_idle():
            self._devices[k].append((s.labels.get("profile") or "GPU", s.points[-1][1] if s.points else 0.0))

    def pod(self, s: Series) -> None:
        k = _key(s)
        if k in self._choose_idle():
            self._pods[k].append(s.labels.get("pod", ""))

    def claim_label(self, s: Series) -> None:
        self._claim_values[_key(s)].add(s.labels.get(self._grouping, ""))

    def report(self) -> Report:
        idle_of = self._choose_idle()
        priced = self._prices is not None
        measured_hours = self._measured_hours if self._measured_given else self._held_hours

        def usage(ns: str, claim: str, indices: Iterable[int]) -> Usage:
            ix = list(indices)
            return Usage(ns, claim, sum(self._held_hours[i] for i in ix), sum(self._busy_hours[i] for i in ix),
                         sum(self._cost[i] for i in ix) if priced else None, sum(measured_hours[i] for i in ix))

        claims = sorted((usage(k[0], k[1], [i]) for k, i in self._index.items()),
                        key=lambda u: (-u.held_hours, u.namespace, u.claim))
        by_ns: dict[str, list[int]] = defaultdict(list)
        for k, i in self._index.items():
            by_ns[k[0]].append(i)
        namespaces = sorted((usage(ns, "", ix) for ns, ix in by_ns.items()), key=lambda u: (-u.held_hours, u.namespace))
        total = usage("", "", range(len(self._held_hours)))
        # A claim whose pods carry several values of the label counts for each of them, joined ("a,b").
        by_label = self._grouping.startswith("label_")
        claim_groups = {k: ",".join(sorted(self._claim_values.get(k, set()) - {""})) for k in self._index} \
            if by_label else {}
        by_group: dict[str, list[int]] = defaultdict(list)
        for k, value in claim_groups.items():
            by_group[value].append(self._index[k])
        groups = sorted((usage(value, "", ix) for value, ix in by_group.items()),
                        key=lambda u: (-u.held_hours, u.namespace))
        idle = []
        for k, since in idle_of.items():
            text, share = _devices_text(self._devices.get(k, []))
            before = since <= self._start + self._step  # the first step may lack a rule sample (the rules' phase)
            idle.append(IdleClaim(k[0], k[1], tuple(sorted(self._pods.get(k, []))), text or "?", share,
                                  self._start if before else since, before))
        idle.sort(key=lambda c: (c.idle_since, c.namespace, c.claim))
        return Report(self._start, self._end, self._step, self._source, tuple(namespaces), tuple(claims),
                      tuple(idle), total, priced, self._idle_below, self._grouping, tuple(groups), claim_groups,
                      self._prices.currency if self._prices is not None else None)


# --- rendering --------------------------------------------------------------------------------


def iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _span(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            whole, rest = divmod(round(seconds), size)
            sub = {"d": ("h", 3600), "h": ("m", 60), "m": ("s", 1)}[unit]
            return f"{whole}{unit}" + (f"{rest // sub[1]}{sub[0]}" if rest // sub[1] else "")
    return f"{round(seconds)}s"


UNKNOWN: Final = "unknown"
"""What the table and CSV say where no held device has a busy signal (JSON: null)."""


def _usage_dict(u: Usage, priced: bool) -> dict[str, object]:
    idle = u.idle_share
    out: dict[str, object] = {"gpu_hours_held": round(u.held_hours, 6),
                              "gpu_hours_busy": round(u.busy_hours, 6) if u.busy_known else None,
                              "idle_share": round(idle, 6) if idle is not None else None,
                              "gpu_hours_without_busy_signal": round(u.unmeasured_hours, 6)}
    if priced:
        out["cost"] = round(u.cost or 0.0, 6)
    return out


def render_json(r: Report) -> str:
    doc = {
        "window": {"start": iso(r.start), "end": iso(r.end), "step_seconds": r.step},
        "source": r.source,
        **({"currency": r.currency} if r.currency else {}),
        "total": _usage_dict(r.total, r.priced),
        "namespaces": [{"namespace": u.namespace, **_usage_dict(u, r.priced)} for u in r.namespaces],
        **({"groups": {"label": r.group_label,
                       "values": [{"value": u.namespace, **_usage_dict(u, r.priced)} for u in r.groups]}}
           if r.group_label else {}),
        "claims": [{"namespace": u.namespace, "claim": u.claim,
                    **({r.group_label: r.claim_groups.get((u.namespace, u.claim), "")} if r.group_label else {}),
                    **_usage_dict(u, r.priced)} for u in r.claims],
        "idle_claims": [
            {"namespace": c.namespace, "claim": c.claim, "pods": list(c.pods), "devices": c.devices,
             "gpu_equivalents": round(c.gpu_equivalents, 6), "idle_since": iso(c.idle_since),
             "idle_since_before_window": c.idle_since_before_window, "idle_seconds": r.end - c.idle_since}
            for c in r.idle
        ],
    }
    return json.dumps(doc, indent=2, ensure_ascii=False)


def render_csv(r: Report) -> str:
    """One row per claim; the idle columns are filled for the idle claims listed."""
    idle = {(c.namespace, c.claim): c for c in r.idle}
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["namespace", "claim", *([r.group_label] if r.group_label else []), "gpu_hours_held",
                     "gpu_hours_busy", "idle_share",
                     "gpu_hours_without_busy_signal", *(["cost"] if r.priced else []),
                     *(["currency"] if r.currency else []), "idle_since", "pods", "devices"])
    for u in r.claims:
        c = idle.get((u.namespace, u.claim))
        share = u.idle_share
        cell = printable.csv_cell  # the names come from the server's series
        writer.writerow([cell(u.namespace), cell(u.claim),
                         *([cell(r.claim_groups.get((u.namespace, u.claim), ""))] if r.group_label else []),
                         f"{u.held_hours:.6f}",
                         f"{u.busy_hours:.6f}" if u.busy_known else UNKNOWN,
                         f"{share:.6f}" if share is not None else UNKNOWN, f"{u.unmeasured_hours:.6f}",
                         *([f"{u.cost or 0.0:.6f}"] if r.priced else []), *([r.currency] if r.currency else []),
                         iso(c.idle_since) if c else "", cell(" ".join(c.pods)) if c else "",
                         cell(c.devices) if c else ""])
    return out.getvalue()


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], right: int) -> list[str]:
    """Left-aligned text columns, then ``right`` right-aligned number columns; every cell as the
    terminal should show it (``printable.for_terminal``: names come from the server's series)."""
    rows = [[printable.for_terminal(c) for c in row] for row in rows]
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    lines = []
    for row in [header, *rows]:
        cells = [c.ljust(w) if i < len(header) - right else c.rjust(w) for i, (c, w) in
                 enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
    return lines


def render_table(r: Report) -> str:
    unmeasured = r.total.unmeasured_hours > 0
    numbers = ["GPU-H HELD", "GPU-H BUSY", "IDLE", *(["NO SIGNAL"] if unmeasured else []),
               *([f"COST ({r.currency})" if r.currency else "COST"] if r.priced else [])]

    def cells(u: Usage) -> list[str]:
        share = u.idle_share
        return [f"{u.held_hours:.2f}", f"{u.busy_hours:.2f}" if u.busy_known else UNKNOWN,
                f"{share:.0%}" if share is not None else UNKNOWN,
                *([f"{u.unmeasured_hours:.2f}"] if unmeasured else []),
                *([f"{u.cost or 0.0:.2f}"] if r.priced else [])]

    title = (f"GPU showback {iso(r.start)} → {iso(r.end)} ({_span(r.end - r.start)}, step "
             f"{_span(r.step)}, from {r.source})")
    lines = [title, ""]
    label = r.group_label
    if label:  # --group-by label:<key>: its values instead of the namespaces
        lines += _table([label.removeprefix("label_").upper(), *numbers],
                        [[u.namespace or "(none)", *cells(u)] for u in r.groups] + [["(all)", *cells(r.total)]],
                        len(numbers))
        lines.append("")
    elif r.grouping == "namespace":
        lines += _table(["NAMESPACE", *numbers], [[u.namespace, *cells(u)] for u in r.namespaces]
                        + [["(all)", *cells(r.total)]], len(numbers))
        lines.append("")
    lines += _table(["NAMESPACE", "CLAIM", *([label.removeprefix("label_").upper()] if label else []), *numbers],
                    [[u.namespace, u.claim, *([r.claim_groups.get((u.namespace, u.claim)) or "-"] if label else []),
                      *cells(u)] for u in r.claims]
                    + ([["(all)", "", *([""] if label else []), *cells(r.total)]] if r.grouping == "claim" else []),
                    len(numbers))
    lines.append("")
    if unmeasured:
        lines.append("NO SIGNAL: GPU-hours held on devices without a busy signal (A100 and A30 MIG devices have "
                     "no utilisation and no GPM); busy and idle cover the rest, unknown where nothing is left.")
        lines.append("")
    if r.idle:
        lines.append(f"Claims idle longest (busy under {r.idle_below:.0%} of what they hold, until the end of "
                     "the window):")
        lines += _table(["NAMESPACE", "CLAIM", "PODS", "DEVICES", "IDLE SINCE", "FOR"],
                        [[c.namespace, c.claim, ",".join(c.pods) or "-", c.devices,
                          ("before " if c.idle_since_before_window else "") + iso(c.idle_since),
                          _span(r.end - c.idle_since)] for c in r.idle], 0)
    else:
        lines.append("No claim sits idle at the end of the window.")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m dra_exporter.showback > deploy/recording-rules.yaml
    import sys

    if sys.argv[1:]:
        sys.exit("usage: python -m dra_exporter.showback (the rules file of deploy/; for --pod-labels and "
                 "--price-file: dra-exporter recording-rules)")
    print(rules_yaml(), end="")
