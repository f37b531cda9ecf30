"""The servers the benchmarks start as child processes (so a scraper never shares their GIL).

``python -m benchmarks.servers exporter [--renderer reference] [--gzip-on-scrape] [--nagle] [--unbounded-heads]
[--global-cap-only] -- ARGS``
    dra-exporter's own command line (``ARGS`` as for ``dra-exporter``); with
    ``--renderer reference`` the sink renders with prometheus_client instead of
    ``sinks.exposition``: the exporter as it was before this renderer. With
    ``--gzip-on-scrape`` the sink never compresses ahead at publish time: the first scrape
    of each frame that wants gzip compresses it, as before ``GZIP_AHEAD_S``. With ``--nagle``
    accepted sockets keep Nagle's algorithm on (no ``TCP_NODELAY``), as before issue 13; with
    ``--unbounded-heads`` a request head is bounded only by the stdlib's 100 lines of 64 KiB,
    as before ``MAX_HEAD_BYTES`` and the shared head budget; with ``--global-cap-only`` the server has
    its global connection cap alone, no per-client cap and no probe reserve, as before issue 13.
``python -m benchmarks.servers frozen --simulate SCENARIO --listen HOST:PORT``
    dra-exporter's runtime on a stopped simulated clock and without its collection loop: two
    cycles, then the sink serves that frame until stopped. Scraping it measures the HTTP
    server alone, with no cycle competing for the interpreter.
``python -m benchmarks.servers per-scrape --simulate SCENARIO --listen HOST:PORT``
    the per-scrape baseline: prometheus_client's HTTP server with a collector that reads the
    simulated NVML, joins and builds the families on every request (``baseline.py``).
"""

from __future__ import annotations

import argparse
import platform
import signal
import threading

from dra_exporter import __version__
from dra_exporter.sinks.http import parse_listen

from .baseline import PerScrapeCollector, render_reference


def _exporter(renderer: str, gzip_on_scrape: bool, nagle: bool, unbounded_heads: bool, global_cap_only: bool,
              args: list[str]) -> None:
    from dra_exporter import cli
    from dra_exporter.sinks import http, prometheus

    if nagle:
        http._disable_nagle = lambda sock: None  # type: ignore[assignment]  # looked up per connection
    if unbounded_heads:
        # Read per line and per server start: 100 header lines of 64 KiB and a request line.
        http.MAX_HEAD_BYTES = http.HEAD_ALLOWANCE_BYTES = http.SHARED_HEAD_BYTES = 102 << 16  # type: ignore[misc]

    if global_cap_only:
        http.PROBE_RESERVE = 0  # type: ignore[misc]  # read per connection
        plain_init = http.MetricsServer.__init__

        def one_cap(self: http.MetricsServer, *a: object, **kw: object) -> None:
            kw["max_connections_per_client"] = kw.get("max_connections", 256)
            plain_init(self, *a, **kw)  # type: ignore[arg-type]

        http.MetricsServer.__init__ = one_cap  # type: ignore[method-assign]

    if renderer == "reference":
        prometheus.render = render_reference  # type: ignore[assignment]  # publish() looks it up per call
    if gzip_on_scrape:
        prometheus.GZIP_AHEAD_S = 0.0  # type: ignore[misc]  # publish() reads it per call
    cli.main(args=args, prog_name="dra-exporter")


def _wait_for_signal() -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()


def _frozen(scenario: str, listen: str) -> None:
    from dra_exporter import runtime
    from dra_exporter.config import Settings

    rt = runtime.build(Settings(listen=listen, simulate=scenario), sim_time=600.0, publish=True)
    try:
        rt.agent.cycle(collect_side=True)
        rt.sim.clock.advance(1.0)
        rt.agent.cycle(collect_side=True)  # a second sample, so rates (GPM) are in the frame
        _wait_for_signal()
    finally:
        rt.close()


def _per_scrape(scenario_name: str, listen: str) -> None:
    from prometheus_client import CollectorRegistry, start_http_server

    from dra_exporter.join import JoinInput, join
    from dra_exporter.sources.nvml import NvmlSource
    from dra_exporter_sim import load_scenario
    from dra_exporter_sim.clock import SimClock
    from dra_exporter_sim.fake_nvml import FakeNvml

    scenario = load_scenario(scenario_name)
    clock = SimClock()  # follows the wall clock, as under `serve --simulate`
    source = NvmlSource(FakeNvml(scenario, clock), wall_clock=clock.wall, monotonic=clock.now, events=False)
    exporter_pod = scenario.exporter_pod
    self_pod = (exporter_pod.namespace, exporter_pod.name) if exporter_pod else None

    def cycle():  # type: ignore[no-untyped-def]
        # The kubelet's view is taken from the scenario directly (no gRPC call): that keeps the
        # baseline cheaper than the peers, which ask the kubelet on every scrape too.
        return join(JoinInput(devices=(source.collect(),), pods=scenario.pod_allocations_at(clock.now()),
                              self_pod=self_pod, version=__version__,
                              python_version=platform.python_version(), timestamp=clock.wall()))

    registry = CollectorRegistry(auto_describe=False)
    registry.register(PerScrapeCollector(cycle))  # type: ignore[arg-type]
    address = parse_listen(listen)
    start_http_server(address.port, addr=address.host, registry=registry)
    _wait_for_signal()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.servers", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="kind", required=True)
    exporter = sub.add_parser("exporter", help="dra-exporter's command line")
    exporter.add_argument("--renderer", choices=("exposition", "reference"), default="exposition")
    exporter.add_argument("--gzip-on-scrape", action="store_true")
    exporter.add_argument("--nagle", action="store_true")
    exporter.add_argument("--unbounded-heads", action="store_true")
    exporter.add_argument("--global-cap-only", action="store_true")
    exporter.add_argument("args", nargs=argparse.REMAINDER)
    for kind, text in (("frozen", "dra-exporter serving one frame, no collection loop"),
                       ("per-scrape", "the per-scrape prometheus_client baseline")):
        simulated = sub.add_parser(kind, help=text)
        simulated.add_argument("--simulate", default="demo")
        simulated.add_argument("--listen", default="127.0.0.1:9402")
    ns = parser.parse_args(argv)
    if ns.kind == "exporter":
        _exporter(ns.renderer, ns.gzip_on_scrape, ns.nagle, ns.unbounded_heads, ns.global_cap_only,
                  [a for a in ns.args if a != "--"])
    elif ns.kind == "frozen":
        _frozen(ns.simulate, ns.listen)
    else:
        _per_scrape(ns.simulate, ns.listen)


if __name__ == "__main__":
    main()
