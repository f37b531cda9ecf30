"""``sources/nvml_calls.Getters`` against NVIDIA's mock NVML: a getter called straight through pynvml's
loaded library answers what pynvml's own wrapper answers for the same C function and arguments, value
or error (the same ``NVMLError`` class and code), on every GPU of a profile, a lost GPU included; a
function the library lacks raises FUNCTION_NOT_FOUND when called, as pynvml's wrapper does."""

from __future__ import annotations

from typing import Any

import pytest
from conftest import NvmlTestbed
from nvmltestbed import profile_path, run_python

pytestmark = pytest.mark.testbed_nvml

_COMPARE = """
import ctypes, json, pynvml
from dra_exporter.sources.nvml_calls import Getters

pynvml.nvmlInit()
getters = Getters(pynvml)
u, ull = ctypes.c_uint, ctypes.c_ulonglong
CALLS = [("nvmlDeviceGetPowerUsage", (), (u,)), ("nvmlDeviceGetEnforcedPowerLimit", (), (u,)),
         ("nvmlDeviceGetTemperature", (pynvml.NVML_TEMPERATURE_GPU,), (u,)),
         *(("nvmlDeviceGetClockInfo", (getattr(pynvml, f"NVML_CLOCK_{clock}"),), (u,))
           for clock in ("SM", "MEM", "GRAPHICS", "VIDEO")),
         ("nvmlDeviceGetCurrentClocksEventReasons", (), (ull,)),
         ("nvmlDeviceGetEncoderUtilization", (), (u, u)), ("nvmlDeviceGetDecoderUtilization", (), (u, u)),
         ("nvmlDeviceGetNvLinkState", (0,), (u,)), ("nvmlDeviceGetNvLinkState", (pynvml.NVML_NVLINK_MAX_LINKS,), (u,))]

def outcome(call, *args):
    try:
        value = call(*args)
    except pynvml.NVMLError as err:
        return ["error", type(err).__name__, err.value]
    return ["ok", value[0] if isinstance(value, list) else value]  # the codecs: [utilisation, period]

rows = []
for index in range(pynvml.nvmlDeviceGetCount()):
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    for name, args, outs in CALLS:
        rows.append([index, name, list(args), outcome(getters.make(name, *args, outs=outs), handle),
                     outcome(getattr(pynvml, name), handle, *args)])
    util = getters.make("nvmlDeviceGetUtilizationRates", outs=(ctypes.c_uint * 2,), read=tuple)
    rates = outcome(pynvml.nvmlDeviceGetUtilizationRates, handle)
    rows.append([index, "nvmlDeviceGetUtilizationRates", [], outcome(util, handle),
                 rates if rates[0] == "error" else ["ok", [rates[1].gpu, rates[1].memory]]])
    missing = getters.make("nvmlDeviceGetNoSuchFunction")
    rows.append([index, "missing", [], outcome(missing, handle), ["error", "NVMLError_FunctionNotFound",
                                                                    pynvml.NVML_ERROR_FUNCTION_NOT_FOUND]])
print(json.dumps(rows))
"""


@pytest.mark.parametrize("profile", ["gb200.rich", "h100.rich", "b200", "h100.fail"])
def test_a_direct_getter_answers_what_pynvml_answers(nvml_testbed: NvmlTestbed, profile: str) -> None:
    rows: list[Any] = run_python(nvml_testbed.library, profile_path(nvml_testbed.folder, profile), _COMPARE)
    assert rows
    for index, name, args, direct, wrapped in rows:
        assert direct == wrapped, (profile, index, name, args)
    assert any(direct[0] == "ok" for *_, direct, _ in rows)
    assert any(direct[0] == "error" and name != "missing" for _, name, _, direct, _ in rows)  # refusals too
