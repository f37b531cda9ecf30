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


# -- the product's own NVML source against the mock ------------------------------------------------

#: The script ``run_source`` runs: the real ``NvmlSource`` over the real pynvml, nothing faked.
SOURCE_RUNNER = Path(__file__).with_name("nvml_source_run.py")


def copy_profile(profile: Path, folder: Path) -> Path:
    """A private copy of ``profile`` in ``folder``: the mock reads ``overrides.yaml`` beside the profile
    it loaded, so a test that changes the GPUs at run time must never do it beside the shared one."""
    folder.mkdir(parents=True, exist_ok=True)
    copy = folder / profile.name
    shutil.copyfile(profile, copy)
    return copy


def write_overrides(profile: Path, doc: dict[str, Any] | None) -> Path:
    """Write (``None``: remove) the mock's runtime overrides beside ``profile``, atomically.

    The format is the mock's ``overrides.yaml`` (NVIDIA/k8s-test-infra docs/nvml-mock-ctl.md):
    ``{"version": 1, "all": {...}, "devices": {"<index>": {...}}}``, each block deep-merged over the
    device's profile config; the mock re-reads it every ``MOCK_NVML_OVERRIDES_TTL`` (default 1 s).
    """
    import yaml

    path = profile.parent / "overrides.yaml"
    if doc is None:
        path.unlink(missing_ok=True)
        return path
    tmp = path.with_name(f".overrides.{os.getpid()}.tmp")
    tmp.write_text(yaml.safe_dump({"version": 1, **doc}, sort_keys=False))
    tmp.replace(path)
    return path


def run_source(library: Path, profile: Path, steps: list[dict[str, Any]] | None = None, *,
               interval: float = 0.25, timeout: float = 120,
               extra_env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Run the product's ``NvmlSource`` (real pynvml) against the mock with ``profile``, in a process of
    its own, and return one record per ``collect()``.

    ``steps``: ``[{"cycles": n, "overrides": doc, "settle": seconds}, ...]`` (default: two cycles, so
    GPM and the link families have two samples). Before a step's cycles the runner writes ``overrides``
    with ``write_overrides`` (``{}`` removes the file) and waits ``settle`` seconds for the mock to re-read
    it. A record is ``{"error": str}`` where ``collect()`` raised ``SourceError``, else ``{"driver",
    "nvml", "devices": [{identity..., "up", "error", "readings": [[metric, {labels}, value], ...]}],
    "processes": [...], "step": i}``.
    """
    plan = {"steps": steps or [{"cycles": 2}], "interval": interval,
            "overrides_ttl": "100ms"}
    env = {"MOCK_NVML_OVERRIDES_TTL": plan["overrides_ttl"], **(extra_env or {})}
    proc = subprocess.run([sys.executable, str(SOURCE_RUNNER), json.dumps(plan)],
                          env=environment(library, profile, env), capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        raise TestbedError(f"{profile.name}: exit {proc.returncode}\n{proc.stderr[-4000:]}")
    records: list[dict[str, Any]] = json.loads(proc.stdout.strip().splitlines()[-1])
    for record in records:
        record["log"] = proc.stderr
    return records


# -- what a profile means (NVIDIA/k8s-test-infra docs/configuration.md, engine/config.go) -------------


def load_profile(profile: Path) -> dict[str, Any]:
    import yaml

    doc: dict[str, Any] = yaml.safe_load(profile.read_text())
    return doc


def device_config(doc: dict[str, Any], index: int) -> dict[str, Any]:
    """The configuration of GPU ``index``: ``device_defaults`` with the device's own entry on top. As the
    mock merges them, a block the device names (``power:``, ``utilization:``) replaces the default block
    whole; ``pci:`` is merged field by field."""
    merged = dict(doc["device_defaults"])
    for entry in doc["devices"]:
        if entry["index"] == index:
            for key, value in entry.items():
                merged[key] = {**merged.get(key, {}), **value} if key == "pci" else value
    return merged


def nvml_bus_id(bus_id: str) -> str:
    """A profile's ``0000:1A:00.0`` as NVML writes it in ``nvmlPciInfo_t.busId``: ``00000000:1A:00.0``."""
    domain, rest = bus_id.split(":", 1)
    return f"{int(domain, 16):08X}:{rest.upper()}"
