"""The pod-resources source against the simulated kubelet, over a real unix socket.

What users rely on: every claim/device the kubelet reports reaches the snapshot unchanged
and in a stable order; a restarting, rate-limiting, slow or broken kubelet produces a clear
``SourceError`` (never a traceback) and the same source object recovers by itself.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Callable, Iterator

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dra_exporter import model
from dra_exporter.proto import api_pb2, api_pb2_grpc
from dra_exporter.sources import SourceError
from dra_exporter.sources.podresources import (
    LIST_METHOD,
    MAX_ANSWER_BYTES,
    MAX_CONTAINERS,
    MAX_DEVICES,
    MAX_PODS,
    RESTART_SETTLE_S,
    PodResourcesSource,
    _decode,
    snapshot_from_response,
)
from dra_exporter_sim.kubelet import SimulatedKubelet, response_from_snapshot

NV = "gpu.nvidia.com"
NODE = "node-a"
UID_TRAIN = "3f6c2f5e-0d1b-4c55-9a43-5d0f3c1e7a10"
UID_INFER = "9b1d4c2a-6e7f-4a8b-b1c2-d3e4f5a6b7c8"
GPU_UUID = "GPU-5a0e3f7c-1b2d-4e6f-8a9b-0c1d2e3f4a5b"
MIG_UUID = "MIG-7d8e9f0a-1b2c-4d3e-9f5a-6b7c8d9e0f1a"


def cdi(uid: str, device: str) -> str:
    return f"k8s.gpu.nvidia.com/claim={uid}-{device}"


def dev(device: str, *cdi_names: str, share_id: str = "") -> model.ClaimDevice:
    return model.ClaimDevice(driver=NV, pool=NODE, device=device, cdi_devices=cdi_names, share_id=share_id)


SHARED_CLAIM = model.ClaimUse("ml", "shared-gpu", (dev("gpu-3"),))
TRAIN_CLAIM = model.ClaimUse(
    "train",
    "trainer-0-gpus-x7k2p",
    tuple(dev(f"gpu-{i}", cdi(UID_TRAIN, f"gpu-{i}")) for i in range(4, 8)),
)

#: A node as the kubelet sees it, already in the canonical (sorted, merged) form.
SNAPSHOT = model.PodResourcesSnapshot(
    pods=(
        # No GPU at all: still listed, with no claims or devices.
        model.PodAllocation(
            "kube-system", "coredns-5d78c9869d-abcde", (model.ContainerAllocation("coredns"),)
        ),
        # Device-plugin GPUs: a whole GPU and a MIG device.
        model.PodAllocation(
            "legacy",
            "cuda-job",
            (
                model.ContainerAllocation(
                    "cuda",
                    plugin_devices=(
                        model.PluginDevices("nvidia.com/gpu", (GPU_UUID,)),
                        model.PluginDevices("nvidia.com/mig-1g.18gb", (MIG_UUID,)),
                    ),
                ),
            ),
        ),
        # MIG through DRA, current device name format (25.12+).
        model.PodAllocation(
            "ml",
            "infer-a",
            (
                model.ContainerAllocation(
                    "server",
                    claims=(
                        model.ClaimUse(
                            "ml",
                            "infer-a-mig-q9w8e",
                            (dev("gpu-0-mig-1g18gb-19-0", cdi(UID_INFER, "gpu-0-mig-1g18gb-19-0")),),
                        ),
                    ),
                ),
            ),
        ),
        # MIG through DRA, old device name format (25.3-25.8).
        model.PodAllocation(
            "ml",
            "infer-b",
            (
                model.ContainerAllocation(
                    "server", claims=(model.ClaimUse("ml", "infer-b-mig-r5t6y", (dev("gpu-1-mig-19-6-1"),)),)
                ),
            ),
        ),
        # One claim shared by two pods.
        model.PodAllocation("ml", "shared-1", (model.ContainerAllocation("main", claims=(SHARED_CLAIM,)),)),
        model.PodAllocation("ml", "shared-2", (model.ContainerAllocation("main", claims=(SHARED_CLAIM,)),)),
        # A whole GPU held as a share of consumable capacity.
        model.PodAllocation(
            "team-a",
            "notebook",
            (
                model.ContainerAllocation(
                    "jupyter",
                    claims=(
                        model.ClaimUse(
                            "team-a", "notebook-gpu", (dev("gpu-2", share_id="0b9f5a3e-share-1"),)
                        ),
                    ),
                ),
            ),
        ),
        # A multi-GPU claim referenced by two containers of one pod.
        model.PodAllocation(
            "train",
            "trainer-0",
            (
                model.ContainerAllocation("sidecar", claims=(TRAIN_CLAIM,)),
                model.ContainerAllocation("trainer", claims=(TRAIN_CLAIM,)),
            ),
        ),
    )
)


def NO_JITTER() -> float:
    """The middle of the backoff's jitter range (factor 1): exact, doubling waits."""
    return 0.5


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def sock(tmp_path) -> str:
    return str(tmp_path / "kubelet.sock")


@pytest.fixture
def serve(sock: str) -> Iterator[Callable[..., SimulatedKubelet]]:
    """Start simulated kubelets on ``sock``; all are stopped at the end of the test."""
    started: list[SimulatedKubelet] = []

    def start(
        provider: Callable[[], model.PodResourcesSnapshot] = lambda: SNAPSHOT, **kw
    ) -> SimulatedKubelet:
        kubelet = SimulatedKubelet(provider, sock, **kw).start()
        started.append(kubelet)
        return kubelet

    yield start
    for kubelet in started:
        kubelet.stop()


@pytest.fixture
def source(sock: str) -> Iterator[PodResourcesSource]:
    src = PodResourcesSource(sock, timeout=2.0)
    yield src
    src.close()


def wait_until(predicate: Callable[[], bool], what: str) -> None:
    # Generous: only guards against hanging forever on a broken watcher.
    deadline = time.monotonic() + 10.0
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"gave up waiting for {what}")
        time.sleep(0.02)


# --- pure conversion -------------------------------------------------------------------------


def test_snapshot_survives_conversion_to_response_and_back():
    assert snapshot_from_response(response_from_snapshot(SNAPSHOT)) == SNAPSHOT


def test_conversion_maps_every_field_both_ways():
    response = api_pb2.ListPodResourcesResponse(
        pod_resources=[
            api_pb2.PodResources(
                name="p",
                namespace="ns",
                containers=[
                    api_pb2.ContainerResources(
                        name="c",
                        devices=[
                            api_pb2.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=[GPU_UUID])
                        ],
                        dynamic_resources=[
                            api_pb2.DynamicResource(
                                claim_name="claim",
                                claim_namespace="ns",
                                claim_resources=[
                                    api_pb2.ClaimResource(
                                        cdi_devices=[api_pb2.CDIDevice(name=cdi(UID_INFER, "gpu-0"))],
                                        driver_name=NV,
                                        pool_name=NODE,
                                        device_name="gpu-0",
                                        share_id="s-1",
                                    ),
                                    api_pb2.ClaimResource(
                                        driver_name=NV, pool_name=NODE, device_name="gpu-1"
                                    ),
                                ],
                            )
                        ],
                    )
                ],
            )
        ]
    )
    snapshot = model.PodResourcesSnapshot(
        (
            model.PodAllocation(
                "ns",
                "p",
                (
                    model.ContainerAllocation(
                        "c",
                        claims=(
                            model.ClaimUse(
                                "ns",
                                "claim",
                                (dev("gpu-0", cdi(UID_INFER, "gpu-0"), share_id="s-1"), dev("gpu-1")),
                            ),
                        ),
                        plugin_devices=(model.PluginDevices("nvidia.com/gpu", (GPU_UUID,)),),
                    ),
                ),
            ),
        )
    )
    assert snapshot_from_response(response) == snapshot
    assert response_from_snapshot(snapshot) == response


def test_share_id_is_sent_only_when_set():
    response = response_from_snapshot(SNAPSHOT)
    by_device = {
        res.device_name: res
        for pod in response.pod_resources
        for ctr in pod.containers
        for dyn in ctr.dynamic_resources
        for res in dyn.claim_resources
    }
    assert by_device["gpu-2"].HasField("share_id") and by_device["gpu-2"].share_id == "0b9f5a3e-share-1"
    assert not by_device["gpu-3"].HasField("share_id")
    # An explicitly empty share_id on the wire is still "no share".
    explicit_empty = api_pb2.ClaimResource(driver_name=NV, pool_name=NODE, device_name="gpu-9", share_id="")
    assert explicit_empty.HasField("share_id")
    snap = snapshot_from_response(
        api_pb2.ListPodResourcesResponse(
            pod_resources=[
                api_pb2.PodResources(
                    name="p",
                    namespace="ns",
                    containers=[
                        api_pb2.ContainerResources(
                            name="c",
                            dynamic_resources=[
                                api_pb2.DynamicResource(
                                    claim_name="x", claim_namespace="ns", claim_resources=[explicit_empty]
                                )
                            ],
                        )
                    ],
                )
            ]
        )
    )
    assert snap.pods[0].containers[0].claims[0].devices[0].share_id == ""


def test_kubelet_order_and_repeated_claims_do_not_change_the_snapshot():
    # The kubelet builds these lists from Go maps (random order) and repeats a claim once
    # per resources.claims entry of the container.
    response = response_from_snapshot(SNAPSHOT)
    shuffled = api_pb2.ListPodResourcesResponse()
    for pod in reversed(response.pod_resources):
        new_pod = shuffled.pod_resources.add()
        new_pod.CopyFrom(pod)
        new_pod.containers.reverse()
        for ctr in new_pod.containers:
            for dyn in ctr.dynamic_resources:
                dyn.claim_resources.reverse()
            ctr.dynamic_resources.extend(list(ctr.dynamic_resources))  # every claim twice
            for plugin in ctr.devices:
                plugin.device_ids.reverse()
    assert snapshot_from_response(shuffled) == SNAPSHOT


_names = st.sampled_from(["a", "b", "c"])
_devices = st.builds(
    model.ClaimDevice,
    driver=st.sampled_from([NV, "gpu.example.com"]),
    pool=_names,
    device=st.sampled_from(["gpu-0", "gpu-1", "gpu-0-mig-1g18gb-19-0"]),
    cdi_devices=st.lists(_names, max_size=2).map(tuple),
    share_id=st.sampled_from(["", "s1"]),
)
_claims = st.builds(
    model.ClaimUse, namespace=_names, name=_names, devices=st.lists(_devices, max_size=3).map(tuple)
)
_plugins = st.builds(
    model.PluginDevices, resource_name=_names, device_ids=st.lists(_names, max_size=3).map(tuple)
)
_containers = st.builds(
    model.ContainerAllocation,
    name=_names,
    claims=st.lists(_claims, max_size=3).map(tuple),
    plugin_devices=st.lists(_plugins, max_size=2).map(tuple),
)
_snapshots = st.builds(
    model.PodResourcesSnapshot,
    pods=st.lists(
        st.builds(
            model.PodAllocation,
            namespace=_names,
            name=_names,
            containers=st.lists(_containers, max_size=3).map(tuple),
        ),
        max_size=4,
    ).map(tuple),
)


def _facts(snap: model.PodResourcesSnapshot) -> set[tuple[str, ...]]:
    facts: set[tuple[str, ...]] = set()
    for pod in snap.pods:
        for ctr in pod.containers:
            facts.add(("container", pod.namespace, pod.name, ctr.name))
            for claim in ctr.claims:
                facts.add(("claim", pod.namespace, pod.name, ctr.name, claim.namespace, claim.name))
                for d in claim.devices:
                    key = (
                        pod.namespace,
                        pod.name,
                        ctr.name,
                        claim.namespace,
                        claim.name,
                        d.driver,
                        d.pool,
                        d.device,
                    )
                    facts.add(("device", *key, d.share_id))
                    facts.update(("cdi", *key, d.share_id, name) for name in d.cdi_devices)
            for plugin in ctr.plugin_devices:
                facts.add(("plugin", pod.namespace, pod.name, ctr.name, plugin.resource_name))
                facts.update(
                    ("id", pod.namespace, pod.name, ctr.name, plugin.resource_name, i)
                    for i in plugin.device_ids
                )
    return facts


@settings(max_examples=60, deadline=None)
@given(_snapshots)
def test_normalisation_loses_nothing_and_is_stable(snap):
    canonical = snapshot_from_response(response_from_snapshot(snap))
    assert _facts(canonical) == _facts(snap)
    assert snapshot_from_response(response_from_snapshot(canonical)) == canonical
    reordered = model.PodResourcesSnapshot(tuple(reversed(snap.pods)))
    assert snapshot_from_response(response_from_snapshot(reordered)) == canonical


# --- client <-> simulated kubelet ---------------------------------------------------------------


def test_collect_returns_what_the_kubelet_holds(serve, source):
    serve()
    assert source.collect() == SNAPSHOT


def test_churn_shows_in_the_next_collect(serve, source):
    current = {"snap": SNAPSHOT}
    kubelet = serve(lambda: current["snap"])
    assert source.collect() == SNAPSHOT
    current["snap"] = model.PodResourcesSnapshot(SNAPSHOT.pods[:2])  # ML and training pods ended
    assert source.collect() == current["snap"]
    new_pod = model.PodAllocation(
        "ml", "infer-c", (model.ContainerAllocation("server", claims=(SHARED_CLAIM,)),)
    )
    current["snap"] = model.PodResourcesSnapshot(SNAPSHOT.pods[:2] + (new_pod,))
    assert source.collect() == current["snap"]
    assert kubelet.calls == 3


def test_missing_socket_is_a_clear_error(tmp_path):
    path = str(tmp_path / "nope.sock")
    with pytest.raises(SourceError) as err:
        PodResourcesSource(path).collect()
    assert str(err.value) == f"podresources: kubelet socket {path} not found"


def test_path_that_is_not_a_socket_is_a_clear_error(tmp_path):
    path = tmp_path / "kubelet.sock"
    path.write_text("")
    with pytest.raises(SourceError, match="exists but is not a unix socket"):
        PodResourcesSource(str(path)).collect()


def test_socket_gone_then_back_recovers_with_the_same_source(serve, source, sock):
    kubelet = serve()
    assert source.collect() == SNAPSHOT
    kubelet.inject("kubelet_socket_gone")
    assert not os.path.exists(sock)
    with pytest.raises(SourceError, match="not found"):
        source.collect()
    kubelet.inject(None)
    assert source.collect() == SNAPSHOT


def test_kubelet_restart_recovers_with_the_same_source(serve, source, sock):
    kubelet = serve()
    assert source.collect() == SNAPSHOT
    restarting = threading.Thread(target=kubelet.restart, kwargs={"down_seconds": 0.3})
    restarting.start()
    try:
        wait_until(lambda: not os.path.exists(sock), "the socket to be removed")
        with pytest.raises(SourceError, match="not found"):
            source.collect()
    finally:
        restarting.join()
    assert os.path.exists(sock)
    assert source.collect() == SNAPSHOT
    # Recreated socket under an open channel, without a window to notice it was gone.
    kubelet.restart()
    assert source.collect() == SNAPSHOT


def test_fault_provider_takes_the_socket_away_and_gives_it_back(serve, source, sock):
    faults: set[str] = set()
    serve(fault_provider=lambda: faults)
    assert source.collect() == SNAPSHOT
    faults.add("kubelet_socket_gone")
    wait_until(lambda: not os.path.exists(sock), "the watcher to remove the socket")
    with pytest.raises(SourceError, match="not found"):
        source.collect()
    faults.clear()
    wait_until(lambda: os.path.exists(sock), "the watcher to recreate the socket")
    assert source.collect() == SNAPSHOT


def test_nobody_listening_is_unavailable_then_backs_off_then_recovers(serve, sock):
    clock = FakeClock()
    src = PodResourcesSource(sock, timeout=2.0, backoff=(0.5, 30.0), monotonic=clock, random=NO_JITTER)
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(sock)  # a socket file with no listener, as after a kubelet crash
    try:
        with pytest.raises(SourceError, match="unavailable"):
            src.collect()
        with pytest.raises(SourceError, match="backing off"):
            src.collect()
    finally:
        dead.close()
        os.unlink(sock)
    kubelet = serve()
    with pytest.raises(SourceError, match="backing off"):
        src.collect()
    assert kubelet.calls == 0
    clock.advance(0.5)
    assert src.collect() == SNAPSHOT
    src.close()


def test_rate_limit_rejection_backs_off_without_calling_the_kubelet(serve, sock):
    clock = FakeClock()
    src = PodResourcesSource(sock, backoff=(0.5, 30.0), monotonic=clock, random=NO_JITTER)
    kubelet = serve()
    kubelet.inject("kubelet_resource_exhausted")
    with pytest.raises(SourceError, match="rate limit") as err:
        src.collect()
    assert "next try in 0.5s" in str(err.value)
    assert kubelet.calls == 1
    kubelet.inject(None)
    clock.advance(0.4)
    with pytest.raises(SourceError, match="backing off"):
        src.collect()
    assert kubelet.calls == 1  # the backoff kept us off the kubelet

    # Failing again doubles the wait.
    kubelet.inject("kubelet_resource_exhausted")
    clock.advance(0.1)
    with pytest.raises(SourceError, match="next try in 1s"):
        src.collect()
    assert kubelet.calls == 2
    kubelet.inject(None)
    clock.advance(0.5)
    with pytest.raises(SourceError, match="backing off"):
        src.collect()
    assert kubelet.calls == 2
    clock.advance(0.5)
    assert src.collect() == SNAPSHOT
    assert kubelet.calls == 3

    # Success reset the backoff to its initial value.
    kubelet.inject("kubelet_resource_exhausted")
    with pytest.raises(SourceError, match="next try in 0.5s"):
        src.collect()
    src.close()


def test_backoff_waits_are_jittered(serve, sock):
    # random 0.999… is the top of the ±20 % range: the wait is 0.6 s, not 0.5 s.
    clock = FakeClock()
    src = PodResourcesSource(sock, backoff=(0.5, 30.0), monotonic=clock, random=lambda: 0.9999)
    kubelet = serve()
    kubelet.inject("kubelet_resource_exhausted")
    with pytest.raises(SourceError, match=r"next try in 0\.6s"):
        src.collect()
    kubelet.inject(None)
    clock.advance(0.55)
    with pytest.raises(SourceError, match="backing off"):
        src.collect()
    clock.advance(0.05)
    assert src.collect() == SNAPSHOT
    src.close()


def test_slow_kubelet_hits_the_deadline(serve, sock):
    kubelet = serve(slow_delay=30.0)
    kubelet.inject("kubelet_slow")
    src = PodResourcesSource(sock, timeout=0.2)
    with pytest.raises(SourceError, match="did not answer List within 0.2s"):
        src.collect()
    src.close()


def test_malformed_answer_is_a_clear_error(serve, source):
    kubelet = serve()
    kubelet.inject("kubelet_malformed")
    with pytest.raises(SourceError, match="not a valid ListPodResourcesResponse"):
        source.collect()
    kubelet.inject(None)
    assert source.collect() == SNAPSHOT


def test_oversize_answer_is_refused(serve, sock):
    serve()
    src = PodResourcesSource(sock, max_message_bytes=64)
    with pytest.raises(SourceError, match="max_message_bytes=64"):
        src.collect()
    src.close()


# --- how much one answer may cost -------------------------------------------------------------------


def _pods(count: int, containers: int = 1, ids: int = 0, claims: int = 0) -> model.PodResourcesSnapshot:
    """``count`` pods with realistic names and ``containers`` containers each; the first (the worker)
    holds ``ids`` device-plugin GPUs and ``claims`` claims of one device (with its CDI name) each."""
    def container(p: int, c: int) -> model.ContainerAllocation:
        if c:
            return model.ContainerAllocation(f"sidecar-{c}")
        return model.ContainerAllocation(
            "worker",
            claims=tuple(model.ClaimUse(f"team-{p % 50:02d}", f"job-{p:05d}-gpu-{k}-x7k2p",
                                        (dev(f"gpu-{k % 8}-mig-1g18gb-19-{k}", cdi(UID_TRAIN, f"{p}-{k}")),))
                         for k in range(claims)),
            plugin_devices=(model.PluginDevices("nvidia.com/gpu", tuple(
                f"GPU-{p:08x}-{k:04x}-4e6f-8a9b-0c1d2e3f4a5b" for k in range(ids))),) if ids else ())
    return model.PodResourcesSnapshot(tuple(
        model.PodAllocation(f"team-{p % 50:02d}", f"training-job-{p:05d}-worker-abcde",
                            tuple(container(p, c) for c in range(containers)))
        for p in range(count)))


@pytest.mark.parametrize("answer, needle", [
    (lambda: _pods(MAX_PODS + 1), f"more than {MAX_PODS} pods"),
    (lambda: _pods(MAX_CONTAINERS // 8 + 1, containers=8), f"more than {MAX_CONTAINERS} containers"),
    (lambda: _pods(1, ids=MAX_DEVICES + 1), f"more than {MAX_DEVICES} device entries"),
    (lambda: _pods(1, claims=MAX_DEVICES // 3 + 1), f"more than {MAX_DEVICES} device entries"),
], ids=["pods", "containers", "device-plugin-ids", "claim-devices"])
def test_answers_over_a_count_limit_are_refused_naming_the_limit_back_off_and_recover(
        serve, sock, answer, needle):  # type: ignore[no-untyped-def]
    # 100k pods fit under the old 16 MiB answer cap and cost hundreds of MB once decoded into
    # records: counts are checked on the decoded message, before any record is built.
    clock = FakeClock()
    src = PodResourcesSource(sock, backoff=(0.5, 30.0), monotonic=clock, random=NO_JITTER)
    current = [answer()]
    kubelet = serve(lambda: current[0])
    with pytest.raises(SourceError, match=needle) as err:
        src.collect()
    assert "kubelet answer" in str(err.value) and "next try in 0.5s" in str(err.value)
    current[0] = SNAPSHOT
    with pytest.raises(SourceError, match="backing off"):
        src.collect()
    assert kubelet.calls == 1, "no new call (and decode) while backing off"
    clock.advance(0.5)
    assert src.collect() == SNAPSHOT
    src.close()


def test_an_answer_at_every_count_limit_is_accepted_and_fits_the_byte_limit(serve, source):
    # Exactly at the limits (not one over): every pod, container and device entry arrives, and the
    # byte limit derived from the counts leaves room for it with long, realistic names.
    containers = MAX_CONTAINERS // MAX_PODS
    ids = MAX_DEVICES // MAX_PODS - 1  # the worker's device-plugin resource is an entry too
    assert MAX_PODS * containers == MAX_CONTAINERS and MAX_PODS * (1 + ids) == MAX_DEVICES
    snapshot = _pods(MAX_PODS, containers=containers, ids=ids)
    response = response_from_snapshot(snapshot)
    assert response.ByteSize() < MAX_ANSWER_BYTES
    serve(lambda: snapshot)
    got = source.collect()
    assert len(got.pods) == MAX_PODS
    assert sum(len(p.containers) for p in got.pods) == MAX_CONTAINERS
    assert got == snapshot_from_response(response)


def test_the_byte_limit_is_derived_from_the_count_limits():
    # The receive limit bounds what decoding costs before any count can be checked (upb builds
    # every sub-message at once: 16 MiB of empty containers took 576 MB): it is what an answer
    # at every count limit takes with long names, not the 16 MiB a kubelet client allows.
    assert PodResourcesSource("/nonexistent")._max_message_bytes == MAX_ANSWER_BYTES < 16 << 20
    assert MAX_ANSWER_BYTES >= MAX_PODS * (253 + 63) + MAX_CONTAINERS * 63 + MAX_DEVICES * 63


def test_empty_entries_under_the_byte_limit_are_refused_by_count_before_any_record():
    # Two bytes per empty container: the cheapest records to ask for. 1.9 million of them fit
    # under the byte limit; the count refuses them before snapshot_from_response runs.
    pod = api_pb2.PodResources(name="p", namespace="n").SerializeToString() + b"\x1a\x00" * (MAX_ANSWER_BYTES // 2 - 64)
    size, varint = len(pod), bytearray()
    while size > 0x7F:
        varint.append(size & 0x7F | 0x80)
        size >>= 7
    raw = b"\x0a" + bytes(varint) + bytes([size]) + pod  # field 1 (pod_resources), length-delimited
    assert len(raw) <= MAX_ANSWER_BYTES
    assert len(api_pb2.ListPodResourcesResponse.FromString(raw).pod_resources[0].containers) > 1_900_000
    with pytest.raises(SourceError, match=f"more than {MAX_CONTAINERS} containers"):
        _decode(raw)


def test_unknown_fault_name_is_rejected(serve):
    kubelet = serve()
    with pytest.raises(ValueError, match="unknown fault"):
        kubelet.inject("kubelet_on_fire")


# --- the simulated kubelet's own API surface ------------------------------------------------------


@pytest.fixture
def stub(sock) -> Iterator[api_pb2_grpc.PodResourcesListerStub]:
    with grpc.insecure_channel("unix://" + sock) as channel:
        yield api_pb2_grpc.PodResourcesListerStub(channel)


def test_server_rate_limit_rejects_a_burst_beyond_ten(serve, stub, sock):
    clock = FakeClock()  # frozen: no tokens refill during the burst
    kubelet = serve(monotonic=clock)
    request = api_pb2.ListPodResourcesRequest()
    for _ in range(10):
        stub.List(request, timeout=5)
    with pytest.raises(grpc.RpcError) as err:
        stub.List(request, timeout=5)
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert err.value.details() == "rejected by rate limit"
    clock.advance(0.025)  # 100 QPS -> two and a half tokens back
    stub.List(request, timeout=5)
    stub.List(request, timeout=5)
    with pytest.raises(grpc.RpcError):
        stub.List(request, timeout=5)
    assert kubelet.calls == 14
    # The source reports the kubelet's rejection as a rate-limit error.
    with pytest.raises(SourceError, match="rate limit"):
        PodResourcesSource(sock).collect()


def test_get_returns_one_pod_or_not_found(serve, stub):
    serve()
    answer = stub.Get(api_pb2.GetPodResourcesRequest(pod_name="trainer-0", pod_namespace="train"), timeout=5)
    pod = SNAPSHOT.pods[-1]
    assert snapshot_from_response(
        api_pb2.ListPodResourcesResponse(pod_resources=[answer.pod_resources])
    ).pods == (pod,)
    with pytest.raises(grpc.RpcError) as err:
        stub.Get(api_pb2.GetPodResourcesRequest(pod_name="nope", pod_namespace="train"), timeout=5)
    assert err.value.code() == grpc.StatusCode.NOT_FOUND


def test_allocatable_lists_plugin_devices(serve, stub):
    serve()
    answer = stub.GetAllocatableResources(api_pb2.AllocatableResourcesRequest(), timeout=5)
    assert [(d.resource_name, list(d.device_ids)) for d in answer.devices] == [
        ("nvidia.com/gpu", [GPU_UUID]),
        ("nvidia.com/mig-1g.18gb", [MIG_UUID]),
    ]


def test_default_socket_is_temporary_and_removed_on_stop():
    with SimulatedKubelet(lambda: SNAPSHOT) as kubelet:
        path = kubelet.socket_path
        assert os.path.exists(path)
        src = PodResourcesSource(path)
        assert src.collect() == SNAPSHOT
        src.close()
    assert not os.path.exists(path)
    assert not os.path.exists(os.path.dirname(path))


def test_a_restarted_kubelet_lists_no_pods_at_first_and_the_last_answer_is_kept(serve, sock):
    """A real kubelet 1.36 (the node test bed) answers on its new socket with no pods for ~1 s after a
    restart; the simulated one does the same, and the source keeps the old socket's last answer for
    such an empty answer, at most RESTART_SETTLE_S, so attribution does not flap."""
    clock = FakeClock()
    pods: list[model.PodResourcesSnapshot] = [SNAPSHOT]
    kubelet = serve(lambda: pods[0])
    src = PodResourcesSource(sock, timeout=2.0, monotonic=clock)
    try:
        assert src.collect() == SNAPSHOT
        kubelet.restart(unsynced_seconds=30.0)
        with grpc.insecure_channel("unix://" + sock) as channel:
            raw = channel.unary_unary(LIST_METHOD, request_serializer=api_pb2.ListPodResourcesRequest.SerializeToString,
                                      response_deserializer=None)(api_pb2.ListPodResourcesRequest(), timeout=2)
        assert api_pb2.ListPodResourcesResponse.FromString(raw).pod_resources == []  # the kubelet's own answer
        assert src.collect() == SNAPSHOT
        clock.now += RESTART_SETTLE_S - 0.5
        assert src.collect() == SNAPSHOT
        clock.now += 1.0  # past the settling time: an empty answer is what it says
        assert src.collect() == model.PodResourcesSnapshot(())
        # On the same socket, every pod gone is believed at once.
        kubelet.restart(unsynced_seconds=0.0)
        assert src.collect() == SNAPSHOT
        pods[0] = model.PodResourcesSnapshot(())
        assert src.collect() == model.PodResourcesSnapshot(())
    finally:
        src.close()
