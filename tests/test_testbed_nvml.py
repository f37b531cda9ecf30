"""The NVML test bed itself: the real pynvml loads NVIDIA's mock library with a board profile. If this
fails, every ``testbed_nvml`` test's failure is about the harness, not the exporter."""

from __future__ import annotations

import pytest
from conftest import NvmlTestbed
from nvmltestbed import profile_path, run_python

pytestmark = pytest.mark.testbed_nvml


def test_the_real_pynvml_loads_the_mock_with_the_profile_asked_for(nvml_testbed: NvmlTestbed) -> None:
    count, name, serial = run_python(nvml_testbed.library, profile_path(nvml_testbed.folder, "h100"), (
        "import json, pynvml\n"
        "pynvml.nvmlInit()\n"
        "h = pynvml.nvmlDeviceGetHandleByIndex(0)\n"
        "print(json.dumps([pynvml.nvmlDeviceGetCount(), pynvml.nvmlDeviceGetName(h), pynvml.nvmlDeviceGetSerial(h)]))"))
    # A profile that fails to load silently becomes 8 "Mock A100" GPUs: check the model.
    assert count == 8 and "H100" in name, (count, name)
    assert serial
