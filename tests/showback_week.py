"""The week of a mixed cluster that docs/operating.md shows ``dra-exporter report`` on.

Whole H100 and A100 GPUs, H100 MIG devices (GPM: a busy signal), A100 and A30 MIG devices (no
busy signal: "unknown"), an A30 split into 4 compute slices, and a GPU shared by two pods; claims
that start and end. Its series are backfilled into a real Prometheus with the recording rules
(``test_showback_prometheus.backfill``), and the report's table is written between the markers
in docs/operating.md::

    python3 tests/showback_week.py          # needs promtool and prometheus (Debian's package)

The week is fixed (it starts 2026-11-02, a Monday), so the text only changes with the report.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from deploy_tools import REPO
from test_showback_prometheus import HOUR, backfill

DOC = REPO / "docs" / "operating.md"
T0 = 1793577600  # 2026-11-02T00:00:00Z
WEEK = 168
STEP = 300
H100, A100, A30 = "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA A30"
PRICES = {H100: 4.0, A100: 2.5, A30: 1.2}
CURRENCY = "EUR"


@dataclass(frozen=True)
class Device:
    node: str
    uuid: str
    gpu: str
    model: str
    profile: str = ""
    parent: str = ""
    busy_signal: bool = True
    """Whole GPUs (NVML utilisation) and Hopper MIG devices (GPM) have one; Ampere MIG devices none."""


@dataclass(frozen=True)
class Claim:
    namespace: str
    name: str
    devices: tuple[Device, ...]
    pods: tuple[str, ...]
    hours: tuple[int, int]
    util: float


def _gpu(node: str, i: int, model: str) -> Device:
    return Device(node, f"GPU-{node}-{i}", str(i), model)


def _mig(parent: Device, n: int, profile: str, signal: bool) -> Device:
    return Device(parent.node, f"MIG-{parent.node}-{parent.gpu}-{n}", parent.gpu, parent.model, profile,
                  parent.uuid, signal)


H = [_gpu("h100-node", i, H100) for i in range(4)]  # H[3] is MIG-enabled
A = [_gpu("a100-node", i, A100) for i in range(4)]  # A[3] is MIG-enabled
C = [_gpu("a30-node", i, A30) for i in range(2)]    # both MIG-enabled, 4 slices each
PARENTS = {H[3].uuid: 7, A[3].uuid: 7, C[0].uuid: 4, C[1].uuid: 4}
H_MIG = [_mig(H[3], 0, "3g.40gb", True), _mig(H[3], 1, "1g.10gb", True), _mig(H[3], 2, "1g.10gb", True)]
A_MIG = [_mig(A[3], 0, "3g.40gb", False), _mig(A[3], 1, "2g.20gb", False)]
C_MIG = [_mig(C[0], 0, "2g.12gb", False), _mig(C[0], 1, "1g.6gb", False), _mig(C[1], 0, "4g.24gb", False)]
DEVICES = (*H, *A, *C, *H_MIG, *A_MIG, *C_MIG)

CLAIMS = (
    Claim("ml-training", "llama-pretrain", (H[0], H[1]), ("llama-0",), (0, 120), 0.85),
    Claim("ml-training", "llama-finetune", (H[0], H[1]), ("ft-0",), (130, WEEK), 0.6),
    Claim("ml-training", "bert-a100", (A[0], A[1]), ("bert-0",), (0, WEEK), 0.7),
    Claim("inference", "vllm-h100-mig", (H_MIG[0],), ("vllm-0",), (0, WEEK), 0.45),
    Claim("inference", "embed-h100-mig", (H_MIG[1],), ("embed-0",), (24, WEEK), 0.2),
    Claim("inference", "rerank-a100-mig", (A_MIG[0],), ("rerank-0",), (0, WEEK), 0.5),
    Claim("inference", "ocr-a30-mig", (C_MIG[0], C_MIG[1]), ("ocr-0",), (0, WEEK), 0.3),
    Claim("research", "shared-notebook", (H[2],), ("alice", "bob"), (0, WEEK), 0.05),
    Claim("research", "forgotten-a100", (A[2],), ("sweep-0",), (48, WEEK), 0.0),
    Claim("batch", "nightly-a30", (C_MIG[2],), ("etl-0",), (0, WEEK), 0.9),
)
#: The pods' ``team`` label (kube-state-metrics' kube_pod_labels): teams cross namespaces; the
#: batch pod has none.
TEAMS = {"llama-pretrain": "foundation", "llama-finetune": "foundation", "bert-a100": "search",
         "vllm-h100-mig": "search", "embed-h100-mig": "search", "rerank-a100-mig": "search",
         "ocr-a30-mig": "docs-ai", "shared-notebook": "foundation", "forgotten-a100": "docs-ai"}


def _labels(**kw: str) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in kw.items() if v) + "}"


def openmetrics() -> str:
    grid = range(T0 - HOUR, T0 + (WEEK + 1) * HOUR, STEP)
    families: dict[str, list[str]] = {n: [] for n in (
        "dra_gpu_info", "dra_gpu_mig_compute_slices", "dra_gpu_up", "dra_gpu_utilization_ratio",
        "dra_gpu_sm_active_ratio", "dra_claim_consumer_info", "kube_pod_labels")}
    for d in DEVICES:
        mig_mode = "enabled" if d.uuid in PARENTS else ""
        info = _labels(instance=d.node, job="dra-exporter", uuid=d.uuid, gpu=d.gpu, model=d.model,
                       profile=d.profile, parent_uuid=d.parent, mig_mode=mig_mode)
        families["dra_gpu_info"] += [f"dra_gpu_info{info} 1 {t}" for t in grid]
        if d.uuid in PARENTS:
            slices = _labels(instance=d.node, job="dra-exporter", uuid=d.uuid, gpu=d.gpu)
            families["dra_gpu_mig_compute_slices"] += [f"dra_gpu_mig_compute_slices{slices} {PARENTS[d.uuid]} {t}"
                                                       for t in grid]
    for t in grid:
        hour = (t - T0) / HOUR
        for d in DEVICES:
            claim = next((c for c in CLAIMS if d in c.devices and c.hours[0] <= hour < c.hours[1]), None)
            who = {"namespace": claim.namespace, "claim": claim.name,
                   "pod": claim.pods[0] if len(claim.pods) == 1 else ""} if claim else {}
            labels = _labels(instance=d.node, job="dra-exporter", uuid=d.uuid, gpu=d.gpu, profile=d.profile,
                             parent_uuid=d.parent, **who)
            families["dra_gpu_up"].append(f"dra_gpu_up{labels} 1 {t}")
            if d.uuid in PARENTS or not d.busy_signal:
                continue  # a MIG-enabled GPU is only a parent; Ampere MIG devices have no busy signal
            # A day-night swing around the claim's mean, so the figures are not round.
            util = min(1.0, claim.util * (1.0 + 0.2 * (1 if int(hour) % 24 < 12 else -1))) if claim else 0.1
            family = "dra_gpu_sm_active_ratio" if d.profile else "dra_gpu_utilization_ratio"
            families[family].append(f"{family}{labels} {util:.4f} {t}")
        for c in CLAIMS:
            if c.hours[0] <= hour < c.hours[1]:
                for pod in c.pods:
                    who = _labels(instance=c.devices[0].node, job="dra-exporter", namespace=c.namespace,
                                  claim=c.name, pod=pod, container="main")
                    families["dra_claim_consumer_info"].append(f"dra_claim_consumer_info{who} 1 {t}")
                    if c.name in TEAMS:
                        pod_labels = _labels(job="kube-state-metrics", namespace=c.namespace, pod=pod,
                                             label_team=TEAMS[c.name])
                        families["kube_pod_labels"].append(f"kube_pod_labels{pod_labels} 1 {t}")
    out = []
    for name, lines in families.items():
        out.append(f"# TYPE {name} gauge")
        out += lines
    return "\n".join([*out, "# EOF"]) + "\n"


ARGS = ("--start", "2026-11-02", "--end", "2026-11-09", "--price-file", "prices.yaml")
BLOCKS = {"showback-week": (), "showback-week-team": ("--group-by", "label:team")}
"""Marker name in docs/operating.md → the report's extra arguments."""


def reports() -> dict[str, str]:
    """Each block's report (table), from one backfilled Prometheus."""
    out = {}
    with tempfile.TemporaryDirectory() as work:
        server = backfill(Path(work), openmetrics(), T0, T0 + WEEK * HOUR, STEP,
                          extra_args=["--storage.tsdb.retention.time=100y"])
        try:
            (Path(work) / "prices.yaml").write_text("".join(f'"{m}": {p}\n' for m, p in PRICES.items())
                                                    + f"currency: {CURRENCY}\n")
            for marker, extra in BLOCKS.items():
                proc = subprocess.run([sys.executable, "-m", "dra_exporter.cli", "report", "--prometheus",
                                       server.url, *ARGS, *extra], capture_output=True, text=True, timeout=600,
                                      check=True, cwd=work)
                command = " ".join(("dra-exporter report --prometheus http://prometheus:9090", *ARGS, *extra))
                out[marker] = f"```text\n$ {command}\n{proc.stdout}```\n"
        finally:
            server.stop()
    return out


def main() -> int:
    text = DOC.read_text()
    for marker, block in reports().items():
        start_mark, end_mark = f"<!-- {marker}:start -->\n", f"<!-- {marker}:end -->"
        start, end = text.index(start_mark) + len(start_mark), text.index(end_mark)
        text = text[:start] + block + text[end:]
    DOC.write_text(text)
    print(f"wrote the reports of the week into {DOC.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
