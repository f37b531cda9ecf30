"""``dra-exporter cluster``: the cluster-wide source against the simulated API server (the real client),
paged lists, watches, dumps, and the command line."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import yaml
from simnode import eventually

from dra_exporter import catalog as cat
from dra_exporter.cluster.capacity import Capacity
from dra_exporter.sources.kubeapi import Timeouts
from dra_exporter.sources.kubeapi_cluster import ClusterSource
from dra_exporter_sim.apiserver import GONE_410, SimulatedApiServer
from dra_exporter_sim.clock import FIXED_EPOCH, SimClock
from dra_exporter_sim.cluster import builtin_cluster, cluster_scenario, load_cluster_dump
from dra_exporter_sim.scenario import ScenarioError

FAST = Timeouts(request=5.0, backoff=(0.05, 0.2))


@contextmanager
def cluster_server(objects: tuple[Any, ...] | None = None, **kw: Any) -> Iterator[SimulatedApiServer]:
    scenario = cluster_scenario(objects if objects is not None else builtin_cluster(), "test-cluster")
    with SimulatedApiServer(scenario, SimClock(0.0, frozen=True), poll_s=0.02,
                            taint_rule_versions=("v1",), **kw) as server:
        yield server


@contextmanager
def cluster_source(server: SimulatedApiServer, **kw: Any) -> Iterator[ClusterSource]:
    kw.setdefault("timeouts", FAST)
    src = ClusterSource(kubeconfig=server.kubeconfig_path, **kw)
    try:
        yield src
    finally:
        src.close()


RESOURCES = ("resourceslices", "resourceclaims", "deviceclasses", "devicetaintrules", "pods", "nodes")


def test_lists_every_kind_once_then_only_watches() -> None:
    with cluster_server() as server, cluster_source(server) as src:
        state = src.collect()
        kinds = {o["kind"] for o in builtin_cluster()} - {"Pod", "Namespace", "Node"}
        assert {"ResourceSlice", "ResourceClaim", "DeviceClass", "DeviceTaintRule"} == kinds
        assert (len(state.slices), len(state.claims), len(state.classes), len(state.taint_rules)) == tuple(
            sum(1 for o in builtin_cluster() if o["kind"] == k)
            for k in ("ResourceSlice", "ResourceClaim", "DeviceClass", "DeviceTaintRule"))
        for resource in RESOURCES:
            assert server.requests[("list", resource)] == 1, resource
        eventually(lambda: all(server.requests[("watch", r)] == 1 for r in RESOURCES))
        before = sum(server.requests.values())
        assert all(src.collect() is state for _ in range(10)), "nothing changed: the same state"
        assert sum(server.requests.values()) == before, "never polling"


def test_pods_are_kept_only_while_they_reference_claims_and_have_not_ended() -> None:
    with cluster_server() as server, cluster_source(server) as src:
        pods = {(p.namespace, p.name): p for p in src.collect().pods}
    served = [o for o in builtin_cluster() if o["kind"] == "Pod"]
    assert any(o["status"]["phase"] == "Succeeded" for o in served)
    assert set(pods) == {(o["metadata"]["namespace"], o["metadata"]["name"]) for o in served
                         if o["spec"].get("resourceClaims") and o["status"]["phase"] != "Succeeded"}
    assert pods[("research", "tpu-trainer")].claims == ("tpu-job",)
    assert not any(p.ended for p in pods.values())


def test_lists_come_in_pages_and_hold_every_object() -> None:
    with cluster_server() as server, cluster_source(server, page_size=4) as src:
        state = src.collect()
        assert len(state.slices) == 14 and len(state.claims) == 20
        assert server.requests[("list", "resourceslices")] == 4  # 14 slices, 4 a page
        assert server.requests[("list", "resourceclaims")] == 5


def test_claims_keep_only_what_the_families_read() -> None:
    with cluster_server() as server, cluster_source(server) as src:
        claims = {c.name: c for c in src.collect().claims}
    held = claims["forgotten"]
    assert held.allocated and not held.reserved_for and not held.devices and not held.uid
    assert [(r.name, r.device_class) for r in claims["mig-either"].requests] == [
        ("gpu/mig", "mig.nvidia.com"), ("gpu/gpu", "gpu.nvidia.com")]


def test_watch_expired_410_lists_again() -> None:
    with cluster_server() as server, cluster_source(server) as src:
        src.collect()
        eventually(lambda: server.requests[("watch", "resourceclaims")] == 1)
        server.inject(GONE_410)
        eventually(lambda: server.requests[("list", "resourceclaims")] >= 2)
        server.inject(None)
        assert len(src.collect().claims) == 20


def test_the_builtin_cluster_serves_every_family_it_promises() -> None:
    with cluster_server() as server, cluster_source(server) as src:
        frame = Capacity().frame(src.collect(), FIXED_EPOCH)
    names = {f.name for f in frame.families}
    assert {s.name for s in cat.CATALOG if s.name.startswith("dra_cluster_")} <= names
    pending = {dict(s.labels)["claim"]: s.value for s in frame.family(cat.CLUSTER_CLAIM_PENDING.name).samples}
    assert pending == {"tpu-job": 2400.0, "typo-job": 1500.0, "mig-either": 1200.0}, "since their pods wait"
    reasons = {tuple(dict(r.labels)[k] for k in ("namespace", "claim", "request", "reason"))
               for r in frame.family(cat.CLUSTER_CLAIM_PENDING_REASON.name).samples}
    # mig-either fits (a MIG profile is free), so it has no reason: only claims the scheduler cannot place.
    assert reasons == {("training", "typo-job", "gpu", "class_missing"),
                       ("research", "tpu-job", "gpu", "no_matching_device")}
    unused = {(dict(s.labels)["namespace"], s.value) for s in frame.family(cat.CLUSTER_CLAIMS.name).samples
              if dict(s.labels)["state"] == "unused" and s.value}
    assert unused == {("research", 2.0)}, "tpu-job-2 (no pod) and nightly-eval (its pod succeeded)"
    tpu = {dict(s.labels)["state"]: s.value for s in frame.family(cat.CLUSTER_CLASS_DEVICES.name).samples
           if dict(s.labels)["device_class"] == "tpu.example.com"}
    assert set(tpu.values()) == {0.0}, "pending claims whose class nothing matches"
    incomplete = {dict(s.labels)["pool"] for s in frame.family(cat.CLUSTER_POOL_COMPLETE.name).samples if not s.value}
    assert incomplete == {"sim-example-2"}


def dump_file(tmp_path: Path, objects: list[dict[str, Any]]) -> Path:
    path = tmp_path / "dump.yaml"
    path.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": objects}))
    return path


def test_a_cluster_dump_is_replayed_every_node_of_it(tmp_path: Path) -> None:
    objects = [dict(o) for o in builtin_cluster()]
    replayed = load_cluster_dump(dump_file(tmp_path, objects))
    with cluster_server(replayed) as server, cluster_source(server) as src:
        nodes = {s.node_name for s in src.collect().slices}
    assert nodes == {"sim-node-1", "sim-node-2", "sim-a100-1", "sim-example-1", "sim-example-2", "sim-shared-1"}


def test_a_v1beta1_dump_is_read_in_the_version_served(tmp_path: Path) -> None:
    sl = {"apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceSlice", "metadata": {"name": "s"},
          "spec": {"driver": "gpu.example.com", "nodeName": "n", "pool": {"name": "n", "generation": 1,
                                                                           "resourceSliceCount": 1},
                   "devices": [{"name": "gpu-0", "basic": {"attributes": {"model": {"string": "X"}}}}]}}
    with cluster_server(load_cluster_dump(dump_file(tmp_path, [sl]))) as server, cluster_source(server) as src:
        (only,) = src.collect().slices
    assert only.devices[0].attribute("model") == "X"


@pytest.mark.parametrize(("objects", "message"), [
    ([], "has no ResourceSlice"),
    ([{"apiVersion": "resource.k8s.io/v2", "kind": "ResourceSlice", "metadata": {"name": "s"}}],
     "ResourceSlice/s: apiVersion 'resource.k8s.io/v2' is not supported"),
    ([{"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {}}], "metadata.name: required"),
])
def test_a_bad_dump_is_a_clear_error(tmp_path: Path, objects: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        load_cluster_dump(dump_file(tmp_path, objects))


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dra_exporter.cli", "cluster", *args], check=False,
                          capture_output=True, text=True, timeout=120)


def test_cli_once_prints_the_simulated_cluster() -> None:
    result = run_cli("--simulate", "--once")
    assert result.returncode == 0, result.stderr
    assert 'dra_exporter_source_up{source="kubeapi"} 1.0' in result.stdout
    assert 'dra_cluster_pool_complete{driver="gpu.example.com",pool="sim-example-2"} 0.0' in result.stdout


def test_cli_once_without_api_access_says_why_and_exits_1(tmp_path: Path) -> None:
    """Ran, found nothing usable: one line on stderr naming the cause, exit 1, no frame of zeros."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))
    result = run_cli("--once", "--kubeconfig", str(kubeconfig))
    assert result.returncode == 1, result.stderr
    assert result.stdout == "" and result.stderr.count("\n") == 1, result.stderr
    assert "API server unreachable" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize(("source", "needle"), [
    ("/nonexistent", "'/nonexistent' is no such file: give a cluster dump"),
    ("demo", "'demo' is a node scenario (serve, snapshot and demo --simulate run it)"),
])
def test_cli_simulate_names_what_the_cluster_mode_takes(source: str, needle: str) -> None:
    """Not the node scenarios as "built-ins", nor "items[0]: expected a Kubernetes object" for demo."""
    result = run_cli("--simulate", source, "--once")
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert needle in result.stderr and "built-ins" not in result.stderr, result.stderr


def test_cli_a_truncated_dump_says_what_its_last_item_lacks(tmp_path: Path) -> None:
    dump = tmp_path / "cut.yaml"
    dump.write_text("apiVersion: v1\nkind: List\nitems:\n- apiVersion: resource.k8s.io/v1alpha3\n")
    result = run_cli("--simulate", str(dump), "--once")
    assert result.returncode == 2
    assert "items[0]: apiVersion 'resource.k8s.io/v1alpha3' but no kind (a truncated file?)" in result.stderr


def test_cli_bad_dump_is_one_line_and_exit_2(tmp_path: Path) -> None:
    result = run_cli("--simulate", str(dump_file(tmp_path, [])), "--once")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "has no ResourceSlice" in result.stderr


def test_the_api_servers_version_is_read_once_with_discovery() -> None:
    with cluster_server() as server, cluster_source(server) as src:
        state = src.collect()
        assert state.server_version == server.discovery("/version")["gitVersion"] != ""
        src.collect()
        assert server.requests[("get", "version")] == 1
