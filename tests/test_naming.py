"""``--naming dcgm|both``: dcgm-exporter's names, units and labels, as its dashboards and alerts expect."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest
from click.testing import CliRunner
from promharness import promtool_check_metrics

from dra_exporter import catalog as cat
from dra_exporter import cli, naming
from dra_exporter.model import Family, Frame, Labels, Sample
from dra_exporter.sinks.prometheus import render

GPU = "GPU-aaaa"
MIG = "MIG-bbbb"
SHARED = "GPU-cccc"
IDLE_GPU = dict(uuid=GPU, gpu="0", profile="", parent_uuid="")
MIG_DEV = dict(uuid=MIG, gpu="0", profile="1g.18gb", parent_uuid=GPU)
SHARED_DEV = dict(uuid=SHARED, gpu="1", profile="", parent_uuid="")
NOBODY = dict(namespace="", pod="", pod_uid="", container="", claim="", request="")


def labels(name: str, **values: str) -> Labels:
    return tuple((k, values.get(k, "")) for k in cat.spec(name).labels)


def fam(name: str, *samples: tuple[Labels, float]) -> Family:
    return Family(name, tuple(Sample(lbl, v) for lbl, v in samples))


def frame(*families: Family) -> Frame:
    info = fam(cat.GPU_INFO.name,
               (labels(cat.GPU_INFO.name, uuid=GPU, gpu="0", model="NVIDIA H200", pci_bus_id="00000000:18:00.0",
                       driver_version="580.1", mig_mode="enabled"), 1.0),
               (labels(cat.GPU_INFO.name, uuid=MIG, gpu="0", model="NVIDIA H200", pci_bus_id="00000000:18:00.0",
                       driver_version="580.1", profile="1g.18gb", parent_uuid=GPU, gpu_instance_id="7",
                       compute_instance_id="0"), 1.0),
               (labels(cat.GPU_INFO.name, uuid=SHARED, gpu="1", model="NVIDIA H200", pci_bus_id="00000000:2A:00.0",
                       driver_version="580.1", mig_mode="disabled"), 1.0))
    alloc = fam(cat.CLAIM_ALLOCATION_INFO.name,
                (labels(cat.CLAIM_ALLOCATION_INFO.name, namespace="ml", claim="c1", request="gpu",
                        driver="gpu.nvidia.com", pool="node-a", device="gpu-0-mig-19-7-0", uuid=MIG), 1.0))
    return Frame((info, alloc, *families), 1000.0)


def dev(name: str, device: dict[str, str], value: float, attribution: dict[str, str] = NOBODY,
        **extra: str) -> tuple[Labels, float]:
    return labels(name, **device, **attribution, **extra), value


HELD = dict(namespace="ml", pod="train-0", pod_uid="u-1", container="main", claim="c1", request="gpu")
SHARED_BY_TWO = dict(NOBODY, namespace="ml", claim="c2", request="gpu")


def dcgm(fr: Frame, name: str, naming_: str = "dcgm") -> dict[str, tuple[dict[str, str], float]]:
    """The DCGM family ``name`` of ``fr`` converted under ``naming_``, by UUID+GPU_I_ID."""
    family = naming.apply(fr, naming_, hostname="node-a").family(name)
    assert family is not None, name
    out = {}
    for s in family.samples:
        d = dict(s.labels)
        assert tuple(d) == cat.DCGM_NAMINGS[naming_].labels  # always the full, ordered label set
        out[d["UUID"] + "/" + d["GPU_I_ID"]] = (d, s.value)
    return out


def units_frame() -> Frame:
    return frame(
        fam(cat.GPU_MEMORY_USED.name, dev(cat.GPU_MEMORY_USED.name, IDLE_GPU, 3 * 2**20)),
        fam(cat.GPU_MEMORY_TOTAL.name, dev(cat.GPU_MEMORY_TOTAL.name, IDLE_GPU, 141 * 2**30)),
        fam(cat.GPU_CLOCK.name, dev(cat.GPU_CLOCK.name, IDLE_GPU, 1.98e9, clock="sm"),
            dev(cat.GPU_CLOCK.name, IDLE_GPU, 3.2e9, clock="memory"),
            dev(cat.GPU_CLOCK.name, IDLE_GPU, 1e9, clock="video")),
        fam(cat.GPU_ENERGY.name, dev(cat.GPU_ENERGY.name, IDLE_GPU, 12.5)),
        fam(cat.GPU_UTILIZATION.name, dev(cat.GPU_UTILIZATION.name, IDLE_GPU, 0.25)),
        fam(cat.GPU_POWER.name, dev(cat.GPU_POWER.name, IDLE_GPU, 310.0)),
        fam(cat.GPU_TENSOR_ACTIVE.name, dev(cat.GPU_TENSOR_ACTIVE.name, IDLE_GPU, 0.5)),
        fam(cat.GPU_REMAPPED_ROWS.name, dev(cat.GPU_REMAPPED_ROWS.name, IDLE_GPU, 2, type="correctable"),
            dev(cat.GPU_REMAPPED_ROWS.name, IDLE_GPU, 1, type="uncorrectable")),
        fam(cat.GPU_NVLINK_BYTES.name, dev(cat.GPU_NVLINK_BYTES.name, IDLE_GPU, 100, direction="rx"),
            dev(cat.GPU_NVLINK_BYTES.name, IDLE_GPU, 50, direction="tx")),
    )


def test_units_are_dcgms() -> None:
    fr = units_frame()
    key = f"{GPU}/"
    assert dcgm(fr, "DCGM_FI_DEV_FB_USED")[key][1] == 3.0  # MiB
    assert dcgm(fr, "DCGM_FI_DEV_SM_CLOCK")[key][1] == pytest.approx(1980.0)  # MHz
    assert dcgm(fr, "DCGM_FI_DEV_MEM_CLOCK")[key][1] == pytest.approx(3200.0)
    assert dcgm(fr, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION")[key][1] == 12500.0  # mJ
    assert dcgm(fr, "DCGM_FI_DEV_GPU_UTIL")[key][1] == 25.0  # %
    assert dcgm(fr, "DCGM_FI_DEV_POWER_USAGE")[key][1] == 310.0  # W
    assert dcgm(fr, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE")[key][1] == 0.5  # ratio
    assert dcgm(fr, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS")[key][1] == 2
    assert dcgm(fr, "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS")[key][1] == 1
    # A rate, 0 on the first frame as DCGM's first sample (test_every_dcgm_alias_holds_dcgms_value).
    assert dcgm(fr, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL")[key][1] == 0  # rx + tx, one series


# --- dcgm-4.10: dcgm-exporter 4.9/4.10, DCGM 4.7/4.8's names and base units ---------------------


def test_dcgm_410_names_and_base_units() -> None:
    fr = units_frame()
    key = f"{GPU}/"

    def value(name: str) -> float:
        return dcgm(fr, name, "dcgm-4.10")[key][1]

    assert value("DCGM_FI_DEV_FB_USED_BYTES") == 3 * 2**20  # bytes, not MiB
    assert value("DCGM_FI_DEV_FB_CAPACITY_BYTES") == 141 * 2**30  # collected by default since 4.9
    assert value("DCGM_FI_DEV_SM_CLOCK_HERTZ") == 1.98e9  # Hz, not MHz
    assert value("DCGM_FI_DEV_MEMORY_CLOCK_HERTZ") == 3.2e9
    assert value("DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL") == 12  # J, not mJ: DCGM's int64
    assert value("DCGM_FI_DEV_GPU_UTIL_RATIO") == 0.25  # a ratio, not %
    assert value("DCGM_FI_DEV_BOARD_POWER_WATTS") == 310.0
    assert value("DCGM_FI_PROF_TENSOR_UTIL_RATIO") == 0.5
    assert value("DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL") == 2
    assert value("DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL") == 1
    names = {f.name for f in naming.apply(fr, "dcgm-4.10", hostname="n").families}
    # DCGM 4.7's NVLink throughput is a rate in bytes per second; the native counter stays beside it.
    assert cat.GPU_NVLINK_BYTES.name in names and "DCGM_FI_DEV_NVLINK_THROUGHPUT_BYTES_PER_SECOND" in names
    # No 4.8 name is published under 4.10, and no 4.10 name under dcgm.
    old = {f.name for _, f, _ in cat.dcgm_renames() if f} - {f.name for _, _, f in cat.dcgm_renames() if f}
    new = {f.name for _, _, f in cat.dcgm_renames() if f} - {f.name for _, f, _ in cat.dcgm_renames() if f}
    assert old and new and not names & old
    assert not {f.name for f in naming.apply(fr, "dcgm", hostname="n").families} & new


def test_dcgm_410_labels_are_hostname_and_the_system_driver_version() -> None:
    fr = frame(fam(cat.GPU_MEMORY_USED.name, dev(cat.GPU_MEMORY_USED.name, IDLE_GPU, 2**20),
                   dev(cat.GPU_MEMORY_USED.name, MIG_DEV, 2**21, HELD)))
    series = dcgm(fr, "DCGM_FI_DEV_FB_USED_BYTES", "dcgm-4.10")
    whole, _ = series[f"{GPU}/"]
    assert whole == dict(whole, hostname="node-a", DCGM_FI_SYSTEM_DRIVER_VERSION="580.1", UUID=GPU, gpu="0")
    assert "Hostname" not in whole and "DCGM_FI_DRIVER_VERSION" not in whole
    mig, value = series[f"{GPU}/7"]
    assert value == 2**21 and mig["dra_mig_device_uuid"] == MIG and mig["GPU_I_PROFILE"] == "1g.18gb"


def test_dcgm_410_xid_error_is_the_last_code_and_drops_what_dcgm_drops() -> None:
    fr = frame(fam(cat.GPU_UP.name, dev(cat.GPU_UP.name, IDLE_GPU, 1)),
               fam(cat.GPU_XID_ERRORS.name, dev(cat.GPU_XID_ERRORS.name, IDLE_GPU, 1, xid="79")),
               fam(cat.GPU_MEMORY_FREE.name, dev(cat.GPU_MEMORY_FREE.name, IDLE_GPU, float(1 << 30))),
               fam(cat.GPU_POWER.name, dev(cat.GPU_POWER.name, IDLE_GPU, 300.0)))
    out = naming.apply(fr, "dcgm-4.10", hostname="n")
    xid = out.family(cat.DCGM_XID_ERROR.name)
    assert xid is not None and [s.value for s in xid.samples] == [79.0]
    names = {f.name for f in out.families}
    assert cat.DCGM_XID_ERRORS.name not in names
    # Memory free is replaced as under dcgm; power stays for the alerts and dashboards.
    assert "DCGM_FI_DEV_FB_FREE_BYTES" in names and cat.GPU_MEMORY_FREE.name not in names
    assert {"DCGM_FI_DEV_BOARD_POWER_WATTS", cat.GPU_POWER.name} <= names
    assert naming.REPLACED["dcgm-4.10"] == naming.REPLACED["dcgm"]
    # The dashboards read the memory size, which 4.10 publishes as DCGM_FI_DEV_FB_CAPACITY_BYTES: it stays.
    assert cat.GPU_MEMORY_TOTAL.name in cat.DCGM_KEPT_FOR_KIT


def test_identity_labels_and_mig_series_carry_the_parents_gpu_and_uuid() -> None:
    fr = frame(fam(cat.GPU_MEMORY_USED.name, dev(cat.GPU_MEMORY_USED.name, IDLE_GPU, 2**20),
                   dev(cat.GPU_MEMORY_USED.name, MIG_DEV, 2**21, HELD)))
    series = dcgm(fr, "DCGM_FI_DEV_FB_USED")
    whole, _ = series[f"{GPU}/"]
    assert whole == dict(whole, gpu="0", UUID=GPU, pci_bus_id="00000000:18:00.0", device="nvidia0",
                         modelName="NVIDIA H200", Hostname="node-a", DCGM_FI_DRIVER_VERSION="580.1",
                         GPU_I_PROFILE="", GPU_I_ID="", pod="", dra_claim_name="")
    mig, value = series[f"{GPU}/7"]  # MIG: parent's UUID, its own GPU instance
    assert value == 2.0
    assert mig == dict(mig, gpu="0", UUID=GPU, GPU_I_PROFILE="1g.18gb", GPU_I_ID="7", device="nvidia0",
                       pod="train-0", namespace="ml", container="main", dra_claim_name="c1",
                       dra_claim_namespace="ml", dra_driver_name="gpu.nvidia.com", dra_pool_name="node-a",
                       dra_device_name="gpu-0-mig-19-7-0", dra_mig_profile="1g.18gb", dra_mig_device_uuid=MIG)


def test_a_shared_device_keeps_one_series_without_a_pod() -> None:
    fr = frame(fam(cat.GPU_UTILIZATION.name, dev(cat.GPU_UTILIZATION.name, SHARED_DEV, 0.5, SHARED_BY_TWO)))
    series = dcgm(fr, "DCGM_FI_DEV_GPU_UTIL")
    assert len(series) == 1
    labels_, value = series[f"{SHARED}/"]
    assert value == 50.0
    assert (labels_["pod"], labels_["container"], labels_["namespace"], labels_["dra_claim_name"]) == (
        "", "", "ml", "c2")
    assert labels_["device"] == "nvidia1"


def test_dcgm_replaces_only_the_sources_and_both_keeps_everything() -> None:
    fr = frame(fam(cat.GPU_POWER.name, dev(cat.GPU_POWER.name, IDLE_GPU, 300.0)),
               fam(cat.GPU_MEMORY_FREE.name, dev(cat.GPU_MEMORY_FREE.name, IDLE_GPU, float(1 << 30))),
               fam(cat.GPU_ECC_ERRORS.name, dev(cat.GPU_ECC_ERRORS.name, IDLE_GPU, 1, type="corrected")),
               fam(cat.CONTAINER_GPU_MEMORY_USED.name, (labels(cat.CONTAINER_GPU_MEMORY_USED.name, uuid=GPU), 5.0)))
    names = {f.name for f in naming.apply(fr, "dcgm", hostname="n").families}
    assert "DCGM_FI_DEV_FB_FREE" in names and cat.GPU_MEMORY_FREE.name not in names
    # The shipped alerts and dashboards read the power family: it stays beside its DCGM name.
    assert {"DCGM_FI_DEV_POWER_USAGE", cat.GPU_POWER.name} <= names
    # Native families without a DCGM counterpart stay: nothing the exporter knows is lost.
    assert {cat.GPU_ECC_ERRORS.name, cat.CONTAINER_GPU_MEMORY_USED.name, cat.GPU_INFO.name,
            cat.CLAIM_ALLOCATION_INFO.name} <= names
    both = naming.apply(fr, "both", hostname="n")
    assert {f.name for f in fr.families} | {"DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_FB_FREE"} == {
        f.name for f in both.families}
    assert [f.name for f in both.families] == sorted(f.name for f in both.families)
    assert naming.apply(fr, "native", hostname="n") is fr
    with pytest.raises(ValueError, match="unknown naming"):
        naming.apply(fr, "dcgmx", hostname="n")


def test_xid_errors_is_the_last_code_seen_and_zero_before_any() -> None:
    def with_xids(**counts: float) -> Frame:
        return frame(fam(cat.GPU_UP.name, dev(cat.GPU_UP.name, IDLE_GPU, 1)),
                     fam(cat.GPU_XID_ERRORS.name, *(dev(cat.GPU_XID_ERRORS.name, IDLE_GPU, n, xid=code.lstrip("x"))
                                               for code, n in counts.items())))

    memory = naming.XidMemory()

    def last(fr: Frame) -> float:
        family = naming.apply(fr, "dcgm", hostname="n", xid=memory).family(cat.DCGM_XID_ERRORS.name)
        assert family is not None
        return family.samples[0].value

    assert last(frame(fam(cat.GPU_UP.name, dev(cat.GPU_UP.name, IDLE_GPU, 1)))) == 0.0
    assert last(with_xids(x79=1)) == 79.0
    assert last(with_xids(x79=1, x13=1)) == 13.0  # 13 is the code whose counter grew
    assert last(with_xids(x79=1, x13=1)) == 13.0  # nothing new: still the last one
    assert last(with_xids(x79=2, x13=1)) == 79.0  # a repeat of 79 (invisible in dcgm's own gauge)


def test_renderer_finds_help_and_type_for_every_dcgm_family() -> None:  # under --naming dcgm
    fr = frame(fam(cat.GPU_ENERGY.name, dev(cat.GPU_ENERGY.name, IDLE_GPU, 1.0)),
               fam(cat.GPU_UP.name, dev(cat.GPU_UP.name, IDLE_GPU, 1)))
    text = render(naming.apply(fr, "dcgm", hostname="n")).decode()
    # A DCGM counter keeps its exact name (no _total), so it is exposed as a gauge.
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION gauge\n" in text
    assert "\nDCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{" in text
    assert "# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.\n" in text
    for _, form in cat.DCGM_CATALOG:
        assert cat.spec(form.name).labels == cat.DCGM_LABELS
    for n in cat.DCGM_NAMINGS.values():
        assert not {d.name for _, d in n.forms} & {s.name for s in cat.CATALOG}  # not native families


# --- the simulated node --------------------------------------------------------------------


def snapshot(naming_: str) -> str:
    result = CliRunner().invoke(cli.main, ["snapshot", "--simulate", "--naming", naming_, "--format", "prometheus"],
                                catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.fixture(scope="module")
def demo_dcgm() -> str:
    return snapshot("dcgm")


@pytest.fixture(scope="module")
def demo_both() -> str:
    return snapshot("both")


@pytest.fixture(scope="module")
def demo_dcgm_410() -> str:
    return snapshot("dcgm-4.10")


#: dcgm-exporter's default counters with a native source (anchors.md §1a).
DEFAULT_COUNTERS = {
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
}


def test_snapshot_shows_dcgm_names_and_labels_for_the_demo_node(demo_dcgm: str) -> None:
    families = set(re.findall(r"^# TYPE (\S+) ", demo_dcgm, re.M))
    assert DEFAULT_COUNTERS <= families
    assert not families & naming.REPLACED["dcgm"]  # e.g. dra_gpu_memory_free_bytes is gone
    util = [line for line in demo_dcgm.splitlines() if line.startswith("DCGM_FI_DEV_GPU_UTIL{")]
    assert util
    for name in ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION",
                 "pod", "namespace", "container", "dra_claim_name"):
        assert f',{name}="' in util[0] or f'{{{name}="' in util[0], name
    assert 'Hostname="sim-node-1"' in util[0]
    # A MIG partition the demo hands to a pod: its GI labels, the parent's UUID, the DRA labels.
    mig = [line for line in demo_dcgm.splitlines()
           if line.startswith("DCGM_FI_DEV_FB_USED{") and 'dra_mig_device_uuid="MIG-' in line]
    assert mig and all('UUID="GPU-' in line and 'GPU_I_PROFILE="' in line and 'GPU_I_ID=""' not in line
                       for line in mig)


#: promtool's lint on dcgm-exporter's own names: ``modelName`` is camelCase, and
#: ``DCGM_FI_DEV_PCIE_REPLAY_COUNTER`` names its type. Both are exactly what dashboards query, so
#: they stay; any other lint line is a defect.
KNOWN_DCGM_LINT = re.compile(
    r"^(DCGM_\w+ label names should be written in 'snake_case' not 'camelCase'"
    r"|DCGM_FI_DEV_PCIE_REPLAY_COUNTER metric name should not include type 'counter')$")


@pytest.mark.parametrize("which", ["dcgm", "dcgm-4.10", "both"])
def test_promtool_finds_only_dcgms_own_naming_lint(which: str, promtool: str, demo_dcgm: str,
                                                    demo_both: str, demo_dcgm_410: str) -> None:
    text = {"dcgm": demo_dcgm, "dcgm-4.10": demo_dcgm_410, "both": demo_both}[which]
    clean, output = promtool_check_metrics(promtool, text.encode())
    lines = output.splitlines()
    assert lines, "promtool lints modelName; if it stopped, tighten this test"
    assert [line for line in lines if not KNOWN_DCGM_LINT.match(line)] == [], output
    # promtool exits 3 for lint warnings only (1 would be a parse error).
    assert not clean


#: dcgm-exporter 4.9's default counters with a native source (the 4.8 ones under DCGM 4.7's names,
#: and the memory capacity it added), and 4.10's (4.9's PCIe byte rates renamed have no native source).
DEFAULT_COUNTERS_410 = {
    "DCGM_FI_DEV_SM_CLOCK_HERTZ", "DCGM_FI_DEV_MEMORY_CLOCK_HERTZ", "DCGM_FI_DEV_MEMORY_TEMP_CELSIUS",
    "DCGM_FI_DEV_GPU_TEMP_CELSIUS", "DCGM_FI_DEV_BOARD_POWER_WATTS", "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL",
    "DCGM_FI_DEV_PCIE_REPLAY_TOTAL", "DCGM_FI_DEV_GPU_UTIL_RATIO", "DCGM_FI_DEV_MEMORY_UTIL_RATIO",
    "DCGM_FI_DEV_ENC_UTIL_RATIO", "DCGM_FI_DEV_DEC_UTIL_RATIO", "DCGM_FI_DEV_XID_ERROR", "DCGM_FI_DEV_FB_FREE_BYTES",
    "DCGM_FI_DEV_FB_USED_BYTES", "DCGM_FI_DEV_FB_RESERVED_BYTES", "DCGM_FI_DEV_FB_CAPACITY_BYTES",
    "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL", "DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL",
    "DCGM_FI_DEV_ROW_REMAP_FAILED", "DCGM_FI_PROF_TENSOR_UTIL_RATIO", "DCGM_FI_PROF_DRAM_UTIL_RATIO",
}


def test_snapshot_shows_dcgm_410_names_and_labels_for_the_demo_node(demo_dcgm_410: str) -> None:
    families = set(re.findall(r"^# TYPE (\S+) ", demo_dcgm_410, re.M))
    assert DEFAULT_COUNTERS_410 <= families
    assert not families & DEFAULT_COUNTERS and not families & naming.REPLACED["dcgm-4.10"]
    util = [line for line in demo_dcgm_410.splitlines() if line.startswith("DCGM_FI_DEV_GPU_UTIL_RATIO{")]
    assert util and 'hostname="sim-node-1"' in util[0] and "DCGM_FI_SYSTEM_DRIVER_VERSION=" in util[0]
    assert all(0.0 <= float(line.rsplit(" ", 1)[1]) <= 1.0 for line in util)  # a ratio, not %


def test_both_is_native_plus_dcgm(demo_both: str) -> None:
    families = set(re.findall(r"^# TYPE (\S+) ", demo_both, re.M))
    assert DEFAULT_COUNTERS <= families and "dra_gpu_power_watts" in families


def test_naming_flag_reads_env_and_rejects_unknown_values() -> None:
    runner = CliRunner()
    bad = runner.invoke(cli.main, ["snapshot", "--simulate", "--naming", "dcgmx"])
    assert bad.exit_code == 2 and "dcgmx" in bad.output and "Traceback" not in bad.output
    bad_env = runner.invoke(cli.main, ["snapshot", "--simulate"], env={"DRA_EXPORTER_NAMING": "nope"})
    assert bad_env.exit_code == 2
    off = runner.invoke(cli.main, ["serve", "--naming", "dcgm", "--no-prometheus", "--otlp-endpoint",
                                   "http://127.0.0.1:1"])
    assert off.exit_code == 2 and "--naming" in off.output


def test_serve_renames_only_what_the_prometheus_sink_publishes() -> None:
    from dra_exporter.runtime import RenamingSink

    published: list[Frame] = []

    class Inner:
        def publish(self, fr: Frame) -> None:
            published.append(fr)

    sink = RenamingSink(Inner(), "dcgm", "node-a")
    sink.publish(frame(fam(cat.GPU_MEMORY_FREE.name, dev(cat.GPU_MEMORY_FREE.name, IDLE_GPU, float(1 << 30)))))
    names = {f.name for f in published[0].families}
    assert "DCGM_FI_DEV_FB_FREE" in names and cat.GPU_MEMORY_FREE.name not in names


def test_the_charts_naming_value_admits_exactly_the_cli_namings() -> None:
    from pathlib import Path

    schema = json.loads((Path(__file__).resolve().parents[1] / "deploy/helm/dra-exporter/values.schema.json")
                        .read_text())
    assert schema["properties"]["naming"]["enum"] == list(naming.NAMINGS)
    result = CliRunner().invoke(cli.main, ["snapshot", "--simulate", "--format", "prometheus"],
                                env={"DRA_EXPORTER_NAMING": "dcgm-4.10"}, catch_exceptions=False)
    assert result.exit_code == 0 and "\nDCGM_FI_DEV_GPU_UTIL_RATIO{" in result.stdout


# --- every alias's value: DCGM's unit, type (int64 or double) and kind (total or rate) ----------------
#
# What DCGM's field holds for the native readings of ``value_frame`` (DCGM 4.6's dcgm_fields.cpp for the
# types and units; its cache manager for NVLink: NVML's KiB counters' growth per second ÷ 1000 = "MB/s";
# DCGM 4.7's base-unit fields: int64 bytes, hertz and joules, double ratios and watts). An alias the
# catalogue gains without a line here fails, so no name is published without its value checked.

MIB = 2**20
#: Between the two frames (10 s apart) NVLink moved 30.72e9 bytes in and 10.24e9 out: 4.096e9 B/s.
NVLINK_RATE = (30.72e9 + 10.24e9) / 10
EXPECTED_VALUES: dict[str, float] = {
    # dcgm (dcgm-exporter 4.8, DCGM 4.6 field names)
    "DCGM_FI_DEV_GPU_UTIL": 37,  # int64 %: 0.37 × 100 is 37.00000000000001 in floating point
    "DCGM_FI_DEV_MEM_COPY_UTIL": 29,  # 0.29 × 100 is 28.999999999999996
    "DCGM_FI_DEV_ENC_UTIL": 7, "DCGM_FI_DEV_DEC_UTIL": 50,
    "DCGM_FI_DEV_FB_USED": 1023,  # int64 MiB, truncated: 1023.9 MiB
    "DCGM_FI_DEV_FB_FREE": 10, "DCGM_FI_DEV_FB_RESERVED": 512,
    "DCGM_FI_DEV_POWER_USAGE": 301.25,  # double W
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": 12345,  # int64 mJ
    "DCGM_FI_DEV_GPU_TEMP": 41, "DCGM_FI_DEV_MEMORY_TEMP": 52,
    "DCGM_FI_DEV_SM_CLOCK": 1980, "DCGM_FI_DEV_MEM_CLOCK": 2619,  # int64 MHz
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 3,
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": 1, "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 2,
    "DCGM_FI_DEV_ROW_REMAP_FAILURE": 1,
    "DCGM_FI_PROF_SM_ACTIVE": 0.625, "DCGM_FI_PROF_SM_OCCUPANCY": 0.3125,  # double ratios
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": 0.123, "DCGM_FI_PROF_DRAM_ACTIVE": 0.456,
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE": 0.01, "DCGM_FI_PROF_PIPE_FP32_ACTIVE": 0.02, "DCGM_FI_PROF_PIPE_FP16_ACTIVE": 0.03,
    # A rate, not the running byte total (≈1.5e11 here): int64 "MB/s", NVML's KiB/s ÷ 1000.
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": 4000,
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": 5, "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": 4,
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": 3, "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": 2,
    # dcgm-4.10 (dcgm-exporter 4.9/4.10, DCGM 4.7/4.8 names and base units)
    "DCGM_FI_DEV_GPU_UTIL_RATIO": 0.37, "DCGM_FI_DEV_MEMORY_UTIL_RATIO": 0.29,  # double ratios
    "DCGM_FI_DEV_ENC_UTIL_RATIO": 0.07, "DCGM_FI_DEV_DEC_UTIL_RATIO": 0.5,
    "DCGM_FI_DEV_FB_USED_BYTES": 1073636966,  # int64 bytes: 1023.9 MiB is 1073636966.4 bytes
    "DCGM_FI_DEV_FB_FREE_BYTES": 10 * MIB + 1, "DCGM_FI_DEV_FB_CAPACITY_BYTES": 141 * 2**30,
    "DCGM_FI_DEV_FB_RESERVED_BYTES": 512 * MIB,
    "DCGM_FI_DEV_BOARD_POWER_WATTS": 301.25,
    "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL": 12,  # int64 J
    "DCGM_FI_DEV_GPU_TEMP_CELSIUS": 41, "DCGM_FI_DEV_MEMORY_TEMP_CELSIUS": 52,
    "DCGM_FI_DEV_SM_CLOCK_HERTZ": 1_980_000_000, "DCGM_FI_DEV_MEMORY_CLOCK_HERTZ": 2_619_000_000,
    "DCGM_FI_DEV_PCIE_REPLAY_TOTAL": 3,
    "DCGM_FI_DEV_ROW_REMAP_UNCORRECTABLE_TOTAL": 1, "DCGM_FI_DEV_ROW_REMAP_CORRECTABLE_TOTAL": 2,
    "DCGM_FI_DEV_ROW_REMAP_FAILED": 1,
    "DCGM_FI_PROF_SM_UTIL_RATIO": 0.625, "DCGM_FI_PROF_SM_OCCUPANCY_RATIO": 0.3125,
    "DCGM_FI_PROF_TENSOR_UTIL_RATIO": 0.123, "DCGM_FI_PROF_DRAM_UTIL_RATIO": 0.456,
    "DCGM_FI_PROF_FP64_UTIL_RATIO": 0.01, "DCGM_FI_PROF_FP32_UTIL_RATIO": 0.02, "DCGM_FI_PROF_FP16_UTIL_RATIO": 0.03,
    "DCGM_FI_DEV_NVLINK_THROUGHPUT_BYTES_PER_SECOND": NVLINK_RATE,  # int64 bytes per second
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL": 5, "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_TOTAL": 4,
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_TOTAL": 3, "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_TOTAL": 2,
}


def value_frame(at: float, nvlink_rx: float, nvlink_tx: float) -> Frame:
    def one(spec: cat.MetricSpec, value: float) -> Family:
        return fam(spec.name, dev(spec.name, IDLE_GPU, value))

    link_errors = fam(cat.GPU_NVLINK_LINK_ERRORS.name, *(
        dev(cat.GPU_NVLINK_LINK_ERRORS.name, IDLE_GPU, n / 2, link=str(link), type=kind)
        for kind, n in (("crc_flit", 5), ("crc_data", 4), ("replay", 3), ("recovery", 2)) for link in (0, 1)))
    return replace(frame(
        one(cat.GPU_UTILIZATION, 0.37), one(cat.GPU_MEMORY_UTILIZATION, 0.29),
        one(cat.GPU_ENCODER_UTILIZATION, 0.07), one(cat.GPU_DECODER_UTILIZATION, 0.5),
        one(cat.GPU_MEMORY_USED, 1023.9 * MIB), one(cat.GPU_MEMORY_FREE, 10 * MIB + 1),
        one(cat.GPU_MEMORY_TOTAL, 141 * 2**30), one(cat.GPU_MEMORY_RESERVED, 512 * MIB),
        one(cat.GPU_POWER, 301.25), one(cat.GPU_ENERGY, 12.3456789),
        one(cat.GPU_TEMPERATURE, 41), one(cat.GPU_MEMORY_TEMPERATURE, 52),
        fam(cat.GPU_CLOCK.name, dev(cat.GPU_CLOCK.name, IDLE_GPU, 1.98e9, clock="sm"),
            dev(cat.GPU_CLOCK.name, IDLE_GPU, 2.619e9, clock="memory")),
        one(cat.GPU_PCIE_REPLAYS, 3),
        fam(cat.GPU_REMAPPED_ROWS.name, dev(cat.GPU_REMAPPED_ROWS.name, IDLE_GPU, 2, type="correctable"),
            dev(cat.GPU_REMAPPED_ROWS.name, IDLE_GPU, 1, type="uncorrectable")),
        one(cat.GPU_ROW_REMAP_FAILURE, 1),
        one(cat.GPU_SM_ACTIVE, 0.625), one(cat.GPU_SM_OCCUPANCY, 0.3125), one(cat.GPU_TENSOR_ACTIVE, 0.123),
        one(cat.GPU_DRAM_ACTIVE, 0.456), one(cat.GPU_FP64_ACTIVE, 0.01), one(cat.GPU_FP32_ACTIVE, 0.02),
        one(cat.GPU_FP16_ACTIVE, 0.03),
        fam(cat.GPU_NVLINK_BYTES.name, dev(cat.GPU_NVLINK_BYTES.name, IDLE_GPU, nvlink_rx, direction="rx"),
            dev(cat.GPU_NVLINK_BYTES.name, IDLE_GPU, nvlink_tx, direction="tx")),
        link_errors), timestamp=at)


def _values_forms() -> list[tuple[str, str]]:
    return [(n.name, form.name) for n in cat.DCGM_NAMINGS.values() for _, form in n.forms
            if form is not n.xid and "FABRIC" not in form.name]  # XID and fabric: tests of their own


@pytest.mark.parametrize(("naming_", "name"), _values_forms())
def test_every_dcgm_alias_holds_dcgms_value(naming_: str, name: str) -> None:
    rates = naming.RateMemory()
    first = naming.apply(value_frame(1000.0, 100e9, 50e9), naming_, hostname="n", rates=rates)
    later = naming.apply(value_frame(1010.0, 130.72e9, 60.24e9), naming_, hostname="n", rates=rates)
    family = later.family(name)
    assert family is not None and len(family.samples) == 1, name
    value = family.samples[0].value
    assert value == pytest.approx(EXPECTED_VALUES[name], rel=1e-12), name
    form = next(f for _, f in cat.DCGM_NAMINGS[naming_].forms if f.name == name)
    if form.value_type == "int64":
        assert value == int(value), f"{name} is an int64 field in DCGM: {value}"
    if form.rate:  # DCGM's first sample of a rate is 0: there is nothing to divide by yet
        assert [s.value for s in first.family(name).samples] == [0.0]  # type: ignore[union-attr]


def test_a_rate_is_zero_when_the_counter_goes_back_and_forgets_gone_devices() -> None:
    rates = naming.RateMemory()
    name = "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"

    def bandwidth(at: float, rx: float) -> float:
        out = naming.apply(value_frame(at, rx, 0.0), "dcgm", hostname="n", rates=rates).family(name)
        assert out is not None
        return out.samples[0].value

    assert bandwidth(0.0, 1e12) == 0.0
    assert bandwidth(1.0, 1e12 + 1.024e9) == 1000.0  # 1.024e9 B/s = 1e6 KiB/s = 1000 "MB/s"
    assert bandwidth(2.0, 5.0) == 0.0  # the driver reloaded: no negative rate
    assert bandwidth(2.0, 1e9) == 0.0  # the clock did not move: no division by zero
    naming.apply(frame(), "dcgm", hostname="n", rates=rates)
    assert rates.last[name] == {}  # the GPU is gone: so is its previous total


def test_every_published_dcgm_name_says_its_dcgm_field() -> None:
    names = {form.name for n in cat.DCGM_NAMINGS.values() for _, form in n.forms}
    assert names == set(cat.DCGM_FIELDS)
    assert cat.DCGM_FIELDS["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"] == ("DCGM_FI_DEV_NVLINK_THROUGHPUT_TOTAL", 449)
    assert cat.DCGM_FIELDS["DCGM_FI_DEV_NVLINK_THROUGHPUT_BYTES_PER_SECOND"][1] == 1648
