"""Source: the devices DRA drivers prepared on this node, from their CDI specs (``--cdi-root``).

A DRA kubelet plugin prepares a claim's devices by writing a CDI spec for the claim under the
CDI root (``/var/run/cdi`` by default; the container runtime reads it when the container starts)
and removes the spec again when the kubelet unprepares the claim. NVIDIA's ``gpu-kubelet-plugin``
writes one file per claim, ``k8s.gpu.nvidia.com-claim_<claimUID>.yaml``, of kind
``k8s.gpu.nvidia.com/claim`` whose devices are named ``<claimUID>-<device>`` (``…-gpu-3``); the
Kubernetes example driver follows the same convention. A spec left behind when its claim is gone
is a device the driver still holds for nobody: what ``orphans`` looks for.

Only specs whose device names start with a claim UID count; the rest (a static
``/etc/cdi/nvidia.yaml`` of kind ``nvidia.com/gpu``) are not per claim and are ignored. The
directory is read with bounds: at most ``MAX_SPEC_FILES`` files listed and read, each at most
``MAX_SPEC_BYTES`` (``boundedio``: a FIFO or ``/dev/zero`` under the root cannot block or eat
memory). A file that cannot be read or parsed costs that file, with one log line (once per
version of the file), never the rest. Parsed files are cached by (name, inode, size, mtime):
a cycle re-reads only what changed.
"""

from __future__ import annotations

import itertools
import logging
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

import yaml

from ..boundedio import read_text
from ..model import CdiSnapshot, PreparedDevice
from . import Source, SourceError

DEFAULT_CDI_ROOT: Final = "/var/run/cdi"
#: A spec of NVIDIA's for 8 GPUs is ~6 KiB; far larger is no per-claim spec.
MAX_SPEC_BYTES: Final = 1 << 20
#: Spec files looked at per cycle: a node holds a few per claim in use.
MAX_SPEC_FILES: Final = 4096
_SPEC_SUFFIXES: Final = (".yaml", ".yml", ".json")
_CLAIM_UID: Final = re.compile(r"^([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})-(.+)$")
#: The DRA helper's CDI vendors are ``k8s.<driver name>``.
_VENDOR_PREFIX: Final = "k8s."

log = logging.getLogger(__name__)

try:  # libyaml's loader when PyYAML has it: ~10x faster on these files
    _Loader: Any = yaml.CSafeLoader
except AttributeError:  # pragma: no cover - PyYAML without libyaml
    _Loader = yaml.SafeLoader


class SpecError(ValueError):
    """A CDI spec that is not one: the message says what is wrong with it."""


def prepared_devices(spec: object, spec_file: str) -> tuple[PreparedDevice, ...]:
    """The per-claim devices a parsed CDI spec names; ``()`` for a spec that is not per claim.

    Raises ``SpecError`` when it is no CDI spec (no ``kind`` of the form vendor/class, no device list)."""
    if not isinstance(spec, dict):
        raise SpecError("not a mapping")
    kind = spec.get("kind")
    if not isinstance(kind, str) or kind.count("/") != 1:
        raise SpecError(f"kind {kind!r} is not <vendor>/<class>")
    vendor = kind.split("/", 1)[0]
    driver = vendor[len(_VENDOR_PREFIX):] if vendor.startswith(_VENDOR_PREFIX) else vendor
    devices = spec.get("devices")
    if not isinstance(devices, list):
        raise SpecError("no device list")
    found = []
    for dev in devices:
        name = dev.get("name") if isinstance(dev, dict) else None
        if not isinstance(name, str):
            raise SpecError("a device without a name")
        if m := _CLAIM_UID.match(name):
            found.append(PreparedDevice(m[1], m[2], driver, spec_file))
    return tuple(found)


@dataclass(frozen=True, slots=True)
class _Cached:
    version: tuple[int, int, int]
    """(inode, size, mtime_ns) of the file read."""
    devices: tuple[PreparedDevice, ...] | None
    """None: the file could not be read (logged once)."""


class CdiSource(Source[CdiSnapshot]):
    """Reads the per-claim CDI specs under ``root``; see the module docstring."""

    name = "cdi"

    def __init__(self, root: str = DEFAULT_CDI_ROOT, *, max_files: int = MAX_SPEC_FILES,
                 max_bytes: int = MAX_SPEC_BYTES) -> None:
        self.root = root
        self._max_files = max_files
        self._max_bytes = max_bytes
        self._cache: dict[str, _Cached] = {}
        self._said_too_many = False

    def collect(self) -> CdiSnapshot:
        try:
            # At most one more than the bound is listed: a folder of a million files costs no more.
            entries = sorted(itertools.islice(self._spec_entries(), self._max_files + 1))
        except FileNotFoundError:
            # No driver has written a spec yet (the runtime makes the folder on demand): nothing prepared.
            self._cache.clear()
            return CdiSnapshot()
        except OSError as exc:
            raise SourceError(f"cdi: cannot list {self.root}: {exc.strerror or exc}") from None
        if len(entries) > self._max_files:
            if not self._said_too_many:
                log.warning("cdi: %s holds more than %d spec files; only %d are read", self.root, self._max_files,
                            self._max_files)
                self._said_too_many = True
            entries = entries[:self._max_files]
        cache: dict[str, _Cached] = {}
        for name, version in entries:
            cached = self._cache.get(name)
            if cached is None or cached.version != version:
                cached = _Cached(version, self._read(name))
            cache[name] = cached
        self._cache = cache
        devices = sorted((d for c in cache.values() if c.devices for d in c.devices),
                         key=lambda d: (d.driver, d.claim_uid, d.device, d.spec_file))
        return CdiSnapshot(tuple(devices), skipped=sum(1 for c in cache.values() if c.devices is None))

    def _spec_entries(self) -> Iterable[tuple[str, tuple[int, int, int]]]:
        with os.scandir(self.root) as it:
            for entry in it:
                if not entry.name.endswith(_SPEC_SUFFIXES):
                    continue
                try:
                    st = entry.stat(follow_symlinks=True)
                except OSError:
                    continue  # gone since the listing: the next cycle no longer sees it
                yield entry.name, (st.st_ino, st.st_size, st.st_mtime_ns)

    def _read(self, name: str) -> tuple[PreparedDevice, ...] | None:
        path = os.path.join(self.root, name)
        try:
            spec = yaml.load(read_text(path, self._max_bytes), Loader=_Loader)  # noqa: S506 - a safe loader
            return prepared_devices(spec, name)
        except (OSError, UnicodeDecodeError, yaml.YAMLError, SpecError) as exc:
            detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            log.warning("cdi: skipping %s: %s", path, detail)
            return None

    def close(self) -> None:
        self._cache.clear()
