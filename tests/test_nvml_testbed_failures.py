"""Failure injection of NVIDIA's mock NVML (the ``*.fail`` profiles) through the product's ``NvmlSource``.

Each profile's failures trip after a number of the device's NVML calls: a GPU lost (``lost``), one
fallen off the bus with XID 79, one with uncorrectable ECC and XID 48, NVLink errors on two links of
another. One run per profile, on a private copy of the profile: first until every failure has tripped,
then with the mock's ``overrides.yaml`` healing the lost GPUs (``failure: {mode: healthy}`` deep-merged
over the profile, as ``nvml-mock-ctl fail --mode healthy`` does for a runtime failure).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import pytest
from conftest import NvmlTestbed
from nvmltestbed import copy_profile, device_config, load_profile, profile_path, profiles, run_source
from nvmltestbed import testbed_folder as folder_of_testbed

from dra_exporter import catalog as cat

pytestmark = pytest.mark.testbed_nvml

TRIP_CYCLES = 12
"""Enough cycles for the slowest failure (90 calls of that GPU) to trip."""
HEAL_CYCLES = 3
LOST_MODES = ("lost", "fallen_off_bus")


def failing_profiles() -> list[str]:
    folder = folder_of_testbed()
    if folder is None or not folder.is_dir():
        return ["no-testbed"]
    return [p.name.removesuffix(".yaml") for p in profiles(folder)
            if p.name.endswith(".fail.yaml") and failures(load_profile(p))]


def failures(doc: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {e["index"]: device_config(doc, e["index"])["failure"] for e in doc["devices"]
            if "failure" in device_config(doc, e["index"])}


@functools.cache
def _run(name: str, library: Path, folder: Path, scratch: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    profile = copy_profile(profile_path(folder, name), scratch / name)
    doc = load_profile(profile)
    heal = {str(i): {"failure": {"mode": "healthy"}} for i, f in failures(doc).items() if f["mode"] in LOST_MODES}
    records = run_source(library, profile, [{"cycles": TRIP_CYCLES},
                                            {"cycles": HEAL_CYCLES, "overrides": {"devices": heal}, "settle": 0.4}],
                         interval=0.1)
    return doc, records


@pytest.fixture
def run(request: pytest.FixtureRequest, nvml_testbed: NvmlTestbed,
        tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    return _run(request.param, nvml_testbed.library, nvml_testbed.folder, tmp_path_factory.getbasetemp() / "fail")


def by_index(record: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {d["index"]: d for d in record["devices"]}


def reading(device: dict[str, Any], family: cat.MetricSpec, **labels: str) -> float | None:
    found = [v for m, lab, v in device["readings"] if m == family.name and lab == labels]
    return found[0] if found else None


@pytest.mark.parametrize("run", failing_profiles(), indirect=True)
def test_a_lost_gpu_is_down_alone_and_comes_back_when_it_heals(
        run: tuple[dict[str, Any], list[dict[str, Any]]]) -> None:
    doc, records = run
    assert not [r["error"] for r in records if "error" in r]
    lost = {i for i, f in failures(doc).items() if f["mode"] in LOST_MODES}
    tripped = by_index([r for r in records if r["step"] == 0][-1])
    assert {i for i, d in tripped.items() if not d["up"]} == lost
    for index in lost:
        assert "GPU is lost" in tripped[index]["error"] or "Lost" in tripped[index]["error"], tripped[index]["error"]
        # A down GPU publishes no readings, only what is not read from it (its XIDs).
        assert {m for m, _, _ in tripped[index]["readings"]} <= {cat.GPU_XID_ERRORS.name, cat.GPU_LAST_XID.name}
    for index, device in tripped.items():
        if index not in lost:
            assert reading(device, cat.GPU_TEMPERATURE) == device_config(doc, index)["thermal"]["temperature_gpu_c"]
    healed = by_index(records[-1])
    assert all(d["up"] for d in healed.values()), {i: d["error"] for i, d in healed.items() if not d["up"]}
    for index in lost:
        assert reading(healed[index], cat.GPU_POWER) == device_config(doc, index)["power"]["current_draw_mw"] / 1000


@pytest.mark.parametrize("run", failing_profiles(), indirect=True)
def test_each_xid_counts_once_on_the_gpu_it_happened_on(run: tuple[dict[str, Any], list[dict[str, Any]]]) -> None:
    doc, records = run
    want = {i: str(f["xid"]["code"]) for i, f in failures(doc).items() if "xid" in f}
    assert want
    for record in records[-HEAL_CYCLES - 2:]:  # tripped, and still once after healing: a counter never re-counts
        got = {d["index"]: {lab["xid"]: v for m, lab, v in d["readings"] if m == cat.GPU_XID_ERRORS.name}
               for d in record["devices"]}
        assert {i: x for i, x in got.items() if x} == {i: {code: 1.0} for i, code in want.items()}
        for index in want:
            assert (reading(by_index(record)[index], cat.GPU_LAST_XID) or 0) > 1.6e9  # wall-clock seconds


@pytest.mark.parametrize("run", failing_profiles(), indirect=True)
def test_uncorrectable_ecc_climbs_on_a_gpu_that_stays_up(run: tuple[dict[str, Any], list[dict[str, Any]]]) -> None:
    doc, records = run
    ecc = [i for i, f in failures(doc).items() if f["mode"] == "ecc_uncorrectable"]
    assert ecc
    for index in ecc:
        series = [reading(by_index(r)[index], cat.GPU_ECC_ERRORS, type="uncorrected") for r in records]
        assert all(by_index(r)[index]["up"] for r in records)
        assert None not in series and series == sorted(series) and series[-1] > series[0], series


@pytest.mark.parametrize("run", [n for n in failing_profiles() if n.split(".")[0] in ("a100", "h100", "no-testbed")],
                         indirect=True)
def test_injected_nvlink_errors_climb_on_those_links_only(run: tuple[dict[str, Any], list[dict[str, Any]]]) -> None:
    # Hopper and Ampere only: on Blackwell the injection surfaces on the DL fields that nvml.h says
    # Blackwell does not have (a mock quirk; see test_nvml_testbed_profiles).
    doc, records = run
    injected = {e["index"]: device_config(doc, e["index"])["nvlink_error"] for e in doc["devices"]
                if "nvlink_error" in device_config(doc, e["index"])}
    assert injected
    # The links are found on the first cycle and read from the second on.
    first, last = by_index(records[1]), by_index(records[TRIP_CYCLES - 1])
    for index, spec in injected.items():
        errors = {(lab["link"], lab["type"]): v for m, lab, v in last[index]["readings"]
                  if m == cat.GPU_NVLINK_LINK_ERRORS.name}
        before = {(lab["link"], lab["type"]): v for m, lab, v in first[index]["readings"]
                  if m == cat.GPU_NVLINK_LINK_ERRORS.name}
        climbing = {link for (link, kind), v in errors.items() if kind == "replay" and v > before[(link, kind)]}
        assert climbing == {str(n) for n in spec["links"]}
        assert not any(v for (link, _), v in errors.items() if int(link) not in spec["links"])
