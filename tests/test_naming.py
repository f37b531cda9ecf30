"""``--naming dcgm|both``: dcgm-exporter's names, units and labels, as its dashboards and alerts expect."""

from __future__ import annotations

import re

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


def dcgm(fr: Frame, name: str) -> dict[str, tuple[dict[str, str], float]]:
    """The DCGM family ``name`` of ``fr`` converted, by UUID+GPU_I_ID."""
    family = naming.apply(fr, "dcgm", hostname="node-a").family(name)
    assert family is not None, name
    out = {}
    for s in family.samples:
        d = dict(s.labels)
        assert tuple(d) == cat.DCGM_LABELS  # always the full, ordered label set
        out[d["UUID"] + "/" + d["GPU_I_ID"]] = (d, s.value)
    return out


def test_units_are_dcgms() -> None:
    fr = frame(
        fam(cat.GPU_MEMORY_USED.name, dev(cat.GPU_MEMORY_USED.name, IDLE_GPU, 3 * 2**20)),
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
    assert dcgm(fr, "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL")[key][1] == 150  # rx + tx, one series


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


def test_renderer_finds_help_and_type_for_every_dcgm_family() -> None:
    fr = frame(fam(cat.GPU_ENERGY.name, dev(cat.GPU_ENERGY.name, IDLE_GPU, 1.0)),
               fam(cat.GPU_UP.name, dev(cat.GPU_UP.name, IDLE_GPU, 1)))
    text = render(naming.apply(fr, "dcgm", hostname="n")).decode()
    # A DCGM counter keeps its exact name (no _total), so it is exposed as a gauge.
    assert "# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION gauge\n" in text
    assert "\nDCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{" in text
    assert "# HELP DCGM_FI_DEV_XID_ERRORS Value of the last XID error encountered.\n" in text
    for _, form in cat.DCGM_CATALOG:
        assert cat.spec(form.name).labels == cat.DCGM_LABELS
    assert not {d.name for _, d in cat.DCGM_CATALOG} & {s.name for s in cat.CATALOG}  # not native families


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
    assert not families & naming.REPLACED  # e.g. dra_gpu_power_watts is gone
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


@pytest.mark.parametrize("which", ["dcgm", "both"])
def test_promtool_finds_only_dcgms_own_naming_lint(which: str, promtool: str, demo_dcgm: str,
                                                    demo_both: str) -> None:
    text = demo_dcgm if which == "dcgm" else demo_both
    clean, output = promtool_check_metrics(promtool, text.encode())
    lines = output.splitlines()
    assert lines, "promtool lints modelName; if it stopped, tighten this test"
    assert [line for line in lines if not KNOWN_DCGM_LINT.match(line)] == [], output
    # promtool exits 3 for lint warnings only (1 would be a parse error).
    assert not clean


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
