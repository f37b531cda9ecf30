"""``dra-exporter doctor``: what this node offers the exporter, as actionable findings."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Literal

from . import environment
from .config import Settings
from .environment import Environment
from .runtime import SNAPSHOT_SIM_TIME

Level = Literal["OK", "WARN", "FAIL"]


@dataclass(frozen=True, slots=True)
class Finding:
    level: Level
    check: str
    message: str
    hint: str = ""


def run(settings: Settings) -> list[Finding]:
    """The findings on the environment the node agent would run in (``environment.node``, the
    simulated one under --simulate, on the frozen clock ``snapshot`` looks at)."""
    env = environment.node(settings, sim_time=SNAPSHOT_SIM_TIME)
    try:
        return [*_nvml(env.context.nvml), *_kubelet(env.context.kubelet_socket), *_apiserver(settings, env)]
    finally:
        env.close()


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
        driver = _text(nvml.nvmlSystemGetDriverVersion())
        yield Finding("OK", "nvml", f"driver {driver}, NVML {_text(nvml.nvmlSystemGetNVMLVersion())}")
        count = nvml.nvmlDeviceGetCount()
        if count == 0:
            yield Finding("WARN", "gpus", "NVML sees no GPU", "Check that the pod is granted the node's GPUs.")
        for i in range(count):
            yield from _gpu(nvml, i, driver)
    finally:
        nvml.nvmlShutdown()


def _gpu(nvml: Any, i: int, driver: str) -> Iterator[Finding]:
    try:
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        name, uuid = _text(nvml.nvmlDeviceGetName(h)), _text(nvml.nvmlDeviceGetUUID(h))
    except nvml.NVMLError as exc:
        yield Finding("FAIL", f"gpu {i}", f"unreadable: {exc}", "Check `nvidia-smi -i {i}` and dmesg for XIDs.")
        return
    try:
        mig_on = nvml.nvmlDeviceGetMigMode(h)[0] == nvml.NVML_DEVICE_MIG_ENABLE
        mig = "MIG enabled" if mig_on else "MIG disabled"
    except nvml.NVMLError:
        mig_on, mig = False, "MIG not supported"
    gpm, hint = _gpm(nvml, h, driver)
    level: Level = "OK"
    if mig_on and not _has_mig_devices(nvml, h):
        level, mig = "WARN", "MIG enabled but no MIG devices"
        hint = ("Nothing can run on it and no partition is reported until MIG devices exist: create them "
                "(nvidia-smi mig -cgi … -C, or let the DRA driver's dynamic MIG do it)"
                + (f". {hint}" if hint else "."))
    yield Finding(level, f"gpu {i}", f"{name} {uuid}, {mig}, {gpm}", hint)


def _gpm(nvml: Any, handle: Any, driver: str) -> tuple[str, str]:
    """GPM's state and, where missing, what would bring it: a newer GPU, or a newer driver."""
    try:
        supported = bool(nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
    except nvml.NVMLError as exc:
        if getattr(exc, "value", None) == nvml.NVML_ERROR_FUNCTION_NOT_FOUND:
            return (f"GPM not available: driver {driver} lacks it",
                    "Profiling ratios (SM active, tensor active…) need a driver with the GPM API; "
                    "update the NVIDIA driver.")
        return f"GPM unknown ({exc})", ""
    except AttributeError:  # a pynvml older than GPM
        return "GPM not available: this pynvml lacks it", "Install a newer nvidia-ml-py."
    if supported:
        return "GPM supported", ""
    return "GPM not supported", "Profiling ratios (SM active, tensor active…) need GPM (Hopper or newer)."


def _has_mig_devices(nvml: Any, handle: Any) -> bool:
    try:
        slots = int(nvml.nvmlDeviceGetMaxMigDeviceCount(handle))
    except nvml.NVMLError:
        return True  # cannot tell: say nothing rather than something wrong
    for slot in range(slots):
        try:
            nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
            return True
        except nvml.NVMLError as exc:
            if getattr(exc, "value", None) != nvml.NVML_ERROR_NOT_FOUND:
                return True
    return False


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


def _apiserver(settings: Settings, env: Environment) -> Iterator[Finding]:
    """Discovery, the resource.k8s.io version read, and the access the source needs (RBAC)."""
    if not settings.kubeapi:
        yield Finding("WARN", "apiserver", "turned off (--no-kubeapi): node-local attribution only")
        return
    from .sources import SourceError
    from .sources.kubeapi import discover, load_client, probe

    ctx = env.context
    try:
        client = ctx.kube_client() if ctx.kube_client is not None else load_client(ctx.kubeconfig)
    except SourceError as exc:
        yield Finding("WARN", "apiserver", str(exc).removeprefix("kubeapi: "),
                      "Run in a pod with a service account (or pass --kubeconfig): without the API server, "
                      "request names, pod UIDs, admin access, slice devices, taints and health stay unknown.")
        return
    try:
        try:
            served, version = discover(client, timeout=5.0)
        except SourceError as exc:
            yield Finding("FAIL", "apiserver", str(exc).removeprefix("kubeapi: "),
                          "Check the API server address and that DRA (resource.k8s.io) is enabled.")
            return
        host = client.configuration.host
        yield Finding("OK", "apiserver", f"{host} serves resource.k8s.io {', '.join(served)}; reading {version}")
        # The simulated API server allows everything and has no authoriser to ask.
        for result in probe(client, ctx.node_name, version, timeout=5.0, access_review=not env.simulated_apiserver):
            yield Finding("OK" if result.ok else "FAIL", "apiserver", result.message,
                          "" if result.ok else "Bind a ClusterRole with get/list/watch on resourceslices, "
                                               "resourceclaims and pods to the exporter's service account.")
    finally:
        client.close()


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
