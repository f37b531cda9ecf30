"""``dra-exporter doctor``: what this node offers the exporter, as actionable findings."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from .config import DEFAULT_KUBELET_SOCKET, Settings

Level = Literal["OK", "WARN", "FAIL"]


@dataclass(frozen=True, slots=True)
class Finding:
    level: Level
    check: str
    message: str
    hint: str = ""


def run(settings: Settings) -> list[Finding]:
    sim = None
    if settings.simulate is not None:
        from .runtime import SNAPSHOT_SIM_TIME
        from .sim.clock import SimClock
        from .sim.node import SimulatedNode
        from .sim.scenario import load_scenario

        sim = SimulatedNode(load_scenario(settings.simulate), SimClock(SNAPSHOT_SIM_TIME, frozen=True),
                            kubelet=settings.kubelet_socket is None).start()
    try:
        nvml: Any
        if sim is not None:
            nvml = sim.nvml
        else:
            import pynvml

            nvml = pynvml
        socket = settings.kubelet_socket or (sim.kubelet.socket_path if sim and sim.kubelet
                                             else DEFAULT_KUBELET_SOCKET)
        findings = [*_nvml(nvml), *_kubelet(socket), *_apiserver(simulated=sim is not None)]
    finally:
        if sim is not None:
            sim.close()
    return findings


def format_findings(findings: list[Finding]) -> str:
    lines = []
    for f in findings:
        lines.append(f"[{f.level:<4}] {f.check}: {f.message}")
        if f.hint:
            lines.append(f"       → {f.hint}")
    fails = sum(f.level == "FAIL" for f in findings)
    warns = sum(f.level == "WARN" for f in findings)
    lines.append(f"{fails} problem(s), {warns} warning(s).")
    return "\n".join(lines)


def _nvml(nvml: Any) -> Iterator[Finding]:
    try:
        nvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - any failure here is the finding
        yield Finding("FAIL", "nvml", f"NVML could not be initialised: {exc}",
                      "Install the NVIDIA driver; in a pod use the NVIDIA container runtime (or mount "
                      "libnvidia-ml.so.1 and /dev/nvidia*), e.g. runtimeClassName: nvidia.")
        return
    try:
        yield Finding("OK", "nvml", f"driver {_text(nvml.nvmlSystemGetDriverVersion())}, "
                                    f"NVML {_text(nvml.nvmlSystemGetNVMLVersion())}")
        count = nvml.nvmlDeviceGetCount()
        if count == 0:
            yield Finding("WARN", "gpus", "NVML sees no GPU", "Check that the pod is granted the node's GPUs.")
        for i in range(count):
            yield from _gpu(nvml, i)
    finally:
        nvml.nvmlShutdown()


def _gpu(nvml: Any, i: int) -> Iterator[Finding]:
    try:
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        name, uuid = _text(nvml.nvmlDeviceGetName(h)), _text(nvml.nvmlDeviceGetUUID(h))
    except nvml.NVMLError as exc:
        yield Finding("FAIL", f"gpu {i}", f"unreadable: {exc}", "Check `nvidia-smi -i {i}` and dmesg for XIDs.")
        return
    try:
        mig = "MIG enabled" if nvml.nvmlDeviceGetMigMode(h)[0] else "MIG disabled"
    except nvml.NVMLError:
        mig = "MIG not supported"
    try:
        gpm = bool(nvml.nvmlGpmQueryDeviceSupport(h).isSupportedDevice)
    except nvml.NVMLError:
        gpm = False
    yield Finding("OK", f"gpu {i}", f"{name} {uuid}, {mig}, GPM {'supported' if gpm else 'not supported'}",
                  "" if gpm else "Profiling ratios (SM active, tensor active…) need GPM (Hopper or newer).")


def _kubelet(path: str) -> Iterator[Finding]:
    try:
        mode = os.stat(path).st_mode
    except OSError:
        yield Finding("FAIL", "kubelet", f"pod-resources socket {path} not found",
                      "Mount /var/lib/kubelet/pod-resources read-only into the exporter's pod.")
        return
    if not stat.S_ISSOCK(mode):
        yield Finding("FAIL", "kubelet", f"{path} is not a socket")
        return
    from .sources import SourceError
    from .sources.podresources import PodResourcesSource

    source = PodResourcesSource(path, timeout=3.0)
    try:
        snap = source.collect()
    except SourceError as exc:
        yield Finding("FAIL", "kubelet", str(exc), "Is the kubelet running? Does the pod run as root or with "
                                                   "access to the socket?")
        return
    finally:
        source.close()
    claims = {(c.namespace, c.name) for p in snap.pods for ctr in p.containers for c in ctr.claims}
    yield Finding("OK", "kubelet", f"pod-resources answers: {len(snap.pods)} pods, {len(claims)} DRA claims")
    if snap.pods and not claims:
        yield Finding("WARN", "kubelet", "no pod on this node reports DRA claims",
                      "Kubernetes < 1.34 needs the kubelet feature gate KubeletPodResourcesDynamicResources=true.")


def _apiserver(*, simulated: bool) -> Iterator[Finding]:
    if simulated:
        yield Finding("WARN", "apiserver", "not simulated: node-local attribution only")
        return
    in_cluster = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    kubeconfig = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
    if not in_cluster and not os.path.exists(kubeconfig):
        yield Finding("WARN", "apiserver", "no in-cluster service account and no kubeconfig",
                      "Without the API server, request names, pod UIDs and admin access stay unknown.")
        return
    yield Finding("OK", "apiserver", "in-cluster config found" if in_cluster else f"kubeconfig {kubeconfig}")


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
