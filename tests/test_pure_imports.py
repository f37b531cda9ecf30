"""The pure cores load no I/O library: importing them in a fresh interpreter leaves the Kubernetes
client, gRPC and NVML's binding out of ``sys.modules`` (the import-linter contract checks the
imports as written; this checks what Python really loads, through every package ``__init__``)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

CORES = ("dra_exporter.model", "dra_exporter.quantity", "dra_exporter.catalog", "dra_exporter.resolve",
         "dra_exporter.join", "dra_exporter.join_domains", "dra_exporter.naming", "dra_exporter.showback",
         "dra_exporter.dra_versions", "dra_exporter.cluster.capacity", "dra_exporter.cluster.claims",
         "dra_exporter.cluster.selectors")
IO_LIBRARIES = ("kubernetes", "grpc", "pynvml")


def loaded_after_import(module: str) -> list[str]:
    code = (f"import importlib, json, sys; importlib.import_module({module!r}); "
            f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    return list(json.loads(out.stdout))


@pytest.mark.parametrize("module", CORES)
def test_importing_a_core_loads_no_io_library(module: str) -> None:
    loaded = set(loaded_after_import(module))
    assert not loaded & set(IO_LIBRARIES), f"{module} loads {sorted(loaded & set(IO_LIBRARIES))}"


def test_the_check_sees_an_io_library_where_one_is_loaded() -> None:
    # The edge that reads the API server does load the client: the check above can fail.
    assert "kubernetes" in loaded_after_import("dra_exporter.sources.kubeapi")
