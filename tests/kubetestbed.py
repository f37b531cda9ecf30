"""The real Kubernetes control plane as a test bed: etcd, kube-apiserver, kube-scheduler and
kube-controller-manager on free loopback ports, for the tests that must agree with the real thing.

The binaries come from the folder named by ``KUBEBUILDER_ASSETS`` (controller-runtime's envtest
convention). It may hold them unpacked or as ``NAME.xz`` (the test bed CI uses does);
``.xz`` files are unpacked once into a cache folder keyed by their checksum list.

``ControlPlane.start(workdir)`` makes a throw-away PKI (EC keys: milliseconds, unlike RSA), writes an
admin kubeconfig and starts the four processes; ``stop()`` ends exactly the processes it started.
What a cluster without kubelets needs (the test bed's README) is here once: ``ready_node`` makes a
Node the scheduler accepts, ``namespace`` makes a namespace whose default ServiceAccount exists, and
``run_pod`` marks a bound pod Running through the status subresource.

Nothing here knows dra-exporter: tests bring the objects and the exporter.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import itertools
import json
import lzma
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from childproc import die_with_parent
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

ASSETS_VARIABLE = "KUBEBUILDER_ASSETS"
BINARIES = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager")
SKIP_HINT = (f"the real Kubernetes control plane is not available: set {ASSETS_VARIABLE} to a folder with etcd, "
             "kube-apiserver, kube-scheduler and kube-controller-manager v1.36 (`setup-envtest use 1.36 -p path` "
             "plus a kube-scheduler and kube-controller-manager of the same version; .ci/run uses "
             "the test bed)")

# Every DRA gate of 1.36 (the test bed's README). The scheduler runs without DRADeviceTaintRules: with it,
# this build's scheduler panics on the next slice event once a DeviceTaintRule exists ("Known problems").
GATES = ("DynamicResourceAllocation", "DRAAdminAccess", "DRAPrioritizedList", "DRAPartitionableDevices",
         "DRADeviceTaints", "DRADeviceTaintRules", "DRAConsumableCapacity", "DRAExtendedResource",
         "DRADeviceBindingConditions", "DRAResourceClaimDeviceStatus")
SCHEDULER_GATES = tuple(g for g in GATES if g != "DRADeviceTaintRules")
RUNTIME_CONFIG = ",".join(f"resource.k8s.io/{v}=true" for v in ("v1", "v1beta2", "v1beta1", "v1alpha3"))
CONTROLLERS = ("resourceclaim-controller", "device-taint-eviction-controller", "garbage-collector-controller",
               "namespace-controller", "serviceaccount-controller", "serviceaccount-token-controller",
               "clusterrole-aggregation-controller", "root-ca-certificate-publisher-controller",
               "pod-garbage-collector-controller")
ADMIN_ACCESS_LABEL = "resource.kubernetes.io/admin-access"
# What the RBAC tests read back: every request of a ServiceAccount outside kube-system (the
# controller-manager's own service accounts would drown them), at Metadata level.
AUDIT_POLICY = {"apiVersion": "audit.k8s.io/v1", "kind": "Policy", "omitStages": ["RequestReceived"],
                "rules": [{"level": "None", "userGroups": ["system:serviceaccounts:kube-system"]},
                          {"level": "Metadata", "userGroups": ["system:serviceaccounts"]},
                          {"level": "None"}]}
_READY_TIMEOUT = 90.0  # a cold start on a busy 2-core machine


#: Cluster-scoped collections whose objects change what the scheduler (and the exporter) decides for every
#: later test: a slice of shared counters is gathered on every node, a slice for all nodes or a node
#: selector is seen from other tests' nodes, a Node's labels meet other tests' selectors. One control
#: plane serves the whole session, so each test module removes those it made (``cluster_objects``,
#: ``remove_cluster_objects``; the module fixture in tests/conftest.py).
SHARED_COLLECTIONS = ("/apis/resource.k8s.io/v1/resourceslices", "/apis/resource.k8s.io/v1/deviceclasses",
                      "/apis/resource.k8s.io/v1beta2/devicetaintrules", "/api/v1/nodes")
#: Deletions at once when a module's objects are removed (each is a TLS request of its own).
PARALLEL_DELETES = 8


class ControlPlaneError(RuntimeError):
    """The control plane did not start, or answered with an error."""


def assets_folder() -> Path | None:
    """The folder ``KUBEBUILDER_ASSETS`` names, or None when unset."""
    value = os.environ.get(ASSETS_VARIABLE, "").strip()
    return Path(value) if value else None


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dra-exporter-testbeds"


def binaries(assets: Path) -> dict[str, Path]:
    """The four executables: from ``assets`` as they are, or unpacked from ``NAME.xz`` into the cache."""
    if all((assets / name).is_file() and os.access(assets / name, os.X_OK) for name in BINARIES):
        return {name: assets / name for name in BINARIES}
    packed = {name: assets / f"{name}.xz" for name in BINARIES}
    missing = [str(p) for p in packed.values() if not p.is_file()]
    if missing:
        raise ControlPlaneError(f"{ASSETS_VARIABLE}={assets} has neither the binaries nor {', '.join(missing)}")
    return unpacked("kube", packed)


def unpacked(prefix: str, packed: Mapping[str, Path], salt: bytes = b"") -> dict[str, Path]:
    """Each ``NAME.xz`` of ``packed`` (name -> file) unpacked once into the cache as an executable, in a
    folder keyed by what the packed files are (and ``salt``), so a newer test bed unpacks anew."""
    key = hashlib.sha256(salt)
    for name, path in packed.items():
        stat = path.stat()
        key.update(f"{name}:{stat.st_size}:{int(stat.st_mtime)}\n".encode())
    target = cache_root() / f"{prefix}-{key.hexdigest()[:16]}"
    target.mkdir(parents=True, exist_ok=True)
    for name, path in packed.items():
        out = target / name
        if out.is_file() and os.access(out, os.X_OK):
            continue
        tmp = target / f".{name}.{os.getpid()}.tmp"
        with lzma.open(path) as src, open(tmp, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
        tmp.chmod(0o755)
        tmp.replace(out)  # atomic: a parallel session sees a whole file or none
    return {name: target / name for name in packed}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# --- PKI ---------------------------------------------------------------------------------------------

def _name(common_name: str, organization: str | None = None) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization:
        attrs.insert(0, x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attrs)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


@dataclass(frozen=True)
class Pki:
    folder: Path

    @property
    def ca(self) -> Path:
        return self.folder / "ca.crt"

    def cert(self, stem: str) -> Path:
        return self.folder / f"{stem}.crt"

    def key(self, stem: str) -> Path:
        return self.folder / f"{stem}.key"


def make_pki(folder: Path) -> Pki:
    folder.mkdir(parents=True, exist_ok=True)
    now = dt.datetime.now(dt.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("dra-exporter test-bed CA")
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(x509.random_serial_number())
          .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=7))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
          .sign(ca_key, hashes.SHA256()))
    (folder / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    (folder / "ca.key").write_bytes(_pem_key(ca_key))

    def leaf(stem: str, cn: str, org: str | None = None, server: bool = False) -> None:
        key = ec.generate_private_key(ec.SECP256R1())
        usages = [ExtendedKeyUsageOID.CLIENT_AUTH] + ([ExtendedKeyUsageOID.SERVER_AUTH] if server else [])
        builder = (x509.CertificateBuilder().subject_name(_name(cn, org)).issuer_name(ca_name)
                   .public_key(key.public_key()).serial_number(x509.random_serial_number())
                   .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=7))
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(x509.ExtendedKeyUsage(usages), critical=False))
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName([
                x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost"),
                x509.DNSName("kubernetes.default.svc")]), critical=False)
        cert = builder.sign(ca_key, hashes.SHA256())
        (folder / f"{stem}.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        (folder / f"{stem}.key").write_bytes(_pem_key(key))

    leaf("apiserver", "kube-apiserver", server=True)
    leaf("admin", "admin", "system:masters")
    leaf("scheduler", "system:kube-scheduler")
    leaf("controller-manager", "system:kube-controller-manager")
    sa = ec.generate_private_key(ec.SECP256R1())
    (folder / "sa.key").write_bytes(_pem_key(sa))
    (folder / "sa.pub").write_bytes(sa.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return Pki(folder)


def write_kubeconfig(path: Path, server: str, ca: Path, user: str, *, cert: Path | None = None,
                     key: Path | None = None, token: str | None = None) -> Path:
    """A kubeconfig with one cluster, one user (client certificate or bearer token), one context."""
    credentials: dict[str, str] = {}
    if cert and key:
        credentials = {"client-certificate": str(cert), "client-key": str(key)}
    if token:
        credentials = {"token": token}
    config = {"apiVersion": "v1", "kind": "Config",
              "clusters": [{"name": "testbed", "cluster": {"server": server, "certificate-authority": str(ca)}}],
              "users": [{"name": user, "user": credentials}],
              "contexts": [{"name": "testbed", "context": {"cluster": "testbed", "user": user}}],
              "current-context": "testbed"}
    path.write_text(json.dumps(config, indent=1))  # JSON is YAML
    path.chmod(0o600)
    return path


# --- the control plane --------------------------------------------------------------------------------

@dataclass
class ControlPlane:
    """Four processes on loopback and what talks to them. Use ``start``; ``stop`` ends what it started."""

    workdir: Path
    bins: dict[str, Path]
    pki: Pki
    ports: dict[str, int]
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    _names: Iterator[int] = field(default_factory=lambda: itertools.count(1))

    # -- life cycle

    @classmethod
    def start(cls, workdir: Path, assets: Path, *, controller_manager: bool = True) -> ControlPlane:
        workdir.mkdir(parents=True, exist_ok=True)
        (workdir / "logs").mkdir(exist_ok=True)
        plane = cls(workdir=workdir, bins=binaries(assets), pki=make_pki(workdir / "pki"),
                    ports={n: free_port() for n in ("etcd", "peer", "api", "scheduler", "kcm")})
        write_kubeconfig(plane.kubeconfig, plane.server, plane.pki.ca, "admin",
                         cert=plane.pki.cert("admin"), key=plane.pki.key("admin"))
        for stem, user in (("scheduler", "system:kube-scheduler"),
                           ("controller-manager", "system:kube-controller-manager")):
            write_kubeconfig(workdir / f"{stem}.kubeconfig", plane.server, plane.pki.ca, user,
                             cert=plane.pki.cert(stem), key=plane.pki.key(stem))
        try:
            plane._start_etcd()
            plane.start_apiserver()
            plane._start_scheduler()
            if controller_manager:
                plane._start_controller_manager()
                # Pods need their namespace's default ServiceAccount: the controller-manager's first work.
                plane._wait(lambda: plane._get("/api/v1/namespaces/default/serviceaccounts/default"),
                            "the default ServiceAccount")
        except BaseException:
            plane.stop()
            raise
        return plane

    def stop(self) -> None:
        """End exactly the processes this object started, the newest first."""
        for name in reversed(list(self.processes)):
            self._end(name)

    def _end(self, name: str) -> None:
        proc = self.processes.pop(name, None)
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.workdir / "logs" / f"{name}.log", "ab")  # noqa: SIM115 - owned by the child
        try:
            self.processes[name] = subprocess.Popen([str(self.bins.get(name, name)), *args], stdout=log,
                                                    stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                                    start_new_session=True, preexec_fn=die_with_parent)
        finally:
            log.close()

    def _wait(self, ready: Callable[[], object], what: str, timeout: float = _READY_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        last: BaseException | None = None
        while time.monotonic() < deadline:
            for name, proc in self.processes.items():
                if proc.poll() is not None:
                    raise ControlPlaneError(f"{name} exited with {proc.returncode} while waiting for {what}: "
                                            f"{self.log_tail(name)}")
            try:
                ready()
                return
            except Exception as exc:  # not ready yet
                last = exc
            time.sleep(0.1)
        raise ControlPlaneError(f"not ready after {timeout:.0f} s: {what} ({last}); logs in {self.workdir / 'logs'}")

    def log_tail(self, name: str, lines: int = 20) -> str:
        path = self.workdir / "logs" / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])

    def _start_etcd(self) -> None:
        etcd, peer = self.ports["etcd"], self.ports["peer"]
        self._spawn("etcd", ["--name", "testbed", "--data-dir", str(self.workdir / "etcd"),
                             "--listen-client-urls", f"http://127.0.0.1:{etcd}",
                             "--advertise-client-urls", f"http://127.0.0.1:{etcd}",
                             "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                             "--initial-cluster", f"testbed=http://127.0.0.1:{peer}",
                             "--log-level", "warn"])
        self._wait(lambda: urllib.request.urlopen(f"http://127.0.0.1:{etcd}/health", timeout=2).read(), "etcd")

    def start_apiserver(self, extra: tuple[str, ...] = ()) -> None:
        """(Re)start kube-apiserver on its port, over the same etcd; waits for /readyz."""
        p, w = self.pki, self.workdir
        (w / "audit-policy.json").write_text(json.dumps(AUDIT_POLICY))
        self._spawn("kube-apiserver", [
            f"--etcd-servers=http://127.0.0.1:{self.ports['etcd']}", "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1", f"--secure-port={self.ports['api']}", "--endpoint-reconciler-type=none",
            f"--cert-dir={w / 'apiserver-certs'}", f"--tls-cert-file={p.cert('apiserver')}",
            f"--tls-private-key-file={p.key('apiserver')}", f"--client-ca-file={p.ca}",
            f"--service-account-key-file={p.folder / 'sa.pub'}",
            f"--service-account-signing-key-file={p.folder / 'sa.key'}",
            "--service-account-issuer=https://kubernetes.default.svc", "--service-cluster-ip-range=10.96.0.0/16",
            "--authorization-mode=Node,RBAC", "--allow-privileged=true", "--profiling=false",
            f"--runtime-config={RUNTIME_CONFIG}", f"--feature-gates={_gates(GATES)}", "--v=1",
            f"--audit-policy-file={w / 'audit-policy.json'}", f"--audit-log-path={self.audit_log}",
            "--audit-log-format=json", "--audit-log-mode=blocking", *extra])
        self._wait(lambda: self._get("/readyz"), "kube-apiserver")

    def restart_apiserver(self) -> None:
        """Stop and start kube-apiserver (etcd, and so every object, stays): watches must resume."""
        self._end("kube-apiserver")
        self.start_apiserver()

    def _start_scheduler(self) -> None:
        kc = self.workdir / "scheduler.kubeconfig"
        self._spawn("kube-scheduler", [
            f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1", f"--secure-port={self.ports['scheduler']}",
            f"--cert-dir={self.workdir / 'scheduler-certs'}", "--leader-elect=false",
            f"--feature-gates={_gates(SCHEDULER_GATES)}", "--v=2"])
        self._wait(lambda: _insecure_get(f"https://127.0.0.1:{self.ports['scheduler']}/healthz"), "kube-scheduler")

    def _start_controller_manager(self) -> None:
        kc = self.workdir / "controller-manager.kubeconfig"
        self._spawn("kube-controller-manager", [
            f"--kubeconfig={kc}", f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1", f"--secure-port={self.ports['kcm']}",
            f"--cert-dir={self.workdir / 'kcm-certs'}", "--leader-elect=false",
            "--use-service-account-credentials=true", f"--controllers={','.join(CONTROLLERS)}",
            f"--service-account-private-key-file={self.pki.folder / 'sa.key'}", f"--root-ca-file={self.pki.ca}",
            f"--feature-gates={_gates(GATES)}", "--v=1"])
        self._wait(lambda: _insecure_get(f"https://127.0.0.1:{self.ports['kcm']}/healthz"),
                   "kube-controller-manager")

    def compact_etcd(self) -> int:
        """Compact etcd at its current revision: older resourceVersions answer 410 Gone from now on."""
        base = f"http://127.0.0.1:{self.ports['etcd']}/v3"
        status = _post_json(f"{base}/kv/range", {"key": "Lw==", "limit": 1})  # "/"
        revision = int(status["header"]["revision"])
        _post_json(f"{base}/kv/compaction", {"revision": revision, "physical": True})
        return revision

    # -- talking to it

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.ports['api']}"

    @property
    def kubeconfig(self) -> Path:
        return self.workdir / "admin.kubeconfig"

    @property
    def audit_log(self) -> Path:
        return self.workdir / "logs" / "audit.jsonl"

    def audit_events(self, user: str) -> list[dict[str, Any]]:
        """The audit log's events (ResponseStarted of watches, ResponseComplete of everything) of
        ``user``, e.g. ``system:serviceaccount:NS:NAME``; only ServiceAccounts outside kube-system
        are logged (``AUDIT_POLICY``)."""
        if not self.audit_log.exists():
            return []
        events = []
        for line in self.audit_log.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:  # the line being written
                continue
            if event.get("user", {}).get("username") == user:
                events.append(event)
        return events

    def _ssl(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki.ca))
        ctx.load_cert_chain(str(self.pki.cert("admin")), str(self.pki.key("admin")))
        return ctx

    def request(self, method: str, path: str, body: Mapping[str, Any] | None = None, *,
                content_type: str = "application/json", token: str | None = None,
                timeout: float = 30) -> tuple[int, Any]:
        """One REST call as admin (or with ``token``); returns (status, decoded JSON or text)."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.server + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", content_type)
        ctx = self._ssl()
        if token:
            ctx = ssl.create_default_context(cafile=str(self.pki.ca))
            req.add_header("Authorization", f"Bearer {token}")
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=timeout) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as err:
            status, raw = err.code, err.read()
        try:
            return status, json.loads(raw) if raw else None
        except ValueError:
            return status, raw.decode("utf-8", "replace")

    def _get(self, path: str) -> Any:
        status, body = self.request("GET", path, timeout=5)
        if status != 200:
            raise ControlPlaneError(f"GET {path}: {status} {body}")
        return body

    def create(self, obj: Mapping[str, Any], namespace: str | None = None) -> dict[str, Any]:
        """Create one object (any kind the server serves); raises with the server's message on refusal."""
        status, body = self.request("POST", collection_path(obj, namespace), obj)
        if status not in (200, 201):
            raise ControlPlaneError(f"create {obj.get('kind')} {obj.get('metadata', {}).get('name')}: {status} "
                                    f"{_message(body)}")
        return dict(body)

    def try_create(self, obj: Mapping[str, Any], namespace: str | None = None) -> tuple[int, str]:
        """Create one object; returns (status, the server's message) instead of raising."""
        status, body = self.request("POST", collection_path(obj, namespace), obj)
        return status, _message(body) if status not in (200, 201) else ""

    def patch_status(self, obj: Mapping[str, Any], status_patch: Mapping[str, Any]) -> dict[str, Any]:
        path = object_path(obj) + "/status"
        status, body = self.request("PATCH", path, {"status": status_patch},
                                    content_type="application/merge-patch+json")
        if status != 200:
            raise ControlPlaneError(f"patch status {path}: {status} {_message(body)}")
        return dict(body)

    def get(self, path: str) -> dict[str, Any]:
        return dict(self._get(path))

    def delete(self, path: str) -> None:
        status, body = self.request("DELETE", path)
        if status not in (200, 202, 404):
            raise ControlPlaneError(f"delete {path}: {status} {_message(body)}")

    def cluster_objects(self) -> set[str]:
        """The paths of every object in ``SHARED_COLLECTIONS`` (a collection not served counts as empty)."""
        paths: set[str] = set()
        for collection in SHARED_COLLECTIONS:
            status, body = self.request("GET", collection)
            if status == 200:
                paths |= {f"{collection}/{o['metadata']['name']}" for o in body["items"]}
        return paths

    def remove_cluster_objects(self, kept: set[str]) -> int:
        """Deletes every object of ``SHARED_COLLECTIONS`` whose path is not in ``kept``; how many."""
        gone = sorted(self.cluster_objects() - kept)
        with ThreadPoolExecutor(max_workers=PARALLEL_DELETES) as pool:
            list(pool.map(self.delete, gone))
        return len(gone)

    def wait_for(self, check: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
        """Poll ``check`` until it returns something truthy; returns it."""
        deadline = time.monotonic() + timeout
        while True:
            result = check()
            if result:
                return result
            if time.monotonic() > deadline:
                raise ControlPlaneError(f"timed out after {timeout:.0f} s waiting for {what}")
            time.sleep(0.1)

    # -- what a kubelet-less cluster needs

    def unique(self, prefix: str) -> str:
        return f"{prefix}-{os.getpid()}-{next(self._names)}"

    def namespace(self, prefix: str = "t", *, admin_access: bool = False) -> str:
        """A new namespace (a unique name) whose default ServiceAccount exists; with ``admin_access`` it
        carries the label without which the server refuses admin-access claims (422)."""
        name = self.unique(prefix)
        labels = {ADMIN_ACCESS_LABEL: "true"} if admin_access else {}
        self.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
        self.wait_for(lambda: self.request("GET", f"/api/v1/namespaces/{name}/serviceaccounts/default")[0] == 200,
                      f"the default ServiceAccount of {name}")
        return name

    def ready_node(self, name: str | None = None, labels: Mapping[str, str] | None = None) -> str:
        """A Node the scheduler accepts: Ready with allocatable cpu/memory/pods, without the not-ready taint
        that a Node created by hand gets and no kubelet lifts."""
        name = name or self.unique("node")
        node = self.create({"apiVersion": "v1", "kind": "Node",
                            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}}})
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        resources = {"cpu": "64", "memory": "512Gi", "pods": "250"}
        self.patch_status(node, {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                                 "message": "test bed", "lastHeartbeatTime": now,
                                                 "lastTransitionTime": now}],
                                 "capacity": resources, "allocatable": resources})
        status, body = self.request("PATCH", f"/api/v1/nodes/{name}", {"spec": {"taints": None}},
                                    content_type="application/merge-patch+json")
        if status != 200:
            raise ControlPlaneError(f"untaint node {name}: {status} {_message(body)}")
        return name

    def pod(self, namespace: str, name: str, *, claims: Mapping[str, str] | None = None,
            templates: Mapping[str, str] | None = None, node_name: str | None = None,
            containers: Mapping[str, tuple[str, ...]] | None = None,
            extended: Mapping[str, str] | None = None) -> dict[str, Any]:
        """A pod that references claims by name (``claims``: pod claim name → ResourceClaim name) or through
        templates (``templates``: pod claim name → ResourceClaimTemplate name). ``containers`` maps each
        container to the pod claim names it uses (default: one container ``main`` using them all;
        ``claim/request`` for one request of a claim);
        ``extended`` asks for extended resources (``nvidia.com/gpu: "1"``)."""
        pod_claims = [{"name": k, "resourceClaimName": v} for k, v in (claims or {}).items()]
        pod_claims += [{"name": k, "resourceClaimTemplateName": v} for k, v in (templates or {}).items()]
        uses = containers or {"main": tuple(c["name"] for c in pod_claims)}
        spec: dict[str, Any] = {
            "containers": [{"name": c, "image": "registry.k8s.io/pause:3.10",
                            "resources": {"claims": [_container_claim(n) for n in used],
                                          **({"limits": dict(extended)} if extended else {})}}
                           for c, used in uses.items()],
            "resourceClaims": pod_claims, "terminationGracePeriodSeconds": 0}
        if node_name:
            spec["nodeSelector"] = {"kubernetes.io/hostname": node_name}
        return self.create({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace},
                            "spec": spec}, namespace)

    def wait_scheduled(self, namespace: str, name: str, timeout: float = 60.0) -> dict[str, Any]:
        """The pod once the scheduler has bound it (raises with its last condition when it does not)."""
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"
        try:
            return dict(self.wait_for(lambda: (p := self.get(path)) if self.get(path)["spec"].get("nodeName")
                                      else None, f"pod {namespace}/{name} bound", timeout))
        except ControlPlaneError as exc:
            conditions = self.get(path).get("status", {}).get("conditions", [])
            raise ControlPlaneError(f"{exc}; conditions: {conditions}") from None

    def unschedulable_message(self, namespace: str, name: str, timeout: float = 30.0) -> str:
        """The scheduler's PodScheduled=False message for a pod it cannot place."""
        path = f"/api/v1/namespaces/{namespace}/pods/{name}"

        def message() -> str | None:
            for cond in self.get(path).get("status", {}).get("conditions", []):
                if cond.get("type") == "PodScheduled" and cond.get("status") == "False":
                    return str(cond.get("message", ""))
            return None

        return str(self.wait_for(message, f"pod {namespace}/{name} unschedulable", timeout))

    def run_pod(self, namespace: str, name: str) -> dict[str, Any]:
        """Mark a bound pod Running with ready containers (no kubelet does)."""
        pod = self.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        return self.patch_status(pod, {
            "phase": "Running", "startTime": now,
            "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}],
            "containerStatuses": [{"name": c["name"], "image": c["image"], "imageID": "", "ready": True,
                                   "restartCount": 0, "started": True, "containerID": f"containerd://{i:064x}",
                                   "state": {"running": {"startedAt": now}}}
                                  for i, c in enumerate(pod["spec"]["containers"], 1)]})

    def service_account_token(self, namespace: str, name: str, seconds: int = 3600) -> str:
        """A bound token for a ServiceAccount (the TokenRequest API), as a pod would mount."""
        status, body = self.request("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/{name}/token",
                                    {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                                     "spec": {"expirationSeconds": seconds}})
        if status not in (200, 201):
            raise ControlPlaneError(f"token for {namespace}/{name}: {status} {_message(body)}")
        return str(body["status"]["token"])

    def token_kubeconfig(self, path: Path, token: str, user: str = "sa") -> Path:
        return write_kubeconfig(path, self.server, self.pki.ca, user, token=token)


# --- paths of objects -------------------------------------------------------------------------------------

_CLUSTER_SCOPED = {"Node", "Namespace", "ResourceSlice", "DeviceClass", "DeviceTaintRule", "ClusterRole",
                   "ClusterRoleBinding", "CustomResourceDefinition", "PersistentVolume", "PriorityClass"}
_PLURALS = {"ResourceSliceList": "", "DeviceClass": "deviceclasses", "ComputeDomainClique": "computedomaincliques",
            "ComputeDomain": "computedomains", "Endpoints": "endpoints"}


def plural(kind: str) -> str:
    if kind in _PLURALS:
        return _PLURALS[kind]
    lower = kind.lower()
    if lower.endswith("s"):
        return lower + "es"
    if lower.endswith("y"):
        return lower[:-1] + "ies"
    return lower + "s"


def collection_path(obj: Mapping[str, Any], namespace: str | None = None) -> str:
    api_version, kind = str(obj.get("apiVersion", "")), str(obj.get("kind", ""))
    prefix = f"/api/{api_version}" if "/" not in api_version else f"/apis/{api_version}"
    ns = namespace or obj.get("metadata", {}).get("namespace")
    if kind in _CLUSTER_SCOPED or not ns:
        return f"{prefix}/{plural(kind)}"
    return f"{prefix}/namespaces/{ns}/{plural(kind)}"


def object_path(obj: Mapping[str, Any]) -> str:
    return f"{collection_path(obj)}/{obj['metadata']['name']}"


def _container_claim(use: str) -> dict[str, str]:
    name, _, request = use.partition("/")
    return {"name": name, "request": request} if request else {"name": name}


def _message(body: Any) -> str:
    if isinstance(body, dict):
        return str(body.get("message", body))
    return str(body)


def _gates(names: tuple[str, ...]) -> str:
    return ",".join(f"{g}=true" for g in names)


def _insecure_get(url: str) -> bytes:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with urllib.request.urlopen(url, context=ctx, timeout=2) as resp:
        return bytes(resp.read())


def _post_json(url: str, body: Mapping[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as resp:
        return dict(json.loads(resp.read()))


@contextmanager
def control_plane(workdir: Path, assets: Path, **kw: Any) -> Iterator[ControlPlane]:
    plane = ControlPlane.start(workdir, assets, **kw)
    try:
        yield plane
    finally:
        plane.stop()
