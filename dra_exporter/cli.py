"""Command line: ``dra-exporter serve | snapshot | doctor | demo | healthcheck | report | cluster | explain``.

Thin by design: parse flags (every flag also reads ``DRA_EXPORTER_<FLAG>``), build
``Settings``, hand over to ``runtime``. User errors exit with code 2 and one line.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import click

from . import __version__
from .boundedio import require_regular_file
from .config import (
    CLUSTER_INTERVAL_RANGE,
    DEFAULT_CLAIM_REFRESH,
    DEFAULT_CLUSTER_INTERVAL,
    DEFAULT_CLUSTER_LISTEN,
    DEFAULT_INTERVAL,
    DEFAULT_LISTEN,
    NODE_INTERVAL_RANGE,
    ClusterSettings,
    ConfigError,
    Settings,
    check_stall_timeout,
    parse_pod_labels,
    parse_self_pod,
)
from .demo import DEFAULT_BASE_PORT
from .naming import NAMINGS
from .sources import registry

if TYPE_CHECKING:
    from .sinks.otlp_settings import OtlpSettings, Protocol

ENV_PREFIX = "DRA_EXPORTER"


def _env(name: str) -> str:
    return f"{ENV_PREFIX}_{name.upper().replace('-', '_')}"


def _opt(*decls: str, **kw: Any) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A click option that also reads DRA_EXPORTER_<NAME> from the environment (``envvar=`` names
    another variable where one name would mean two things: ``tests/test_cli_environment.py``)."""
    long = next(d for d in decls if d.startswith("--")).lstrip("-").split("/")[0]
    kw.setdefault("envvar", _env(long))
    return click.option(*decls, show_envvar=True, **kw)


class FiniteFloat(click.FloatRange):
    """The type of every float option: a ``FloatRange`` that also refuses NaN and ±infinity.

    Python's ``float()`` reads "nan" and "inf", and NaN passes every range check (each comparison
    is False): ``--interval nan`` spun the serve loop at 100 % CPU and made ``snapshot`` crash.
    """

    name = "finite float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number", param, ctx)
        return super().convert(number, param, ctx)


#: The largest kubeconfig read (it is parsed here before the Kubernetes client reads it again): one
#: with embedded certificates for a few hundred contexts stays well under this.
MAX_KUBECONFIG_BYTES = 16 << 20


class FileOption(click.types.StringParamType):
    """The type of every option that names a file for the program to read: a web-config, a price file,
    a token, a certificate, a kubeconfig, a scenario.

    Refused here, in one line naming the option, unless it is a regular file: no reader may block on
    a FIFO or read /dev/zero for ever. The readers themselves go through ``boundedio`` and
    ``strict_yaml``; ``tests/test_cli_files.py`` feeds every option of this type a FIFO, a directory
    and /dev/zero, and every ``yaml`` one a repeated key.

    ``yaml``: the file is YAML. ``library_parses``: a library reads it itself (the Kubernetes
    client's kubeconfig, with a YAML loader that keeps the last of a repeated key), so it is read
    and parsed strictly here first. ``or_name``: a built-in name is accepted too (a scenario); the
    check applies where a file of that name exists.
    """

    name = "file"

    def __init__(self, *, yaml: bool = False, library_parses: bool = False, or_name: bool = False) -> None:
        self.yaml = yaml
        self.library_parses = library_parses
        self.or_name = or_name

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        path = os.fspath(value)
        if self.or_name and not os.path.lexists(path):
            return path
        try:
            if self.library_parses:
                from . import strict_yaml

                strict_yaml.load(strict_yaml.read_text(path, MAX_KUBECONFIG_BYTES))
            else:
                require_regular_file(path)
        except OSError as exc:
            self.fail(f"{path}: {exc.strerror or exc}", param, ctx)
        except ValueError as exc:  # strict_yaml.YamlFileError: one line, never the file's content
            self.fail(f"{path}: {exc}", param, ctx)
        return path


class Interval(FiniteFloat):
    """The type of every program's ``--interval``: seconds, in the program's one range
    (``config.NODE_INTERVAL_RANGE``, ``config.CLUSTER_INTERVAL_RANGE``)."""

    name = "seconds"

    def __init__(self, bounds: tuple[float, float]) -> None:
        super().__init__(min=bounds[0], max=bounds[1])


@dataclasses.dataclass(frozen=True, slots=True)
class ProgramOptions:
    """Where the shared options of the node agent and the cluster mode differ: defaults and words."""

    listen: str
    interval: float
    interval_range: tuple[float, float]
    interval_help: str
    interval_envvar: str
    """Its own variable per range: DRA_EXPORTER_INTERVAL is the node agent's (0.05 s and up), so a
    value meant for a node cannot reach the cluster mode, whose range starts at 1 s."""
    simulate_default: str
    simulate_help: str


NODE_OPTIONS = ProgramOptions(
    DEFAULT_LISTEN, DEFAULT_INTERVAL, NODE_INTERVAL_RANGE, "Seconds between collection cycles", _env("interval"),
    "demo", "Run on a simulated node: a built-in scenario (default 'demo') or a scenario YAML file.")
CLUSTER_OPTIONS = ProgramOptions(
    DEFAULT_CLUSTER_LISTEN, DEFAULT_CLUSTER_INTERVAL, CLUSTER_INTERVAL_RANGE,
    "Seconds between frames (the objects arrive by watch as they change)", _env("cluster-interval"),
    "cluster", "Run on a simulated cluster: the built-in 'cluster', or a cluster dump (kubectl get "
               "resourceslices,resourceclaims,deviceclasses,pods,nodes -A -o yaml).")

Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


def _apply(options: list[Decorator]) -> Decorator:
    def decorate(f: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(options):
            f = option(f)
        return f
    return decorate


def interval_option(program: ProgramOptions, what: str | None = None) -> Decorator:
    """A program's ``--interval``: its one type, range and variable; the range said in --help."""
    low, high = program.interval_range
    return _opt("--interval", type=Interval(program.interval_range), default=program.interval, show_default=True,
                envvar=program.interval_envvar, help=f"{what or program.interval_help}, {low:g} to {high:g}.")


def environment_options(program: ProgramOptions, *, interval: bool = True) -> Decorator:
    """What every program's environment needs: --simulate, --interval, --kubeconfig, --log-level
    (read back by ``_shell_settings``); ``interval`` False for a command that reads once (``explain``:
    an interval would mean nothing to it)."""
    return _apply([
        _opt("--simulate", "simulate", is_flag=False, flag_value=program.simulate_default, default=None,
             type=FileOption(yaml=True, or_name=True), metavar="[SCENARIO]", help=program.simulate_help),
        *([interval_option(program)] if interval else []),
        _opt("--kubeconfig", default=None, metavar="PATH", type=FileOption(yaml=True, library_parses=True),
             help="Kubeconfig for the API server [default: the in-cluster service account, else $KUBECONFIG or "
                  "~/.kube/config]. With --simulate it replaces the simulated API server."),
        _opt("--max-objects", type=click.IntRange(min=1), default=None, metavar="N",
             help="Objects of one kind held from the API server; past it the list or watch is refused with one "
                  "line and source_up says 0, instead of memory growing without bound [default: 10000 per kind "
                  "for a node; for the cluster mode 50000, claims and pods 250000]."),
        log_level_option,
    ])


def publishing_options(program: ProgramOptions) -> Decorator:
    """What every serving program publishes through: --listen, --[no-]prometheus, --web-config,
    --stall-timeout and the --otlp-* options (read back by ``_shell_settings``)."""
    return _apply([
        _opt("--listen", default=program.listen, show_default=True, metavar="HOST:PORT",
             help="Address for /metrics, /healthz and /readyz."),
        _opt("--prometheus/--no-prometheus", default=True, show_default=True,
             help="Serve the Prometheus endpoint (turn off to only push OTLP)."),
        _opt("--web-config", default=None, metavar="FILE", type=FileOption(yaml=True),
             help="TLS, client certificates, basic auth and headers for the endpoint "
                  "(the Prometheus exporter-toolkit web-config format)."),
        _opt("--stall-timeout", type=FiniteFloat(min=0, min_open=True), default=None, metavar="S",
             help="Seconds without a finished collection cycle (a hung NVML call, an API server that stopped "
                  "answering) after which the primary source is reported down and /readyz fails; /healthz "
                  "fails after as long again, so the kubelet restarts the pod [default: 10 intervals, at "
                  "least 30]."),
        _otlp_options,
    ])


kubelet_socket_option = _opt(
    "--kubelet-socket", default=None, metavar="PATH",
    help="Kubelet pod-resources socket [default: /var/lib/kubelet/pod-resources/kubelet.sock]. "
         "With --simulate it replaces the simulated kubelet.")
node_name_option = _opt(
    "--node-name", default=None, metavar="NAME",
    help="Node name, for the API server's spec.nodeName selectors [default: $NODE_NAME, else the "
         "scenario's node under --simulate, else the hostname].")
procfs_option = _opt(
    "--procfs", default=None, metavar="PATH",
    help="The host's /proc, to find the pod of each GPU process [default: /proc; the exporter needs "
         "hostPID: true]. With --simulate it replaces the simulated /proc.")

cdi_root_option = _opt(
    "--cdi-root", default=None, metavar="PATH",
    help="Where DRA drivers write their per-claim CDI specs, to find devices still prepared for claims the API "
         "server no longer has [default: /var/run/cdi; mount it read-only].")


def _source_switches() -> list[Decorator]:
    """``--source-<name>/--no-source-<name>`` for every source a flag may turn off, from the
    registry (as node_exporter's ``--[no-]collector.<name>``), each also read from
    ``DRA_EXPORTER_SOURCE_<NAME>``; a source's ``aliases`` keep older spellings working
    (``--no-kubeapi``, ``DRA_EXPORTER_KUBEAPI``)."""
    switches: list[Decorator] = []
    for spec in registry.sources():
        if not spec.switchable:
            continue
        names = [f"source-{spec.name}", *spec.aliases]
        switches.append(click.option(
            *(f"--{n}/--no-{n}" for n in names), _source_param(spec.name), default=spec.enabled_by_default,
            show_default=True, envvar=[_env(n) for n in names], show_envvar=True, help=spec.help))
    return switches


def _source_param(name: str) -> str:
    return f"source_{name}"


def _sources(kw: dict[str, Any]) -> frozenset[str]:
    """The enabled sources, from the switches (popped from ``kw``)."""
    return registry.enabled({spec.name: kw.pop(_source_param(spec.name))
                             for spec in registry.sources() if spec.switchable})


pod_options = [
    _opt("--pod-namespace", default=None, metavar="NS", help="Namespace of the exporter's own pod (downward API)."),
    _opt("--pod-name", default=None, metavar="NAME",
         help="Name of the exporter's own pod; its claims count as monitoring."),
]
naming_option = _opt(
    "--naming", type=click.Choice(NAMINGS), default="native", show_default=True,
    help="Metric names on /metrics: native, dcgm (dcgm-exporter 4.6-4.8's names, units and labels, for existing "
         "dashboards and alerts), dcgm-4.10 (dcgm-exporter 4.9 and 4.10's: DCGM 4.7's names, base units) or both "
         "(native and dcgm side by side). OTLP keeps the semantic names.")
pod_labels_option = _opt(
    "--pod-labels", default=None, metavar="KEY,…",
    help="Pod labels to put on dra_claim_consumer_info, comma-separated (team,cost-center), each as "
         "label_<key> with other characters than letters, digits and _ as _ (kube-state-metrics' spelling; "
         "\"\" where a pod lacks it): report --group-by label:<key> groups by them [default: none].")
log_level_option = _opt("--log-level", type=click.Choice(["debug", "info", "warning", "error"]),
                        default="info", show_default=True)


def node_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The node agent's programs (serve, snapshot, doctor): the environment and what only a node has."""
    return _apply([environment_options(NODE_OPTIONS), kubelet_socket_option, node_name_option, procfs_option,
                   cdi_root_option,
                   *_source_switches(),
                   _opt("--claim-refresh", type=FiniteFloat(min=10, max=86400), default=DEFAULT_CLAIM_REFRESH,
                        show_default=True, metavar="S",
                        help="Seconds after which each ResourceClaim in use on this node is fetched again, for "
                             "the status its driver writes (device conditions); each claim costs 3600/S API "
                             "requests an hour."),
                   *pod_options])(f)


def _shell_settings(kw: dict[str, Any], *, publishing: bool) -> dict[str, Any]:
    """The ``ShellSettings`` fields from the shared options (popped from ``kw``), checked together:
    one line and exit 2 for what cannot work. ``publishing``: the program serves (the publishing
    options are there)."""
    from .sinks.http import ListenAddressError, parse_listen

    shared: dict[str, Any] = {name: kw.pop(name) for name in ("interval", "kubeconfig", "simulate", "max_objects")
                              if name in kw}  # a one-shot command has no --interval: the settings' default
    if not publishing:
        return shared
    listen, prometheus, web_config, stall_timeout = (kw.pop(k) for k in ("listen", "prometheus", "web_config",
                                                                         "stall_timeout"))
    try:
        parse_listen(listen)  # fail at start-up, before anything else is built
        if stall_timeout is not None:
            check_stall_timeout(stall_timeout, shared["interval"])
    except (ConfigError, ListenAddressError) as exc:
        raise click.UsageError(str(exc)) from None
    otlp = _otlp_settings(kw)
    if not prometheus and otlp is None:
        raise click.UsageError("--no-prometheus needs --otlp-endpoint: otherwise nothing is published")
    if web_config and not prometheus:
        raise click.UsageError("--web-config protects the Prometheus endpoint, which --no-prometheus turns off")
    return {**shared, "listen": listen, "prometheus": prometheus, "otlp": otlp, "stall_timeout": stall_timeout,
            "web_config": _web_config(web_config) if web_config else None}


def _web_config(path: str) -> Any:
    from .sinks.webconfig import load_web_config

    return load_web_config(path)


def _settings(kw: dict[str, Any], *, publishing: bool = False) -> Settings:
    """The node agent's ``Settings`` from its options (popped from ``kw``)."""
    shell = _shell_settings(kw, publishing=publishing)
    try:
        return Settings(
            **shell,
            node_name=kw.pop("node_name") or os.environ.get("NODE_NAME") or "",
            kubelet_socket=kw.pop("kubelet_socket"),
            sources=_sources(kw),
            procfs=kw.pop("procfs"),
            cdi_root=kw.pop("cdi_root"),
            claim_refresh=kw.pop("claim_refresh"),
            self_pod=parse_self_pod(kw.pop("pod_namespace"), kw.pop("pod_name")),
            pod_labels=parse_pod_labels(kw.pop("pod_labels", None)),
        )
    except ConfigError as exc:
        raise click.UsageError(str(exc)) from None


def _user_errors(f: Callable[..., Any]) -> Callable[..., Any]:
    """Known user errors (bad scenario, bad setting) → one line on stderr, exit 2; no traceback."""

    @functools.wraps(f)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from dra_exporter_sim import ScenarioError

        from .showback import ShowbackError
        from .sinks.http import ListenAddressError
        from .sinks.otlp import OtlpConfigError
        from .sinks.tls import TlsError
        from .sinks.webconfig import WebConfigError

        try:
            return f(*args, **kwargs)
        except (ScenarioError, ConfigError, ListenAddressError, OtlpConfigError, WebConfigError, TlsError,
                ShowbackError) as exc:
            click.echo(f"dra-exporter: error: {exc}", err=True)
            sys.exit(2)

    return wrapper


def _snapshot_or_exit(take: Callable[[], Any]) -> Any:
    """``take()``'s frame; where it ran but found nothing usable, why on stderr and exit 1."""
    from . import runtime

    try:
        return take()
    except runtime.NothingUsable as exc:
        click.echo(f"dra-exporter: nothing to show: {exc}", err=True)
        sys.exit(1)


def _logging(level: str) -> None:
    logging.basicConfig(level=level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="dra-exporter")
def main() -> None:
    """GPU metrics for Kubernetes DRA, labelled by claim, pod, container and MIG partition."""


def _otlp_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The ``--otlp-*`` options of ``serve`` and ``cluster`` (read back by ``_otlp_settings``)."""
    options = [
        _opt("--otlp-endpoint", default=None, metavar="URL",
             help="Push metrics to this OpenTelemetry collector (e.g. http://collector:4317). "
                  "OTEL_EXPORTER_OTLP_(METRICS_)ENDPOINT also turns the push on."),
        _opt("--otlp-protocol", type=click.Choice(["grpc", "http/protobuf"]), default=None,
             help="OTLP transport [default: OTEL_EXPORTER_OTLP_(METRICS_)PROTOCOL, else grpc]."),
        _opt("--otlp-interval", type=FiniteFloat(min=0.1), default=10.0, show_default=True, metavar="S",
             help="Seconds between pushes."),
        _opt("--otlp-header", "otlp_headers", multiple=True, metavar="KEY=VALUE",
             help="Header sent with every push (repeatable), e.g. an API key."),
        _opt("--otlp-timeout", type=FiniteFloat(min=0.1), default=10.0, show_default=True, metavar="S",
             help="Seconds one push may take, retries included."),
        _opt("--otlp-insecure/--otlp-secure", default=None,
             help="gRPC without TLS [default: from the URL scheme]."),
        _opt("--otlp-certificate", default=None, metavar="FILE", type=FileOption(),
             help="CA bundle for the collector's certificate."),
        _opt("--otlp-client-certificate", default=None, metavar="FILE", type=FileOption(),
             help="Client certificate (mTLS)."),
        _opt("--otlp-client-key", default=None, metavar="FILE", type=FileOption(), help="Client key (mTLS)."),
    ]
    for option in reversed(options):
        f = option(f)
    return f


def _otlp_settings(kw: dict[str, Any]) -> OtlpSettings | None:
    """OtlpSettings from the --otlp-* flags (popped from ``kw``), or None when no push is asked for."""
    from .sinks.otlp import OtlpConfigError, OtlpSettings, parse_header

    flags = {k: kw.pop(k) for k in list(kw) if k.startswith("otlp_")}
    env_endpoint = os.environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT")
    if not flags["otlp_endpoint"] and not env_endpoint:
        return None
    protocol = flags["otlp_protocol"] or os.environ.get("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL") or os.environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc"
    try:
        return OtlpSettings(
            endpoint=flags["otlp_endpoint"] or "",  # "" lets the SDK read OTEL_EXPORTER_OTLP_*
            # An environment variable may say anything: OtlpSettings checks it (OtlpConfigError).
            protocol=cast("Protocol", protocol), interval=flags["otlp_interval"], timeout=flags["otlp_timeout"],
            headers=tuple(parse_header(h) for h in flags["otlp_headers"]),
            insecure=flags["otlp_insecure"], certificate_file=flags["otlp_certificate"],
            client_certificate_file=flags["otlp_client_certificate"],
            client_key_file=flags["otlp_client_key"],
        )
    except (OtlpConfigError, ValueError) as exc:
        raise click.UsageError(str(exc)) from None


@main.command()
@naming_option
@publishing_options(NODE_OPTIONS)
@node_options
@pod_labels_option
@_user_errors
def serve(naming: str, log_level: str, **kw: Any) -> None:
    """Collect every interval; serve the latest frame on /metrics and/or push it over OTLP."""
    from . import runtime

    if naming != "native" and not kw["prometheus"]:
        raise click.UsageError("--naming renames the Prometheus endpoint, which --no-prometheus turns off")
    _logging(log_level)  # before the web config, whose loading may warn
    settings = dataclasses.replace(_settings(kw, publishing=True), naming=naming)
    runtime.serve(settings)


@main.command()
@_opt("--format", "fmt", type=click.Choice(["prometheus", "openmetrics", "json", "table"]), default="table",
      show_default=True, help="Output format.")
@naming_option
@node_options
@pod_labels_option
@_user_errors
def snapshot(fmt: str, naming: str, log_level: str, **kw: Any) -> None:
    """Run one collection cycle (two samples, for rates) and print it."""
    from . import runtime

    settings = dataclasses.replace(_settings(kw), naming=naming)
    _logging("error" if log_level == "info" else log_level)
    # The table is the native view (its columns are native families); the other formats follow --naming.
    frame = _snapshot_or_exit(lambda: runtime.snapshot(settings, renamed=fmt != "table"))
    if fmt in ("prometheus", "openmetrics"):
        from .sinks.prometheus import render

        click.echo(render(frame, openmetrics=fmt == "openmetrics").decode(), nl=False)
    elif fmt == "json":
        from .sinks.text import render_json

        click.echo(render_json(frame))
    else:
        from .sinks.text import render_table

        click.echo(render_table(frame))


@main.command()
@node_options
@_user_errors
def doctor(log_level: str, **kw: Any) -> None:
    """Check what this node offers and print actionable findings."""
    from . import doctor as checks

    settings = _settings(kw)
    _logging("error" if log_level == "info" else log_level)
    findings = checks.run(settings)
    click.echo(checks.format_findings(findings))
    sys.exit(1 if any(f.level == "FAIL" for f in findings) else 0)


@main.command()
@_opt("--scenario", default="gb200-domain", show_default=True, metavar="SCENARIO",
      type=FileOption(yaml=True, or_name=True),
      help="A built-in scenario or a scenario file; every node of a multi-node one gets its exporter.")
@_opt("--base-port", type=click.IntRange(1, 65535), default=DEFAULT_BASE_PORT, show_default=True, metavar="PORT",
      help="Port of the first node's exporter; the others follow on consecutive ports (the default is clear of "
           "serve's 9401 and cluster's 9402).")
@_opt("--host", default="127.0.0.1", show_default=True, metavar="HOST", help="The address the exporters listen on.")
@interval_option(NODE_OPTIONS, "Seconds between collection cycles (and the printed scrape interval)")
@_user_errors
def demo(scenario: str, base_port: int, host: str, interval: float) -> None:
    """Start an exporter per node of a simulated cluster and print their Prometheus scrape config."""
    from dra_exporter_sim import load_scenario, node_names

    from . import demo as cluster_demo

    nodes = node_names(load_scenario(scenario))
    if base_port + len(nodes) - 1 > 65535:
        raise ConfigError(f"--base-port {base_port}: {len(nodes)} exporters need ports up to "
                          f"{base_port + len(nodes) - 1}, past 65535")
    taken = cluster_demo.ports_in_use(host, range(base_port, base_port + len(nodes)))
    if taken:
        raise ConfigError(f"--base-port {base_port}: port{'s' if len(taken) > 1 else ''} "
                          f"{', '.join(map(str, taken))} on {host} in use ({len(nodes)} exporters need "
                          f"{base_port}-{base_port + len(nodes) - 1}); pick another --base-port")
    sys.exit(cluster_demo.run(scenario, nodes, base_port, host, interval))


@main.command()
@_opt("--listen", default=DEFAULT_LISTEN, show_default=True, metavar="HOST:PORT",
      help="The address the exporter listens on.")
@_opt("--web-config", default=None, metavar="FILE", type=FileOption(yaml=True),
      help="The exporter's web-config (TLS: ask over HTTPS).")
@_user_errors
def healthcheck(listen: str, web_config: str | None) -> None:
    """Ask the exporter on this machine for /healthz (the image's HEALTHCHECK); exit 1 when unhealthy."""
    from .healthcheck import check

    problem = check(listen, web_config)
    if problem:
        click.echo(f"unhealthy: {problem}", err=True)
        sys.exit(1)


@main.command()
@_opt("--prometheus-url", "--prometheus", "prometheus", required=True, metavar="URL",
      help="Base URL of the Prometheus HTTP API (or Thanos, Mimir, VictoriaMetrics), e.g. http://prometheus:9090 "
           "(--prometheus is the older spelling).")
@_opt("--since", default=None, metavar="DURATION", help="Window ending at --end: 30m, 12h, 7d, 2w [default: 7d].")
@_opt("--start", default=None, metavar="TIME", help="Window start: RFC 3339 or Unix seconds (instead of --since).")
@_opt("--end", default=None, metavar="TIME", help="Window end: RFC 3339 or Unix seconds [default: now].")
@_opt("--step", default=None, metavar="DURATION",
      help="Resolution [default: 60s, the rules' interval; window/60 under an hour; coarser past 11000 points].")
@_opt("--format", "fmt", type=click.Choice(["table", "csv", "json"]), default="table", show_default=True,
      envvar=_env("report-format"), help="Output format (csv: one row per claim).")
@_opt("--price-per-gpu-hour", type=FiniteFloat(min=0), default=None, metavar="PRICE",
      help="Price of one hour of a whole GPU (a MIG device pays its share); adds cost columns.")
@_opt("--price-file", default=None, metavar="FILE", type=FileOption(yaml=True),
      help='Prices per GPU model, YAML or JSON: {"NVIDIA H200": 4.5, "default": 3.0, "currency": "EUR"}.')
@_opt("--currency", default=None, metavar="CODE",
      help="ISO 4217 code the prices are in (EUR, USD), named with the cost [default: the price file's "
           "currency, else none].")
@_opt("--idle-below", type=FiniteFloat(min=0, max=1), default=0.01, show_default=True, metavar="RATIO",
      help="A claim is idle while its busy share of what it holds stays below this.")
@_opt("--top", type=click.IntRange(min=0), default=10, show_default=True, metavar="N",
      help="How many idle claims to list.")
@_opt("--raw", is_flag=True, default=False,
      help="Compute from the raw series even where the recording rules run (slower).")
@_opt("--group-by", "grouping", default="namespace", show_default=True, metavar="namespace|claim|label:KEY",
      help="Totals per namespace, per claim only, or per value of a pod label (label:team: from the pods' "
           "label_team on dra_claim_consumer_info, else kube-state-metrics' kube_pod_labels).")
@_opt("--bearer-token-file", default=None, metavar="FILE", type=FileOption(),
      help="Send this file's token as a bearer token.")
@_opt("--basic-auth-user", default=None, metavar="USER", help="Basic auth user (with --basic-auth-password-file).")
@_opt("--basic-auth-password-file", default=None, metavar="FILE", type=FileOption(), help="Basic auth password file.")
@_opt("--ca-file", default=None, metavar="FILE", type=FileOption(), help="CA bundle for the server's TLS certificate.")
@_opt("--timeout", type=FiniteFloat(min=1), default=60.0, show_default=True, metavar="S",
      help="Seconds one query may take.")
@_user_errors
def report(prometheus: str, since: str | None, start: str | None, end: str | None, step: str | None, fmt: str,
           price_per_gpu_hour: float | None, price_file: str | None, currency: str | None, idle_below: float,
           top: int, raw: bool,
           grouping: str, bearer_token_file: str | None, basic_auth_user: str | None,
           basic_auth_password_file: str | None, ca_file: str | None, timeout: float) -> None:
    """GPU-hours held and busy per namespace and claim, idle claims and cost, from Prometheus."""
    import time

    from . import report as edge
    from . import showback

    if since and start:
        raise click.UsageError("--since and --start both say where the window starts: give one")
    if price_per_gpu_hour is not None and price_file:
        raise click.UsageError("--price-per-gpu-hour and --price-file both set prices: give one")
    if bool(basic_auth_user) != bool(basic_auth_password_file):
        raise click.UsageError("--basic-auth-user and --basic-auth-password-file go together")
    if bearer_token_file and basic_auth_user:
        raise click.UsageError("--bearer-token-file and basic auth both authenticate: give one")
    group = showback.group_by(grouping)
    until = showback.parse_time(end) if end else time.time()
    begin = showback.parse_time(start) if start else until - showback.parse_duration(since or "7d")
    resolution = showback.parse_duration(step) if step else showback.default_step(until - begin)
    prices = (edge.read_prices(price_file) if price_file else
              showback.Prices(default=price_per_gpu_hour) if price_per_gpu_hour is not None else None)
    if currency is not None:
        if prices is None:
            raise click.UsageError("--currency names what the prices are in: give --price-per-gpu-hour or "
                                   "--price-file too")
        prices = prices.in_currency(currency)
    client = edge.PrometheusClient(edge.Connection(
        prometheus,
        bearer_token=edge.read_secret(bearer_token_file, "--bearer-token-file") if bearer_token_file else None,
        basic_auth=(basic_auth_user, edge.read_secret(basic_auth_password_file, "--basic-auth-password-file"))
        if basic_auth_user and basic_auth_password_file else None,
        ca_file=ca_file, timeout=timeout))
    try:
        result = edge.run(client, start=begin, end=until, step=resolution, prices=prices, idle_below=idle_below,
                          top=top, use_rules=not raw, grouping=group,
                          warn=lambda note: click.echo(f"dra-exporter: note: {note}", err=True))
        render = {"table": showback.render_table, "csv": showback.render_csv, "json": showback.render_json}[fmt]
        text = render(result)
    except showback.NothingToReport as exc:
        click.echo(f"dra-exporter: nothing to report: {exc}", err=True)
        sys.exit(1)  # ran, but found nothing usable
    except MemoryError:
        text = None  # said below, once the exception (and what the report had built) is let go
    if text is None:
        click.echo("dra-exporter: error: out of memory building the report; ask for a shorter window or a longer "
                   "--step, or give the command more memory", err=True)
        sys.exit(1)
    click.echo(text, nl=fmt != "csv")


@main.command("recording-rules")
@pod_labels_option
@_opt("--price-file", default=None, metavar="FILE", type=FileOption(yaml=True),
      help="Also record these prices (report's price file) for the showback dashboard's cost panels.")
@_opt("--currency", default=None, metavar="CODE", help="ISO 4217 code the prices are in [default: the price file's].")
@_user_errors
def recording_rules(pod_labels: str | None, price_file: str | None, currency: str | None) -> None:
    """Print the showback recording rules (deploy/recording-rules.yaml) for exporters run with
    --pod-labels, and with the prices of --price-file recorded for the dashboards."""
    from . import report as edge
    from . import showback

    if currency is not None and not price_file:
        raise click.UsageError("--currency names what the prices are in: give --price-file too")
    prices = edge.read_prices(price_file).in_currency(currency) if price_file else None
    click.echo(showback.rules_yaml(parse_pod_labels(pod_labels), prices), nl=False)


@main.command()
@_opt("--once", is_flag=True, default=False,
      help="Print one frame (Prometheus text) and exit instead of serving.")
@publishing_options(CLUSTER_OPTIONS)
@environment_options(CLUSTER_OPTIONS)
@_user_errors
def cluster(once: bool, log_level: str, **kw: Any) -> None:
    """The DRA state of the whole cluster: capacity, free devices, partitions that fit, pending claims,
    pools, taint rules, on /metrics and/or pushed over OTLP (one replica per cluster; reads the API server
    only)."""
    from . import runtime
    from .cluster.runtime import CLUSTER

    if once:
        if kw["otlp_endpoint"] or not kw["prometheus"]:
            raise click.UsageError("--once prints one frame and exits: --otlp-endpoint and --no-prometheus "
                                   "are for serving")
        from .cluster.explain import unread_warnings
        from .sinks.prometheus import render

        settings = ClusterSettings(**_shell_settings(kw, publishing=False), once=True)
        _logging("error" if log_level == "info" else log_level)
        frame, snaps = _snapshot_or_exit(lambda: runtime.snapshot_and_sources(settings, CLUSTER))
        for line in unread_warnings(snaps.state) if snaps.state is not None else ():
            click.echo(f"dra-exporter: {line}", err=True)  # a kind it cannot read: pods forbidden
        click.echo(render(frame).decode(), nl=False)
        return
    _logging(log_level)  # before the web config, whose loading may warn
    runtime.serve(ClusterSettings(**_shell_settings(kw, publishing=True)), CLUSTER)


@main.command()
@click.argument("claim", required=False, metavar="[NAMESPACE/CLAIM|NAMESPACE/POD]")
@_opt("--all", "all_claims", is_flag=True, default=False, envvar=_env("explain-all"),
      help="Explain every ResourceClaim not yet allocated (instead of one).")
@_opt("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
      envvar=_env("explain-format"), help="text: what to paste into a ticket; json: for scripts.")
@_opt("--namespace", default=None, metavar="NS", envvar=_env("explain-namespace"),
      help="With --all: only the claims of this namespace [default: every namespace].")
@_opt("--context", default=None, metavar="NAME", envvar=_env("explain-context"),
      help="The kubeconfig context to read the cluster with [default: the kubeconfig's current context].")
@environment_options(CLUSTER_OPTIONS, interval=False)
@_user_errors
def explain(claim: str | None, all_claims: bool, fmt: str, namespace: str | None, context: str | None,
            log_level: str, **kw: Any) -> None:
    """Why is a ResourceClaim pending? Whether the scheduler could allocate it now and, per request,
    which devices match and what keeps the others (taken by which claims, tainted, counters used up,
    pools incomplete …), the blocking reason first. Reads the API server (or --simulate's cluster)
    once. A pod's name explains each of its claims, placed together as the scheduler places them.
    Exit 0 for a claim found, 2 for bad input or a name that is no claim or pod (or both)."""
    from . import runtime
    from .cluster import explain as why
    from .cluster.cel_worker import CelWorker
    from .cluster.runtime import EXPLAIN

    if bool(claim) == all_claims:
        hint = (f" (--simulate took {kw['simulate']!r} as its scenario: put the claim before it)"
                if not claim and "/" in str(kw.get("simulate") or "") and not os.path.lexists(kw["simulate"]) else "")
        raise click.UsageError(f"name one claim as NAMESPACE/CLAIM, or give --all{hint}")
    if namespace is not None and claim:
        raise click.UsageError("--namespace goes with --all; one claim is named as NAMESPACE/CLAIM")
    try:
        targets = [why.parse_target(claim)] if claim else []
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None
    settings = ClusterSettings(**_shell_settings(kw, publishing=False), context=context)
    _logging("error" if log_level == "info" else log_level)
    state = _snapshot_or_exit(lambda: runtime.snapshots(settings, EXPLAIN)).state
    for line in why.unread_warnings(state) if state is not None else ():
        click.echo(f"dra-exporter: {line}", err=True)
    engine = CelWorker()
    try:
        outcomes = why.explain(state, targets, engine, namespace=namespace)
    except why.ClaimNotFound as exc:
        click.echo(f"dra-exporter: {exc}", err=True)
        sys.exit(2)
    finally:
        engine.close()
    covers = why.coverage(state.nodes is not None)  # so that "placeable" is never read as more than it is
    single = bool(claim) and len(outcomes) == 1  # a pod's name gives a list, one per claim
    click.echo(why.render_json(outcomes, single=single, covers=covers) if fmt == "json"
               else why.render_text(outcomes, covers), nl=fmt == "json")


if __name__ == "__main__":
    main()
