"""Generate the Grafana dashboards in this folder from the metric catalogue.

Role: the single source of the committed ``dashboards/*.json``. Every metric name comes from
``dra_exporter.catalog`` so a renamed family breaks generation, not a dashboard in production.
Contract: ``python dashboards/generate.py`` rewrites the JSON files; ``--check`` exits 1 when a
committed file differs from what this script writes (``tests/test_dashboards.py`` checks the
same, and runs every panel's PromQL against a real Prometheus).

The dashboards are plain Grafana JSON (schemaVersion 39, Grafana 10+) with a ``${datasource}``
Prometheus variable, so they import into any Grafana without editing. Written by hand rather
than with a dashboard SDK: the output is a small, reviewable JSON document and generating it
needs nothing beyond the exporter package itself.

Node selection: the exporter puts no node label on its series; the scrape target's labels say
where a series comes from. ``NODE_LABEL`` (``instance``) is that label; the Helm chart's
ServiceMonitor rewrites ``instance`` to the node name so the picker lists nodes.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from dra_exporter import catalog as cat
from dra_exporter import showback as sb

HERE = Path(__file__).resolve().parent
NODE_LABEL = "instance"
JOB = "dra-exporter"
"""The ``job`` label of the exporter's targets (the chart's ServiceMonitor pins it)."""
IDLE_RATIO = 0.01
"""Below this utilisation a claimed device counts as idle (the alert uses the same)."""
IDLE_WINDOW = "1h"
TAGS = ("dra-exporter", "gpu", "dra")
DS = {"type": "prometheus", "uid": "${datasource}"}
SCHEMA_VERSION = 39

PanelKind = Literal["timeseries", "stat", "table", "bargauge", "text"]
QueryKind = Literal["range", "instant", "table"]


# --- PromQL helpers ---------------------------------------------------------------------------


def eq(label: str, value: str) -> str:
    return f'{label}="{value}"'


def ne(label: str, value: str = "") -> str:
    return f'{label}!="{value}"'


def rx(label: str, value: str) -> str:
    return f'{label}=~"{value}"'


CLAIMED = ne("claim")
BY_CLAIM = "{{namespace}}/{{claim}}"
UNCLAIMED = eq("claim", "")
MIG = ne("profile")
WHOLE = eq("profile", "")


def sel(*matchers: str) -> str:
    """A label selector that always starts with the node picker."""
    return "{" + ", ".join((rx(NODE_LABEL, "$node"), *matchers)) + "}"


def busy(*matchers: str) -> str:
    """How busy a device is: NVML utilisation, or GPM SM activity where NVML has none (MIG).

    NVML reports no utilisation rates for MIG devices; GPM does. ``or`` keeps one series per
    device because the two families carry the same labels.
    """
    return f"({cat.GPU_UTILIZATION.name}{sel(*matchers)} or {cat.GPU_SM_ACTIVE.name}{sel(*matchers, MIG)})"


def activity(*matchers: str) -> str:
    """What the idle alert (DraClaimIdle) calls busy, per device: NVML utilisation, else GPM SM
    activity (MIG), else the processes on a MIG device (GPUs without GPM: A100). At or above
    ``IDLE_RATIO`` a device is in use; the three carry the same labels, so ``or`` keeps one each.
    """
    return (f"({cat.GPU_UTILIZATION.name}{sel(*matchers)} or {cat.GPU_SM_ACTIVE.name}{sel(*matchers, MIG)} "
            f"or {cat.GPU_PROCESSES.name}{sel(*matchers, MIG)})")


# Whole GPUs and MIG devices a claim can hold: a MIG-enabled GPU is only a parent.
ALLOCATABLE = f"unless on (uuid) {cat.GPU_INFO.name}{{{eq('mig_mode', 'enabled')}}}"


def xids_in(window: str, *matchers: str) -> str:
    """XIDs per device and code within ``window``, as the alerts count them: per device identity
    (a GPU that changes hands starts new series with the old count), and a counter born in the
    window counts its whole value (it starts at its first XID, which ``increase()`` cannot see)."""
    device = "max by (instance, job, uuid, gpu, profile, xid)"
    now_, before = (f"{device} ({cat.GPU_XID_ERRORS.name}{sel(*matchers)}{offset})"
                    for offset in ("", f" offset {window}"))
    return f"(increase(({now_})[{window}:1m]) and {before}) or ({now_} unless {before})"


def or_zero(expr: str) -> str:
    """Counts of nothing are 0, not "No data"."""
    return f"({expr}) or vector(0)"


# --- dashboard model --------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    expr: str
    legend: str = ""
    query: QueryKind = "range"
    """``range`` for graphs; ``instant`` (latest value per series) for stats and bar gauges;
    ``table``: an instant query whose labels become table columns."""


@dataclass(frozen=True)
class Panel:
    title: str
    kind: PanelKind
    targets: tuple[Target, ...] = ()
    description: str = ""
    unit: str = "short"
    width: int = 12
    height: int = 8
    max: float | None = None
    columns: tuple[str, ...] = ()
    """For tables: the label columns to show, in order (everything else is hidden). A table of
    several targets merges them on their labels; their values are columns ``Value #A``, …"""
    renames: tuple[tuple[str, str], ...] = ()
    """For tables: column → header shown."""
    field_units: tuple[tuple[str, str], ...] = ()
    """Column → unit, where it differs from ``unit``."""
    content: str = ""
    """Markdown of a text panel."""
    thresholds: tuple[tuple[float, str], ...] = ()


@dataclass(frozen=True)
class Row:
    title: str
    panels: tuple[Panel, ...]


@dataclass(frozen=True)
class Variable:
    name: str
    label: str
    query: str
    """``label_values(<selector>, <label>)``, evaluated by Grafana's Prometheus data source; for a
    ``textbox``, its default value."""
    multi: bool = True
    kind: Literal["query", "textbox", "name"] = "query"
    """``name``: a hidden query variable whose one value only names something in titles (the
    prices' currency), never a selection: no "All"."""


@dataclass(frozen=True)
class Dashboard:
    uid: str
    filename: str
    title: str
    description: str
    variables: tuple[Variable, ...]
    rows: tuple[Row, ...] = field(default=())


def t(expr: str, legend: str = "") -> Target:
    return Target(expr, legend)


def now(expr: str, legend: str = "") -> Target:
    return Target(expr, legend, "instant")


def tab(expr: str) -> Target:
    return Target(expr, query="table")


def stat(
    title: str,
    expr: str,
    description: str,
    *,
    unit: str = "short",
    thresholds: tuple[tuple[float, str], ...] = (),
    width: int = 4,
) -> Panel:
    return Panel(title, "stat", (now(expr),), description, unit, width, 4, thresholds=thresholds)


RED_FROM_ONE = ((1, "red"),)


# --- JSON rendering ---------------------------------------------------------------------------


def _thresholds(steps: Sequence[tuple[float, str]]) -> dict[str, Any]:
    return {
        "mode": "absolute",
        "steps": [{"color": "green", "value": None}] + [{"color": c, "value": v} for v, c in steps],
    }


def _target_json(target: Target, ref: str) -> dict[str, Any]:
    out: dict[str, Any] = {
        "refId": ref,
        "datasource": DS,
        "expr": target.expr,
        "editorMode": "code",
        "instant": target.query != "range",
        "range": target.query == "range",
        "format": "table" if target.query == "table" else "time_series",
    }
    if target.query != "table":
        out["legendFormat"] = target.legend or "__auto"
    return out


def _table_transform(panel: Panel) -> list[dict[str, Any]]:
    # Instant table queries return Time, every label and Value; keep what the title promises.
    merged = len(panel.targets) > 1
    wanted = list(panel.columns) + ([] if merged else ["Value"])
    return [{"id": "merge", "options": {}}] * merged + [
        {
            "id": "organize",
            "options": {
                "excludeByName": {"Time": True, "__name__": True, "job": True},
                "indexByName": {name: i for i, name in enumerate(wanted)},
                "includeByName": {name: True for name in wanted},
                "renameByName": dict(panel.renames),
            },
        }
    ]


def _panel_json(panel: Panel, pid: int, pos: dict[str, int]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "id": pid,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "gridPos": pos,
    }
    if panel.kind == "text":
        out["options"] = {"mode": "markdown", "content": panel.content}
        return out
    defaults: dict[str, Any] = {"unit": panel.unit, "thresholds": _thresholds(panel.thresholds)}
    if panel.max is not None:
        defaults.update(min=0, max=panel.max)
    out.update(
        datasource=DS,
        fieldConfig={
            "defaults": defaults,
            "overrides": [
                {"matcher": {"id": "byName", "options": name}, "properties": [{"id": "unit", "value": unit}]}
                for name, unit in panel.field_units
            ],
        },
        targets=[_target_json(tg, chr(ord("A") + i)) for i, tg in enumerate(panel.targets)],
    )
    if panel.kind == "timeseries":
        out["options"] = {
            "legend": {"displayMode": "table", "placement": "right", "calcs": ["lastNotNull", "max"]},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    elif panel.kind == "stat":
        out["options"] = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "value",
            "graphMode": "none",
            "textMode": "value",
        }
    elif panel.kind == "bargauge":
        out["options"] = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "orientation": "horizontal",
            "displayMode": "gradient",
            "showUnfilled": True,
        }
    elif panel.kind == "table":
        out["options"] = {"showHeader": True, "cellHeight": "sm"}
        out["transformations"] = _table_transform(panel) if panel.columns else []
    return out


def _variable_json(var: Variable) -> dict[str, Any]:
    if var.kind == "textbox":
        return {"name": var.name, "label": var.label, "type": "textbox", "query": var.query,
                "current": {"text": var.query, "value": var.query}, "options": [], "hide": 0}
    if var.kind == "name":
        return {"name": var.name, "label": var.label, "type": "query", "datasource": DS, "definition": var.query,
                "query": {"query": var.query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
                "refresh": 2, "sort": 1, "multi": False, "includeAll": False, "current": {}, "options": [],
                "hide": 2}
    return {
        "name": var.name,
        "label": var.label,
        "type": "query",
        "datasource": DS,
        "definition": var.query,
        "query": {"query": var.query, "refId": "PrometheusVariableQueryEditor-VariableQuery"},
        "refresh": 2,
        "sort": 1,
        "multi": var.multi,
        "includeAll": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "options": [],
        "hide": 0,
    }


def _datasource_variable() -> dict[str, Any]:
    return {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "options": [],
        "refresh": 1,
        "regex": "",
        "hide": 0,
    }


def _layout(rows: Iterable[Row]) -> list[dict[str, Any]]:
    """Flow panels left to right in 24 columns, each row starting on a fresh line."""
    out: list[dict[str, Any]] = []
    y, pid = 0, 1
    for row in rows:
        out.append(
            {
                "id": pid,
                "type": "row",
                "title": row.title,
                "collapsed": False,
                "panels": [],
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
            }
        )
        pid, y = pid + 1, y + 1
        x, line_height = 0, 0
        for panel in row.panels:
            if x + panel.width > 24:
                x, y, line_height = 0, y + line_height, 0
            out.append(_panel_json(panel, pid, {"h": panel.height, "w": panel.width, "x": x, "y": y}))
            pid, x, line_height = pid + 1, x + panel.width, max(line_height, panel.height)
        y += line_height
    return out


def dashboard_json(dash: Dashboard) -> dict[str, Any]:
    return {
        "uid": dash.uid,
        "title": dash.title,
        "description": dash.description,
        "tags": list(TAGS),
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "timezone": "",
        "time": {"from": "now-6h", "to": "now"},
        "refresh": "30s",
        "links": [
            {
                "type": "dashboards",
                "tags": [TAGS[0]],
                "asDropdown": True,
                "title": "DRA dashboards",
                "includeVars": True,
                "keepTime": True,
            }
        ],
        "annotations": {"list": []},
        "templating": {"list": [_datasource_variable(), *(_variable_json(v) for v in dash.variables)]},
        "panels": _layout(dash.rows),
    }


def render(dash: Dashboard) -> str:
    return json.dumps(dashboard_json(dash), indent=2, ensure_ascii=False) + "\n"


# --- the dashboards ---------------------------------------------------------------------------

NODE_VAR = Variable("node", "Node", f"label_values({cat.GPU_INFO.name}, {NODE_LABEL})")
GPU_VAR = Variable("gpu", "GPU", f"label_values({cat.GPU_INFO.name}{sel()}, gpu)")
DEV = (rx("gpu", "$gpu"),)
DEVICE_LEGEND = "{{instance}} GPU {{gpu}} {{profile}} {{claim}}"


def overview() -> Dashboard:
    allocated = f"count({cat.GPU_UP.name}{sel(CLAIMED)})"
    unallocated = f"count({cat.GPU_UP.name}{sel(UNCLAIMED)} {ALLOCATABLE})"
    # The alert's notion of busy (activity()), over its window.
    idle = (
        f"count((max_over_time({cat.GPU_UTILIZATION.name}{sel(CLAIMED)}[{IDLE_WINDOW}]) or "
        f"max_over_time({cat.GPU_SM_ACTIVE.name}{sel(CLAIMED, MIG)}[{IDLE_WINDOW}]) or "
        f"max_over_time({cat.GPU_PROCESSES.name}{sel(CLAIMED, MIG)}[{IDLE_WINDOW}])) < {IDLE_RATIO})"
    )
    fleet = Row(
        "Fleet",
        (
            stat("GPUs", f"count({cat.GPU_INFO.name}{sel(WHOLE)})", "Physical GPUs on the selected nodes."),
            stat(
                "MIG devices",
                or_zero(f"count({cat.GPU_INFO.name}{sel(MIG)})"),
                "MIG devices (partitions) on the selected nodes.",
            ),
            stat(
                "Allocated devices",
                or_zero(allocated),
                "Whole GPUs and MIG devices held by a ResourceClaim (admin-access claims do not count).",
            ),
            stat(
                "Unallocated devices",
                or_zero(unallocated),
                "Whole GPUs and MIG devices no claim holds (MIG-enabled GPUs count through their MIG devices).",
            ),
            stat(
                "Claimed but idle",
                or_zero(idle),
                f"Allocated devices whose utilisation stayed below {IDLE_RATIO:.0%} for the last {IDLE_WINDOW}.",
                thresholds=RED_FROM_ONE,
            ),
            stat(
                "Devices down",
                or_zero(f"count({cat.GPU_UP.name}{sel()} == 0)"),
                "Devices the last collection could not read (GPU lost, NVML error).",
                thresholds=RED_FROM_ONE,
            ),
        ),
    )
    allocation = Row(
        "Allocation and use",
        (
            Panel(
                "Allocated vs unallocated devices",
                "timeseries",
                (
                    t(or_zero(allocated), "allocated"),
                    t(or_zero(unallocated), "unallocated"),
                    t(or_zero(idle), "claimed but idle"),
                ),
                "Devices over time by allocation state.",
            ),
            Panel(
                "Mean utilisation: allocated vs unallocated",
                "timeseries",
                (
                    t(f"avg({busy(CLAIMED)})", "allocated"),
                    t(f"avg({cat.GPU_UTILIZATION.name}{sel(UNCLAIMED)} {ALLOCATABLE})", "unallocated whole GPUs"),
                ),
                "Mean utilisation of allocated devices (MIG devices through GPM SM activity) and of whole GPUs "
                "nobody holds.",
                "percentunit",
                max=1,
            ),
            Panel(
                "Top claims by utilisation",
                "bargauge",
                (now(f"topk(10, avg by (namespace, claim) ({busy(CLAIMED)}))", BY_CLAIM),),
                "Mean utilisation over the devices of each claim, now.",
                "percentunit",
                max=1,
            ),
            Panel(
                "Top claims by memory used",
                "bargauge",
                (
                    now(
                        f"topk(10, sum by (namespace, claim) ({cat.GPU_MEMORY_USED.name}{sel(CLAIMED)}))", BY_CLAIM
                    ),
                ),
                "Device memory in use on the devices of each claim.",
                "bytes",
            ),
            Panel(
                "Top claims by power",
                "bargauge",
                (now(f"topk(10, sum by (namespace, claim) ({cat.GPU_POWER.name}{sel(CLAIMED)}))", BY_CLAIM),),
                "Board power of the whole GPUs each claim holds (NVML reports no power per MIG device).",
                "watt",
            ),
            Panel(
                "Power by node",
                "timeseries",
                (t(f"sum by ({NODE_LABEL}) ({cat.GPU_POWER.name}{sel()})", f"{{{{{NODE_LABEL}}}}}"),),
                "Board power of all GPUs of each node.",
                "watt",
            ),
        ),
    )
    health = Row(
        "Health",
        (
            Panel(
                "XID errors in the last hour",
                "timeseries",
                (
                    t(
                        f"sum by ({NODE_LABEL}, xid) ({xids_in('1h')})",
                        f"{{{{{NODE_LABEL}}}}} XID {{{{xid}}}}",
                    ),
                ),
                "XID errors by node and code; see the node dashboard for the device.",
                width=12,
            ),
            Panel(
                "Exporter sources",
                "table",
                (tab(f"{cat.SOURCE_UP.name}{sel()}"),),
                "Whether each exporter's sources (nvml, podresources, kubeapi, otlp) collected successfully (1).",
                columns=(NODE_LABEL, "source"),
                width=12,
            ),
        ),
    )
    return Dashboard(
        "dra-exporter-overview",
        "dra-overview.json",
        "DRA GPUs / Cluster overview",
        "GPUs allocated through Dynamic Resource Allocation: allocation, idle claims, top claims.",
        (NODE_VAR,),
        (fleet, allocation, health),
    )


def claims() -> Dashboard:
    namespace = Variable(
        "namespace",
        "Namespace",
        f"label_values({cat.CLAIM_ALLOCATION_INFO.name}{sel(eq('admin_access', 'false'))}, namespace)",
    )
    claim = Variable(
        "claim",
        "Claim",
        f"label_values({cat.CLAIM_ALLOCATION_INFO.name}"
        f"{sel(eq('admin_access', 'false'), rx('namespace', '$namespace'))}, claim)",
    )
    c = (rx("namespace", "$namespace"), rx("claim", "$claim"), CLAIMED)
    # Only devices with an NVML UUID can be idle: IMEX channels and ComputeDomain daemon devices
    # have none and no activity to read, so they would all look idle.
    gpu_allocations = f"{cat.CLAIM_ALLOCATION_INFO.name}{sel(eq('admin_access', 'false'), ne('uuid'), *c)}"
    by_ns = "{{namespace}}"
    per_namespace = Row(
        "Per namespace",
        (
            Panel(
                "Devices by namespace",
                "bargauge",
                (now(f"count by (namespace) ({cat.GPU_UP.name}{sel(*c)})", by_ns),),
                "Whole GPUs and MIG devices each namespace's claims hold.",
                width=8,
            ),
            Panel(
                "Utilisation by namespace",
                "timeseries",
                (t(f"avg by (namespace) ({busy(*c)})", by_ns),),
                "Mean utilisation over each namespace's devices.",
                "percentunit",
                width=8,
                max=1,
            ),
            Panel(
                "Memory used by namespace",
                "timeseries",
                (t(f"sum by (namespace) ({cat.GPU_MEMORY_USED.name}{sel(*c)})", by_ns),),
                "Device memory in use on each namespace's devices.",
                "bytes",
                width=8,
            ),
        ),
    )
    per_claim = Row(
        "Per claim",
        (
            Panel(
                "Utilisation by claim",
                "timeseries",
                (t(f"avg by (namespace, claim) ({busy(*c)})", BY_CLAIM),),
                "Mean utilisation over each claim's devices (MIG devices through GPM SM activity).",
                "percentunit",
                max=1,
            ),
            Panel(
                "Memory used by claim",
                "timeseries",
                (
                    t(
                        f"sum by (namespace, claim) ({cat.GPU_MEMORY_USED.name}{sel(*c)}) / "
                        f"sum by (namespace, claim) ({cat.GPU_MEMORY_TOTAL.name}{sel(*c)})",
                        BY_CLAIM,
                    ),
                ),
                "Fraction of the claim's device memory in use.",
                "percentunit",
                max=1,
            ),
            Panel(
                "Tensor core activity by claim",
                "timeseries",
                (t(f"avg by (namespace, claim) ({cat.GPU_TENSOR_ACTIVE.name}{sel(*c)})", BY_CLAIM),),
                "GPM: fraction of cycles a tensor pipe was active (Hopper and newer).",
                "percentunit",
                max=1,
            ),
            Panel(
                "Power by claim",
                "timeseries",
                (
                    t(
                        f"sum by (namespace, claim) (rate({cat.GPU_ENERGY.name}{sel(*c)}[$__rate_interval]))",
                        BY_CLAIM,
                    ),
                ),
                "Mean board power of each claim's whole GPUs, from the energy counter.",
                "watt",
            ),
            Panel(
                "Idle claims",
                "table",
                (
                    tab(f"count by ({NODE_LABEL}, namespace, claim) ({gpu_allocations})"),
                    tab(f"count by ({NODE_LABEL}, namespace, claim) "
                        f"(group by ({NODE_LABEL}, namespace, claim, pod) ({cat.CLAIM_CONSUMER_INFO.name}{sel(*c)}) "
                        f"and on ({NODE_LABEL}, namespace, claim) group by ({NODE_LABEL}, namespace, claim) "
                        f"({gpu_allocations}))"),
                    tab(f"time() - max by ({NODE_LABEL}, namespace, claim) ("
                        f"max_over_time((timestamp(max by ({NODE_LABEL}, namespace, claim) ({activity(*c)}) "
                        f">= {IDLE_RATIO}))[$__range:$__interval]) "
                        f"or min_over_time((timestamp(group by ({NODE_LABEL}, namespace, claim) "
                        f"({gpu_allocations})))[$__range:$__interval]))"),
                ),
                f"Every claim of GPUs or MIG devices (not IMEX channels or ComputeDomain daemons: they have no "
                f"activity) with its devices and pods, and how long ago any of its devices was last in use "
                f"(utilisation ≥ {IDLE_RATIO:.0%}; MIG devices: GPM SM activity, or a process where the GPU "
                f"has no GPM), within the dashboard's time range; since the claim appeared if it never was. Sort "
                f"by idle for: the DraClaimIdle alert fires after two hours.",
                "s",
                columns=(NODE_LABEL, "namespace", "claim", "Value #B", "Value #A", "Value #C"),
                renames=(("Value #A", "devices"), ("Value #B", "pods"), ("Value #C", "idle for")),
                field_units=(("Value #A", "short"), ("Value #B", "short")),
                thresholds=((3600, "orange"), (7200, "red")),
                width=24,
            ),
            Panel(
                "Devices of each claim",
                "table",
                (tab(f"{cat.CLAIM_ALLOCATION_INFO.name}{sel(eq('admin_access', 'false'), *c)}"),),
                "Every device allocated to the selected claims.",
                columns=(NODE_LABEL, "namespace", "claim", "request", "driver", "pool", "device", "uuid"),
                width=24,
            ),
            Panel(
                "Pods using each claim",
                "table",
                (tab(f"{cat.CLAIM_CONSUMER_INFO.name}{sel(*c)}"),),
                "Consumers: every pod (and container) that references a claim. A claim with several pods "
                'shares its devices; its device series carry pod="".',
                columns=(NODE_LABEL, "namespace", "claim", "pod", "container"),
                width=12,
            ),
            Panel(
                "Monitoring (admin-access) claims",
                "table",
                (tab(f"{cat.CLAIM_ALLOCATION_INFO.name}{sel(eq('admin_access', 'true'))}"),),
                "Admin-access claims, such as the exporter's own: they see devices but never count as use.",
                columns=(NODE_LABEL, "namespace", "claim", "device", "uuid"),
                width=12,
            ),
            Panel(
                "Claims not prepared",
                "table",
                (tab(f"{cat.CLAIM_NOT_PREPARED.name}{sel(*c)}"),),
                "Claims the kubelet lists for a pod with no devices: allocated and reserved, but the DRA driver "
                "has not prepared them (the pod waits in ContainerCreating). Alert: DraClaimNotPrepared.",
                columns=(NODE_LABEL, "namespace", "claim", "pod"),
                width=24,
            ),
        ),
    )
    return Dashboard(
        "dra-exporter-claims",
        "dra-claims.json",
        "DRA GPUs / Claims and namespaces",
        "Use of GPUs per ResourceClaim and per namespace.",
        (NODE_VAR, namespace, claim),
        (per_namespace, per_claim),
    )


def node() -> Dashboard:
    d = DEV
    devices = Row(
        "Devices",
        (
            Panel(
                "Devices",
                "table",
                (tab(f"{cat.GPU_INFO.name}{sel(*d)}"),),
                "Every GPU and MIG device NVML reports, with its identity.",
                columns=(
                    NODE_LABEL,
                    "gpu",
                    "profile",
                    "model",
                    "uuid",
                    "parent_uuid",
                    "pci_bus_id",
                    "driver_version",
                    "mig_mode",
                    "gpu_instance_id",
                    "compute_instance_id",
                ),
                width=24,
            ),
            Panel(
                "Who holds each device",
                "table",
                (tab(f"{cat.GPU_UP.name}{sel(*d)}"),),
                'Attribution of each device (empty: unallocated, or pod="" when several pods share it); '
                "Value is 1 when the device was read, 0 when it is down.",
                columns=(NODE_LABEL, "gpu", "profile", "uuid", "namespace", "pod", "container", "claim"),
                width=24,
            ),
        ),
    )
    use = Row(
        "Utilisation and memory",
        (
            Panel(
                "GPU utilisation",
                "timeseries",
                (t(f"{cat.GPU_UTILIZATION.name}{sel(*d)}", DEVICE_LEGEND),),
                "NVML utilisation of whole GPUs (not reported for MIG devices).",
                "percentunit",
                max=1,
            ),
            Panel(
                "SM active (GPM)",
                "timeseries",
                (t(f"{cat.GPU_SM_ACTIVE.name}{sel(*d)}", DEVICE_LEGEND),),
                "Fraction of SM cycles with a warp resident, for GPUs and MIG devices.",
                "percentunit",
                max=1,
            ),
            Panel(
                "Memory used",
                "timeseries",
                (t(f"{cat.GPU_MEMORY_USED.name}{sel(*d)}", DEVICE_LEGEND),),
                "Device memory in use.",
                "bytes",
            ),
            Panel(
                "Tensor and DRAM activity (GPM)",
                "timeseries",
                (
                    t(f"{cat.GPU_TENSOR_ACTIVE.name}{sel(*d)}", "tensor " + DEVICE_LEGEND),
                    t(f"{cat.GPU_DRAM_ACTIVE.name}{sel(*d)}", "dram " + DEVICE_LEGEND),
                ),
                "Tensor pipe activity and DRAM bandwidth use.",
                "percentunit",
                max=1,
            ),
        ),
    )
    physical = Row(
        "Power, temperature, clocks",
        (
            Panel(
                "Power",
                "timeseries",
                (
                    t(f"{cat.GPU_POWER.name}{sel(*d)}", "GPU {{gpu}}"),
                    t(f"{cat.GPU_POWER_LIMIT.name}{sel(*d)}", "GPU {{gpu}} limit"),
                ),
                "Board power draw and the enforced limit.",
                "watt",
            ),
            Panel(
                "Temperature",
                "timeseries",
                (
                    t(f"{cat.GPU_TEMPERATURE.name}{sel(*d)}", "GPU {{gpu}}"),
                    t(f"{cat.GPU_MEMORY_TEMPERATURE.name}{sel(*d)}", "GPU {{gpu}} memory"),
                ),
                "Die and HBM temperature.",
                "celsius",
            ),
            Panel(
                "Clocks",
                "timeseries",
                (t(f"{cat.GPU_CLOCK.name}{sel(*d, rx('clock', 'sm|memory'))}", "GPU {{gpu}} {{clock}}"),),
                "SM and memory clocks.",
                "hertz",
            ),
            Panel(
                "GPUs throttled, by reason",
                "timeseries",
                (
                    t(
                        f"sum by (reason) ({cat.GPU_CLOCK_EVENT.name}{sel(*d, ne('reason', 'gpu_idle'))})",
                        "{{reason}}",
                    ),
                ),
                "How many selected GPUs have each clock event reason active. sw_power_cap under full load is "
                "normal; thermal and hardware slowdowns are not.",
            ),
            Panel(
                "Clock event reasons active now",
                "table",
                (tab(f"{cat.GPU_CLOCK_EVENT.name}{sel(*d)} == 1"),),
                "Every clock event reason (throttling) active at the end of the range.",
                columns=(NODE_LABEL, "gpu", "uuid", "reason"),
                width=24,
            ),
        ),
    )
    errors = Row(
        "Errors",
        (
            stat(
                "Devices down",
                or_zero(f"count({cat.GPU_UP.name}{sel(*d)} == 0)"),
                "Devices the last collection could not read.",
                thresholds=RED_FROM_ONE,
            ),
            stat(
                "Uncorrected ECC errors",
                f"sum({cat.GPU_ECC_ERRORS.name}{sel(*d, eq('type', 'uncorrected'))})",
                "Volatile uncorrected ECC errors since the driver loaded.",
                thresholds=RED_FROM_ONE,
            ),
            stat(
                "Rows remapped (uncorrectable)",
                f"sum({cat.GPU_REMAPPED_ROWS.name}{sel(*d, eq('type', 'uncorrectable'))})",
                "Memory rows remapped because of uncorrectable errors.",
                thresholds=((1, "orange"),),
            ),
            stat(
                "Row remap pending",
                f"sum({cat.GPU_ROW_REMAP_PENDING.name}{sel(*d)})",
                "GPUs waiting for a reset to finish a row remap.",
                thresholds=((1, "orange"),),
            ),
            stat(
                "Row remap failed",
                f"sum({cat.GPU_ROW_REMAP_FAILURE.name}{sel(*d)})",
                "GPUs where a row remap failed: replace or service the GPU.",
                thresholds=RED_FROM_ONE,
            ),
            stat(
                "XID errors in range",
                or_zero(f"sum({xids_in('$__range', *d)})"),
                "XID errors counted over the dashboard's time range (a device's first XID too).",
                thresholds=RED_FROM_ONE,
            ),
            Panel(
                "XID errors",
                "table",
                (tab(f"{cat.GPU_XID_ERRORS.name}{sel(*d)}"),),
                "XID errors this exporter has seen since it started, by device and code.",
                columns=(NODE_LABEL, "gpu", "profile", "uuid", "xid", "claim"),
                width=12,
            ),
            Panel(
                "Last XID",
                "table",
                (tab(f"{cat.GPU_LAST_XID.name}{sel(*d)} * 1000"),),
                "When each device last reported an XID.",
                "dateTimeAsIso",
                columns=(NODE_LABEL, "gpu", "profile", "uuid"),
                width=12,
            ),
            Panel(
                "ECC errors",
                "timeseries",
                (
                    t(
                        f"sum by ({NODE_LABEL}, gpu, type) "
                        f"(increase({cat.GPU_ECC_ERRORS.name}{sel(*d)}[$__rate_interval]))",
                        "GPU {{gpu}} {{type}}",
                    ),
                ),
                "ECC errors per interval.",
            ),
            Panel(
                "PCIe replays",
                "timeseries",
                (t(f"increase({cat.GPU_PCIE_REPLAYS.name}{sel(*d)}[$__rate_interval])", "GPU {{gpu}}"),),
                "PCIe replays per interval: a rising count points at a bad link or riser.",
            ),
        ),
    )
    io = Row(
        "Interconnect",
        (
            Panel(
                "PCIe throughput",
                "timeseries",
                (t(f"rate({cat.GPU_PCIE_BYTES.name}{sel(*d)}[$__rate_interval])", "GPU {{gpu}} {{direction}}"),),
                "Bytes per second over PCIe.",
                "Bps",
            ),
            Panel(
                "NVLink throughput",
                "timeseries",
                (
                    t(
                        f"rate({cat.GPU_NVLINK_BYTES.name}{sel(*d)}[$__rate_interval])",
                        DEVICE_LEGEND + " {{direction}}",
                    ),
                ),
                "Bytes per second over all NVLinks of each device: NVML's per-link data counters where the "
                "GPU has them, else GPM's NVLink rates (MIG devices, GPUs without per-link counters).",
                "Bps",
            ),
            Panel(
                "Energy used in range",
                "bargauge",
                (
                    now(
                        f"sum by ({NODE_LABEL}, gpu) (increase({cat.GPU_ENERGY.name}{sel(*d)}[$__range]))",
                        f"{{{{{NODE_LABEL}}}}} GPU {{{{gpu}}}}",
                    ),
                ),
                "Energy each GPU used over the dashboard's time range.",
                "joule",
            ),
        ),
    )
    exporter = Row(
        "Exporter",
        (
            Panel(
                "Collection duration",
                "timeseries",
                (t(f"{cat.COLLECT_DURATION.name}{sel()}", "{{instance}} {{source}}"),),
                "Seconds each source's last collection took.",
                "s",
                width=8,
            ),
            Panel(
                "Collection errors",
                "timeseries",
                (t(f"increase({cat.COLLECT_ERRORS.name}{sel()}[$__rate_interval])", "{{instance}} {{source}}"),),
                "Failed collections per interval.",
                width=8,
            ),
            Panel(
                "Data age",
                "timeseries",
                (t(f"time() - {cat.LAST_SUCCESS.name}{sel()}", "{{instance}} {{source}}"),),
                "Seconds since each source last succeeded.",
                "s",
                width=8,
            ),
        ),
    )
    dra_devices = Row(
        "DRA devices (API server)",
        (
            Panel(
                "Devices the node's ResourceSlices publish",
                "table",
                (tab(f"{cat.DEVICE_INFO.name}{sel()}"),),
                "Every slice device of the node, allocated or not, with its UUID and type.",
                columns=(NODE_LABEL, "driver", "pool", "device", "type", "profile", "uuid"),
                width=24,
            ),
            Panel(
                "Device taints",
                "table",
                (tab(f"{cat.DEVICE_TAINT.name}{sel()}"),),
                "Taints on slice devices (ResourceSlice or DeviceTaintRule): NoSchedule keeps new claims "
                "away, NoExecute evicts.",
                columns=(NODE_LABEL, "driver", "pool", "device", "key", "value", "effect"),
                width=24,
            ),
        ),
    )
    orphans = Row(
        "Held for no claim",
        (
            Panel(
                "Prepared for a claim that is gone",
                "table",
                (tab(f"time() - {cat.ORPHAN_PREPARED_DEVICE.name}{sel()}"),),
                "Devices a DRA driver still holds prepared (its CDI spec under the CDI root) for a claim the API "
                "server no longer has or has deallocated, and for how long. DraOrphanedPreparedDevice fires after "
                "10 minutes; the runbook says how to free them.",
                "s",
                columns=(NODE_LABEL, "driver", "device", "uuid", "claim_uid", "reason"),
                renames=(("Value", "for"),),
                thresholds=((600, "red"),),
                width=24,
            ),
            Panel(
                "MIG devices no claim names",
                "table",
                (tab(f"time() - {cat.ORPHAN_MIG_DEVICE.name}{sel()}"),),
                "MIG devices on GPUs a DRA driver publishes that no allocated claim, no device-plugin allocation "
                "and no ResourceSlice names (a dynamic MIG device its claim left behind), and for how long.",
                "s",
                columns=(NODE_LABEL, "gpu", "profile", "uuid", "parent_uuid"),
                renames=(("Value", "for"),),
                thresholds=((600, "red"),),
                width=12,
            ),
            Panel(
                "GPU processes no claim covers",
                "table",
                (tab(f"time() - {cat.ORPHAN_GPU_PROCESS.name}{sel()}"),),
                "Processes on a GPU or MIG device that no claim and no device-plugin allocation covers, and for "
                "how long.",
                "s",
                columns=(NODE_LABEL, "gpu", "uuid", "pid"),
                renames=(("Value", "for"),),
                thresholds=((600, "red"),),
                width=12,
            ),
        ),
    )
    return Dashboard(
        "dra-exporter-node",
        "dra-node.json",
        "DRA GPUs / Node",
        "Every GPU and MIG device of a node: use, power, temperature, clocks, throttling, XID and ECC.",
        (NODE_VAR, GPU_VAR),
        (devices, use, physical, errors, io, dra_devices, orphans, exporter),
    )


def sharing() -> Dashboard:
    d = DEV
    mig = (*d, MIG)
    shared = (*d, CLAIMED, eq("pod", ""))
    layout = Row(
        "MIG layout",
        (
            Panel(
                "MIG devices and who holds them",
                "table",
                (tab(f"{cat.GPU_UP.name}{sel(*mig)}"),),
                "Every MIG device with its claim and pod (empty: free).",
                columns=(NODE_LABEL, "gpu", "profile", "uuid", "namespace", "pod", "container", "claim"),
                width=24,
            ),
            Panel(
                "MIG devices by profile",
                "bargauge",
                (now(f"count by (profile) ({cat.GPU_INFO.name}{sel(*mig)})", "{{profile}}"),),
                "MIG devices of each profile on the selected GPUs.",
                width=8,
            ),
            Panel(
                "Allocated MIG devices by profile",
                "bargauge",
                (now(f"count by (profile) ({cat.GPU_UP.name}{sel(*mig, CLAIMED)})", "{{profile}}"),),
                "MIG devices of each profile that a claim holds.",
                width=8,
            ),
            Panel(
                "MIG memory used",
                "bargauge",
                (
                    now(
                        f"{cat.GPU_MEMORY_USED.name}{sel(*mig)} / {cat.GPU_MEMORY_TOTAL.name}{sel(*mig)}", DEVICE_LEGEND
                    ),
                ),
                "Fraction of each MIG device's memory in use.",
                "percentunit",
                width=8,
                max=1,
            ),
            Panel(
                "MIG SM active (GPM)",
                "timeseries",
                (t(f"{cat.GPU_SM_ACTIVE.name}{sel(*mig)}", DEVICE_LEGEND),),
                "How busy each MIG device's SMs are.",
                "percentunit",
                max=1,
            ),
            Panel(
                "MIG memory used over time",
                "timeseries",
                (t(f"{cat.GPU_MEMORY_USED.name}{sel(*mig)}", DEVICE_LEGEND),),
                "Device memory in use on each MIG device.",
                "bytes",
            ),
        ),
    )
    sharing_row = Row(
        "Shared claims",
        (
            Panel(
                "Claims used by several pods",
                "table",
                (tab(f"count by (namespace, claim) ({cat.CLAIM_CONSUMER_INFO.name}{sel()}) > 1"),),
                "Claims whose devices several pods share (Value: how many pods).",
                columns=("namespace", "claim"),
                width=8,
            ),
            Panel(
                "Consumers of shared claims",
                "table",
                (
                    tab(
                        f"{cat.CLAIM_CONSUMER_INFO.name}{sel()} and on (namespace, claim) "
                        f"(count by (namespace, claim) ({cat.CLAIM_CONSUMER_INFO.name}{sel()}) > 1)"
                    ),
                ),
                "Every pod and container of the shared claims.",
                columns=(NODE_LABEL, "namespace", "claim", "pod", "container"),
                width=16,
            ),
            Panel(
                "Shared devices: utilisation",
                "timeseries",
                (t(busy(*shared), DEVICE_LEGEND),),
                "Devices held by a claim that several pods use: one series per device, never copied per pod.",
                "percentunit",
                max=1,
            ),
            Panel(
                "Shared devices: memory used",
                "timeseries",
                (t(f"{cat.GPU_MEMORY_USED.name}{sel(*shared)}", DEVICE_LEGEND),),
                "Device memory in use on shared devices (all their pods together).",
                "bytes",
            ),
            Panel(
                "About per-pod shares",
                "text",
                (),
                "Why a shared device has one series.",
                width=24,
                height=3,
                content='A device that several pods share keeps **one** series with `pod=""`, so `sum()` stays '
                "right; `dra_claim_consumer_info` lists its pods. Per-container use of a shared device "
                "comes from the per-process families (`dra_container_gpu_*`).",
            ),
        ),
    )
    on_gpu = f"and on ({NODE_LABEL}, uuid) {cat.GPU_INFO.name}{sel(*d)}"
    container_legend = "{{namespace}}/{{pod}}/{{container}} {{uuid}}"
    containers = Row(
        "Per-container shares",
        (
            Panel(
                "Memory used per container",
                "timeseries",
                (t(f"{cat.CONTAINER_GPU_MEMORY_USED.name}{sel()} {on_gpu}", container_legend),),
                "Device memory of each container's GPU processes, per device (NVML per-process memory, "
                "PIDs mapped to containers through /proc; needs hostPID).",
                "bytes",
            ),
            Panel(
                "SM utilisation per container",
                "timeseries",
                (t(f"{cat.CONTAINER_GPU_SM_UTILIZATION.name}{sel()} {on_gpu}", container_legend),),
                "Each container's share of the device's SMs; the shares of one device add up to at most "
                "its utilisation.",
                "percentunit",
                max=1,
            ),
            Panel(
                "Containers on GPUs now",
                "table",
                (tab(f"{cat.CONTAINER_GPU_MEMORY_USED.name}{sel()} {on_gpu}"),),
                "Every container with GPU processes, its device and claim (Value: memory used, bytes).",
                columns=(NODE_LABEL, "uuid", "namespace", "pod", "container", "claim"),
                width=24,
            ),
        ),
    )
    return Dashboard(
        "dra-exporter-sharing",
        "dra-mig-sharing.json",
        "DRA GPUs / MIG and shared GPUs",
        "MIG partitions and GPUs shared by several pods: layout, holders, use.",
        (NODE_VAR, GPU_VAR),
        (layout, sharing_row, containers),
    )


def compute_domain() -> Dashboard:
    """NVIDIA ComputeDomains (multi-node NVLink): readiness, members, IMEX channel holders, the GPUs
    serving each domain and their NVLink traffic. Each member's agent reports the whole domain,
    so domain and member queries aggregate the agents away (max)."""
    cd = f"max by (namespace, compute_domain, uid, allocation_mode, num_nodes) ({cat.COMPUTE_DOMAIN_INFO.name}{sel()})"
    ready = f"max by (namespace, compute_domain) ({cat.COMPUTE_DOMAIN_READY.name}{sel()})"
    members = f"max by (namespace, compute_domain, node, clique, index) ({cat.COMPUTE_DOMAIN_NODE_READY.name}{sel()})"
    gpus = f"max by (uuid, compute_domain) ({cat.COMPUTE_DOMAIN_GPU_INFO.name}{sel()})"
    nvlink = (f"rate({cat.GPU_NVLINK_LINK_BYTES.name}{sel()}[$__rate_interval]) * on (uuid) "
              f"group_left (compute_domain) {gpus}")
    domains = Row(
        "Domains",
        (
            stat("ComputeDomains", f"count({cd}) or vector(0)", "ComputeDomains the nodes' claims belong to.",
                 width=6),
            stat("Not Ready", f"count({ready} == 0) or vector(0)", "ComputeDomains whose status is not Ready.",
                 width=6, thresholds=((0, "green"), (1, "red"))),
            stat("Member nodes NotReady",
                 f"count(max by (namespace, compute_domain, node) ({cat.COMPUTE_DOMAIN_NODE_READY.name}{sel()}) == 0) "
                 "or vector(0)", "Member nodes whose IMEX daemon is NotReady, over all domains.",
                 width=6, thresholds=((0, "green"), (1, "red"))),
            stat("IMEX channels held", f"count({cat.COMPUTE_DOMAIN_CHANNEL_INFO.name}{sel()}) or vector(0)",
                 "Pods holding an IMEX channel of a domain.", width=6),
            Panel("ComputeDomains", "table", (tab(cd), tab(ready)),
                  "Each domain, its channel allocation mode and numNodes (Value #B: Ready 1 / NotReady 0).",
                  columns=("namespace", "compute_domain", "uid", "allocation_mode", "num_nodes"), width=24),
        ),
    )
    nodes = Row(
        "Member nodes",
        (
            Panel("Members and their IMEX daemons", "table", (tab(members),),
                  "Every member node of each domain with its clique and DNS index (Value: Ready 1 / NotReady 0): "
                  "which node keeps a domain NotReady.",
                  columns=("namespace", "compute_domain", "node", "clique", "index"), width=24),
            Panel("Ready members per domain", "timeseries",
                  (t(f"sum by (namespace, compute_domain) ({members})", "{{namespace}}/{{compute_domain}}"),),
                  "Member nodes whose IMEX daemon is Ready, over time.", width=12),
            Panel("Domain readiness", "timeseries", (t(ready, "{{namespace}}/{{compute_domain}}"),),
                  "1 while the domain's status is Ready.", width=12, max=1),
        ),
    )
    traffic = Row(
        "IMEX channels, GPUs and NVLink",
        (
            Panel("IMEX channel holders", "table", (tab(f"{cat.COMPUTE_DOMAIN_CHANNEL_INFO.name}{sel()}"),),
                  "Pods holding an IMEX channel of a domain, with their claim and channel device.",
                  columns=(NODE_LABEL, "namespace", "pod", "claim", "compute_domain", "device"), width=12),
            Panel("GPUs serving each domain", "table", (tab(f"{cat.COMPUTE_DOMAIN_GPU_INFO.name}{sel()}"),),
                  "The GPUs allocated to the pods of each domain.",
                  columns=(NODE_LABEL, "compute_domain", "namespace", "pod", "gpu", "uuid"), width=12),
            Panel("NVLink throughput per domain", "timeseries",
                  (t(f"sum by (compute_domain) ({nvlink})", "{{compute_domain}}"),),
                  "Bytes per second over NVLink (rx + tx) of every GPU serving the domain, over all its nodes.",
                  "Bps", width=12),
            Panel("NVLink throughput per node", "timeseries",
                  (t(f"sum by ({NODE_LABEL}, compute_domain) ({nvlink})", "{{instance}} {{compute_domain}}"),),
                  "The domain's NVLink traffic split by node: a node far below the others is worth a look.",
                  "Bps", width=12),
            Panel("NVLink throughput per GPU", "timeseries",
                  (t(f"sum by ({NODE_LABEL}, gpu, compute_domain) ({nvlink})", "{{instance}} GPU {{gpu}}"),),
                  "Each domain GPU's NVLink traffic.", "Bps", width=12),
            Panel("NVLink links down (domain GPUs)", "table",
                  (tab(f"{cat.GPU_NVLINK_LINK_UP.name}{sel()} * on (uuid) group_left (compute_domain) {gpus} == 0"),),
                  "Links of the domains' GPUs that are not active (Value: 0).",
                  columns=(NODE_LABEL, "compute_domain", "gpu", "link", "uuid"), width=12),
            Panel("NVLink errors and recoveries per link", "timeseries",
                  (t(f"sum by ({NODE_LABEL}, gpu, link) "
                     f"(rate({cat.GPU_NVLINK_LINK_ERRORS.name}{sel()}[$__rate_interval]))",
                     "{{instance}} GPU {{gpu}} link {{link}}"),),
                  "Errors per second on each link (every error type summed).", width=12),
            Panel("Fabric health of the domains' GPUs", "table",
                  (tab(f"{cat.GPU_FABRIC_HEALTH.name}{sel()} * on (uuid) group_left (compute_domain) "
                       f"{gpus} == 1"),),
                  "The NVML fabric health summary of each GPU serving a domain.",
                  columns=(NODE_LABEL, "compute_domain", "gpu", "summary", "uuid"), width=12),
            Panel("Utilisation of the domain's GPUs", "timeseries",
                  (t(f"avg by (compute_domain) ({cat.GPU_UTILIZATION.name}{sel()} * on (uuid) "
                     f"group_left (compute_domain) {gpus})", "{{compute_domain}}"),),
                  "Mean NVML utilisation of the GPUs serving each domain.", "percentunit", width=12, max=1),
        ),
    )
    return Dashboard(
        "dra-exporter-compute-domain",
        "dra-compute-domain.json",
        "DRA GPUs / ComputeDomain",
        "NVIDIA ComputeDomains (multi-node NVLink, IMEX): readiness, member nodes, channel holders, their GPUs "
        "and NVLink traffic.",
        (NODE_VAR,),
        (domains, nodes, traffic),
    )


def showback() -> Dashboard:
    """Cluster-wide GPU-hours on the recording rules (deploy/recording-rules.yaml): no node picker,
    since a namespace's claims span nodes; the rules have already summed the nodes."""
    ns = rx("namespace", "$namespace")
    held_ns, busy_ns = f"{sb.HELD_NAMESPACE}{{{ns}}}", f"{sb.BUSY_NAMESPACE}{{{ns}}}"
    busy_claim = f"{sb.BUSY_CLAIM}{{{ns}}}"
    # Idle shares are of the GPU-hours with a busy signal: A100 and A30 MIG devices have none, and
    # unknown is not idle (they drop out of the idle panels; `report` counts them as NO SIGNAL).
    measured_ns, measured_claim = f"{sb.MEASURED_NAMESPACE}{{{ns}}}", f"{sb.MEASURED_CLAIM}{{{ns}}}"
    # Recorded every RULE_INTERVAL: the sum of a range's samples times the interval is GPU-time.
    # Written as a fraction, not 0.0166667: a rounded factor would be off by 2 ppm in every figure.
    hours_per_sample = f"{sb.parse_duration(sb.RULE_INTERVAL):g} / 3600"

    def hours(expr: str, by: str = "") -> str:
        grouping = f" by ({by})" if by else ""
        return f"sum{grouping} (sum_over_time({expr}[$__range])) * {hours_per_sample}"

    # Cost: each device's GPU-hours times the price recorded for its GPU model (sb.PRICE, from the
    # price file or the chart's prometheusRule.showbackPrices), else the recorded default, else the
    # price variable. The prices are those at the end of the range: a price list, not a price history.
    price = Variable("price", "Price per GPU-hour (unpriced models)", "1", kind="textbox")
    money = Variable("currency", "Currency", f"label_values({sb.PRICE}, currency)", kind="name")
    held_device = f"sum_over_time({sb.HELD_DEVICE}{{{ns}}}[$__range])"
    priced = (f'{held_device} * on (model) group_left () max by (model) ({sb.PRICE}{{model!=""}})\n  or\n  '
              f'{held_device} * on () group_left () max ({sb.PRICE}{{model=""}})\n  or\n  '
              f"{held_device} * $price")
    cost_why = ("GPU-hours held times the price of their GPU model recorded from the price file "
                "(`dra-exporter recording-rules --price-file`, the chart's prometheusRule.showbackPrices), else "
                "its default, else the price variable; in the prices' currency.")

    def cost(by: str = "") -> str:
        grouping = f" by ({by})" if by else ""
        return f"sum{grouping} (\n  {priced}\n) * {hours_per_sample}"

    totals = Row(
        "In the dashboard's time range",
        (
            stat("GPU-hours held", hours(held_ns), "Whole GPUs count 1 an hour, a MIG device its share of "
                 "its GPU (its compute slices over the GPU's: 7, 4 on an A30); a claim shared by several pods counts "
                 "once.", width=6),
            stat("GPU-hours busy", hours(busy_ns), "Held GPU-hours weighted by utilisation (GPM SM activity "
                 "for MIG devices).", width=6),
            stat("Idle share", f"1 - ({hours(busy_ns)}) / ({hours(measured_ns)})",
                 "Share of the held GPU-hours nobody used, of those with a busy signal (A100 and A30 MIG "
                 "devices have none: unknown, not idle).", unit="percentunit", width=6),
            stat("Cost ${currency}", cost(), cost_why, width=6),
        ),
    )
    over_time = Row(
        "Held vs busy by namespace",
        (
            Panel("GPU-equivalents held", "timeseries", (t(held_ns, "{{namespace}}"),),
                  "GPUs each namespace's claims hold, MIG devices by their share."),
            Panel("GPU-equivalents busy", "timeseries", (t(busy_ns, "{{namespace}}"),),
                  "How much of what each namespace holds is busy."),
            Panel("GPU-hours held by namespace", "bargauge",
                  (now(f"sort_desc({hours(held_ns, 'namespace')})", "{{namespace}}"),),
                  "GPU-hours held over the time range.", width=8),
            Panel("Idle share by namespace", "bargauge",
                  (now(f"sort_desc(1 - ({hours(busy_ns, 'namespace')}) / ({hours(measured_ns, 'namespace')}))",
                       "{{namespace}}"),),
                  "Share of each namespace's GPU-hours nobody used, of those with a busy signal (A100 and "
                  "A30 MIG devices have none).", "percentunit", width=8, max=1),
            Panel("Cost by namespace ${currency}", "bargauge",
                  (now(f"sort_desc({cost('namespace')})", "{{namespace}}"),), cost_why, width=8),
        ),
    )
    idle = Row(
        "Claims",
        (
            Panel("Top idle claims", "bargauge",
                  (now(f"topk(10, 1 - ({hours(busy_claim, 'namespace, claim')}) / "
                       f"({hours(measured_claim, 'namespace, claim')}))", BY_CLAIM),),
                  "Claims with the largest share of their GPU-hours unused over the range, of those with a busy "
                  "signal (a claim of A100 or A30 MIG devices only has none and is not listed). `dra-exporter report` "
                  "says since when each idle claim has been idle.", "percentunit", max=1),
            Panel("Top claims by cost ${currency}", "bargauge",
                  (now(f"topk(10, {cost('namespace, claim')})", BY_CLAIM),), cost_why),
        ),
    )
    return Dashboard(
        "dra-exporter-showback",
        "dra-showback.json",
        "DRA GPUs / Showback",
        "GPU-hours held and busy per namespace and claim, idle claims and cost, from the recording rules.",
        (Variable("namespace", "Namespace", f"label_values({sb.HELD_NAMESPACE}, namespace)"), price, money),
        (totals, over_time, idle),
    )


# --- the cluster mode's dashboard (``dra-exporter cluster``) ----------------------------------

CLUSTER_JOB = "dra-exporter-cluster"
"""The ``job`` label of the cluster mode's target (its ServiceMonitor sets it; deploy/cluster-rules.yaml
selects the same)."""


def csel(*matchers: str) -> str:
    """A selector on the cluster mode's series. One target publishes the whole cluster, so there is
    no node picker on ``instance``: the families carry ``node`` themselves."""
    return "{" + ", ".join((eq("job", CLUSTER_JOB), *matchers)) + "}"


def in_state(metric: str, by: str, state: str, *matchers: str) -> str:
    """Devices of ``metric`` in ``state`` per ``by``, and 0 for a group that has devices but none in
    that state: ``dra_cluster_devices`` publishes only the states that have devices, and a merged
    table needs a cell in every row."""
    return (f"(sum by ({by}) ({metric}{csel(*matchers, eq('state', state))}) "
            f"or 0 * sum by ({by}) ({metric}{csel(*matchers)}))")


def cluster_capacity() -> Dashboard:
    """The whole cluster's DRA state from the cluster mode: capacity, fragmentation, pending claims,
    DeviceClasses, pools and taints. Every query selects ``job="dra-exporter-cluster"``."""
    devices, fit = cat.CLUSTER_DEVICES.name, cat.CLUSTER_PARTITIONS_FIT.name
    classes, evaluable = cat.CLUSTER_CLASS_DEVICES.name, cat.CLUSTER_CLASS_EVALUABLE.name
    pending, pools = cat.CLUSTER_CLAIM_PENDING.name, cat.CLUSTER_POOL_INFO.name
    requests, reasons = cat.CLUSTER_CLAIM_PENDING_REQUEST.name, cat.CLUSTER_CLAIM_PENDING_REASON.name
    drv, nod, cls = rx("driver", "$driver"), rx("node", "$node"), rx("device_class", "$device_class")
    dev = (drv, nod)
    gpu = "driver, pool, node, counter_set"  # a counter set is one partitionable GPU
    on_nodes = f"and on (driver, pool) {pools}{csel(*dev)}"  # pool families carry no node
    # One pending series per claim; its requests name the classes, so the class picker goes through them.
    pending_claims = f"count by (namespace, claim, device_class) ({requests}{csel(cls)})"
    pending_for_classes = f"({pending}{csel()} and on (namespace, claim) {requests}{csel(cls)})"
    age_by_request = f"({requests}{csel(cls)} * on (namespace, claim) group_left () {pending}{csel()})"

    def states(by: str, metric: str = devices, *matchers: str) -> tuple[Target, ...]:
        """Devices, free, allocated, tainted and blocked per ``by``: the columns of a capacity table."""
        return (tab(f"sum by ({by}) ({metric}{csel(*matchers)})"),
                *(tab(in_state(metric, by, s, *matchers)) for s in ("free", "allocated", "tainted", "blocked")))

    state_columns = ("Value #A", "Value #B", "Value #C", "Value #D", "Value #E")
    state_renames = (("Value #A", "devices"), ("Value #B", "free"), ("Value #C", "allocated"),
                     ("Value #D", "tainted"), ("Value #E", "blocked"))
    states_help = ("Allocated: a claim holds it; tainted: not allocated, kept from new claims by a "
                   "NoSchedule/NoExecute taint; blocked: not allocated, but what is allocated on its GPU "
                   "leaves too few counters; free: the scheduler could allocate it now, on its own (partitions "
                   "of one GPU exclude each other). Devices of pools the scheduler cannot use are "
                   "unavailable, shared devices with capacity left shared; the columns leave them out.")
    gpu_eq, placeable = cat.CLUSTER_GPU_EQUIVALENTS.name, cat.CLUSTER_CLASS_PLACEABLE.name
    capacity = Row(
        "Capacity",
        (
            stat("GPU-equivalents free", or_zero(f"sum({gpu_eq}{csel(nod, eq('state', 'free'))})"),
                 "Whole GPUs' worth that could still be allocated: a whole GPU is 1, a partitionable GPU counts "
                 "the share of its counters still free (by the counter that bounds it most), so exclusive "
                 "partitions of one GPU are not added up.", width=6),
            Panel("Placeable claims by DeviceClass", "bargauge",
                  (now(f"max by (device_class) ({placeable}{csel(cls)})", "{{device_class}}"),),
                  "How many claims for one device of each DeviceClass the scheduler could allocate now, one after "
                  "another (its allocator: first fit, counters, taints, shared capacity, usable pools). 0 with "
                  "claims waiting fires DraDeviceClassExhausted.", width=18),
            stat("GPU-equivalents allocated", or_zero(f"sum({gpu_eq}{csel(nod, eq('state', 'allocated'))})"),
                 "Whole GPUs' worth allocated to claims (a partitionable GPU by the share of its counters used).",
                 width=4),
            stat("GPU-equivalents blocked", or_zero(f"sum({gpu_eq}{csel(nod, eq('state', 'blocked'))})"),
                 "Whole GPUs' worth neither allocated nor allocatable: tainted, or in a pool the scheduler cannot "
                 "use.", thresholds=RED_FROM_ONE, width=4),
            stat("Devices", f"sum({devices}{csel(*dev)})",
                 "Devices the ResourceSlices publish (newest pool generations) on the selected drivers and nodes: "
                 "whole GPUs and every MIG placement, so a MIG-partitionable GPU counts many times.", width=4),
            stat("Tainted", or_zero(f"sum({devices}{csel(*dev, eq('state', 'tainted'))})"),
                 "Unallocated devices a NoSchedule or NoExecute taint keeps from new claims.",
                 thresholds=RED_FROM_ONE, width=4),
            stat("Unavailable devices", or_zero(f"sum({devices}{csel(*dev, eq('state', 'unavailable'))})"),
                 "Devices of pools the scheduler does not allocate from: the newest generation incomplete or "
                 "invalid (DraResourcePoolIncomplete).", thresholds=RED_FROM_ONE, width=4),
            stat("Pending claims", or_zero(f"count({pending_for_classes})"),
                 "ResourceClaims not allocated yet that a pod waits for and that ask for the selected "
                 "DeviceClasses.", thresholds=RED_FROM_ONE, width=4),
            Panel("Devices by state", "timeseries", (t(f"sum by (state) ({devices}{csel(*dev)})", "{{state}}"),),
                  states_help),
            Panel("GPU-equivalents by model and state", "bargauge",
                  (now(f"sum by (model, state) ({gpu_eq}{csel(nod)})", "{{model}} {{state}}"),),
                  "GPUs of each model, free, allocated and blocked, in whole GPUs (partitions by their share)."),
            Panel("Capacity by node", "table", states("node", devices, *dev),
                  "Devices of each node by state. " + states_help + " An empty node: a pool for all nodes or a "
                  "node selector.",
                  columns=("node", *state_columns), renames=state_renames, width=12),
            Panel("Capacity by driver and pool", "table", states("driver, pool", devices, *dev),
                  "Devices of each driver's pools by state. " + states_help,
                  columns=("driver", "pool", *state_columns), renames=state_renames, width=12),
            Panel("Capacity by MIG profile", "table", states("profile", devices, *dev, MIG),
                  "MIG placements of each profile by state: a profile's free placements overlap, see "
                  "Fragmentation for how many fit per GPU.",
                  columns=("profile", *state_columns), renames=state_renames, width=12),
            Panel("Capacity by model", "table", states("driver, model", devices, *dev),
                  "Devices of each model (NVIDIA's productName, the example driver's model) by state.",
                  columns=("driver", "model", *state_columns), renames=state_renames, width=12),
        ),
    )
    fragmentation = Row(
        "Fragmentation (partitionable GPUs)",
        (
            stat("GPUs with everything free",
                 or_zero(f"count(min by ({gpu}) ({fit}{csel(*dev)}) > 0)"),
                 "Partitionable GPUs (counter sets) on which every profile still fits: nothing allocated.",
                 width=8),
            stat("Partly used GPUs",
                 or_zero(f"count(max by ({gpu}) ({fit}{csel(*dev)}) > 0 "
                         f"and on ({gpu}) min by ({gpu}) ({fit}{csel(*dev)}) == 0)"),
                 "Partitionable GPUs on which some profiles still fit and others no longer do: where a "
                 "large profile would fit if the small allocations sat together.", width=8),
            stat("Full GPUs", or_zero(f"count(max by ({gpu}) ({fit}{csel(*dev)}) == 0)"),
                 "Partitionable GPUs on which no profile fits any more.", width=8),
            Panel("GPUs with room for one more, by profile", "bargauge",
                  (now(f"count by (profile) ({fit}{csel(*dev)} > 0)", "{{profile}}"),),
                  "On how many GPUs at least one more partition of each profile still fits. Compare with the "
                  "free placements: many free placements on few GPUs is fragmentation.", width=8),
            Panel("Free placements by profile", "bargauge",
                  (now(f"sum by (profile) ({fit}{csel(*dev)})", "{{profile}}"),),
                  "Partitions of each profile the scheduler could still place, one after another on each GPU, "
                  "summed over the GPUs (profiles exclude each other: not all at once).",
                  width=8),
            Panel("Placements blocked by what is allocated, by profile", "bargauge",
                  (now(f"sum by (profile) ({devices}{csel(*dev, eq('state', 'blocked'))})", "{{profile}}"),),
                  "Unallocated placements of each profile whose counters allocated partitions of their GPU "
                  "have taken.", width=8),
            Panel("Partitions that still fit, per GPU and profile", "table",
                  (tab(f"{fit}{csel(*dev)}"),),
                  "dra_cluster_partitions_fit: for each GPU (counter set) and profile, how many partitions the "
                  "scheduler could place one after another (every counter must fit, engines too: one +me "
                  "partition per GPU). 0: the profile no longer fits on that GPU.",
                  columns=("node", "driver", "pool", "counter_set", "profile", "Value"),
                  renames=(("counter_set", "GPU (counter set)"), ("Value", "fit")), width=24),
        ),
    )
    claims_row = Row(
        "Claims",
        (
            stat("Oldest pending claim", or_zero(f"max({pending_for_classes})"),
                 "Seconds a pod has waited for the longest-pending claim for the selected DeviceClasses; "
                 "DraClaimPendingTooLong fires after 15 minutes.", unit="s", thresholds=((900, "red"),), width=6),
            stat("Claims held by no pod", or_zero(f"count({cat.CLUSTER_CLAIM_UNRESERVED.name}{csel()})"),
                 "Allocated claims that no pod reserves: their devices are taken and unused.",
                 thresholds=RED_FROM_ONE, width=6),
            stat("Devices held by no pod", or_zero(f"sum({cat.CLUSTER_CLAIM_UNRESERVED.name}{csel()})"),
                 "Devices allocated to claims that no pod reserves.", width=6),
            stat("Claims in use", or_zero(f"sum({cat.CLUSTER_CLAIMS.name}{csel(eq('state', 'reserved'))})"),
                 "Allocated claims a pod reserves.", width=6),
            Panel("Claims by state", "timeseries",
                  (t(f"sum by (state) ({cat.CLUSTER_CLAIMS.name}{csel()})", "{{state}}"),),
                  "ResourceClaims of the cluster: pending (not allocated, a pod waits for it), unused (not "
                  "allocated, no pod waits: never referenced, or its pods ended), allocated (reserved by no pod), "
                  "reserved (a pod uses it)."),
            Panel("Oldest pending claim by DeviceClass", "timeseries",
                  (t(f"max by (device_class) ({age_by_request})", "{{device_class}}"),),
                  "How long a pod has waited for the longest-pending claim that asks for each DeviceClass.", "s"),
            Panel("Pending claims and their age", "table", (tab(age_by_request),),
                  "Every pending claim with each request (subrequests as request/subrequest), the DeviceClass it "
                  "asks for and how long a pod has waited for the claim. Compare the class in the DeviceClasses "
                  "table: no device at all means nothing matches it, none free means it is exhausted.",
                  "s", columns=("namespace", "claim", "request", "device_class", "Value"),
                  renames=(("device_class", "DeviceClass"), ("Value", "pending for")),
                  thresholds=((900, "red"),), width=16),
            Panel("Pending claims by DeviceClass", "bargauge",
                  (now(f"count by (device_class) ({pending_claims})", "{{device_class}}"),),
                  "Pending claims that ask for each DeviceClass (a claim with requests for two classes counts "
                  "in both).", width=8),
            Panel("Why claims wait", "table",
                  (tab(f"{reasons}{csel()} and on (namespace, claim) {requests}{csel(cls)}"),),
                  "The first reason each pending claim cannot be allocated now, as the scheduler's allocator "
                  "finds it, and the request (or subrequest) it blocks (taken, counters_exhausted, tainted, "
                  "class_missing, pool_incomplete …; `dra-exporter explain NAMESPACE/CLAIM` says more). Claims "
                  "not asked about yet are not listed.",
                  columns=("namespace", "claim", "request", "reason"), width=24),
            Panel("Allocated claims no pod reserves", "table", (tab(f"{cat.CLUSTER_CLAIM_UNRESERVED.name}{csel()}"),),
                  "Allocated claims no pod reserves (a finished job's claim nobody deleted, a pod not created "
                  "yet): their devices are not free for anyone else.",
                  columns=("namespace", "claim", "Value"), renames=(("Value", "devices"),), width=24),
        ),
    )
    class_row = Row(
        "DeviceClasses",
        (
            stat("Classes nothing matches",
                 or_zero(f"count(sum by (device_class) ({classes}{csel(cls)}) == 0)"),
                 "DeviceClasses whose CEL selectors match no device: a claim for one waits for ever.",
                 thresholds=RED_FROM_ONE, width=8),
            stat("Exhausted classes",
                 or_zero(f"count(max by (device_class) ({placeable}{csel(cls)}) == 0 "
                         f"and on (device_class) sum by (device_class) ({classes}{csel(cls)}) > 0 "
                         f"and on (device_class) count by (device_class) ({requests}{csel(cls)}) > 0)"),
                 "Classes with devices, room for no claim, and claims waiting for them (DraDeviceClassExhausted's "
                 "condition).", thresholds=RED_FROM_ONE, width=8),
            stat("Classes not evaluable", or_zero(f"count({evaluable}{csel(cls)} == 0)"),
                 "DeviceClasses whose CEL selectors the exporter cannot run: they get no capacity series.",
                 thresholds=RED_FROM_ONE, width=8),
            Panel(
                "DeviceClasses",
                "table",
                (
                    *states("device_class", classes, cls),
                    tab(f"sum by (device_class) ({evaluable}{csel(cls)})"),
                    tab(f"sum by (device_class) ({cat.CLUSTER_CLASS_ERRORS.name}{csel(cls)})"),
                    tab(f"(count by (device_class) ({pending_claims}) "
                        f"or 0 * sum by (device_class) ({evaluable}{csel(cls)}))"),
                    tab(f"max by (device_class) ({placeable}{csel(cls)})"),
                ),
                "Each DeviceClass: the devices its CEL selectors match, by state; whether the exporter could "
                "evaluate its selectors (0: no capacity reported); devices its selectors failed on (a missing "
                "attribute: the scheduler refuses a claim on a node when its search reaches one); its pending "
                "claims; and how many claims for one of its devices the scheduler could place now.",
                columns=("device_class", *state_columns, "Value #F", "Value #G", "Value #H", "Value #I"),
                renames=(("device_class", "DeviceClass"), *state_renames, ("Value #F", "evaluable"),
                         ("Value #G", "selector errors"), ("Value #H", "pending claims"),
                         ("Value #I", "placeable claims")),
                width=24,
            ),
        ),
    )
    pool = "driver, pool"
    pools_row = Row(
        "Pools",
        (
            stat("Incomplete pools",
                 # The comparison first: ``==`` binds tighter than ``and``.
                 or_zero(f"count({cat.CLUSTER_POOL_COMPLETE.name}{csel(drv)} == 0 {on_nodes})"),
                 "Pools whose newest generation has not published all its slices (the scheduler allocates "
                 "nothing from them) or that still publish older ones (DraResourcePoolIncomplete).",
                 thresholds=RED_FROM_ONE, width=12),
            stat("Pools being replaced",
                 or_zero(f"count({cat.CLUSTER_POOL_SLICES.name}{csel(drv, eq('generation', 'older'))} > 0 "
                         f"{on_nodes})"),
                 "Pools that still publish slices of an older generation.", thresholds=RED_FROM_ONE, width=12),
            Panel(
                "Pool completeness",
                "table",
                (
                    tab(f"sum by ({pool}) ({cat.CLUSTER_POOL_COMPLETE.name}{csel(drv)} {on_nodes})"),
                    tab(f"sum by ({pool}) ({cat.CLUSTER_POOL_SLICES.name}{csel(drv, eq('generation', 'current'))} "
                        f"{on_nodes})"),
                    tab(f"sum by ({pool}) ({cat.CLUSTER_POOL_SLICES_EXPECTED.name}{csel(drv)} {on_nodes})"),
                    tab(f"sum by ({pool}) ({cat.CLUSTER_POOL_SLICES.name}{csel(drv, eq('generation', 'older'))} "
                        f"{on_nodes})"),
                ),
                "Each pool: complete (1) or not, the slices of its newest generation seen against its "
                "resourceSliceCount, and slices of older generations still there.",
                columns=("driver", "pool", "Value #A", "Value #B", "Value #C", "Value #D"),
                renames=(("Value #A", "complete"), ("Value #B", "slices"), ("Value #C", "expected"),
                         ("Value #D", "older slices")),
                thresholds=((1, "green"),),
                width=12,
            ),
            Panel("Where pools are", "table", (tab(f"{pools}{csel(*dev)}"),),
                  "Each pool's slices: on one node, for all nodes, a node selector, per-device node selection "
                  "or counters only (node is set for node only).",
                  columns=("driver", "pool", "node", "placement"), width=12),
        ),
    )
    taints_row = Row(
        "Taints",
        (
            Panel("Tainted devices by node", "bargauge",
                  (now(f"sum by (node) ({devices}{csel(*dev, eq('state', 'tainted'))})", "{{node}}"),),
                  "Unallocated devices a NoSchedule/NoExecute taint (the slice's own or a DeviceTaintRule's) "
                  "keeps from new claims. An allocated tainted device counts as allocated; the node agents' "
                  "dra_device_taint lists every taint.", width=8),
            Panel("DeviceTaintRules", "table", (tab(f"{cat.CLUSTER_TAINT_RULE_DEVICES.name}{csel(drv)}"),),
                  "Each DeviceTaintRule with its selector (driver, pool, device; empty: any) and taint, and the "
                  "devices it taints now (0: its selector matches none, or it uses the 1.33-1.34 CEL selectors, "
                  "which are not applied).",
                  columns=("rule", "driver", "pool", "device", "key", "value", "effect", "Value"),
                  renames=(("Value", "devices"),), width=16),
        ),
    )
    source = eq("source", "kubeapi")
    exporter = Row(
        "Exporter",
        (
            stat("API server data age", f"time() - max({cat.LAST_SUCCESS.name}{csel(source)})",
                 "Seconds since the cluster mode last read the API server successfully.", unit="s",
                 thresholds=((300, "red"),), width=8),
            stat("API server reads failing", f"1 - min({cat.SOURCE_UP.name}{csel(source)})",
                 "1 while the cluster mode's last read of the API server failed (it keeps the last good state).",
                 thresholds=RED_FROM_ONE, width=8),
            Panel("Objects held", "bargauge", (now(f"sum by (kind) ({cat.CLUSTER_OBJECTS.name}{csel()})", "{{kind}}"),),
                  "DRA objects the cluster mode keeps, by kind: its memory grows with these.", width=8),
        ),
    )
    return Dashboard(
        "dra-exporter-cluster-capacity",
        "dra-cluster-capacity.json",
        "DRA cluster capacity",
        "The whole cluster's DRA state from dra-exporter cluster: GPU-equivalents free and claims the scheduler "
        "could place per DeviceClass; devices by state per DeviceClass, MIG profile, node, driver and pool; MIG "
        "fragmentation; pending claims and their age; pools; taints.",
        (
            Variable("driver", "Driver", f"label_values({devices}{csel()}, driver)"),
            Variable("node", "Node", f"label_values({devices}{csel(drv)}, node)"),
            Variable("device_class", "DeviceClass", f"label_values({classes}{csel()}, device_class)"),
        ),
        (capacity, fragmentation, claims_row, class_row, pools_row, taints_row, exporter),
    )


def dashboards() -> tuple[Dashboard, ...]:
    return (overview(), claims(), node(), sharing(), compute_domain(), showback(), cluster_capacity())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 if a committed file is out of date")
    parser.add_argument("--out", type=Path, default=HERE, help="folder to write to [default: dashboards/]")
    args = parser.parse_args(argv)
    stale = []
    for dash in dashboards():
        path = args.out / dash.filename
        text = render(dash)
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
    if stale:
        print(f"out of date: {', '.join(stale)}; run: python dashboards/generate.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
