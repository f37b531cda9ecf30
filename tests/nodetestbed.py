"""A real Kubernetes node as a test bed: a real kubelet v1.36 with NVIDIA's real DRA kubelet plugin
(``gpu-kubelet-plugin``) on the mock ``libnvidia-ml.so``, joined to the real control plane.

``DRA_EXPORTER_TESTBED_NODE`` names the test bed's ``node/`` folder: ``node.sh``, the binaries as
``NAME.xz``, ``tools/``. ``node.sh`` finds the control plane (``../kube``) and the mock NVML
(``../nvml``) beside it, or where ``KUBE_BED`` / ``NVML_BED`` say. It needs root.

The bed is one per machine (the kubelet uses ``/var/lib/kubelet/device-plugins`` and
``/var/log/containers``): ``NodeBed.start`` takes an exclusive ``flock`` on ``LOCK_PATH`` before
``node.sh start`` (waiting, with one log line, while another test run holds it) and ``stop`` drops it
after ``node.sh stop``. A run that dies without its teardown (``kill -9``, a CI timeout) still stops
the bed: a small guardian process started beside it holds the lock too and runs ``node.sh stop``
when the test run's end of a pipe closes without a word.

Binaries are unpacked once into a cache folder (as the other harnesses do) and linked into the bed's
folder, so ``node.sh`` does not unpack 250 MB per start.

What the tests need from the bed is here once: ``apply``/``delete`` objects as admin, wait for a pod
to run or be gone, ``exporter()`` runs ``dra-exporter serve`` on the node and scrapes it,
``restart`` restarts the kubelet or the plugin as they were started (the bed's ``tools/restart.sh``),
``podresources()`` asks the kubelet's pod-resources API through the bed's own Go client.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from childproc import die_with_parent
from kubetestbed import binaries as kube_binaries
from kubetestbed import collection_path, unpacked
from nvmltestbed import library_folder
from prometheus_client.parser import text_string_to_metric_families

FOLDER_VARIABLE = "DRA_EXPORTER_TESTBED_NODE"
#: (what, seconds) the bed's tests measured; conftest prints them at the end of the run.
TIMINGS: list[tuple[str, float]] = []
LOCK_PATH = Path("/tmp/dra-exporter-node-bed.lock")
SKIP_HINT = (f"the real node test bed is not available: set {FOLDER_VARIABLE} to the test beds' node/ folder "
             "(node.sh, the kubelet and NVIDIA's gpu-kubelet-plugin as .xz; ../kube and ../nvml beside it, or "
             "KUBE_BED/NVML_BED) and run as root; .ci/run points it at the test bed")
NODE_BINARIES = ("kubelet", "gpu-kubelet-plugin", "fakecri", "podresdump")
#: A board profile of the mock NVML by short name: NVML_BED/configs/mock-nvml-config-<name>.yaml.
DEFAULT_PROFILE = "h100"
_START_TIMEOUT = 240.0  # a cold start (unpacking) on a busy 2-core machine; ~17 s warm
_STOP_TIMEOUT = 120.0

# The guardian: holds the lock (inherited fd) and stops the bed when the test run dies. It reads its
# stdin to the end: "stopped" means the run stopped the bed itself; anything else (EOF alone: the
# run died) makes it run node.sh stop. It ignores SIGINT/SIGTERM/SIGHUP so a Ctrl-C or a terminal
# closing reaches the test run, whose teardown then tells it.
_GUARDIAN = """
import shutil, signal, subprocess, sys
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, signal.SIG_IGN)
said = sys.stdin.read()
if "stopped" not in said:
    subprocess.run(sys.argv[1:], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   timeout=300)
    if sys.argv[-1].startswith("/tmp/dra-exporter-node-bed-"):
        shutil.rmtree(sys.argv[-1], ignore_errors=True)
"""


class NodeBedError(RuntimeError):
    """The node test bed did not start, or a step against it failed."""


def testbed_folder() -> Path | None:
    """The folder ``DRA_EXPORTER_TESTBED_NODE`` names, or None when unset."""
    value = os.environ.get(FOLDER_VARIABLE, "").strip()
    return Path(value) if value else None


def unavailable_reason(folder: Path | None) -> str | None:
    """Why this machine cannot run the bed (one line), or None when it can."""
    if folder is None:
        return SKIP_HINT
    if not (folder / "node.sh").is_file():
        return f"{FOLDER_VARIABLE}={folder} has no node.sh: {SKIP_HINT}"
    if os.geteuid() != 0:
        return f"the node test bed needs root (mknod, the kubelet's mounts): run the tests as root; {SKIP_HINT}"
    return None


def beside(folder: Path, variable: str, name: str) -> Path:
    value = os.environ.get(variable, "").strip()
    return Path(value) if value else (folder / ".." / name).resolve()


def _unpacked_node_binaries(folder: Path) -> dict[str, Path]:
    """The bed's Go binaries, unpacked once into the cache (keyed by the bed's checksum list too)."""
    sums = folder / "SHA256SUMS"
    return unpacked("node", {name: folder / f"{name}.xz" for name in NODE_BINARIES},
                    sums.read_bytes() if sums.is_file() else b"")


def _driver_version(profile: Path) -> str:
    """The profile's driver version, as node.sh reads it (the mock library's file name carries it)."""
    match = re.search(r'^\s*driver_version:\s*"?([0-9.]+)', profile.read_text(), re.M)
    if not match:
        raise NodeBedError(f"no driver_version in {profile}")
    return match.group(1)


def _prepare(folder: Path, workdir: Path, profile: Path, nvml_bed: Path) -> None:
    """Put what node.sh would unpack into ``workdir`` from the cache (node.sh skips what exists)."""
    (workdir / "bin").mkdir(parents=True, exist_ok=True)
    for name, path in _unpacked_node_binaries(folder).items():
        link = workdir / "bin" / name
        if not link.exists():
            link.symlink_to(path)
    lib = workdir / "nvidia-driver" / "usr" / "lib64"
    lib.mkdir(parents=True, exist_ok=True)
    versioned = lib / f"libnvidia-ml.so.{_driver_version(profile)}"
    if not versioned.exists():
        # A copy, not a link: the plugin's CDI generator resolves driver files by their versioned name.
        shutil.copyfile(library_folder(nvml_bed) / "libnvidia-ml.so.1", versioned)


def _log(message: str) -> None:
    """One line on the terminal even under pytest's capture (the wait for the lock can be long)."""
    try:
        with open("/dev/tty", "w") as tty:
            tty.write(f"\n[nodetestbed] {message}\n")
    except OSError:
        print(f"[nodetestbed] {message}", file=sys.stderr, flush=True)


def take_lock(fd: int) -> None:
    """An exclusive flock on ``fd``: at once if free, else one log line and a blocking wait."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        _log(f"waiting for {LOCK_PATH}: another test run holds the node test bed (one per machine)")
        waited = time.monotonic()
        fcntl.flock(fd, fcntl.LOCK_EX)
        _log(f"got {LOCK_PATH} after {time.monotonic() - waited:.0f} s")


# --- the bed ----------------------------------------------------------------------------------------------

@dataclass
class NodeBed:
    """One running node test bed; ``start`` it, ``stop`` ends it and releases the machine's lock."""

    folder: Path
    workdir: Path
    profile: str
    info: dict[str, str]
    _lock_fd: int | None = None
    _guardian: subprocess.Popen[bytes] | None = None
    _ssl: ssl.SSLContext | None = None
    _names: Iterator[int] = field(default_factory=lambda: iter(range(1, 1 << 30)))

    # -- life cycle

    @classmethod
    def start(cls, folder: Path, workdir: Path, profile: str = DEFAULT_PROFILE) -> NodeBed:
        kube_bed = beside(folder, "KUBE_BED", "kube")
        nvml_bed = beside(folder, "NVML_BED", "nvml")
        profile_file = nvml_bed / "configs" / f"mock-nvml-config-{profile}.yaml"
        if not profile_file.is_file():
            raise NodeBedError(f"no board profile {profile!r}: {profile_file} is missing")
        workdir.mkdir(parents=True, exist_ok=True)
        bed = cls(folder=folder.resolve(), workdir=workdir.resolve(), profile=profile, info={})
        fd = os.open(LOCK_PATH, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        bed._lock_fd = fd
        try:
            take_lock(fd)
            env = {**os.environ, "KUBE_BED": str(kube_bed), "NVML_BED": str(nvml_bed), "PROFILE": str(profile_file),
                   # control-plane.sh runs the binaries from ASSETS: the kube harness's cache, unpacked once
                   "ASSETS": str(kube_binaries(kube_bed)["etcd"].parent)}
            env.pop("KUBECONFIG", None)
            bed._guardian = subprocess.Popen(
                [sys.executable, "-c", _GUARDIAN, str(bed.node_sh), "stop", str(bed.workdir)],
                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                pass_fds=(fd,), start_new_session=True, env=env, cwd=str(bed.workdir))
            _prepare(bed.folder, bed.workdir, profile_file, nvml_bed)
            started = time.monotonic()
            out = subprocess.run([str(bed.node_sh), "start", str(bed.workdir)], env=env, cwd=str(bed.workdir),
                                 stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=_START_TIMEOUT)
            if out.returncode != 0:
                raise NodeBedError(f"node.sh start failed ({out.returncode}): {out.stderr.strip()[-2000:]}; "
                                   f"logs in {bed.workdir / 'logs'}")
            bed.info = dict(line.split("=", 1) for line in out.stdout.splitlines()
                            if "=" in line and not line.startswith("NVML:"))
            bed.info["start_seconds"] = f"{time.monotonic() - started:.1f}"
            bed.wait_for(lambda: bed.slice_devices(), "the driver's ResourceSlices", timeout=60)
        except BaseException:
            bed.stop()
            raise
        return bed

    @property
    def node_sh(self) -> Path:
        return self.folder / "node.sh"

    def stop(self) -> None:
        """node.sh stop, then tell the guardian, then drop the lock. Safe to call twice."""
        if self._lock_fd is None:
            return
        try:
            subprocess.run([str(self.node_sh), "stop", str(self.workdir)], cwd=str(self.workdir),
                           stdin=subprocess.DEVNULL, capture_output=True, timeout=_STOP_TIMEOUT,
                           env={**os.environ, "KUBE_BED": str(beside(self.folder, "KUBE_BED", "kube")),
                                "NVML_BED": str(beside(self.folder, "NVML_BED", "nvml"))})
        finally:
            guardian, self._guardian = self._guardian, None
            if guardian is not None and guardian.stdin is not None:
                try:
                    guardian.stdin.write(b"stopped")
                    guardian.stdin.close()
                    guardian.wait(timeout=10)
                except (OSError, subprocess.TimeoutExpired):
                    guardian.kill()
            fd, self._lock_fd = self._lock_fd, None
            os.close(fd)

    # -- what node.sh printed

    @property
    def node_name(self) -> str:
        return self.info.get("NODE_NAME", "bed-node")

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "cp" / "admin.kubeconfig"

    @property
    def pod_resources_socket(self) -> Path:
        return self.workdir / "kubelet" / "pod-resources" / "kubelet.sock"

    @property
    def library_dir(self) -> Path:
        return self.workdir / "nvidia-driver" / "usr" / "lib64"

    @property
    def nvml_config(self) -> Path:
        return self.workdir / "nvidia-driver" / "config" / "config.yaml"

    @property
    def cdi_root(self) -> Path:
        return self.workdir / "cdi"

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.info['API_PORT']}"

    def pid(self, process: str) -> int:
        """The pid of ``kubelet``, ``gpu-kubelet-plugin`` or ``fakecri`` as node.sh recorded it."""
        return int((self.workdir / "run" / f"{process}.pid").read_text().strip())

    def log_tail(self, process: str, lines: int = 30) -> str:
        path = self.workdir / "logs" / f"{process}.log"
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""

    # -- the API server, as admin

    def _context(self) -> ssl.SSLContext:
        if self._ssl is None:
            pki = self.workdir / "cp" / "pki"
            ctx = ssl.create_default_context(cafile=str(pki / "ca.crt"))
            ctx.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))
            self._ssl = ctx
        return self._ssl

    def request(self, method: str, path: str, body: Mapping[str, Any] | None = None, *,
                content_type: str = "application/json", timeout: float = 30) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, context=self._context(), timeout=timeout) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as err:
            status, raw = err.code, err.read()
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode("utf-8", "replace")

    def get(self, path: str) -> dict[str, Any]:
        status, body = self.request("GET", path)
        if status != 200:
            raise NodeBedError(f"GET {path}: {status} {body}")
        return dict(body)

    def items(self, path: str) -> list[dict[str, Any]]:
        return list(self.get(path).get("items", []))

    def apply(self, objects: str | Iterable[Mapping[str, Any]], namespace: str | None = None) -> list[dict[str, Any]]:
        """Create each object (YAML text or dicts), in order; ``namespace`` overrides theirs."""
        created = []
        for obj in _objects(objects, namespace):
            status, body = self.request("POST", collection_path(obj), obj)
            if status not in (200, 201):
                raise NodeBedError(f"create {obj['kind']} {obj['metadata']['name']}: {status} {_message(body)}")
            created.append(dict(body))
        return created

    def delete(self, objects: str | Iterable[Mapping[str, Any]], namespace: str | None = None, *,
               wait: bool = True, timeout: float = 60) -> None:
        """Delete each object (pods at once, grace 0); with ``wait``, until the server no longer has them."""
        paths = []
        for obj in _objects(objects, namespace):
            path = f"{collection_path(obj)}/{obj['metadata']['name']}"
            body = {"gracePeriodSeconds": 0} if obj["kind"] == "Pod" else None
            status, answer = self.request("DELETE", path, body)
            if status not in (200, 202, 404):
                raise NodeBedError(f"delete {path}: {status} {_message(answer)}")
            paths.append(path)
        if wait:
            for path in paths:
                self.wait_for(lambda p=path: self.request("GET", p)[0] == 404, f"{path} gone", timeout)  # type: ignore[misc]

    def pod(self, namespace: str, name: str) -> dict[str, Any]:
        return self.get(f"/api/v1/namespaces/{namespace}/pods/{name}")

    def wait_running(self, namespace: str, name: str, timeout: float = 60) -> dict[str, Any]:
        """The pod once the kubelet reports it Running (its claims prepared, its containers started)."""
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"

        def running() -> dict[str, Any] | None:
            pod = self.get(path)
            return pod if pod.get("status", {}).get("phase") == "Running" else None

        try:
            return dict(self.wait_for(running, f"pod {namespace}/{name} Running", timeout))
        except NodeBedError as exc:
            status = self.request("GET", path)[1]
            raise NodeBedError(f"{exc}; status: {json.dumps((status or {}).get('status'))[:1500]}") from None

    def namespace(self, prefix: str = "t") -> str:
        """A new namespace whose default ServiceAccount exists (pods are refused before)."""
        name = f"{prefix}-{os.getpid()}-{next(self._names)}"
        self.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}])
        self.wait_for(lambda: self.request("GET", f"/api/v1/namespaces/{name}/serviceaccounts/default")[0] == 200,
                      f"the default ServiceAccount of {name}")
        return name

    def claims(self, namespace: str) -> dict[str, dict[str, Any]]:
        return {c["metadata"]["name"]: c
                for c in self.items(f"/apis/resource.k8s.io/v1/namespaces/{namespace}/resourceclaims")}

    def slices(self) -> list[dict[str, Any]]:
        return self.items(f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.nodeName={self.node_name}")

    def slice_devices(self) -> int:
        return sum(len(s["spec"].get("devices", [])) for s in self.slices())

    def uuid_of(self) -> dict[tuple[str, str, str], str]:
        """(driver, pool, device) → the GPU uuid the driver's slice gives it."""
        out = {}
        for s in self.slices():
            for d in s["spec"].get("devices", []):
                uuid = d.get("attributes", {}).get("uuid", {}).get("string")
                if uuid:
                    out[(s["spec"]["driver"], s["spec"]["pool"]["name"], d["name"])] = uuid
        return out

    @staticmethod
    def wait_for(check: Callable[[], Any], what: str, timeout: float = 60.0, step: float = 0.1) -> Any:
        """Poll ``check`` until it returns something truthy; returns it."""
        deadline = time.monotonic() + timeout
        while True:
            result = check()
            if result:
                return result
            if time.monotonic() > deadline:
                raise NodeBedError(f"timed out after {timeout:.0f} s waiting for {what}")
            time.sleep(step)

    # -- the node

    def restart(self, process: str) -> None:
        """Restart ``kubelet``, ``gpu-kubelet-plugin`` or ``fakecri`` with its argv, env and log (tools/restart.sh)."""
        out = subprocess.run([str(self.folder / "tools" / "restart.sh"), str(self.workdir), process],
                             capture_output=True, text=True, timeout=60, cwd=str(self.workdir / "cwd"))
        if out.returncode != 0:
            raise NodeBedError(f"restart {process}: {out.stderr.strip()}")

    @contextmanager
    def stopped(self, process: str) -> Iterator[None]:
        """``process`` (``gpu-kubelet-plugin``, ``kubelet``) killed for the block, then started again with
        its argv, environment and log, as tools/restart.sh does."""
        pid = self.pid(process)
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
        env = dict(e.split(b"=", 1) for e in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in e)
        os.kill(pid, signal.SIGKILL)
        self.wait_for(lambda: not Path(f"/proc/{pid}").exists() or _zombie(pid), f"{process} gone", timeout=10)
        try:
            yield
        finally:
            with open(self.workdir / "logs" / f"{process}.log", "ab") as log:
                proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        cwd=str(self.workdir / "cwd"), start_new_session=True)
            (self.workdir / "run" / f"{process}.pid").write_text(f"{proc.pid}\n")

    def podresources(self, pod: tuple[str, str] | None = None) -> dict[str, Any]:
        """The kubelet's pod-resources answers through the bed's Go client: {"List": ...,
        "GetAllocatableResources": ..., "Get": ... (with ``pod`` = (namespace, name))}."""
        argv = [str(self.workdir / "bin" / "podresdump"), "--socket", str(self.pod_resources_socket)]
        if pod:
            argv += ["--namespace", pod[0], "--pod", pod[1]]
        out = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        if out.returncode != 0:
            raise NodeBedError(f"podresdump: {out.stderr.strip()}")
        return parse_podresdump(out.stdout)

    # -- the exporter on this node

    def exporter_env(self) -> dict[str, str]:
        return {"LD_LIBRARY_PATH": str(self.library_dir), "MOCK_NVML_CONFIG": str(self.nvml_config)}

    def exporter_argv(self, port: int, interval: float = 0.25) -> list[str]:
        return [sys.executable, "-m", "dra_exporter.cli", "serve", "--listen", f"127.0.0.1:{port}",
                "--interval", str(interval), "--kubelet-socket", str(self.pod_resources_socket),
                "--kubeconfig", str(self.kubeconfig), "--node-name", self.node_name]

    @contextmanager
    def exporter(self, *extra: str, interval: float = 0.25) -> Iterator[Exporter]:
        """``dra-exporter serve`` on this node until the block ends; ready once /readyz says 200."""
        exporter = Exporter(self, _free_port(), interval, list(extra))
        exporter.start()
        try:
            yield exporter
        finally:
            exporter.stop()


@dataclass
class Exporter:
    """One ``dra-exporter serve`` process on the bed's node; ``restart`` keeps the port."""

    bed: NodeBed
    port: int
    interval: float
    extra: list[str]
    proc: subprocess.Popen[bytes] | None = None
    log: Path | None = None

    def start(self) -> None:
        self.log = self.bed.workdir / "logs" / f"exporter-{self.port}.log"
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(self.bed.exporter_argv(self.port, self.interval) + self.extra,
                                         stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env={**os.environ, **self.bed.exporter_env()}, preexec_fn=die_with_parent)
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise NodeBedError(f"exporter exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise NodeBedError(f"exporter not ready within 60 s: {self.log_tail()}")
            time.sleep(0.1)

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def restart(self) -> None:
        self.stop()
        self.start()

    def log_tail(self, lines: int = 30) -> str:
        if self.log is None or not self.log.exists():
            return ""
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])

    def text(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=10) as resp:
            return str(resp.read().decode())

    def series(self, name: str | None = None) -> list[tuple[str, dict[str, str], float]]:
        """(sample name, labels, value) of every sample, or of the family ``name``."""
        return [(s.name, dict(s.labels), float(s.value))
                for family in text_string_to_metric_families(self.text())
                for s in family.samples if name is None or s.name == name]


class NodeBeds:
    """The real node test bed for the session: one at a time (one per machine), started on first use
    with a board profile and kept for every later test of that board; a module that asks for another
    board stops it and starts that one (keep such tests in one module: each start is ~20 s)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.current: NodeBed | None = None

    def bed(self, profile: str = DEFAULT_PROFILE) -> NodeBed:
        if self.current is not None and self.current.profile == profile:
            return self.current
        self.close()
        # Not under pytest's basetemp: a parallel pytest run deletes all but the newest three of those,
        # a running bed's folder included.
        workdir = Path(tempfile.mkdtemp(prefix=f"dra-exporter-node-bed-{profile}-"))
        try:
            self.current = NodeBed.start(self.folder, workdir, profile)
        except BaseException:
            shutil.rmtree(workdir, ignore_errors=True)
            raise
        return self.current

    def close(self) -> None:
        current, self.current = self.current, None
        if current is not None:
            current.stop()
            shutil.rmtree(current.workdir, ignore_errors=True)


def parse_podresdump(text: str) -> dict[str, Any]:
    """podresdump prints ``== List:`` then JSON, and so on for each call: {call name: JSON}."""
    out: dict[str, Any] = {}
    for part in re.split(r"^== ", text, flags=re.M):
        head, _, body = part.partition("\n")
        if head.rstrip().endswith(":") and body.strip():
            out[head.rstrip()[:-1].strip()] = json.loads(body)
    return out


def _objects(objects: str | Iterable[Mapping[str, Any]], namespace: str | None) -> list[dict[str, Any]]:
    docs = [d for d in yaml.safe_load_all(objects) if d] if isinstance(objects, str) else [dict(o) for o in objects]
    out = []
    for doc in docs:
        doc = json.loads(json.dumps(doc))  # a deep copy: the caller's objects stay as they were
        if namespace and doc["kind"] not in ("Namespace", "DeviceClass", "ResourceSlice"):
            doc["metadata"]["namespace"] = namespace
        out.append(doc)
    return out


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def _message(body: Any) -> str:
    return str(body.get("message", body)) if isinstance(body, dict) else str(body)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
