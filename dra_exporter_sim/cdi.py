"""A CDI root for the simulated node: the per-claim specs its scenario says a driver left behind
(``leftover_cdi_specs``), in the shape NVIDIA's ``gpu-kubelet-plugin`` writes them
(``k8s.gpu.nvidia.com-claim_<uid>.yaml``, kind ``k8s.gpu.nvidia.com/claim``, devices ``<uid>-<device>``;
other drivers under ``k8s.<driver>``, as Kubernetes' DRA helper names them)."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from .scenario import Scenario


def spec_text(vendor: str, claim_uid: str, devices: tuple[str, ...]) -> str:
    """A per-claim CDI spec as the real plugin writes it (device nodes and hooks left out)."""
    lines = ["---", "cdiVersion: 0.5.0", f"kind: {vendor}/claim", "devices:"]
    for device in devices:
        lines += [f"    - name: {claim_uid}-{device}", "      containerEdits: {}"]
    return "\n".join([*lines, "containerEdits: {}", ""])


class SimulatedCdiRoot:
    """Owns a temp directory laid out like ``/var/run/cdi`` with the scenario's leftover specs."""

    def __init__(self, scenario: Scenario) -> None:
        self.root = tempfile.mkdtemp(prefix="dra-exporter-cdi-")
        for spec in scenario.leftover_cdi_specs:
            vendor = f"k8s.{spec.driver}"
            Path(self.root, f"{vendor}-claim_{spec.claim_uid}.yaml").write_text(
                spec_text(vendor, spec.claim_uid, spec.devices))

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
