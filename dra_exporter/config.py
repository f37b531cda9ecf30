"""One frozen ``Settings`` object, built by the CLI from flags and ``DRA_EXPORTER_*`` env vars."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .sources import registry

if TYPE_CHECKING:
    from .sinks.otlp import OtlpSettings
    from .sinks.webconfig import WebConfig

DEFAULT_LISTEN = "0.0.0.0:9401"  # 9400 is dcgm-exporter's: both can run side by side
DEFAULT_INTERVAL = 1.0
DEFAULT_KUBELET_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULT_CLAIM_REFRESH = 300.0
#: A cycle counts as stalled once none has finished for this many intervals, and never sooner
#: than STALL_FLOOR_S: a first cycle may wait 10 s for its side sources, and a real NVML read of
#: a big node can take a few seconds under load.
STALL_INTERVALS = 10
STALL_FLOOR_S = 30.0


class ConfigError(ValueError):
    """A setting is invalid; the message names it and says what is expected."""


def default_stall_timeout(interval: float) -> float:
    """Seconds without a finished collection cycle after which the cycle counts as stalled."""
    return max(STALL_INTERVALS * interval, STALL_FLOOR_S)


def check_stall_timeout(stall_timeout: float, interval: float) -> float:
    """``stall_timeout`` if it can tell a stalled cycle from a slow one, else a ``ConfigError``."""
    if not math.isfinite(stall_timeout) or stall_timeout < 2 * interval:
        raise ConfigError(f"--stall-timeout must be a number of seconds of at least twice --interval "
                          f"({2 * interval:g} s), got {stall_timeout:g}: a cycle takes up to one interval")
    return stall_timeout


def parse_self_pod(namespace: str | None, name: str | None) -> tuple[str, str] | None:
    if bool(namespace) != bool(name):
        raise ConfigError("--pod-namespace and --pod-name go together (set both from the downward API)")
    return (namespace, name) if namespace and name else None


@dataclass(frozen=True, slots=True)
class Settings:
    listen: str = DEFAULT_LISTEN
    """Where /metrics, /healthz and /readyz are served."""
    interval: float = DEFAULT_INTERVAL
    """Seconds between NVML collection cycles (and rendered frames)."""
    node_name: str = ""
    """This node's name: the field selector for node-local API objects, and NVIDIA's pool name.
    ``""``: the simulated scenario's node, else the hostname."""
    procfs: str | None = None
    """Where the host's /proc is (GPU PIDs → pods); None: /proc, or the simulated one under --simulate."""
    sources: frozenset[str] = field(default_factory=registry.default_enabled)
    """The sources to read (``sources.registry``; NVML always): each one's ``--[no-]source-<name>``.
    Without ``kubeapi`` (``--no-kubeapi``) the join is node-local."""
    claim_refresh: float = DEFAULT_CLAIM_REFRESH
    """Seconds after which a claim in use is fetched again for its status (device conditions):
    each claim costs the API server 3600 / claim_refresh GETs an hour."""
    kubeconfig: str | None = None
    """Kubeconfig for the API server; None: the in-cluster service account, else $KUBECONFIG or
    ~/.kube/config (under --simulate: the simulated API server)."""
    simulate: str | None = None
    """Built-in scenario name or scenario file; None runs against the real node."""
    kubelet_socket: str | None = None
    """Pod-resources socket; None means the default (or the simulated kubelet under --simulate)."""
    self_pod: tuple[str, str] | None = None
    """(namespace, name) of the exporter's own pod; its claims are monitoring claims."""
    prometheus: bool = True
    """Serve /metrics; off with --no-prometheus (then /healthz and /readyz are off too)."""
    web_config: WebConfig | None = None
    """TLS / client certificates / basic auth for the Prometheus endpoint (--web-config)."""
    otlp: OtlpSettings | None = None
    """Push to an OpenTelemetry collector when set."""
    stall_timeout: float | None = None
    """Seconds without a finished collection cycle after which the cycle counts as stalled (NVML
    reported down, /readyz failing; /healthz fails after as long again); None: ``default_stall_timeout``."""
    naming: str = "native"
    """Metric names on the Prometheus endpoint: ``native``, ``dcgm`` (dcgm-exporter's names, units and
    labels) or ``both``; see ``dra_exporter.naming``. OTLP always uses the semantic names."""

    @property
    def kubeapi(self) -> bool:
        """Whether the API server is read (slices, claims, pods)."""
        return "kubeapi" in self.sources
