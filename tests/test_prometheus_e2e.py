"""A real Prometheus scrapes the sink; what it stores must be what the frame said."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from promharness import PromServer

from dra_exporter import catalog, model
from dra_exporter.sinks.prometheus import PrometheusSink

pytestmark = pytest.mark.prometheus

CLAIMED = {"uuid": "GPU-11111111-2222-3333-4444-555555555555", "gpu": "0", "profile": "",
           "parent_uuid": "", "namespace": "ml-team", "pod": "trainer-0", "container": "main",
           "claim": "train-gpus"}
MIG = {"uuid": "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee", "gpu": "1", "profile": "1g.18gb",
       "parent_uuid": "GPU-66666666-7777-8888-9999-000000000000", "namespace": "infer",
       "pod": 'svc "ü"\\0', "container": "server", "claim": "mig-slice"}
IDLE = {"uuid": "GPU-99999999-8888-7777-6666-555555555555", "gpu": "2", "profile": "",
        "parent_uuid": "", "namespace": "", "pod": "", "container": "", "claim": ""}


def labels(values: dict[str, str]) -> model.Labels:
    return tuple((name, values.get(name, "")) for name in catalog.DEVICE_LABELS)


def frame(scale: float = 1.0) -> model.Frame:
    return model.Frame((
        model.Family(catalog.GPU_UTILIZATION.name, (
            model.Sample(labels(CLAIMED), 0.93 * scale),
            model.Sample(labels(MIG), 0.41 * scale),
            model.Sample(labels(IDLE), 0.0),
        )),
        model.Family(catalog.GPU_MEMORY_USED.name, (
            model.Sample(labels(CLAIMED), 120_000_000_000.0 * scale),
            model.Sample(labels(MIG), 17_179_869_184.0),
            model.Sample(labels(IDLE), 0.0),
        )),
    ))


@pytest.fixture
def sink() -> Iterator[PrometheusSink]:
    sink = PrometheusSink("127.0.0.1:0")
    sink.start()
    sink.publish(frame())
    yield sink
    sink.stop()


def by_uuid(result: list[dict]) -> dict[str, dict]:
    return {series["metric"]["uuid"]: series for series in result}


@pytest.mark.slow  # ~7 s: a real Prometheus starts and scrapes
def test_prometheus_scrapes_values_and_labels(sink: PrometheusSink,
                                              prometheus: Callable[..., PromServer]) -> None:
    server = prometheus([f"127.0.0.1:{sink.port}"])
    published = frame()
    expected = {fam.name: {dict(s.labels)["uuid"]: s.value for s in fam.samples} for fam in published.families}

    for name, values in expected.items():
        result = by_uuid(server.wait_for(name, lambda r: len(r) == 3))
        assert set(result) == set(values)
        for uuid, value in values.items():
            metric = result[uuid]["metric"]
            assert metric.pop("__name__") == name
            assert metric.pop("job") == "dra-exporter"
            assert metric.pop("instance") == f"127.0.0.1:{sink.port}"
            source = next(d for d in (CLAIMED, MIG, IDLE) if d["uuid"] == uuid)
            # Prometheus drops empty labels; everything else must arrive unchanged.
            assert metric == {k: v for k, v in source.items() if v}
            assert float(result[uuid]["value"][1]) == value

    targets = server.targets()
    assert [t["health"] for t in targets] == ["up"], targets

    # A new frame reaches Prometheus on a later scrape.
    sink.publish(frame(scale=0.5))
    result = server.wait_for(f'{catalog.GPU_UTILIZATION.name}{{pod="trainer-0"}}',
                             lambda r: len(r) == 1 and float(r[0]["value"][1]) == 0.93 * 0.5)
    assert result[0]["metric"]["claim"] == "train-gpus"
    # Sums stay right: the MIG slice and the idle GPU count once each.
    total = server.query(f"sum({catalog.GPU_MEMORY_USED.name})")
    assert float(total[0]["value"][1]) == 120_000_000_000.0 * 0.5 + 17_179_869_184.0
