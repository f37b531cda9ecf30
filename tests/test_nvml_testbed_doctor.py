"""``dra-exporter doctor`` and ``snapshot`` on NVIDIA's mock NVML: what they tell an operator about a GPU.

Run as a user runs them (the console script's ``main`` in a process of its own, the mock on the library
path, one board profile each).
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import NvmlTestbed
from nvmltestbed import environment, profile_path

pytestmark = pytest.mark.testbed_nvml

CLI = "import sys; from dra_exporter.cli import main; sys.exit(main())"


def run_cli(testbed: NvmlTestbed, profile: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", CLI, *args], capture_output=True, text=True, timeout=60,
                          env=environment(testbed.library, profile_path(testbed.folder, profile)))


def gpu_findings(output: str) -> list[str]:
    """Each ``gpu N`` finding with its hint line, as one string."""
    findings: list[str] = []
    for line in output.splitlines():
        if line.startswith("[") and "] gpu " in line:
            findings.append(line)
        elif line.startswith("       →") and findings and "] gpu " in findings[-1] and "→" not in findings[-1]:
            findings[-1] += " " + line.strip()
    return findings


def test_doctor_blames_the_driver_not_the_gpu_when_an_h100_has_no_gpm(nvml_testbed: NvmlTestbed) -> None:
    out = run_cli(nvml_testbed, "h100.drv525", "doctor", "--no-kubeapi").stdout
    findings = gpu_findings(out)
    assert len(findings) == 8, out
    for finding in findings:
        assert "Hopper or newer" not in finding, finding  # it is a Hopper
        assert "525.85.12" in finding and "GPM" in finding, finding


def test_doctor_does_not_call_a_mig_gpu_without_mig_devices_ok(nvml_testbed: NvmlTestbed) -> None:
    out = run_cli(nvml_testbed, "h100.mig", "doctor", "--no-kubeapi").stdout
    findings = gpu_findings(out)
    assert len(findings) == 8, out
    for finding in findings:
        assert finding.startswith("[WARN]") and "no MIG devices" in finding, finding


def test_doctor_says_ok_for_a_gpu_with_everything(nvml_testbed: NvmlTestbed) -> None:
    out = run_cli(nvml_testbed, "h100", "doctor", "--no-kubeapi").stdout
    findings = gpu_findings(out)
    assert len(findings) == 8 and all(f.startswith("[OK  ]") and "GPM supported" in f for f in findings), out


def test_snapshot_on_a_driver_before_r510_shows_every_gpu(nvml_testbed: NvmlTestbed) -> None:
    result = run_cli(nvml_testbed, "h100.drv470", "snapshot", "--no-kubeapi", "--interval", "0.1", "--format", "json")
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("GPU-01000100-0000-0000-0000-00000000000") >= 8
