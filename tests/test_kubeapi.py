"""The API server source with the real ``kubernetes`` client against what a real API server will
not do on demand: the simulated API server (dropped watches, injected 410s, outages, claim
refreshes spread over time, unserved versions) and a tiny local server (403, unserved group,
garbage). What a real server can answer — lists, watches, claim fetching — is in
tests/test_testbed_kubeapi.py, against kube-apiserver itself."""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from simnode import eventually

from dra_exporter.agent import SourceRunner
from dra_exporter.sources import SourceError
from dra_exporter.sources.kubeapi import (
    NO_ACCESS,
    RBAC_HINT,
    KubeApiSource,
    Timeouts,
    load_client,
    probe,
)
from dra_exporter_sim.apiserver import GONE, GONE_410, WATCH_DROP, SimulatedApiServer
from dra_exporter_sim.clock import SimClock
from dra_exporter_sim.k8s_objects import cluster_objects
from dra_exporter_sim.scenario_builder import parse_scenario

NODE = "kube-node-1"
FAST = Timeouts(request=5.0, backoff=(0.05, 0.2))


def scenario(api_version: str = "v1") -> Any:
    """Three GPUs; `short-0` ends at t=100 s (with its generated claim), `late-0` starts at t=200 s."""
    return parse_scenario({
        "node": NODE, "seed": 3, "api_version": api_version,
        "gpus": [{"index": 0}, {"index": 1}, {"index": 2}],
        "claims": [
            {"namespace": "ml", "name": "train", "devices": ["gpu-0"]},
            {"namespace": "ml", "name": "short-0-gpu", "template": "short-gpu", "devices": ["gpu-1"]},
            {"namespace": "ml", "name": "late-0-gpu", "template": "late-gpu", "devices": ["gpu-2"]},
        ],
        "pods": [
            {"namespace": "ml", "name": "train-0", "containers": [{"name": "c", "claims": ["train"]}]},
            {"namespace": "ml", "name": "short-0", "end": 100,
             "containers": [{"name": "c", "claims": ["short-0-gpu"]}]},
            {"namespace": "ml", "name": "late-0", "start": 200,
             "containers": [{"name": "c", "claims": ["late-0-gpu"]}]},
        ],
    }, "kubeapi-test")


@contextmanager
def api_server(api_version: str = "v1", t: float = 50.0, **kw: Any) -> Iterator[SimulatedApiServer]:
    with SimulatedApiServer(scenario(api_version), SimClock(t, frozen=True), poll_s=0.02, **kw) as server:
        yield server


@contextmanager
def source(server: SimulatedApiServer | None = None, **kw: Any) -> Iterator[KubeApiSource]:
    kw.setdefault("timeouts", FAST)
    src = KubeApiSource(NODE, kubeconfig=server.kubeconfig_path if server else None, **kw)
    try:
        yield src
    finally:
        src.close()


def pods_of(src: KubeApiSource) -> set[str]:
    return {p.name for p in src.collect().pods}


def counts(server: SimulatedApiServer, verb: str, resource: str) -> int:
    return server.requests[(verb, resource)]


def test_dropped_watch_resumes_from_its_resource_version() -> None:
    with api_server() as server, source(server) as src:
        src.collect()
        eventually(lambda: counts(server, "watch", "pods") == 1)
        server.inject(WATCH_DROP)
        eventually(lambda: counts(server, "watch", "pods") >= 3)
        server.clock.set(150.0)
        server.inject(None)
        eventually(lambda: pods_of(src) == {"train-0"})
        assert counts(server, "list", "pods") == 1, "resumed from the resourceVersion, not re-listed"


def test_expired_resource_version_410_lists_again() -> None:
    with api_server() as server, source(server) as src:
        src.collect()
        eventually(lambda: counts(server, "watch", "pods") == 1)
        server.inject(GONE_410)
        eventually(lambda: counts(server, "list", "pods") >= 2 and counts(server, "list", "resourceslices") >= 2)
        server.clock.set(150.0)
        server.inject(None)
        eventually(lambda: pods_of(src) == {"train-0"})


def test_outage_is_an_error_and_recovery_catches_up() -> None:
    with api_server() as server, source(server) as src:
        good = src.collect()
        server.inject(GONE)

        def down() -> bool:
            try:
                src.collect()
            except SourceError as exc:
                assert "unreachable" in str(exc)
                return True
            return False

        eventually(down)
        server.clock.set(150.0)  # changes while we are cut off
        server.inject(None)
        eventually(lambda: not down() and pods_of(src) == {"train-0"})
        assert src.collect() != good


def test_runner_keeps_the_last_good_view_and_logs_the_outage_once(caplog: pytest.LogCaptureFixture) -> None:
    with api_server() as server, source(server) as src:
        runner = SourceRunner(src, keep_last_good=True)
        runner.collect_once()
        good, health = runner.latest()
        assert health.up and good is not None
        server.inject(GONE)
        with caplog.at_level(logging.WARNING, logger="dra_exporter.agent"):
            eventually(lambda: (runner.collect_once(), not runner.latest()[1].up)[1])
            for _ in range(10):
                runner.collect_once()
        snapshot, health = runner.latest()
        assert snapshot is good and not health.up and health.errors_total >= 1
        assert len([r for r in caplog.records if "kubeapi" in r.getMessage()]) == 1


def test_claims_fetched_together_are_refreshed_spread_out_not_in_one_burst() -> None:
    """A node's start-up fetches every claim at once; their refreshes must not stay in lockstep."""
    many = parse_scenario({
        "node": NODE, "gpus": [{"index": 0, "mig": [{"profile": "1g.18gb", "placement_start": s} for s in range(7)]}],
        "claims": [{"namespace": "ml", "name": f"c{i}", "devices": [f"gpu-0-mig-1g18gb-19-{i}"]} for i in range(7)],
        "pods": [{"namespace": "ml", "name": f"p{i}", "containers": [{"name": "c", "claims": [f"c{i}"]}]}
                 for i in range(7)],
    }, "many")
    now = [0.0]
    with SimulatedApiServer(many, SimClock(50.0, frozen=True), poll_s=0.02) as server, \
            source(server, claim_refresh=300.0, monotonic=lambda: now[0]) as src:
        src.collect()
        assert counts(server, "get", "resourceclaims") == 7
        fetched_per_step = []
        for step in range(31):  # 300 s to 360 s, every 2 s
            now[0] = 300.0 + 2.0 * step
            before = counts(server, "get", "resourceclaims")
            src.collect()
            fetched_per_step.append(counts(server, "get", "resourceclaims") - before)
        assert sum(fetched_per_step) == 7, "each claim refreshed exactly once in [300, 360] s"
        assert max(fetched_per_step) < 7 and sum(1 for n in fetched_per_step if n) >= 2, fetched_per_step


def test_older_served_versions_are_read_when_v1_is_not_served() -> None:
    with api_server("v1beta2") as server, source(server) as src:
        assert src.collect().api_version == "v1beta2"
    with api_server("v1", versions=["v1beta1"]) as server, source(server) as src:
        assert src.collect().api_version == "v1beta1"


def test_no_api_access_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "absent"))
    with pytest.raises(SourceError) as err:
        load_client()
    assert str(err.value) == NO_ACCESS
    with source() as src, pytest.raises(SourceError, match="no API server access"):
        src.collect()


def test_unreadable_kubeconfig_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "kubeconfig"
    bad.write_text("clusters: [")
    with pytest.raises(SourceError, match=f"cannot use {bad}"):
        load_client(str(bad))


# --- answers the simulator does not give ---------------------------------------------------------


@contextmanager
def canned(answers: dict[str, tuple[int, dict[str, Any]]], tmp_path: Path,
           denied: frozenset[str] = frozenset()) -> Iterator[str]:
    """A local HTTP server answering GET <path prefix> with (status, JSON), and access reviews with
    allowed unless the resource is in ``denied``; yields a kubeconfig path."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = next(((s, b) for prefix, (s, b) in answers.items() if self.path.startswith(prefix)),
                                (404, {"kind": "Status", "code": 404}))
            self._send(status, body)

        def do_POST(self) -> None:
            review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            resource = review["spec"]["resourceAttributes"]["resource"]
            self._send(201, {**review, "status": {"allowed": resource not in denied}})

        def _send(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    config = tmp_path / "kubeconfig"
    config.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{server.server_address[1]}"}}],
        "users": [{"name": "u", "user": {}}], "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}]}))
    try:
        yield str(config)
    finally:
        server.shutdown()
        server.server_close()


GROUP_V1 = {"kind": "APIGroup", "name": "resource.k8s.io",
            "versions": [{"groupVersion": "resource.k8s.io/v1", "version": "v1"}]}
FORBIDDEN = {"kind": "Status", "code": 403, "reason": "Forbidden",
             "message": 'resourceslices.resource.k8s.io is forbidden: User "system:serviceaccount:x:y" cannot list'}


def collect_error(kubeconfig: str) -> str:
    src = KubeApiSource(NODE, kubeconfig=kubeconfig, timeouts=FAST)
    try:
        with pytest.raises(SourceError) as err:
            src.collect()
        return str(err.value)
    finally:
        src.close()


def test_rbac_forbidden_names_what_is_missing(tmp_path: Path) -> None:
    answers = {"/apis/resource.k8s.io/v1/resourceslices": (403, FORBIDDEN), "/apis/resource.k8s.io": (200, GROUP_V1)}
    with canned(answers, tmp_path) as kubeconfig:
        message = collect_error(kubeconfig)
    assert "forbidden (403)" in message and "list resourceslices" in message and RBAC_HINT in message


def test_dra_not_served(tmp_path: Path) -> None:
    with canned({}, tmp_path) as kubeconfig:
        assert "does not serve resource.k8s.io" in collect_error(kubeconfig)
    alpha = {"kind": "APIGroup", "versions": [{"groupVersion": "resource.k8s.io/v1alpha3", "version": "v1alpha3"}]}
    with canned({"/apis/resource.k8s.io": (200, alpha)}, tmp_path) as kubeconfig:
        assert "no resource.k8s.io version both served (v1alpha3)" in collect_error(kubeconfig)


def test_server_errors_and_garbage_are_source_errors(tmp_path: Path) -> None:
    answers: dict[str, tuple[int, dict[str, Any]]] = {
        "/apis/resource.k8s.io/v1/resourceslices": (500, {"kind": "Status", "code": 500}),
        "/apis/resource.k8s.io": (200, GROUP_V1)}
    with canned(answers, tmp_path) as kubeconfig:
        assert "list resourceslices failed: HTTP 500" in collect_error(kubeconfig)
    answers["/apis/resource.k8s.io/v1/resourceslices"] = (200, [1, 2])  # type: ignore[assignment]
    with canned(answers, tmp_path) as kubeconfig:
        assert "not a JSON object" in collect_error(kubeconfig)


def test_probe_lists_for_real_and_asks_for_the_rest(tmp_path: Path) -> None:
    answers = {"/apis/resource.k8s.io/v1/resourceslices": (200, {"items": [{}, {}]}),
               "/api/v1/pods": (403, {**FORBIDDEN, "message": "pods is forbidden"})}
    with canned(answers, tmp_path, denied=frozenset({"resourceclaims"})) as kubeconfig:
        client = load_client(kubeconfig)
        try:
            results = probe(client, NODE, "v1", timeout=5.0)
        finally:
            client.close()
    assert [(r.ok, r.message) for r in results] == [
        (True, f"resourceslices with spec.nodeName={NODE}: 2"),
        (False, f"forbidden (403) to list pods: {RBAC_HINT}"),
        (True, "may watch resourceslices.resource.k8s.io"),
        (False, f"may not get resourceclaims.resource.k8s.io ({RBAC_HINT})"),
        (False, f"may not list resourceclaims.resource.k8s.io ({RBAC_HINT})"),
        (True, "may watch pods"),
    ]


def test_a_node_name_is_required() -> None:
    with pytest.raises(ValueError, match="node name"):
        KubeApiSource("")


def test_the_source_never_imports_the_clients_typed_api_classes() -> None:
    """Each typed API module of kubernetes 37 costs megabytes of pydantic annotations
    (CoreV1Api and the resource.k8s.io classes ~29 MB of RSS): a full cycle with the cluster
    view, discovery and claim GETs included, must not load one."""
    import subprocess
    import sys

    program = (
        "import sys\n"
        "from dra_exporter import runtime\n"
        "from dra_exporter.config import Settings\n"
        "rt = runtime.build(Settings(listen='127.0.0.1:0', simulate='demo'), sim_time=600.0, publish=True)\n"
        "frame = rt.agent.cycle(collect_side=True)\n"
        "rt.close()\n"
        "up = {s.labels: s.value for s in frame.family('dra_exporter_source_up').samples}\n"
        "claims = {s.labels for s in frame.family('dra_claim_device_condition').samples}\n"
        "print(up[(('source', 'kubeapi'),)], len(claims) > 0)\n"
        "print(sorted(m for m in sys.modules if m.startswith('kubernetes.client.api.')))\n"
    )
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    up, modules = done.stdout.splitlines()
    assert up == "1.0 True", "the cluster view must have been read (source up, claim conditions present)"
    assert modules == "[]"


# --- Kubernetes 1.36/1.37 objects: DeviceTaintRules, slices that name no node, health messages ------


def nic_slice(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name, "uid": f"uid-{name}"},
            "spec": {"driver": "nic.example.com", "pool": {"name": name, "generation": 1, "resourceSliceCount": 1},
                     **spec}}


def newer_cluster(taint_rule_versions: tuple[str, ...]) -> SimulatedApiServer:
    """The kubeapi-test cluster plus what 1.36/1.37 add: a DeviceTaintRule, slices placed by
    allNodes / nodeSelector / per device, this node's Node object, and a health message."""
    base = scenario()
    objects = cluster_objects(base, 50.0)
    pods = []
    for pod in objects.pods:
        if pod["metadata"]["name"] == "train-0":
            pod = copy.deepcopy(pod)
            claim_uid = next(c.uid for c in base.claims if c.name == "train")
            pod["status"]["containerStatuses"][0]["allocatedResourcesStatus"] = [{"name": "claim:train", "resources": [
                {"resourceID": f"k8s.gpu.nvidia.com/claim={claim_uid}-gpu-0", "health": "Unhealthy",
                 "message": "XID 79: GPU has fallen off the bus"}]}]
        pods.append(pod)
    rack = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "rack", "operator": "In", "values": ["r1"]}]}]}
    extra = [
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule",
         "metadata": {"name": "drain-gpu-1", "uid": "r1"},
         "spec": {"deviceSelector": {"driver": "gpu.nvidia.com", "device": "gpu-1"},
                  "taint": {"key": "example.com/drain", "value": "now", "effect": "NoExecute"}}},
        nic_slice("fabric", allNodes=True, devices=[{"name": "fabric-0"}]),
        nic_slice("rack-r1", nodeSelector=rack, devices=[{"name": "tor-0"}]),
        nic_slice("rack-r2", nodeSelector={"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "rack", "operator": "In", "values": ["r2"]}]}]}, devices=[{"name": "tor-1"}]),
        nic_slice("per-device", perDeviceNodeSelection=True, devices=[
            {"name": "here", "nodeName": NODE}, {"name": "elsewhere", "nodeName": "kube-node-2"}]),
        nic_slice("other-node", nodeName="kube-node-2", devices=[{"name": "far"}]),
        {"apiVersion": "v1", "kind": "Node", "metadata": {"name": NODE, "uid": "node-uid", "labels": {"rack": "r1"}}},
    ]
    raw = (*objects.resourceslices, *objects.resourceclaims, *pods, *extra)
    return SimulatedApiServer(dataclasses.replace(base, raw_objects=raw), SimClock(50.0, frozen=True), poll_s=0.02,
                              taint_rule_versions=taint_rule_versions)


@pytest.mark.parametrize(("served", "read"), [(("v1", "v1beta2", "v1alpha3"), "v1"),
                                              (("v1beta2", "v1alpha3"), "v1beta2"), (("v1alpha3",), "v1alpha3")])
def test_taint_rules_slices_naming_no_node_and_health_messages(
        served: tuple[str, ...], read: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="dra_exporter.sources.kubeapi")
    with newer_cluster(served) as server, source(server) as src:
        snap = src.collect()
        assert src.taint_rule_version == read
        assert [(r.name, r.device, r.taint.key) for r in snap.taint_rules] == [
            ("drain-gpu-1", "gpu-1", "example.com/drain")]
        devices = {(s.name, d.name) for s in snap.slices for d in s.devices if s.driver == "nic.example.com"}
        assert devices == {("fabric", "fabric-0"), ("rack-r1", "tor-0"), ("per-device", "here")}
        assert counts(server, "get", "nodes") == 1, "the node's labels, for the nodeSelector slices"
        assert counts(server, "list", "devicetaintrules") == 1
        eventually(lambda: counts(server, "watch", "devicetaintrules") == 1)
    messages = [r.getMessage() for r in caplog.records]
    assert any("device k8s.gpu.nvidia.com/claim=" in m and "Unhealthy: XID 79: GPU has fallen off the bus" in m
               for m in messages), messages


def test_taint_rules_not_served_are_left_out_without_a_request_for_them(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="dra_exporter.sources.kubeapi")
    with newer_cluster(()) as server, source(server) as src:
        assert src.collect().taint_rules == ()
        assert src.taint_rule_version is None
        assert counts(server, "list", "devicetaintrules") == 0
    assert any("serves no DeviceTaintRules" in r.getMessage() for r in caplog.records)


def test_taint_rules_forbidden_leave_the_rest_of_the_view_up(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # A chart from before DeviceTaintRules: RBAC allows slices, claims and pods only.
    listing = {"kind": "APIResourceList", "resources": [{"name": "devicetaintrules"}, {"name": "resourceslices"}]}
    answers: dict[str, tuple[int, dict[str, Any]]] = {
        "/apis/resource.k8s.io/v1/devicetaintrules": (403, FORBIDDEN),
        "/apis/resource.k8s.io/v1/resourceslices": (200, {"kind": "ResourceSliceList", "items": []}),
        "/apis/resource.k8s.io/v1?": (200, listing), "/apis/resource.k8s.io/v1": (200, listing),
        "/apis/resource.k8s.io": (200, GROUP_V1),
        "/api/v1/pods": (200, {"kind": "PodList", "items": []})}
    with canned(answers, tmp_path) as kubeconfig:
        src = KubeApiSource(NODE, kubeconfig=kubeconfig, timeouts=FAST)
        try:
            assert src.collect().taint_rules == ()
            assert src.taint_rule_version is None
        finally:
            src.close()
    assert any("DeviceTaintRules not read: forbidden (403)" in r.getMessage() for r in caplog.records)


# --- the claim census: only while a driver holds a claim no local pod explains ----------------------------


def test_the_claim_census_lists_only_for_unexplained_prepared_claims_and_rechecks_a_present_one_once() -> None:
    """``short-0`` ended at t=100 with its generated claim; ``train``'s claim is in use; ``spare`` is
    allocated and no pod uses it. A CDI spec of train's claim costs nothing; one of the gone claim costs
    one list, whose answer says it is gone; one of ``spare`` (as a claim whose pod was just deleted,
    before the controller deallocates it) is asked about again once, CENSUS_MIN_S later, then every
    claim_refresh."""
    doc = {"node": NODE, "seed": 3, "gpus": [{"index": 0}, {"index": 1}, {"index": 2}],
           "claims": [{"namespace": "ml", "name": "train", "devices": ["gpu-0"]},
                      {"namespace": "ml", "name": "short-0-gpu", "template": "short-gpu", "devices": ["gpu-1"]},
                      {"namespace": "ml", "name": "spare", "devices": ["gpu-2"]}],
           "pods": [{"namespace": "ml", "name": "train-0", "containers": [{"name": "c", "claims": ["train"]}]},
                    {"namespace": "ml", "name": "short-0", "end": 100,
                     "containers": [{"name": "c", "claims": ["short-0-gpu"]}]}]}
    s = parse_scenario(doc, "census-test")
    uid = {c.name: c.uid for c in s.claims}
    prepared = [uid["train"]]
    now = [0.0]
    with SimulatedApiServer(s, SimClock(150.0, frozen=True), poll_s=0.02) as server, \
            source(server, prepared_claims=lambda: prepared, monotonic=lambda: now[0], claim_refresh=300) as src:
        assert src.collect().claim_census is None
        assert counts(server, "list", "resourceclaims") == 0, "explained by a local pod's claim: no list"
        prepared.append(uid["short-0-gpu"])
        census = src.collect().claim_census
        assert census is not None and census.asked == {uid["short-0-gpu"]} and census.found == ()
        assert counts(server, "list", "resourceclaims") == 1
        now[0] = 10.0
        src.collect()
        assert counts(server, "list", "resourceclaims") == 1, "nothing new to ask"
        prepared.append(uid["spare"])
        src.collect()
        assert counts(server, "list", "resourceclaims") == 1, "a new UID waits CENSUS_MIN_S after the last list"
        for t, lists in ((31.0, 2), (62.0, 3), (93.0, 3), (331.0, 3), (362.0, 4)):
            now[0] = t
            census = src.collect().claim_census
            assert counts(server, "list", "resourceclaims") == lists, t
        assert census is not None and [c.name for c in census.found] == ["spare"]
        assert census.found[0].results, "found allocated: not an orphan"
        assert census.asked == {uid["short-0-gpu"], uid["spare"]}
