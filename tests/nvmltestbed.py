"""NVIDIA's mock libnvidia-ml.so as a test bed: the real pynvml over the real NVML C ABI, without a GPU.

``DRA_EXPORTER_TESTBED_NVML`` names the test bed's folder: the library as ``libnvidia-ml.so.1`` or as
``libnvidia-ml.so.<version>.xz`` (the test bed CI uses holds that), and NVIDIA's board profiles in
``configs/`` and ``configs-derived/``. A packed library is unpacked once into a cache folder keyed by its
size and date.

The library reads ``MOCK_NVML_CONFIG`` at ``nvmlInit`` and pynvml loads it once per process, so every
profile runs in a process of its own: ``run_python(profile, code)`` runs a snippet with the library on
``LD_LIBRARY_PATH`` and the profile set, and returns what it printed as JSON on its last line.
"""

from __future__ import annotations

import json
import lzma
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

FOLDER_VARIABLE = "DRA_EXPORTER_TESTBED_NVML"
LIBRARY = "libnvidia-ml.so.1"
SKIP_HINT = (f"NVIDIA's mock NVML is not available: set {FOLDER_VARIABLE} to a folder with {LIBRARY} (or its .xz) "
             "and the board profiles (configs/, configs-derived/) — NVIDIA/k8s-test-infra pkg/gpu/mocknvml builds "
             "it; .ci/run points it at the test bed")


class TestbedError(RuntimeError):
    """The test bed is incomplete, or a run against it failed."""


def testbed_folder() -> Path | None:
    value = os.environ.get(FOLDER_VARIABLE, "").strip()
    return Path(value) if value else None


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dra-exporter-testbeds"


def library_folder(folder: Path) -> Path:
    """A folder holding ``libnvidia-ml.so.1``: ``folder`` itself, or the cache after unpacking once."""
    if (folder / LIBRARY).is_file():
        return folder
    packed = sorted(folder.glob("libnvidia-ml.so.*.xz"))
    if not packed:
        raise TestbedError(f"{FOLDER_VARIABLE}={folder} holds neither {LIBRARY} nor libnvidia-ml.so.*.xz")
    stat = packed[-1].stat()
    target = cache_root() / f"nvml-{stat.st_size}-{int(stat.st_mtime)}"
    if not (target / LIBRARY).is_file():
        target.mkdir(parents=True, exist_ok=True)
        tmp = target / f".{LIBRARY}.{os.getpid()}.tmp"
        with lzma.open(packed[-1]) as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        tmp.replace(target / LIBRARY)  # atomic: a parallel run sees a whole file or none
    return target


def profiles(folder: Path) -> list[Path]:
    """Every board profile of the test bed: NVIDIA's (configs/) and the derived ones (configs-derived/)."""
    return sorted((folder / "configs").glob("*.yaml")) + sorted((folder / "configs-derived").glob("*.yaml"))


def profile_path(folder: Path, name: str) -> Path:
    """A profile by short name: ``h100`` (configs/mock-nvml-config-h100.yaml) or ``gb200.linkdown``."""
    for candidate in (folder / "configs" / f"mock-nvml-config-{name}.yaml",
                      folder / "configs-derived" / f"{name}.yaml"):
        if candidate.is_file():
            return candidate
    raise TestbedError(f"no profile {name!r} in {folder}")


def environment(library: Path, profile: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(library), env.get("LD_LIBRARY_PATH", "")]))
    env["MOCK_NVML_CONFIG"] = str(profile)
    env.update(extra or {})
    return env


def run_python(library: Path, profile: Path, code: str, *, timeout: float = 120,
               extra_env: dict[str, str] | None = None) -> Any:
    """Run ``code`` in a fresh interpreter against the mock with ``profile``; it must print one JSON
    document on its last line of stdout, which is returned."""
    proc = subprocess.run([sys.executable, "-c", code], env=environment(library, profile, extra_env),
                          capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise TestbedError(f"{profile.name}: exit {proc.returncode}\n{proc.stderr[-4000:]}")
    lines = proc.stdout.strip().splitlines()
    if not lines:
        raise TestbedError(f"{profile.name}: printed nothing\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1])
