"""Requests to the API server per node per hour under churn (issue 9, benchmark 5).

**Ours.** The real ``KubeApiSource`` (default ``claim_refresh`` of 300 s, default watch
lifetimes) runs against the simulated API server (``sim/apiserver.py``) serving the
``apiserver_scenario`` (default ``scale``: 62 pod starts and 63 pod ends in its first ~49
minutes, 105-117 claims in use at any time). The simulated clock is frozen and stepped every
``apiserver_step_seconds`` over ``apiserver_seconds`` of simulated time (default one hour);
at each step we wait until the source's pod watch holds the scenario's pods alive at that time,
then collect once (which fetches the claims that are new, stale or due for their refresh). The
wait reads the watch's state, not ``collect()``: with the exporter's 1 s cycle, watch events
arrive (in milliseconds) long before the next cycle, whereas a cycle run at the step before the
step's pod deletions arrived would charge a refresh GET to a claim whose pod ended at that very
step, an artifact of the coarse step. The server counts the requests per (verb, resource); the response
bodies the source reads are counted by wrapping ``kubeapi_http.get`` for the run (restored
afterwards; nothing under ``dra_exporter/`` changes).

**Watch reconnects are under-counted, and corrected by a stated rule.** The source's watches end
after a random 300-600 *real* seconds (``Timeouts.watch``), but the whole simulated hour runs in
about a minute of real time, so the run sees one watch request per watched kind. In steady state
the two watches restart ``2 * 3600 / 450 = 16`` times an hour (the mean of ``Timeouts.watch``).
The per-hour total therefore counts ``max(observed watches, expected watches)`` where the
expected figure is ``16 * simulated_s / 3600``; the row shows both. Watch bookmarks of idle
streams (one a minute of real time) are under-counted the same way; they are a few hundred bytes.

**Baseline**, measured in the same run against the same server: the pattern of exporters that
poll instead of watching. Each interval (1 s, the exporter's default) they list this node's
ResourceSlices and Pods (``fieldSelector=spec.nodeName=<node>``) and *all* ResourceClaims (there
is no node field for claims). ``apiserver_polls`` polls at simulated times spread over the
window, sent with the real ``kubernetes`` ``ApiClient`` (``kubeapi.load_client``) through
``kubeapi_http.get``; requests per poll (3) and body bytes per poll are measured, and the hour is
``per poll * 3600 / interval``. The simulated cluster is one node, so its cluster-wide claim list
is this node's 150 claims: on a real cluster it grows with every node's claims, so the baseline's
bytes here are a lower bound.

**Check.** The issue sets no number; the budget is what the source's design promises
(``sources/kubeapi.py``: "at most 12 GETs per claim in use per hour, plus one per claim per pod
start"), computed from the scenario over the same window: claim-seconds in use / 300 + one GET
per claim of each pod that starts after 0, + 1 discovery + 2 lists + the expected watches.
A shorter window (``--quick``, the smoke test) is scaled to an hour, which overstates the
one-off costs (discovery, lists, the first GET of every claim) for ours and the budget alike.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any, Final

from dra_exporter.config import DEFAULT_INTERVAL
from dra_exporter.sources import kubeapi_http
from dra_exporter.sources.kubeapi import KubeApiSource, Timeouts, load_client
from dra_exporter_sim import load_scenario
from dra_exporter_sim.apiserver import SimulatedApiServer
from dra_exporter_sim.clock import SimClock
from dra_exporter_sim.scenario import Scenario

from .common import MB, Check, Config, Result, ratio

HOUR: Final = 3600.0
CLAIM_REFRESH_S: Final = 300.0  # KubeApiSource's default claim_refresh
WATCHED_KINDS: Final = 3  # this node's resourceslices, those naming no node (spec.nodeName=), pods
#: Watch requests per hour in steady state: each watch ends after a uniform 300-600 s.
EXPECTED_WATCHES_PER_HOUR: Final = WATCHED_KINDS * HOUR / statistics.mean(Timeouts().watch)
STEP_TIMEOUT_S: Final = 60.0
"""Real seconds one step may take to show the scenario's pods before the benchmark gives up."""


class _CountingResponse:
    """A urllib3 response whose body bytes (read, read1 or streamed) are added to ``counter[kind]``."""

    def __init__(self, response: Any, counter: Counter[str], kind: str, lock: threading.Lock) -> None:
        self._response, self._counter, self._kind, self._lock = response, counter, kind, lock

    def _add(self, n: int) -> None:
        with self._lock:
            self._counter[self._kind] += n

    def read(self, *args: Any, **kwargs: Any) -> bytes:
        data = self._response.read(*args, **kwargs)
        self._add(len(data))
        return data

    def read1(self, *args: Any, **kwargs: Any) -> bytes:
        # What the product reads with (outbound.read_bounded: what has arrived, chunk by chunk).
        data = self._response.read1(*args, **kwargs)
        self._add(len(data))
        return data

    def stream(self, *args: Any, **kwargs: Any) -> Iterator[bytes]:
        for chunk in self._response.stream(*args, **kwargs):
            self._add(len(chunk))
            yield chunk

    def __getattr__(self, name: str) -> Any:
        return getattr(self._response, name)


def _kind_of(path: str, query: Any) -> str:
    if any(key == "watch" for key, _ in query or ()):
        return "watch"
    if "/resourceclaims/" in path:  # one claim (a list of claims would end in /resourceclaims)
        return "get resourceclaims"
    return "discover" if path == kubeapi_http.GROUP_PATH else "list"


@contextmanager
def counting_bodies() -> Iterator[Counter[str]]:
    """Count the body bytes of every ``kubeapi_http.get`` answer read while inside, by kind."""
    counter: Counter[str] = Counter()
    lock = threading.Lock()
    original = kubeapi_http.get

    def get(api_client: Any, path: str, query: Any = (), **kwargs: Any) -> Any:
        response = original(api_client, path, query, **kwargs)
        return _CountingResponse(response, counter, _kind_of(path, query), lock)

    kubeapi_http.get = get  # type: ignore[assignment]
    try:
        yield counter
    finally:
        kubeapi_http.get = original  # type: ignore[assignment]


def _wait(check: Callable[[], bool], what: str, timeout: float = STEP_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"apiserver benchmark: {what} not seen within {timeout:g} s")
        time.sleep(0.005)


def _alive(scenario: Scenario, t: float) -> set[tuple[str, str]]:
    return {(p.namespace, p.name) for p in scenario.pods_at(t)}


def _watched_pods_are(src: KubeApiSource, alive: set[tuple[str, str]]) -> bool:
    """Whether the source's pod watch holds exactly ``alive``, read without a ``collect()`` (which
    would refresh the claims due at this step before the step's pod changes arrived)."""
    reflector = src._pods  # private: the benchmark waits on the watch, not on a cycle
    return reflector is not None and {(p.namespace, p.name) for p in reflector.snapshot()} == alive


def budget(scenario: Scenario, seconds: float) -> dict[str, float]:
    """What the source's design allows over ``[0, seconds)`` of the scenario: see the module docstring."""
    claim_seconds = 0.0
    for t in range(int(seconds)):  # 1 s resolution: the scenario's pods start and end on whole seconds
        claim_seconds += len({(p.namespace, c) for p in scenario.pods_at(float(t))
                              for container in p.containers for c in container.claims})
    starts = [p for p in scenario.pods if 0.0 < p.start < seconds]
    start_gets = sum(len({c for container in p.containers for c in container.claims}) for p in starts)
    watches = EXPECTED_WATCHES_PER_HOUR * seconds / HOUR
    refresh_gets = claim_seconds / CLAIM_REFRESH_S
    return {"claims_in_use_mean": claim_seconds / seconds, "pod_starts": len(starts),
            "start_gets": start_gets, "refresh_gets": refresh_gets, "watches": watches,
            "total": refresh_gets + start_gets + 1 + WATCHED_KINDS + watches}


def measure_source(server: SimulatedApiServer, clock: SimClock, seconds: float,
                   step: float) -> tuple[Counter[tuple[str, str]], Counter[str], float]:
    """Run the source over the window; (server's request counts, body bytes by kind, real seconds)."""
    scenario = server.scenario
    before = Counter(server.requests)
    started = time.monotonic()
    with counting_bodies() as body_bytes:
        src = KubeApiSource(scenario.node_name, kubeconfig=server.kubeconfig_path, monotonic=clock.now,
                            timeouts=Timeouts(backoff=(0.05, 0.2)))
        try:
            # Collections at 0, step, ... up to but not including `seconds`: the next one is the next hour's.
            for i in range(max(1, math.ceil(seconds / step))):
                t = i * step
                clock.set(t)
                if i == 0:
                    src.collect()  # discovery, the two lists, the watches start
                _wait(partial(_watched_pods_are, src, _alive(scenario, t)), f"the pods alive at t={t:g}")
                src.collect()  # one cycle: claims of new pods, claims due for their refresh
        finally:
            src.close()
    elapsed = time.monotonic() - started
    after = Counter(server.requests)
    after.subtract(before)
    return +after, body_bytes, elapsed


def measure_baseline(server: SimulatedApiServer, clock: SimClock, seconds: float,
                     polls: int) -> tuple[Counter[tuple[str, str]], list[int]]:
    """``polls`` polls (3 lists each) at simulated times spread over the window; body bytes per poll."""
    node, version = server.scenario.node_name, server.preferred
    selector = [("fieldSelector", f"spec.nodeName={node}")]
    lists: tuple[tuple[str, kubeapi_http.Query], ...] = (
        (kubeapi_http.slices_path(version), selector),
        (kubeapi_http.PODS_PATH, selector),
        (f"{kubeapi_http.GROUP_PATH}/{version}/resourceclaims", ()),  # no node field for claims: all of them
    )
    client = load_client(server.kubeconfig_path)
    before = Counter(server.requests)
    per_poll: list[int] = []
    try:
        for i in range(polls):
            clock.set(seconds * (i + 0.5) / polls)
            size = 0
            for path, query in lists:
                response = kubeapi_http.get(client, path, query, timeout=10.0)
                try:
                    size += len(response.read())
                finally:
                    response.release_conn()
            per_poll.append(size)
    finally:
        client.close()
    after = Counter(server.requests)
    after.subtract(before)
    return +after, per_poll


def run(config: Config) -> Result:
    seconds, step, polls = config.apiserver_seconds, config.apiserver_step_seconds, config.apiserver_polls
    scenario = load_scenario(config.apiserver_scenario)
    result = Result(
        description=f"API-server requests per node per hour under churn: KubeApiSource over {seconds:g} "
                    f"simulated s of '{config.apiserver_scenario}' (stepped every {step:g} s) against the "
                    "simulated API server.",
        baseline=f"polling every {DEFAULT_INTERVAL:g} s: list this node's ResourceSlices and Pods and all "
                 f"ResourceClaims ({polls} polls measured, scaled to an hour)",
    )
    clock = SimClock(0.0, frozen=True)
    with SimulatedApiServer(scenario, clock, poll_s=0.02) as server:
        ours, body_bytes, elapsed = measure_source(server, clock, seconds, step)
        base, per_poll = measure_baseline(server, clock, seconds, polls)

    scale = HOUR / seconds
    watches = ours[("watch", "resourceslices")] + ours[("watch", "pods")]
    allowed = budget(scenario, seconds)
    counted_watches = max(watches, allowed["watches"])
    total = sum(ours.values()) - watches + counted_watches
    ours_per_hour = total * scale
    ours_mb = sum(body_bytes.values()) * scale / MB

    base_requests_per_poll = sum(base.values()) / polls
    base_per_hour = base_requests_per_poll * HOUR / DEFAULT_INTERVAL
    base_mb = statistics.mean(per_poll) * HOUR / DEFAULT_INTERVAL / MB
    polls_per_hour = HOUR / DEFAULT_INTERVAL

    result.rows.append({
        "client": "dra-exporter (list+watch, claim GETs)", "simulated_s": seconds,
        "discover": ours[("get", "discovery")] + ours[("get", "version")],
        "list_slices": ours[("list", "resourceslices")], "list_pods": ours[("list", "pods")],
        "list_claims": ours[("list", "resourceclaims")],
        "watch_slices": ours[("watch", "resourceslices")], "watch_pods": ours[("watch", "pods")],
        "watch_expected": round(allowed["watches"], 1),
        "get_claims": ours[("get", "resourceclaims")],
        "requests_per_hour": round(ours_per_hour, 1), "response_mb_per_hour": round(ours_mb, 3),
        "requests_ratio": ratio(base_per_hour, ours_per_hour), "bytes_ratio": ratio(base_mb, ours_mb),
    })
    result.rows.append({
        "client": f"baseline (3 lists every {DEFAULT_INTERVAL:g} s)", "simulated_s": seconds,
        "discover": 0,
        "list_slices": base[("list", "resourceslices")] / polls * polls_per_hour,
        "list_pods": base[("list", "pods")] / polls * polls_per_hour,
        "list_claims": base[("list", "resourceclaims")] / polls * polls_per_hour,
        "watch_slices": 0, "watch_pods": 0, "get_claims": 0,
        "requests_per_hour": round(base_per_hour, 1), "response_mb_per_hour": round(base_mb, 3),
    })
    result.checks.append(Check(
        "API-server requests per node per hour within the kubeapi design's budget "
        "(12 GETs per claim in use + 1 per claim per pod start + discovery, 2 lists, 16 watches)",
        round(ours_per_hour, 1), round(allowed["total"] * scale, 1), "requests/h"))

    kinds = ("resourceslices", "pods", "resourceclaims")
    shown = {("get", "discovery"), ("get", "version"), ("get", "resourceclaims"),
             *((verb, res) for verb in ("list", "watch") for res in kinds)}
    other = sorted(f"{verb} {res}: {n}" for (verb, res), n in ours.items() if (verb, res) not in shown)
    result.notes += [
        f"ours: counted by the simulated API server over {seconds:g} simulated s in {elapsed:.1f} real s; "
        f"the per-hour total counts max(observed watches {watches}, expected {allowed['watches']:g}) watch "
        f"requests (watches live 300-600 real s, so a run this short sees one per kind)"
        + (f"; scaled x{scale:g} to an hour" if scale != 1 else ""),
        (f"budget: mean {allowed['claims_in_use_mean']:.1f} claims in use -> "
         f"{allowed['refresh_gets']:.0f} GETs (one per {CLAIM_REFRESH_S:g} s each), "
         f"{allowed['pod_starts']:g} pod starts -> {allowed['start_gets']:g} GETs, +1 discovery "
         f"+{WATCHED_KINDS} lists +{allowed['watches']:g} watches"),
        "ours, response bytes by kind: "
        + ", ".join(f"{k} {v / 1e3:.1f} kB" for k, v in sorted(body_bytes.items())),
        (f"baseline: {base_requests_per_poll:g} requests and {statistics.mean(per_poll) / 1e3:.1f} kB "
         "per poll "
         f"(min {min(per_poll) / 1e3:.1f}, max {max(per_poll) / 1e3:.1f}); the claim list is cluster-wide, "
         "here a one-node cluster, so its bytes are a lower bound"),
    ]
    if other:
        result.notes.append("ours, other requests: " + ", ".join(other))
    return result
