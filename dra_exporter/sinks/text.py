"""Human-readable and JSON renderings of a frame, for ``dra-exporter snapshot``."""

from __future__ import annotations

import json
from collections import defaultdict

from .. import catalog as cat
from .. import printable
from ..model import Frame


def render_json(frame: Frame) -> str:
    """Every family with its samples; labels as objects. Stable key order."""
    doc = {
        "timestamp": frame.timestamp,
        "metrics": {
            fam.name: [{"labels": dict(s.labels), "value": s.value} for s in fam.samples]
            for fam in frame.families
        },
    }
    return json.dumps(doc, indent=2, ensure_ascii=False)


_COLUMNS = ("GPU", "UUID", "PROFILE", "UP", "UTIL", "MEMORY USED / TOTAL", "POWER", "TEMP",
            "NAMESPACE", "POD", "CONTAINER", "CLAIM")


def render_table(frame: Frame) -> str:
    """One line per GPU and MIG device, like ``nvidia-smi``, with who holds it."""
    values: dict[str, dict[str, float]] = defaultdict(dict)
    labels: dict[str, dict[str, str]] = {}
    wanted = {spec.name for spec in (cat.GPU_UP, cat.GPU_UTILIZATION, cat.GPU_MEMORY_USED, cat.GPU_MEMORY_TOTAL,
                                     cat.GPU_POWER, cat.GPU_TEMPERATURE)}
    for fam in frame.families:
        if fam.name not in wanted:
            continue
        for s in fam.samples:
            lbl = dict(s.labels)
            values[lbl["uuid"]][fam.name] = s.value
            labels.setdefault(lbl["uuid"], lbl)
    order = sorted(labels, key=lambda u: (int(labels[u]["gpu"]), labels[u]["parent_uuid"] != "", u))
    rows = [_COLUMNS]
    for uuid in order:
        lbl, v = labels[uuid], values[uuid]
        rows.append((
            lbl["gpu"], _short(uuid), lbl["profile"] or "-", "yes" if v.get(cat.GPU_UP.name) else "NO",
            _pct(v.get(cat.GPU_UTILIZATION.name)),
            f"{_gib(v.get(cat.GPU_MEMORY_USED.name))} / {_gib(v.get(cat.GPU_MEMORY_TOTAL.name))}",
            _unit(v.get(cat.GPU_POWER.name), "W"), _unit(v.get(cat.GPU_TEMPERATURE.name), "C"),
            lbl["namespace"] or "-", lbl["pod"] or ("(shared)" if lbl["claim"] else "-"),
            lbl["container"] or "-", lbl["claim"] or "-",
        ))
    # Names come from the kubelet and NVML: shown, never obeyed by the terminal.
    shown = [[printable.for_terminal(cell) for cell in row] for row in rows]
    widths = [max(len(r[i]) for r in shown) for i in range(len(_COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in shown)


def _short(uuid: str) -> str:
    return uuid if len(uuid) <= 16 else uuid[:15] + "…"


def _pct(v: float | None) -> str:
    return "-" if v is None else f"{v * 100:.0f}%"


def _gib(v: float | None) -> str:
    return "-" if v is None else f"{v / 2**30:.1f}GiB"


def _unit(v: float | None, unit: str) -> str:
    return "-" if v is None else f"{v:.0f}{unit}"
