"""The simulated API server, spoken to by the real ``kubernetes`` client through its kubeconfig."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import urllib3
from kubernetes import client as k8s
from kubernetes import config as k8s_config
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException

from dra_exporter_sim import load_scenario
from dra_exporter_sim.apiserver import SimulatedApiServer
from dra_exporter_sim.clock import SimClock
from dra_exporter_sim.node import SimulatedNode
from dra_exporter_sim.scenario import Scenario
from dra_exporter_sim.scenario_builder import parse_scenario

DUMPS = Path(__file__).resolve().parent / "dumps"

# Pod `early` ends at t=100 (its generated claim goes with it); pod `late` starts at t=50.
SMALL: dict[str, Any] = {
    "node": "n1",
    "seed": 5,
    "gpus": [{"index": 0}, {"index": 1}, {"index": 2, "mig": [{"profile": "3g.71gb", "placement_start": 0}]}],
    "claims": [
        {"namespace": "ml", "name": "shared", "devices": ["gpu-0"]},
        {"namespace": "ml", "name": "early-gpu", "template": "gpu", "devices": ["gpu-1"]},
        {"namespace": "ml", "name": "late-gpu", "devices": ["gpu-2-mig-3g71gb-9-0"]},
    ],
    "pods": [
        {"namespace": "ml", "name": "alice", "containers": [{"name": "nb", "claims": ["shared"]}]},
        {"namespace": "ml", "name": "bob", "containers": [{"name": "nb", "claims": ["shared"]}]},
        {
            "namespace": "ml",
            "name": "early",
            "end": 100,
            "containers": [{"name": "job", "claims": ["early-gpu"]}],
        },
        {
            "namespace": "ml",
            "name": "late",
            "start": 50,
            "containers": [{"name": "srv", "claims": ["late-gpu"]}],
        },
    ],
    "faults": [{"kind": "apiserver_error", "at": 1000, "until": 1010}],
}
NODE = "spec.nodeName=n1"


def small(**changes: Any) -> Scenario:
    return parse_scenario({**SMALL, **changes}, "small.yaml")


@pytest.fixture
def clock() -> SimClock:
    return SimClock(10, frozen=True)


@pytest.fixture
def server(clock: SimClock) -> Iterator[SimulatedApiServer]:
    with SimulatedApiServer(small(), clock, poll_s=0.02) as api:
        yield api


def api_client(server: SimulatedApiServer) -> k8s.ApiClient:
    cfg = k8s.Configuration()
    k8s_config.load_kube_config(config_file=server.kubeconfig_path, client_configuration=cfg)
    cfg.retries = False  # a fault must show at once, not after urllib3's retries
    return k8s.ApiClient(cfg)


def names(items: list[Any]) -> list[str]:
    return sorted(i.metadata.name for i in items)


# --- discovery -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("preferred", "served", "kube_version"),
    [
        ("v1", ["v1", "v1beta2", "v1beta1"], "v1.36"),
        ("v1beta2", ["v1beta2", "v1beta1"], "v1.33"),
        ("v1beta1", ["v1beta1"], "v1.32"),
    ],
)
def test_discovery_names_the_served_versions(
    clock: SimClock, preferred: str, served: list[str], kube_version: str
) -> None:
    with SimulatedApiServer(small(api_version=preferred), clock) as server:
        api = api_client(server)
        (group,) = [g for g in k8s.ApisApi(api).get_api_versions().groups if g.name == "resource.k8s.io"]
        assert [v.version for v in group.versions] == served
        assert group.preferred_version.version == preferred
        assert k8s.ResourceApi(api).get_api_group().preferred_version.version == preferred
        assert k8s.VersionApi(api).get_code().git_version.startswith(kube_version + ".")
        assert k8s.CoreApi(api).get_api_versions().versions == ["v1"]
        assert "pods" in {r.name for r in k8s.CoreV1Api(api).get_api_resources().resources}
        typed = {
            "v1": k8s.ResourceV1Api,
            "v1beta2": k8s.ResourceV1beta2Api,
            "v1beta1": k8s.ResourceV1beta1Api,
        }
        for version, cls in typed.items():
            if version in served:
                resources = {r.name: r for r in cls(api).get_api_resources().resources}
                assert resources["resourceslices"].namespaced is False
                assert resources["resourceclaims"].namespaced is True
                assert {"get", "list", "watch"} <= set(resources["resourceclaims"].verbs)
                assert len(cls(api).list_resource_slice(field_selector=NODE).items) == 1
            else:
                with pytest.raises(ApiException) as err:
                    cls(api).list_resource_slice()
                assert err.value.status == 404


def test_versions_argument_overrides_the_scenario(clock: SimClock) -> None:
    with SimulatedApiServer(small(), clock, versions=["v1beta1", "v1beta2"]) as server:
        (group,) = k8s.ApisApi(api_client(server)).get_api_versions().groups
        assert [v.version for v in group.versions] == ["v1beta2", "v1beta1"]
        assert group.preferred_version.version == "v1beta2"
    with pytest.raises(ValueError, match="v1alpha3"):
        SimulatedApiServer(small(), clock, versions=["v1alpha3"])


def test_kubeconfig_works_with_load_kube_config_and_new_client(server: SimulatedApiServer) -> None:
    api = k8s_config.new_client_from_config(config_file=server.kubeconfig_path)
    assert api.configuration.host == server.url
    assert k8s.VersionApi(api).get_code().major == "1"


# --- lists and gets --------------------------------------------------------------------------------


def test_slices_are_listed_per_node_and_driver_from_a_dump(clock: SimClock) -> None:
    with SimulatedApiServer(load_scenario(DUMPS / "v1.yaml", "gpu-node-a"), clock) as server:
        api = k8s.ResourceV1Api(api_client(server))
        mine = api.list_resource_slice(field_selector="spec.nodeName=gpu-node-a")
        assert names(mine.items) == ["gpu-node-a-gpu.example.com-p9w2d", "gpu-node-a-gpu.nvidia.com-7xkqz"]
        assert int(mine.metadata.resource_version) > 0
        nvidia = api.list_resource_slice(field_selector="spec.nodeName=gpu-node-a,spec.driver=gpu.nvidia.com")
        assert names(nvidia.items) == ["gpu-node-a-gpu.nvidia.com-7xkqz"]
        assert names(api.list_resource_slice(field_selector="spec.nodeName=gpu-node-b").items) == [
            "gpu-node-b-gpu.nvidia.com-m4t8c"
        ]
        assert len(api.list_resource_slice().items) == 3
        assert names(api.list_resource_slice(field_selector="spec.nodeName!=gpu-node-a").items) == [
            "gpu-node-b-gpu.nvidia.com-m4t8c"
        ]
        with pytest.raises(ApiException) as err:
            api.list_resource_slice(field_selector="spec.devices=x")
        assert err.value.status == 400 and "field label not supported" in err.value.body


def test_claims_get_and_list(server: SimulatedApiServer) -> None:
    api = k8s.ResourceV1Api(api_client(server))
    shared = api.read_namespaced_resource_claim("shared", "ml")
    assert [r.name for r in shared.status.reserved_for] == ["alice", "bob"]
    assert shared.status.allocation.devices.results[0].device == "gpu-0"
    with pytest.raises(ApiException) as err:
        api.read_namespaced_resource_claim("nope", "ml")
    assert err.value.status == 404 and json.loads(err.value.body)["reason"] == "NotFound"
    assert names(api.list_namespaced_resource_claim("ml").items) == ["early-gpu", "late-gpu", "shared"]
    assert names(api.list_namespaced_resource_claim("ml", field_selector="metadata.name=shared").items) == [
        "shared"
    ]
    assert api.list_namespaced_resource_claim("other").items == []
    assert len(api.list_resource_claim_for_all_namespaces().items) == 3
    beta1 = k8s.ResourceV1beta1Api(api_client(server)).read_namespaced_resource_claim("shared", "ml")
    assert beta1.spec.devices.requests[0].device_class_name == "gpu.nvidia.com"


def test_pods_list_get_and_follow_simulated_time(server: SimulatedApiServer, clock: SimClock) -> None:
    core = k8s.CoreV1Api(api_client(server))
    assert names(core.list_pod_for_all_namespaces(field_selector=NODE).items) == ["alice", "bob", "early"]
    assert core.list_pod_for_all_namespaces(field_selector="spec.nodeName=n2").items == []
    alice = core.read_namespaced_pod("alice", "ml")
    assert alice.spec.resource_claims[0].resource_claim_name == "shared"
    assert alice.status.container_statuses[0].container_id.startswith("containerd://")
    clock.set(150)
    assert names(core.list_namespaced_pod("ml", field_selector=NODE).items) == ["alice", "bob", "late"]
    with pytest.raises(ApiException) as err:
        core.read_namespaced_pod("early", "ml")
    assert err.value.status == 404


# --- watches ------------------------------------------------------------------------------------


def test_watch_sees_a_pod_end_and_another_start_as_time_moves(
    server: SimulatedApiServer, clock: SimClock
) -> None:
    core = k8s.CoreV1Api(api_client(server))
    listed = core.list_pod_for_all_namespaces(field_selector=NODE)
    events: list[tuple[str, str]] = []
    seen = [threading.Event(), threading.Event()]

    def watch() -> None:
        for e in k8s_watch.Watch().stream(
            core.list_pod_for_all_namespaces,
            field_selector=NODE,
            resource_version=listed.metadata.resource_version,
            timeout_seconds=10,
        ):
            events.append((e["type"], e["object"].metadata.name))
            seen[len(events) - 1].set()
            if len(events) == 2:
                return

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    clock.set(60)  # `late` starts
    assert seen[0].wait(10), events
    clock.set(120)  # `early` ends
    assert seen[1].wait(10), events
    thread.join(10)
    assert events == [("ADDED", "late"), ("DELETED", "early")]


def test_watch_resumes_from_a_resource_version_and_claims_follow_pods(
    server: SimulatedApiServer, clock: SimClock
) -> None:
    resource = k8s.ResourceV1Api(api_client(server))
    rv = resource.list_resource_claim_for_all_namespaces().metadata.resource_version
    clock.set(120)
    # The client guesses the event type from the list's name (V1ResourceClaim), which 34.x renamed.
    claims = k8s_watch.Watch(return_type="ResourceV1ResourceClaim")
    events = list(
        claims.stream(resource.list_resource_claim_for_all_namespaces, resource_version=rv, timeout_seconds=1)
    )
    changes = [(e["type"], e["object"].metadata.name) for e in events]
    # late-gpu gets its consumer, early's generated claim is deleted with its pod.
    assert sorted(changes) == [("DELETED", "early-gpu"), ("MODIFIED", "late-gpu")]
    modified = next(e["object"] for e in events if e["type"] == "MODIFIED")
    assert [r.name for r in modified.status.reserved_for] == ["late"]
    versions = [int(e["object"].metadata.resource_version) for e in events]
    assert versions == sorted(versions) and versions[0] > int(rv)
    # From the newest version on, there is nothing more to say.
    again = list(
        claims.stream(
            resource.list_resource_claim_for_all_namespaces,
            resource_version=str(versions[-1]),
            timeout_seconds=1,
        )
    )
    assert again == []


def test_watch_without_resource_version_starts_with_the_current_objects(server: SimulatedApiServer) -> None:
    resource = k8s.ResourceV1beta1Api(api_client(server))
    events = list(
        k8s_watch.Watch().stream(resource.list_resource_slice, field_selector=NODE, timeout_seconds=1)
    )
    assert [e["type"] for e in events] == ["ADDED"]
    assert events[0]["object"].spec.devices[0].basic.attributes["type"].string == "gpu"


def test_watch_honours_field_selectors(server: SimulatedApiServer, clock: SimClock) -> None:
    core = k8s.CoreV1Api(api_client(server))
    rv = core.list_pod_for_all_namespaces().metadata.resource_version
    clock.set(120)
    events = list(
        k8s_watch.Watch().stream(
            core.list_namespaced_pod,
            "ml",
            field_selector="metadata.name=early",
            resource_version=rv,
            timeout_seconds=1,
        )
    )
    assert [(e["type"], e["object"].metadata.name) for e in events] == [("DELETED", "early")]


def test_idle_watch_gets_bookmarks_with_the_current_version(clock: SimClock) -> None:
    with SimulatedApiServer(small(), clock, poll_s=0.02, bookmark_s=0.1) as server:
        core = k8s.CoreV1Api(api_client(server))
        rv = core.list_pod_for_all_namespaces().metadata.resource_version
        response = core.list_pod_for_all_namespaces(
            watch=True,
            resource_version=rv,
            allow_watch_bookmarks=True,
            timeout_seconds=1,
            _preload_content=False,
        )
        lines = [line for line in k8s_watch.watch.iter_resp_lines(response) if line]
        assert lines and all('"type":"BOOKMARK"' in line for line in lines)
        assert f'"resourceVersion":"{rv}"' in lines[-1]


# --- faults --------------------------------------------------------------------------------------


def test_gone_410_makes_the_client_raise_410(server: SimulatedApiServer) -> None:
    core = k8s.CoreV1Api(api_client(server))
    rv = core.list_pod_for_all_namespaces().metadata.resource_version
    server.inject("apiserver_gone_410")
    with pytest.raises(ApiException) as err:
        list(
            k8s_watch.Watch().stream(core.list_pod_for_all_namespaces, resource_version=rv, timeout_seconds=5)
        )
    assert err.value.status == 410 and "too old resource version" in err.value.reason
    # The raw stream: one ERROR event whose object is a 410 Expired Status.
    response = core.list_pod_for_all_namespaces(watch=True, resource_version=rv, _preload_content=False)
    (line,) = [x for x in k8s_watch.watch.iter_resp_lines(response) if x]
    assert '"type":"ERROR"' in line and '"code":410' in line and '"reason":"Expired"' in line
    server.inject(None)
    assert (
        list(
            k8s_watch.Watch().stream(core.list_pod_for_all_namespaces, resource_version=rv, timeout_seconds=1)
        )
        == []
    )


def test_error_fault_answers_500_from_the_scenario_and_by_injection(
    server: SimulatedApiServer, clock: SimClock
) -> None:
    resource = k8s.ResourceV1Api(api_client(server))
    clock.set(1005)  # the scenario's apiserver_error fault is active on [1000, 1010)
    with pytest.raises(ApiException) as err:
        resource.list_resource_slice(field_selector=NODE)
    assert err.value.status == 500 and "InternalError" in err.value.body
    clock.set(1010)
    assert len(resource.list_resource_slice(field_selector=NODE).items) == 1
    server.inject("apiserver_error")
    with pytest.raises(ApiException) as err:
        resource.read_namespaced_resource_claim("shared", "ml")
    assert err.value.status == 500
    server.inject(None)
    assert resource.read_namespaced_resource_claim("shared", "ml").metadata.name == "shared"


def test_watch_drop_cuts_running_watches(server: SimulatedApiServer) -> None:
    core = k8s.CoreV1Api(api_client(server))
    rv = core.list_pod_for_all_namespaces().metadata.resource_version
    outcome: list[BaseException] = []
    started = threading.Event()

    def watch() -> None:
        try:
            stream = k8s_watch.Watch().stream(
                core.list_pod_for_all_namespaces, resource_version=rv, timeout_seconds=10
            )
            started.set()
            list(stream)
        except BaseException as exc:  # noqa: BLE001 - the test looks at what was raised
            outcome.append(exc)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    assert started.wait(5)
    while server.requests[("watch", "pods")] == 0:
        threading.Event().wait(0.01)
    server.inject("apiserver_watch_drop")
    thread.join(10)
    assert not thread.is_alive()
    assert outcome and isinstance(outcome[0], urllib3.exceptions.ProtocolError)
    # Lists still work while watches are dropped.
    assert len(core.list_pod_for_all_namespaces().items) == 3


def test_slow_fault_delays_answers_past_the_clients_timeout(clock: SimClock) -> None:
    scenario = small(faults=[{"kind": "apiserver_slow", "delay": 30, "at": 500}])
    with SimulatedApiServer(scenario, clock) as server:
        resource = k8s.ResourceV1Api(api_client(server))
        assert resource.list_resource_slice(_request_timeout=5).items
        clock.set(500)
        with pytest.raises(urllib3.exceptions.ReadTimeoutError):
            resource.list_resource_slice(_request_timeout=0.3)
        server.inject(None)
        clock.set(10)
        assert resource.list_resource_slice(_request_timeout=5).items


def test_gone_refuses_connections_and_comes_back_on_the_same_port(server: SimulatedApiServer) -> None:
    core = k8s.CoreV1Api(api_client(server))
    url = server.url
    server.inject("apiserver_gone")
    with pytest.raises(urllib3.exceptions.NewConnectionError, match="Connection refused"):
        core.list_pod_for_all_namespaces(_request_timeout=2)
    server.inject(None)
    assert server.url == url
    assert len(core.list_pod_for_all_namespaces(_request_timeout=2).items) == 3


def test_inject_rejects_unknown_faults(server: SimulatedApiServer) -> None:
    with pytest.raises(ValueError, match="unknown fault"):
        server.inject("kubelet_slow")


# --- bookkeeping -----------------------------------------------------------------------------------


def test_request_counter_counts_per_verb_and_resource(server: SimulatedApiServer) -> None:
    api = api_client(server)
    resource, core = k8s.ResourceV1Api(api), k8s.CoreV1Api(api)
    for _ in range(3):
        resource.list_resource_slice(field_selector=NODE)
    resource.read_namespaced_resource_claim("shared", "ml")
    core.list_pod_for_all_namespaces()
    list(k8s_watch.Watch().stream(core.list_pod_for_all_namespaces, timeout_seconds=1))
    k8s.ApisApi(api).get_api_versions()
    assert server.requests[("list", "resourceslices")] == 3
    assert server.requests[("get", "resourceclaims")] == 1
    assert server.requests[("list", "pods")] == 1
    assert server.requests[("watch", "pods")] == 1
    assert server.requests[("get", "discovery")] == 1
    assert ("list", "resourceclaims") not in server.requests


def test_resource_versions_only_grow(server: SimulatedApiServer, clock: SimClock) -> None:
    core = k8s.CoreV1Api(api_client(server))
    seen = [int(core.list_pod_for_all_namespaces().metadata.resource_version)]
    for t in (60, 120, 60, 10):  # back and forth: every change is a new version
        clock.set(t)
        seen.append(int(core.list_pod_for_all_namespaces().metadata.resource_version))
    assert seen == sorted(seen) and len(set(seen)) == len(seen)


def test_label_selectors(clock: SimClock) -> None:
    with SimulatedApiServer(load_scenario(DUMPS / "v1.yaml", "gpu-node-a"), clock) as server:
        core = k8s.CoreV1Api(api_client(server))
        for selector, want in [
            ("app=notebook", ["notebook-alice", "notebook-bob"]),
            ("app=notebook,owner!=bob", ["notebook-alice"]),
            ("owner in (bob, carol)", ["notebook-bob"]),
            ("owner notin (bob),app", ["notebook-alice"]),
        ]:
            assert names(core.list_pod_for_all_namespaces(label_selector=selector).items) == want, selector
        assert len(core.list_pod_for_all_namespaces(label_selector="!app").items) == 6  # of 8
        with pytest.raises(ApiException) as err:
            core.list_pod_for_all_namespaces(label_selector="owner in bob")
        assert err.value.status == 400


def test_dump_objects_are_served_as_they_are_and_converted_on_request(clock: SimClock) -> None:
    with SimulatedApiServer(load_scenario(DUMPS / "v1beta1.yaml", "gpu-node-a"), clock) as server:
        api = api_client(server)
        assert [v.version for v in k8s.ApisApi(api).get_api_versions().groups[0].versions] == ["v1beta1"]
        (nvidia,) = (
            k8s.ResourceV1beta1Api(api)
            .list_resource_slice(field_selector="spec.nodeName=gpu-node-a,spec.driver=gpu.nvidia.com")
            .items
        )
        assert nvidia.spec.devices[0].basic.attributes["pcieBusID"].string == "0000:18:00.0"
    with SimulatedApiServer(load_scenario(DUMPS / "v1.yaml", "gpu-node-a"), clock) as server:
        beta1 = k8s.ResourceV1beta1Api(api_client(server))
        claim = beta1.read_namespaced_resource_claim("train", "ml")
        assert claim.spec.devices.requests[0].device_class_name == "gpu.nvidia.com"
        assert claim.status.devices[0].conditions[0].reason == "DevicePrepared"
        pods = k8s.CoreV1Api(api_client(server)).list_pod_for_all_namespaces(
            field_selector="spec.nodeName=gpu-node-a"
        )
        assert "finished-0" in names(pods.items)  # the API server has it; the kubelet does not


def test_the_simulated_node_runs_the_api_server(clock: SimClock) -> None:
    node = SimulatedNode(load_scenario("demo"), clock).start()
    assert node.apiserver is not None
    api = api_client(node.apiserver)
    assert (
        len(k8s.ResourceV1Api(api).list_resource_slice(field_selector="spec.nodeName=sim-node-1").items) == 1
    )
    node.close()
    with pytest.raises(urllib3.exceptions.NewConnectionError):
        k8s.CoreV1Api(api).list_pod_for_all_namespaces(_request_timeout=2)
    assert SimulatedNode(load_scenario("demo"), clock, apiserver=False).apiserver is None
