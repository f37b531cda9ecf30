"""A fake ``/proc`` for the simulated node: ``<pid>/cgroup`` and ``<pid>/stat`` of every
scenario process, in the cgroup path shapes real kubelets produce.

Written once: a PID belongs to one container for the whole scenario, and which processes
run at a given time is NVML's answer (the fake NVML), not the file tree's.
"""

from __future__ import annotations

import hashlib
import shutil
import tempfile
from pathlib import Path

from .scenario import Pod, Scenario

# (cgroup driver, runtime) shapes; each pod gets one, chosen from its UID, so a scenario
# exercises several at once.
_SHAPES = ("systemd-containerd", "systemd-crio", "cgroupfs-containerd", "cgroupfs-v1-docker")


def cgroup_file(pod: Pod, container_id: str, shape: str) -> str:
    """The ``/proc/<pid>/cgroup`` content a process of this container would have."""
    cid = container_id.rpartition("://")[2]
    uid, escaped = pod.uid, pod.uid.replace("-", "_")
    if shape == "systemd-containerd":
        return (f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{escaped}.slice/"
                f"cri-containerd-{cid}.scope\n")
    if shape == "systemd-crio":
        return f"0::/kubepods.slice/kubepods-pod{escaped}.slice/crio-{cid}.scope\n"
    if shape == "cgroupfs-containerd":
        return f"0::/kubepods/besteffort/pod{uid}/{cid}\n"
    return "".join(f"{n}:{ctl}:/kubepods/burstable/pod{uid}/{cid}\n"
                   for n, ctl in ((12, "memory"), (11, "cpu,cpuacct"), (1, "name=systemd"))) + "0::/\n"


def shape_for(pod: Pod) -> str:
    return _SHAPES[hashlib.sha256(pod.uid.encode()).digest()[0] % len(_SHAPES)]


class SimulatedProcfs:
    """Owns a temp directory laid out like ``/proc`` for the scenario's GPU processes."""

    def __init__(self, scenario: Scenario) -> None:
        self.root = tempfile.mkdtemp(prefix="dra-exporter-procfs-")
        for pod in scenario.pods:
            for container in pod.containers:
                for proc in container.processes:
                    d = Path(self.root, str(proc.pid))
                    d.mkdir(exist_ok=True)
                    (d / "cgroup").write_text(cgroup_file(pod, container.container_id, shape_for(pod)))
                    # Start time (field 22) fixed per PID: the same process for the whole run.
                    fields = ["S"] + ["0"] * 18 + [str(proc.pid * 7)]
                    (d / "stat").write_text(f"{proc.pid} (python3) {' '.join(fields)} 0 0\n")

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)
