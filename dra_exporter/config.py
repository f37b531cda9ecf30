"""The programs' settings, built by the CLI from flags and ``DRA_EXPORTER_*`` env vars.

``ShellSettings`` is what every long-running program shares (where it serves, how often it builds
a frame, where it pushes, whether it runs simulated); ``Settings`` (the node agent: ``serve``,
``snapshot``, ``doctor``) and ``ClusterSettings`` (``cluster``) add their own on top.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .catalog import PodLabels
from .model import is_label_key
from .sources import registry

if TYPE_CHECKING:
    from .sinks.otlp import OtlpSettings
    from .sinks.webconfig import WebConfig

DEFAULT_LISTEN = "0.0.0.0:9401"  # 9400 is dcgm-exporter's: both can run side by side
DEFAULT_INTERVAL = 1.0
DEFAULT_CLUSTER_LISTEN = "0.0.0.0:9402"  # beside the node agent's 9401
DEFAULT_CLUSTER_INTERVAL = 15.0
#: The seconds ``--interval`` may be, per program. The node agent's cycle reads NVML (a 50 ms cycle
#: is a benchmark's, an hour the most that still makes a gauge); the cluster mode's objects arrive
#: by watch, and a frame of 5,000 nodes costs ~0.1-1 s, so a frame a second is the fastest asked.
NODE_INTERVAL_RANGE: tuple[float, float] = (0.05, 3600.0)
CLUSTER_INTERVAL_RANGE: tuple[float, float] = (1.0, 3600.0)
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


def parse_pod_labels(text: str | None) -> PodLabels:
    """``--pod-labels team,cost-center``: the pod label keys to export, each a Kubernetes label key."""
    keys = [k.strip() for k in (text or "").split(",")]
    if keys == [""]:
        return PodLabels()
    for key in keys:
        if not is_label_key(key):
            shown = key if len(key) <= 80 else key[:80] + "…"
            raise ConfigError(f"--pod-labels: {shown!r} is not a Kubernetes label key (a name of up to 63 "
                              f"letters, digits, '-', '_' and '.', optionally after a DNS prefix and '/'); "
                              f"give keys separated by commas, e.g. team,cost-center")
    try:
        return PodLabels(tuple(dict.fromkeys(keys)))
    except ValueError as exc:
        raise ConfigError(f"--pod-labels: {exc}") from None


def parse_self_pod(namespace: str | None, name: str | None) -> tuple[str, str] | None:
    if bool(namespace) != bool(name):
        raise ConfigError("--pod-namespace and --pod-name go together (set both from the downward API)")
    return (namespace, name) if namespace and name else None


@dataclass(frozen=True, slots=True)
class ShellSettings:
    """What every long-running program shares: the one option block of the CLI (``cli.shell_options``)."""

    listen: str = DEFAULT_LISTEN
    """Where /metrics, /healthz and /readyz are served."""
    interval: float = DEFAULT_INTERVAL
    """Seconds between collection cycles (and rendered frames)."""
    kubeconfig: str | None = None
    """Kubeconfig for the API server; None: the in-cluster service account, else $KUBECONFIG or
    ~/.kube/config (under --simulate: the simulated API server)."""
    simulate: str | None = None
    """A built-in scenario (the cluster mode: ``cluster``) or a scenario / cluster dump file; None
    runs against the real node or cluster."""
    prometheus: bool = True
    """Serve /metrics; off with --no-prometheus (then /healthz and /readyz are off too)."""
    web_config: WebConfig | None = None
    """TLS / client certificates / basic auth for the Prometheus endpoint (--web-config)."""
    otlp: OtlpSettings | None = None
    """Push to an OpenTelemetry collector when set."""
    max_objects: int | None = None
    """Objects of one kind the API-server reflectors hold (``--max-objects``); None: the source's default."""
    stall_timeout: float | None = None
    """Seconds without a finished collection cycle after which the cycle counts as stalled (its
    primary source reported down, /readyz failing; /healthz fails after as long again); None:
    ``default_stall_timeout``."""


@dataclass(frozen=True, slots=True)
class ClusterSettings(ShellSettings):
    """The cluster mode's settings: the shared ones, with its own defaults."""

    listen: str = DEFAULT_CLUSTER_LISTEN
    interval: float = DEFAULT_CLUSTER_INTERVAL
    """Seconds between frames; the objects themselves arrive by watch, whenever they change."""
    context: str | None = None
    """The kubeconfig context to use (``kubectl dra --context``); None: the kubeconfig's current one."""
    once: bool = False
    """One frame and exit (``--once``): it has every pending claim's reason, not a few shapes' a frame."""


@dataclass(frozen=True, slots=True)
class Settings(ShellSettings):
    """The node agent's settings: the shared ones and what only a node has."""

    node_name: str = ""
    """This node's name: the field selector for node-local API objects, and NVIDIA's pool name.
    ``""``: the simulated scenario's node, else the hostname."""
    procfs: str | None = None
    """Where the host's /proc is (GPU PIDs → pods); None: /proc, or the simulated one under --simulate."""
    cdi_root: str | None = None
    """Where DRA drivers write per-claim CDI specs; None: /var/run/cdi."""
    sources: frozenset[str] = field(default_factory=registry.default_enabled)
    """The sources to read (``sources.registry``; NVML always): each one's ``--[no-]source-<name>``.
    Without ``kubeapi`` (``--no-kubeapi``) the join is node-local."""
    claim_refresh: float = DEFAULT_CLAIM_REFRESH
    """Seconds after which a claim in use is fetched again for its status (device conditions):
    each claim costs the API server 3600 / claim_refresh GETs an hour."""
    kubelet_socket: str | None = None
    """Pod-resources socket; None means the default (or the simulated kubelet under --simulate)."""
    self_pod: tuple[str, str] | None = None
    """(namespace, name) of the exporter's own pod; its claims are monitoring claims."""
    pod_labels: PodLabels = PodLabels()
    """The pod labels ``dra_claim_consumer_info`` carries as ``label_<key>`` (``--pod-labels``); none by default."""
    naming: str = "native"
    """Metric names on the Prometheus endpoint: ``native``, ``dcgm`` (dcgm-exporter 4.8's names, units and
    labels), ``dcgm-4.10`` (4.9/4.10's) or ``both``; see ``dra_exporter.naming``. OTLP always uses the
    semantic names."""

    @property
    def kubeapi(self) -> bool:
        """Whether the API server is read (slices, claims, pods)."""
        return "kubeapi" in self.sources
