"""Hardening IV, item 8: an endless watch of ADDED slices must stay within the chart's memory limit
(768 MiB) at the default cap (50,000 slices). Eight-GPU slices as NVIDIA's driver publishes them
took the cluster mode to 882 MB: each device kept its own copy of every attribute pair and of its
tuple of kinds. Now equal pairs and tuples are one object (``kubeapi_cluster.SHARED``); the figures
are ``benchmarks/bench_hardening_iv.py``'s (docs/reliability.md)."""

from __future__ import annotations

import time
from typing import Any

from hostile import ApiServer, HostileServer, Reply, Request, api_client, empty_list, gpu_slice, idle_watch, watch_event

from dra_exporter.sources.kubeapi_cluster import MAX_SHARED, ClusterSource, Shared
from dra_exporter.sources.reflector import Timeouts


def test_slices_from_an_endless_watch_share_their_equal_attributes() -> None:
    def flood(req: Request, reply: Reply) -> None:
        reply.chunked(watch_event("ADDED", gpu_slice(f"g{i}")) for i in range(400))

    lists = {k: empty_list for k in ("resourceslices", "resourceclaims", "deviceclasses", "pods")}
    watches: dict[str, Any] = {k: idle_watch for k in ("resourceclaims", "deviceclasses", "pods")}
    with HostileServer(ApiServer(lists=lists, watches={**watches, "resourceslices": flood})) as api:
        source = ClusterSource(client_factory=lambda: api_client(api.url),
                               timeouts=Timeouts(request=1.0, backoff=(0.05, 0.2)))
        try:
            source.collect()
            deadline = time.monotonic() + 20
            while len(source._reflectors["resourceslices"].items) < 400:
                assert time.monotonic() < deadline, "the watch's slices never all arrived"
                time.sleep(0.05)
            slices = source._reflectors["resourceslices"].snapshot()
        finally:
            source.close()
    devices = [d for sl in slices for d in sl.devices]
    assert len(devices) == 8 * 400
    first, *others = devices
    # The same model's pair, the same tuple of kinds and of capacities: one object for all.
    model = next(p for p in first.attributes if p[0] == "productName")
    assert all(next(p for p in d.attributes if p[0] == "productName") is model for d in others)
    assert all(d.attribute_kinds is first.attribute_kinds and d.capacity is first.capacity for d in others)
    # What is unique stays each device's own.
    assert len({d.attribute("uuid") for d in devices}) == len(devices)


def test_the_shared_table_is_bounded_and_keeps_sharing_past_its_bound() -> None:
    shared = Shared(limit=10)
    kept = [shared(("uuid", f"GPU-{i}")) for i in range(100)]  # unique values fill it, again and again
    assert len(shared._table) <= 10 and [p[1] for p in kept] == [f"GPU-{i}" for i in range(100)]
    pair = shared(("productName", "H100"))
    assert shared(("productName", "H100")) is pair
    assert MAX_SHARED * 200 < 20 << 20  # ~100 B a pair: the default bound costs a few MB


