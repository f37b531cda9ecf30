"""Every board profile of NVIDIA's mock NVML through the product's ``NvmlSource`` over the real pynvml.

One subprocess per profile (``nvmltestbed.run_source``, three cycles), cached for the module; the tests
compare what the source read with the profile YAML, read here and converted here (mW -> W, MHz -> Hz,
MiB -> bytes, % -> ratio, mJ -> J), so a unit error in the source cannot hide in a shared helper.

Where the mock answers unlike real NVML (the test bed's README), the expectation follows real NVML
(nvml.h) and the test is a strict xfail naming the quirk: it fails loudly the day the mock is fixed.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import NvmlTestbed
from nvmltestbed import (
    device_config,
    load_profile,
    nvml_bus_id,
    profile_path,
    profiles,
    run_source,
)
from nvmltestbed import testbed_folder as folder_of_testbed

from dra_exporter import catalog as cat

pytestmark = pytest.mark.testbed_nvml

Key = tuple[str, tuple[tuple[str, str], ...]]
GPM_ARCHITECTURES = ("hopper", "blackwell")
GPM_FAMILIES = (cat.GPU_SM_ACTIVE, cat.GPU_SM_OCCUPANCY, cat.GPU_TENSOR_ACTIVE, cat.GPU_DRAM_ACTIVE,
                cat.GPU_FP64_ACTIVE, cat.GPU_FP32_ACTIVE, cat.GPU_FP16_ACTIVE)
LINK_FAMILIES = (cat.GPU_NVLINK_LINK_UP, cat.GPU_NVLINK_LINK_INFO, cat.GPU_NVLINK_LINK_SPEED,
                 cat.GPU_NVLINK_LINK_BYTES, cat.GPU_NVLINK_LINK_ERRORS)
FABRIC_FAMILIES = (cat.GPU_FABRIC_INFO, cat.GPU_FABRIC_STATE, cat.GPU_FABRIC_REGISTERED, cat.GPU_FABRIC_HEALTH,
                   cat.GPU_FABRIC_HEALTH_PROBLEM)
#: The profile's throttle-reason keys and the exporter's ``reason`` label (NVML's names, lower case).
REASONS = (("gpu_idle", "gpu_idle"), ("applications_clocks_setting", "applications_clocks_setting"),
           ("sw_power_cap", "sw_power_cap"), ("hw_slowdown", "hw_slowdown"), ("sync_boost", "sync_boost"),
           ("sw_thermal_slowdown", "sw_thermal_slowdown"), ("hw_thermal_slowdown", "hw_thermal_slowdown"),
           ("hw_power_brake_slowdown", "hw_power_brake_slowdown"),
           ("display_clocks_setting", "display_clock_setting"))
#: nvmlNvlinkVersion_t (nvml.h): the enum real NVML answers, by NVLink generation.
NVLINK_VERSION_ENUM = {1: "1.0", 2: "2.0", 3: "3.0", 4: "4.0", 5: "5.0"}
#: The mock's traffic model (engine/topology.go): every active link moves its line rate times
#: ``nvlink.defaults.duty_cycle`` (default 0.05) each second, in each direction.
DEFAULT_DUTY_CYCLE = 0.05


def short_name(path: Path) -> str:
    return path.name.removeprefix("mock-nvml-config-").removesuffix(".yaml")


def names(keep: Any = None) -> list[str]:
    """Profile names for ``parametrize``, chosen by ``keep(doc)``; one placeholder without the test bed
    (the fixture then skips, or fails under CI)."""
    folder = folder_of_testbed()
    if folder is None or not folder.is_dir():
        return ["no-testbed"]
    chosen = [short_name(p) for p in profiles(folder) if keep is None or keep(load_profile(p))]
    return chosen or ["none-applies"]


def quirky(chosen: list[str], quirks: dict[str, str]) -> list[Any]:
    """``chosen`` with the profiles in ``quirks`` as strict xfails: there the mock is not real NVML."""
    return [pytest.param(n, marks=pytest.mark.xfail(strict=True, reason=f"mock quirk: {quirks[n]}"))
            if n in quirks else n for n in chosen]


def arch(doc: dict[str, Any]) -> str:
    return str(doc["device_defaults"].get("architecture", ""))


def driver_major(doc: dict[str, Any]) -> int:
    return int(str(doc["system"]["driver_version"]).split(".")[0])


def has_switch_links(doc: dict[str, Any]) -> bool:
    """NVLink through NVSwitches the mock expands to ``links_per_gpu`` active links per GPU. Profiles
    with explicit per-device links (gb200.linkdown) are the ``nvlink`` enumeration tests' business."""
    nvlink = doc.get("nvlink") or {}
    return bool(nvlink.get("switches")) and not nvlink.get("device_links")


def gpm_expected(doc: dict[str, Any]) -> bool:
    # The mock offers the GPM API from R535 on (engine/version.go); the drv525 profile is left out of
    # GPM expectations rather than asserting either way about a driver NVML's history does not settle here.
    return arch(doc) in GPM_ARCHITECTURES and driver_major(doc) >= 535


@dataclass
class Board:
    name: str
    doc: dict[str, Any]
    records: list[dict[str, Any]]

    @property
    def last(self) -> dict[str, Any]:
        return self.records[-1]

    def cfg(self, index: int) -> dict[str, Any]:
        return device_config(self.doc, index)

    def healthy_devices(self) -> list[dict[str, Any]]:
        """Devices of the last cycle whose profile injects no failure (those are test_nvml_testbed_failures')."""
        return [d for d in self.last["devices"] if "failure" not in self.cfg(d["index"])]


def values(device: dict[str, Any], families: tuple[cat.MetricSpec, ...] | None = None) -> dict[Key, float]:
    wanted = None if families is None else {f.name for f in families}
    return {(metric, tuple(sorted(labels.items()))): value for metric, labels, value in device["readings"]
            if wanted is None or metric in wanted}


def key(family: cat.MetricSpec, **labels: str) -> Key:
    return (family.name, tuple(sorted(labels.items())))


@functools.cache
def _run(name: str, library: Path, folder: Path) -> Board:
    path = profile_path(folder, name)
    return Board(name, load_profile(path), run_source(library, path, [{"cycles": 3}], interval=0.3))


@pytest.fixture
def board(request: pytest.FixtureRequest, nvml_testbed: NvmlTestbed) -> Board:
    if request.param == "none-applies":
        pytest.skip("no profile of this test bed applies")
    board = _run(request.param, nvml_testbed.library, nvml_testbed.folder)
    errors = [r["error"] for r in board.records if "error" in r]
    assert not errors, f"{board.name}: the NVML source failed: {errors[0]}\n{board.last.get('log', '')[-2000:]}"
    return board


def profile_values(cfg: dict[str, Any], *, memory_v2: bool = True) -> dict[Key, float | None]:
    """Every value the profile fixes for one GPU, in the exporter's base units (None: present, any value)."""
    out: dict[Key, float | None] = {}
    memory = cfg["memory"]
    out[key(cat.GPU_MEMORY_USED)] = memory["used_bytes"]
    out[key(cat.GPU_MEMORY_FREE)] = memory["free_bytes"]
    out[key(cat.GPU_MEMORY_TOTAL)] = memory["total_bytes"]
    if memory_v2:  # nvmlMemory_t (v1, drivers before R510) has no reserved field
        out[key(cat.GPU_MEMORY_RESERVED)] = memory["reserved_bytes"]
    out[key(cat.GPU_UTILIZATION)] = cfg["utilization"]["gpu"] / 100
    out[key(cat.GPU_MEMORY_UTILIZATION)] = cfg["utilization"]["memory"] / 100
    out[key(cat.GPU_POWER)] = cfg["power"]["current_draw_mw"] / 1000
    out[key(cat.GPU_POWER_LIMIT)] = cfg["power"]["enforced_limit_mw"] / 1000
    # Real energy grows; the mock's is a fixed number (README), which is still the profile's value. A
    # profile without one says nothing (the mock answers 0): None, not compared.
    energy = cfg["power"].get("total_energy_consumption_mj")
    out[key(cat.GPU_ENERGY)] = None if energy is None else energy / 1000
    out[key(cat.GPU_TEMPERATURE)] = cfg["thermal"]["temperature_gpu_c"]
    out[key(cat.GPU_MEMORY_TEMPERATURE)] = cfg["thermal"]["temperature_memory_c"]
    for clock in ("sm", "memory", "graphics", "video"):
        out[key(cat.GPU_CLOCK, clock=clock)] = cfg["clocks"][f"{clock}_current"] * 1e6
    reasons = cfg["clocks_throttle_reasons"]
    for profile_key, label in REASONS:
        out[key(cat.GPU_CLOCK_EVENT, reason=label)] = float(bool(reasons.get(profile_key)))
    volatile = cfg["ecc"]["errors"]["volatile"]
    out[key(cat.GPU_ECC_ERRORS, type="corrected")] = volatile["single_bit"]["total"]
    out[key(cat.GPU_ECC_ERRORS, type="uncorrected")] = volatile["double_bit"]["total"]
    rows = cfg["remapped_rows"]
    out[key(cat.GPU_REMAPPED_ROWS, type="correctable")] = rows["correctable"]
    out[key(cat.GPU_REMAPPED_ROWS, type="uncorrectable")] = rows["uncorrectable"]
    out[key(cat.GPU_ROW_REMAP_PENDING)] = float(bool(rows["pending"]))
    out[key(cat.GPU_ROW_REMAP_FAILURE)] = float(bool(rows["failure_occurred"]))
    return {k: None if v is None else float(v) for k, v in out.items()}


VALUE_FAMILIES = (cat.GPU_MEMORY_USED, cat.GPU_MEMORY_FREE, cat.GPU_MEMORY_TOTAL, cat.GPU_MEMORY_RESERVED,
                  cat.GPU_UTILIZATION, cat.GPU_MEMORY_UTILIZATION, cat.GPU_POWER, cat.GPU_POWER_LIMIT,
                  cat.GPU_ENERGY, cat.GPU_TEMPERATURE, cat.GPU_MEMORY_TEMPERATURE, cat.GPU_CLOCK,
                  cat.GPU_CLOCK_EVENT, cat.GPU_ECC_ERRORS, cat.GPU_REMAPPED_ROWS, cat.GPU_ROW_REMAP_PENDING,
                  cat.GPU_ROW_REMAP_FAILURE)


# -- identity and plain values ---------------------------------------------------------------------


@pytest.mark.parametrize("board", names(), indirect=True)
def test_every_gpu_of_the_profile_is_reported_with_its_identity(board: Board) -> None:
    system = board.doc["system"]
    assert (board.last["driver"], board.last["nvml"]) == (system["driver_version"], system["nvml_version"])
    got = board.last["devices"]
    assert [d["index"] for d in got] == sorted(e["index"] for e in board.doc["devices"])
    first = board.records[0]["devices"]
    assert all(d["up"] for d in first), [(d["index"], d["error"]) for d in first if not d["up"]]
    for device in got:
        cfg = board.cfg(device["index"])
        entry = next(e for e in board.doc["devices"] if e["index"] == device["index"])
        mig = "enabled" if cfg["mig"]["mode_current"] == "enabled" else "disabled"
        # A profile that fails to load becomes 8 "Mock A100"s: the model and serial-derived UUID tell.
        assert {k: device[k] for k in ("uuid", "minor", "pci_bus_id", "model", "driver_version", "mig_mode",
                                       "parent_uuid")} == {
            "uuid": entry["uuid"], "minor": entry["minor_number"], "pci_bus_id": nvml_bus_id(entry["pci"]["bus_id"]),
            "model": cfg["name"], "driver_version": system["driver_version"], "mig_mode": mig, "parent_uuid": ""}


@pytest.mark.parametrize("board", names(), indirect=True)
def test_every_value_is_the_profiles_in_base_units(board: Board) -> None:
    memory_v2 = driver_major(board.doc) >= 510
    wrong = {}
    for device in board.healthy_devices():
        want = profile_values(board.cfg(device["index"]), memory_v2=memory_v2)
        got = values(device, VALUE_FAMILIES)
        for k in want.keys() | got.keys():
            expected = want.get(k)
            if k not in got or k not in want or (expected is not None and
                                                 abs(got[k] - expected) > 1e-9 * max(1.0, abs(expected))):
                wrong[(device["index"], *k)] = (got.get(k), want.get(k))
    assert not wrong, f"{board.name}: (gpu, family, labels): (exported, profile): {wrong}"


@pytest.mark.parametrize("board", quirky(names(), {
    # Real R470 answers the v2 process calls (pynvml's unversioned v3 ones are refused before R510, and the
    # source falls back to v2); the mock's v2 calls are stubs answering NOT_SUPPORTED (bridge/stubs_generated.go).
    "h100.drv470": "nvmlDevice*RunningProcesses_v2 are NOT_SUPPORTED stubs"}), indirect=True)
def test_processes_are_the_profiles_and_never_read_from_a_mig_parent(board: Board) -> None:
    want = set()
    for device in board.healthy_devices():
        cfg = board.cfg(device["index"])
        if cfg["mig"]["mode_current"] == "enabled":
            continue  # processes of a MIG GPU live on its MIG devices (the mock has none)
        want |= {(device["uuid"], p["pid"], p["used_memory_mib"] * 2**20, p["sm_util"] / 100)
                 for p in cfg.get("processes") or []}
    healthy = {d["uuid"] for d in board.healthy_devices()}
    got = {(p["uuid"], p["pid"], p["used_memory_bytes"], p["sm_utilization_ratio"])
           for p in board.last["processes"] if p["uuid"] in healthy}
    assert got == want


# -- families present and absent as the board has them --------------------------------------------


@pytest.mark.parametrize("board", names(), indirect=True)
def test_families_are_present_and_absent_as_the_board_has_them(board: Board) -> None:
    doc = board.doc
    for device in board.healthy_devices():
        cfg = board.cfg(device["index"])
        present = {metric for metric, _, _ in device["readings"]}
        expect = {
            "gpm": (GPM_FAMILIES, gpm_expected(doc) if driver_major(doc) != 525 else None),
            # Not settled where the profile has no NVLink: real NVML answers NOT_SUPPORTED for every link
            # index there (no link, no family), the mock answers "disabled" for all 18 (a quirk), which the
            # source reads as 18 links down — checked below as down and silent, never as traffic.
            "nvlink per link": (LINK_FAMILIES, True if has_switch_links(doc) else None),
            "nvlink bytes": ((cat.GPU_NVLINK_BYTES,),
                             True if has_switch_links(doc) or (doc.get("nvlink") and gpm_expected(doc)) else None),
            "fabric": (FABRIC_FAMILIES, "fabric" in cfg),
            "xid": ((cat.GPU_XID_ERRORS, cat.GPU_LAST_XID), False),  # no XID without a failure
        }
        if not doc.get("nvlink"):
            ups = [value for metric, _, value in device["readings"] if metric == cat.GPU_NVLINK_LINK_UP.name]
            moved = [value for metric, _, value in device["readings"]
                     if metric in (cat.GPU_NVLINK_LINK_BYTES.name, cat.GPU_NVLINK_BYTES.name) and value]
            assert not any(ups) and not moved, (board.name, device["index"], "a board without NVLink has traffic")
        for what, (families, expected) in expect.items():
            if expected is None:
                continue  # not settled by the profile (see gpm_expected and has_switch_links)
            if what == "fabric" and expected:
                families = families[:3]  # health families need the v2/v3 struct: test_fabric_* checks them
            found = {f.name for f in families} & present
            if expected:
                assert found == {f.name for f in families}, (board.name, device["index"], what, found)
            else:
                assert not found, (board.name, device["index"], what, found)


# -- GPM ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("board", names(gpm_expected), indirect=True)
def test_gpm_ratios_are_ratios_of_the_modelled_load(board: Board) -> None:
    for device in board.healthy_devices():
        util = board.cfg(device["index"])["utilization"]
        got = values(device, GPM_FAMILIES)
        assert all(0.0 <= v <= 1.0 for v in got.values()), got
        # The mock models GPM SM activity as the GPU utilisation and DRAM activity as the memory
        # utilisation (engine/gpm.go), in percent: a ratio left in percent would read 73, not 0.73.
        assert got[key(cat.GPU_SM_ACTIVE)] == pytest.approx(util["gpu"] / 100)
        assert got[key(cat.GPU_DRAM_ACTIVE)] == pytest.approx(util["memory"] / 100)


# -- fabric ---------------------------------------------------------------------------------------


def fabric_expected(fabric: dict[str, Any]) -> dict[Key, float]:
    """What nvmlDeviceGetGpuFabricInfoV says for a profile's ``fabric:`` block, as the exporter names it.

    ``state: auto`` follows the fake fabric manager, which is absent here: COMPLETED. A GPU is in a
    multi-node clique (GPU Feature Discovery's ``<clusterUUID>.<cliqueId>``) only when registration
    completed with a cluster UUID that is not all zeros."""
    import pynvml

    state = {"auto": "completed"}.get(fabric["state"], fabric["state"])
    completed = state == "completed"
    cluster = fabric["cluster_uuid"] if completed and fabric["cluster_uuid"].strip("0-") else ""
    clique_id = str(fabric["clique_id"]) if completed else ""
    out = {key(cat.GPU_FABRIC_INFO, clique=f"{cluster}.{clique_id}" if cluster else "", cluster_uuid=cluster,
               clique_id=clique_id): 1.0,
           key(cat.GPU_FABRIC_REGISTERED): float(completed)}
    for name in ("not_supported", "not_started", "in_progress", "completed"):
        out[key(cat.GPU_FABRIC_STATE, state=name)] = float(name == state)
    health = fabric.get("health") or {}
    problems = {"degraded_bw": bool(health.get("degraded_bandwidth")),
                "route_recovery": bool(health.get("route_recovery")),
                "route_unhealthy": bool(health.get("route_unhealthy")),
                "access_timeout_recovery": bool(health.get("access_timeout_recovery")),
                "incorrect_configuration": False}
    if "health_mask" in fabric:  # a raw mask: decoded with nvml.h's shifts and widths
        mask, problems, prefix = int(fabric["health_mask"]), {}, "NVML_GPU_FABRIC_HEALTH_MASK_"
        for field, bad, negated in (("DEGRADED_BW", "TRUE", False), ("ROUTE_RECOVERY", "TRUE", False),
                                    ("ROUTE_UNHEALTHY", "TRUE", False), ("ACCESS_TIMEOUT_RECOVERY", "TRUE", False),
                                    ("INCORRECT_CONFIGURATION", "NONE", True), ("PARTITION_ASSIGNED", "FALSE", False),
                                    ("GFM_STATE", "DISCONNECTED", False)):
            raw = (mask >> getattr(pynvml, f"{prefix}SHIFT_{field}")) & getattr(pynvml, f"{prefix}WIDTH_{field}")
            if raw:  # 0: NOT_SUPPORTED, not reported
                flagged = getattr(pynvml, f"{prefix}{field}_{bad}")
                problems[field.lower()] = raw != flagged if negated else raw == flagged
    for field, problem in problems.items():
        out[key(cat.GPU_FABRIC_HEALTH_PROBLEM, field=field)] = float(problem)
    if "health_mask" in fabric:
        return out  # the summary a driver would give with this raw mask is not the profile's to say
    summary = "limited_capacity" if problems["degraded_bw"] else "healthy"
    for name in ("not_supported", "healthy", "unhealthy", "limited_capacity"):
        out[key(cat.GPU_FABRIC_HEALTH, summary=name)] = float(name == summary)
    return out


@pytest.mark.parametrize("board", names(lambda doc: "fabric" in doc["device_defaults"]), indirect=True)
def test_fabric_clique_cluster_state_and_health_are_the_profiles(board: Board) -> None:
    wrong = {}
    for device in board.healthy_devices():
        fabric = board.cfg(device["index"])["fabric"]
        want = fabric_expected(fabric)
        families = FABRIC_FAMILIES if "health_mask" not in fabric else FABRIC_FAMILIES[:3] + FABRIC_FAMILIES[4:]
        got = values(device, families)
        if got != want:
            wrong[device["index"]] = {k: (got.get(k), want.get(k)) for k in got.keys() | want.keys()
                                      if got.get(k) != want.get(k)}
    assert not wrong, f"{board.name}: gpu: {{family, labels: (exported, profile)}}: {wrong}"


# -- NVLink per link (enumeration beyond the first link down: the nvlink tests) -------------------


@pytest.mark.parametrize("board", names(has_switch_links), indirect=True)
def test_every_switch_link_is_up_at_the_profiles_speed_towards_a_switch(board: Board) -> None:
    nvlink = board.doc["nvlink"]
    links = [str(n) for n in range(nvlink["links_per_gpu"])]
    for device in board.healthy_devices():
        got = values(device, (cat.GPU_NVLINK_LINK_UP, cat.GPU_NVLINK_LINK_SPEED))
        # Mock quirk: an index past the board's links answers "disabled" where real NVML answers
        # NOT_SUPPORTED, so the source reads such indices as links down: they must be down and nothing else.
        extra = {k: v for k, v in got.items() if dict(k[1])["link"] not in links}
        assert all(k[0] == cat.GPU_NVLINK_LINK_UP.name and v == 0.0 for k, v in extra.items()), extra
        got = {k: v for k, v in got.items() if k not in extra}
        assert got == {**{key(cat.GPU_NVLINK_LINK_UP, link=n): 1.0 for n in links},
                       # MBps in the profile and in NVML (nvml.h: NVML_FI_DEV_NVLINK_GET_SPEED), bytes/s here
                       **{key(cat.GPU_NVLINK_LINK_SPEED, link=n): nvlink["bandwidth_per_link_mbps"] * 1e6
                          for n in links}}
        remote = {labels["link"]: labels["remote_type"] for metric, labels, _ in device["readings"]
                  if metric == cat.GPU_NVLINK_LINK_INFO.name and labels["link"] in links}
        assert remote == dict.fromkeys(links, "switch")
        if "nvlink_error" not in board.cfg(device["index"]):
            errors = values(device, (cat.GPU_NVLINK_LINK_ERRORS, cat.GPU_NVLINK_LINK_RECOVERIES))
            assert errors and not any(errors.values()), {k: v for k, v in errors.items() if v}


# -- where the mock is not real NVML: the expectation is NVML's, the test a strict xfail ----------


@pytest.mark.xfail(strict=True, reason="mock quirk: encoder/decoder utilisation is fixed at 0 (test bed README)")
@pytest.mark.parametrize("board", names(lambda doc: any(device_config(doc, e["index"])["utilization"].get(c)
                                                          for e in doc["devices"] for c in ("encoder", "decoder"))),
                         indirect=True)
def test_codec_utilisation_is_the_profiles(board: Board) -> None:
    for device in board.healthy_devices():
        util = board.cfg(device["index"])["utilization"]
        assert values(device, (cat.GPU_ENCODER_UTILIZATION, cat.GPU_DECODER_UTILIZATION)) == {
            key(cat.GPU_ENCODER_UTILIZATION): util["encoder"] / 100,
            key(cat.GPU_DECODER_UTILIZATION): util["decoder"] / 100}


@pytest.mark.xfail(strict=True, reason="mock quirk: the PCIe replay counter is fixed at 0 (test bed README)")
@pytest.mark.parametrize("board", names(lambda doc: doc["device_defaults"]["pcie"].get("replay_counter")),
                         indirect=True)
def test_pcie_replays_are_the_profiles(board: Board) -> None:
    for device in board.healthy_devices():
        assert values(device, (cat.GPU_PCIE_REPLAYS,)) == {
            key(cat.GPU_PCIE_REPLAYS): float(board.cfg(device["index"])["pcie"]["replay_counter"])}


@pytest.mark.xfail(strict=True, reason="mock quirk: nvmlDeviceGetNvLinkVersion answers the raw generation, "
                                       "not nvml.h's nvmlNvlinkVersion_t (test bed README)")
@pytest.mark.parametrize("board", names(has_switch_links), indirect=True)
def test_nvlink_version_is_the_boards_generation(board: Board) -> None:
    want = NVLINK_VERSION_ENUM[board.doc["nvlink"]["version"]]
    versions = {labels["version"] for d in board.healthy_devices() for metric, labels, _ in d["readings"]
                if metric == cat.GPU_NVLINK_LINK_INFO.name}
    assert versions == {want}


@pytest.mark.xfail(strict=True, reason="mock quirk: NVLink throughput fields 138/139 count bytes; nvml.h counts KiB "
                                       "(test bed README)")
@pytest.mark.parametrize("board", names(has_switch_links), indirect=True)
def test_nvlink_link_bytes_grow_at_the_modelled_line_rate(board: Board) -> None:
    nvlink = board.doc["nvlink"]
    rate = nvlink["bandwidth_per_link_mbps"] * 1e6 * (nvlink.get("defaults") or {}).get("duty_cycle",
                                                                                         DEFAULT_DUTY_CYCLE)
    first, last = board.records[0]["devices"][0], board.records[-1]["devices"][0]
    # The cycles are 0.3 s apart plus the time a cycle takes: bound the rate, do not time it.
    seconds = 2 * 0.3
    k = key(cat.GPU_NVLINK_LINK_BYTES, link="0", direction="tx")
    grown = values(last)[k] - values(first)[k]
    assert rate * seconds * 0.8 <= grown <= rate * seconds * 3, (grown, rate)


@pytest.mark.xfail(strict=True, reason="mock quirk: Blackwell profiles also answer the Hopper NVLink error "
                                       "fields, which nvml.h says are unsupported on Blackwell (test bed README)")
@pytest.mark.parametrize("board", names(lambda doc: has_switch_links(doc) and arch(doc) == "blackwell"), indirect=True)
def test_blackwell_links_have_no_hopper_error_counters(board: Board) -> None:
    hopper_only = {"crc_flit", "replay", "recovery"}
    found = {labels["type"] for d in board.healthy_devices() for metric, labels, _ in d["readings"]
             if metric == cat.GPU_NVLINK_LINK_ERRORS.name} & hopper_only
    assert not found
