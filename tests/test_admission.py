"""A dump a real API server would refuse is refused by the simulator too, in one line naming the object
and the field (``dra_exporter_sim.admission``); what the simulator serves itself passes the same checks.

The dumps are those of tests/dumps/invalid/, which tests/test_testbed_replay.py shows the real
kube-apiserver v1.36 refusing with its own message.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dra_exporter_sim import SimClock, SimulatedApiServer, admission, k8s_objects
from dra_exporter_sim.cluster import builtin_cluster, load_cluster, load_cluster_dump
from dra_exporter_sim.loader import load_scenario
from dra_exporter_sim.scenario import ScenarioError

INVALID = Path(__file__).resolve().parent / "dumps" / "invalid"
#: Each dump the simulator refuses → the object and the field its one line names.
REFUSED = {
    "slice-without-driver-pool-node.yaml": "ResourceSlice/nowhere: spec.driver: Required value",
    "pod-without-image.yaml": "Pod/demo/no-image: spec.containers[0].image: Required value",
    "admin-access-unlabelled-namespace.yaml": (
        "ResourceClaim/monitoring/watch-all: spec.devices.requests[0].adminAccess: Forbidden: admin access to "
        "devices requires the `resource.kubernetes.io/admin-access: true` label"),
    "owner-that-does-not-exist.yaml": (
        "ResourceClaim/demo/worker-1-gpu: metadata.ownerReferences[0]: Pod worker-1 "
        "(uid 3c0e0000-0000-4000-8000-000000000008) is not in the dump"),
    "claim-with-33-devices.yaml": (
        "ResourceClaim/demo/everything: status.allocation.devices.results: Too many: 33: must have at most 32"),
}
#: Refused by a 1.36 server, served by the simulator as the 1.37 cluster it comes from.
NEWER_RELEASE = "taint-rule-v1-on-1.36.yaml"


def test_every_invalid_dump_is_refused_or_served_as_its_release() -> None:
    assert sorted(p.name for p in INVALID.glob("*.yaml")) == sorted([*REFUSED, NEWER_RELEASE])


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_both_loaders_refuse_what_the_server_refuses_naming_object_and_field(name: str) -> None:
    for load in (load_cluster_dump, load_scenario):
        with pytest.raises(ScenarioError) as err:
            load(INVALID / name)
        message = str(err.value)
        assert "\n" not in message and message.startswith(f"{INVALID / name}: ")
        assert REFUSED[name] in message, message


@pytest.mark.parametrize("name", sorted(REFUSED))
@pytest.mark.parametrize("command", [("cluster", "--once"), ("snapshot",)])
def test_the_cli_exits_2_with_one_line(name: str, command: tuple[str, ...]) -> None:
    result = subprocess.run([sys.executable, "-m", "dra_exporter.cli", command[0], "--simulate", str(INVALID / name),
                             *command[1:]], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 2, result.stderr
    assert result.stdout == "" and result.stderr.count("\n") == 1, result.stderr
    assert REFUSED[name] in result.stderr


def served(server: SimulatedApiServer, path: str) -> int:
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(server.url + path, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as err:
        return int(err.code)


def version(server: SimulatedApiServer) -> str:
    import json
    import urllib.request

    with urllib.request.urlopen(server.url + "/version", timeout=10) as resp:
        return str(json.loads(resp.read())["gitVersion"])


def test_device_taint_rules_are_served_in_the_versions_the_clusters_release_serves() -> None:
    # The built-in cluster is 1.36: DeviceTaintRules in v1beta2 and v1alpha3, not in v1 (a 1.36 server: 404).
    (rule,) = [o for o in builtin_cluster() if o["kind"] == "DeviceTaintRule"]
    assert rule["apiVersion"] == "resource.k8s.io/v1beta2"
    with SimulatedApiServer(load_cluster(None), SimClock(0.0, frozen=True), taint_rule_versions=None) as server:
        assert version(server) == "v1.36.2"
        assert served(server, "/apis/resource.k8s.io/v1beta2/devicetaintrules") == 200
        assert served(server, "/apis/resource.k8s.io/v1alpha3/devicetaintrules") == 200
        assert served(server, "/apis/resource.k8s.io/v1/devicetaintrules") == 404
    # A dump with a rule in v1 comes from a 1.37 cluster, and is served as one.
    newer = load_cluster(str(INVALID / NEWER_RELEASE))
    with SimulatedApiServer(newer, SimClock(0.0, frozen=True), taint_rule_versions=None) as server:
        assert version(server) == "v1.37.0"
        assert served(server, "/apis/resource.k8s.io/v1/devicetaintrules") == 200
    assert k8s_objects.taint_rule_versions("v1.35.1") == ("v1alpha3",)
    assert k8s_objects.taint_rule_versions("v1.32.9") == ()


def builtin_objects() -> dict[str, list[dict[str, Any]]]:
    out = {"cluster": list(builtin_cluster())}
    for name in ("demo", "scale", "gb200-domain"):
        objects = k8s_objects.cluster_objects(load_scenario(name), 60.0)
        out[name] = [o for group in objects.by_resource().values() for o in group]
    return out


def test_what_the_simulator_serves_passes_the_checks_it_applies_to_dumps() -> None:
    for name, objects in builtin_objects().items():
        admission.check(objects, name)  # raises on the first object a real cluster would not hold
        # Every admin-access claim's namespace is served, labelled; every slice's Node owner is served.
        labelled = {o["metadata"]["name"] for o in objects if o["kind"] == "Namespace"
                    and o["metadata"]["labels"].get(k8s_objects.ADMIN_ACCESS_LABEL) == "true"}
        admin = {o["metadata"]["namespace"] for o in objects
                 if o["kind"] == "ResourceClaim" and k8s_objects.admin_access_requests(o)}
        assert admin <= labelled, name
        nodes = {(o["metadata"]["name"], o["metadata"]["uid"]) for o in objects if o["kind"] == "Node"}
        owners = {(r["name"], r["uid"]) for o in objects for r in o["metadata"].get("ownerReferences", ())
                  if r["kind"] == "Node"}
        assert owners <= nodes, name
        # Every reservation names a pod that is served, by its UID.
        pods = {(o["metadata"]["namespace"], o["metadata"]["name"], o["metadata"]["uid"]) for o in objects
                if o["kind"] == "Pod"}
        reserved = {(o["metadata"]["namespace"], r["name"], r["uid"]) for o in objects if o["kind"] == "ResourceClaim"
                    for r in (o.get("status") or {}).get("reservedFor", ())}
        assert reserved <= pods, (name, reserved - pods)


def test_a_claim_of_more_than_32_devices_is_a_scenario_error(tmp_path: Path) -> None:
    gpus = "\n".join(f"  - {{index: {g}, mig: [" + ", ".join(
        f"{{profile: 1g.18gb, placement_start: {s}}}" for s in range(7)) + "]}" for g in range(5))
    devices = ", ".join(f"gpu-{g}-mig-1g18gb-19-{s}" for g in range(5) for s in range(7))
    path = tmp_path / "big.yaml"
    path.write_text(f"node: n\ngpus:\n{gpus}\nclaims:\n  - {{namespace: m, name: all, admin_access: true, "
                    f"devices: [{devices}]}}\n")
    with pytest.raises(ScenarioError, match="has 35 devices: a real API server allocates at most 32 to one claim"):
        load_scenario(path)


def test_a_dump_is_served_with_the_defaults_a_server_fills_in() -> None:
    claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "c", "namespace": "n"},
             "spec": {"devices": {"requests": [
                 {"name": "one", "exactly": {"deviceClassName": "gpu"}},
                 {"name": "all", "exactly": {"deviceClassName": "gpu", "allocationMode": "All"}},
                 {"name": "either", "firstAvailable": [{"name": "a", "deviceClassName": "gpu"}]}]}}}
    requests = admission.defaulted(claim)["spec"]["devices"]["requests"]
    assert requests[0]["exactly"] == {"deviceClassName": "gpu", "allocationMode": "ExactCount", "count": 1}
    assert requests[1]["exactly"] == {"deviceClassName": "gpu", "allocationMode": "All"}
    assert requests[2]["firstAvailable"][0] == {"name": "a", "deviceClassName": "gpu", "allocationMode": "ExactCount",
                                                "count": 1}
    flat = {"apiVersion": "resource.k8s.io/v1beta1", "kind": "ResourceClaim", "metadata": {"name": "c"},
            "spec": {"devices": {"requests": [{"name": "one", "deviceClassName": "gpu"}]}}}
    assert admission.defaulted(flat)["spec"]["devices"]["requests"][0]["count"] == 1
    rule = {"apiVersion": "resource.k8s.io/v1beta2", "kind": "DeviceTaintRule",
            "metadata": {"name": "r", "creationTimestamp": "2026-03-02T10:00:00Z"},
            "spec": {"deviceSelector": {"driver": "d"}, "taint": {"key": "k", "effect": "NoExecute"}}}
    assert admission.defaulted(rule)["spec"]["taint"]["timeAdded"] == "2026-03-02T10:00:00Z"
    assert "timeAdded" not in rule["spec"]["taint"]  # a copy
