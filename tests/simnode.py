"""Helpers for tests that run the whole exporter on a simulated node."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from dra_exporter import catalog as cat
from dra_exporter import runtime
from dra_exporter.config import Settings
from dra_exporter.model import Frame

SCENARIOS = Path(__file__).resolve().parent / "scenarios"
ATTRIBUTION = str(SCENARIOS / "attribution.yaml")


@contextmanager
def simulated(scenario: str = "demo", *, sim_time: float = 50.0, http: bool = False,
              **settings: object) -> Iterator[runtime.Runtime]:
    """A built runtime on a frozen simulated clock; closed afterwards."""
    listen = "127.0.0.1:0"
    rt = runtime.build(Settings(listen=listen, simulate=scenario, **settings),  # type: ignore[arg-type]
                       sim_time=sim_time, publish=http)
    try:
        yield rt
    finally:
        rt.close()


def labels_of(frame: Frame, name: str) -> list[dict[str, str]]:
    fam = frame.family(name)
    return [dict(s.labels) for s in fam.samples] if fam else []


def values_of(frame: Frame, name: str, key: str = "uuid") -> dict[str, float]:
    fam = frame.family(name)
    return {dict(s.labels)[key]: s.value for s in fam.samples} if fam else {}


def device_labels(frame: Frame) -> dict[str, dict[str, str]]:
    """uuid → labels of its dra_gpu_up series (identity + attribution)."""
    return {lbl["uuid"]: lbl for lbl in labels_of(frame, cat.GPU_UP.name)}


def source_up(frame: Frame, source: str) -> float:
    return values_of(frame, cat.SOURCE_UP.name, "source")[source]


def scrape(port: int, path: str = "/metrics", headers: dict[str, str] | None = None) -> bytes:
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers or {})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return resp.read()


def eventually(check: Callable[[], bool], timeout: float = 10.0, step: float = 0.05) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(step)
