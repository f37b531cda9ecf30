"""A simulated GPU node inside the real control plane: the simulator's NVML and kubelet on one
side, the real kube-apiserver, scheduler and controller-manager on the other.

``GpuNode.register`` makes a Node the scheduler accepts and publishes the ResourceSlices the
simulated NVIDIA driver would (names, UUIDs, MIG placements and shared counters from the
scenario), owned by that Node as a kubelet plugin's are. Claims and pods are then made in the real
server and allocated by the real scheduler; ``GpuNode.scenario`` writes the node's scenario once
they are, so the simulated kubelet reports the devices the scheduler chose, never a guess.

``DeviceClass`` names follow NVIDIA's driver (gpu.nvidia.com, mig.nvidia.com); they are created
once per control plane.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from deploy_tools import render_chart
from kubetestbed import ControlPlane

from dra_exporter_sim.k8s_objects import cluster_objects
from dra_exporter_sim.scenario_builder import parse_scenario

DRIVER = "gpu.nvidia.com"
GPU_CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"
RESOURCE = "resource.k8s.io/v1"


def device_class(name: str, kind: str, **spec: Any) -> dict[str, Any]:
    cel = f"device.driver == '{DRIVER}' && device.attributes['{DRIVER}'].type == '{kind}'"
    return {"apiVersion": RESOURCE, "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": cel}}], **spec}}


def ensure_device_classes(kube: ControlPlane) -> None:
    for obj in (device_class(GPU_CLASS, "gpu"), device_class(MIG_CLASS, "mig")):
        status, message = kube.try_create(obj)
        if status not in (201, 409):  # 409: an earlier test made it
            raise AssertionError(f"DeviceClass {obj['metadata']['name']}: {status} {message}")


def request(name: str, device_class: str = GPU_CLASS, count: int = 1, cel: str = "", **extra: Any) -> dict[str, Any]:
    mode = {"allocationMode": "ExactCount", "count": count} if extra.get("allocationMode", "ExactCount") == \
        "ExactCount" else {}
    exactly: dict[str, Any] = {"deviceClassName": device_class, **mode, **extra}
    if cel:
        exactly["selectors"] = [{"cel": {"expression": cel}}]
    return {"name": name, "exactly": exactly}


def claim(namespace: str, name: str, *requests: Mapping[str, Any], **devices: Any) -> dict[str, Any]:
    return {"apiVersion": RESOURCE, "kind": "ResourceClaim", "metadata": {"name": name, "namespace": namespace},
            "spec": {"devices": {"requests": list(requests), **devices}}}


def allocated(kube: ControlPlane, namespace: str, name: str) -> dict[str, Any]:
    path = f"/apis/{RESOURCE}/namespaces/{namespace}/resourceclaims/{name}"

    def check() -> dict[str, Any] | None:
        obj = kube.get(path)
        return obj if obj.get("status", {}).get("allocation") else None

    return dict(kube.wait_for(check, f"claim {namespace}/{name} allocated"))


def allocated_devices(claim_obj: Mapping[str, Any]) -> list[str]:
    return [r["device"] for r in claim_obj["status"]["allocation"]["devices"]["results"]]


@dataclass
class GpuNode:
    kube: ControlPlane
    name: str
    gpus: list[dict[str, Any]]
    seed: int
    dynamic_mig: bool
    uuids: dict[str, str]
    """Device name → the simulated NVML's UUID (whole GPUs; MIG devices where the slice names one)."""

    @classmethod
    def register(cls, kube: ControlPlane, gpus: Sequence[Mapping[str, Any]], *, seed: int = 1,
                 dynamic_mig: bool = False, prefix: str = "gpu-node") -> GpuNode:
        ensure_device_classes(kube)
        name = kube.ready_node(kube.unique(prefix))
        node_uid = kube.get(f"/api/v1/nodes/{name}")["metadata"]["uid"]
        doc = {"node": name, "seed": seed, "dynamic_mig": dynamic_mig, "gpus": [dict(g) for g in gpus]}
        objects = cluster_objects(parse_scenario(doc, "testbed"), 0.0)
        uuids: dict[str, str] = {}
        for sl in objects.resourceslices:
            # What a kubelet plugin writes: its Node as the owner (the real one, so the garbage
            # collector keeps the slice while the Node lives), no server-set fields.
            meta = {"name": sl["metadata"]["name"],
                    "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": node_uid,
                                         "controller": True}]}
            kube.create({**sl, "metadata": meta})
            for device in sl["spec"].get("devices", ()):
                attributes = device.get("attributes", {})
                if uuid := attributes.get("uuid", {}).get("string"):
                    uuids[device["name"]] = uuid
                if parent := attributes.get("parentUUID", {}).get("string"):  # a GPU in MIG mode is no device
                    uuids.setdefault(device["name"].partition("-mig-")[0], parent)
        return cls(kube, name, [dict(g) for g in gpus], seed, dynamic_mig, uuids)

    def uuid_cel(self, device: str) -> str:
        return f"device.attributes['{DRIVER}'].uuid == '{self.uuids[device]}'"

    def parent_cel(self, gpu: str, profile: str) -> str:
        return (f"device.attributes['{DRIVER}'].parentUUID == '{self.uuids[gpu]}' && "
                f"device.attributes['{DRIVER}'].profile == '{profile}'")

    def scenario(self, path: Path, claims: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]],
                 **extra: Any) -> Path:
        """Write this node's scenario, its kubelet reporting ``claims`` (the real claim objects, once
        allocated) to the containers of ``pods`` (the real pod objects) as the scheduler chose.
        The MIG devices the scheduler picked exist in the simulated NVML."""
        gpus = {g["index"]: {**g, "mig": list(g.get("mig", ()))} for g in self.gpus}
        entries = []
        for c in claims:
            devices = allocated_devices(c)
            for device in devices:
                if "-mig-" in device:  # gpu-<i>-mig-<profile>-<profile id>-<placement start>
                    gpu, rest = device.split("-mig-")
                    *_, start = rest.split("-")
                    profile = _profile_of(rest)
                    mig = gpus[int(gpu.removeprefix("gpu-"))]["mig"]
                    if not any(m.get("placement_start") == int(start) and m["profile"] == profile for m in mig):
                        mig.append({"profile": profile, "placement_start": int(start)})
            results = c["status"]["allocation"]["devices"]["results"]
            entry = {"namespace": c["metadata"]["namespace"], "name": c["metadata"]["name"],
                     "devices": devices, "admin_access": any(r.get("adminAccess") for r in results)}
            if results and results[0]["driver"] != DRIVER:  # another driver's slice, in the scenario's slices
                entry.update(driver=results[0]["driver"], pool=results[0]["pool"])
            entries.append(entry)
        used = {(c["metadata"]["namespace"], c["metadata"]["name"]) for c in claims}
        pod_entries = []
        for p in pods:
            ns = p["metadata"]["namespace"]
            names = _pod_claim_names(p)
            containers = []
            for ctr in p["spec"]["containers"]:
                refs = [names[r["name"]] for r in ctr.get("resources", {}).get("claims", ()) if r["name"] in names]
                extended = p.get("status", {}).get("extendedResourceClaimStatus", {})
                if any(m.get("containerName") == ctr["name"] for m in extended.get("requestMappings", ())):
                    refs.append(extended["resourceClaimName"])
                containers.append({"name": ctr["name"], "claims": [r for r in refs if (ns, r) in used]})
            pod_entries.append({"namespace": ns, "name": p["metadata"]["name"], "containers": containers})
        doc = {"node": self.name, "seed": self.seed, "dynamic_mig": self.dynamic_mig,
               "gpus": [gpus[i] for i in sorted(gpus)], "claims": entries, "pods": pod_entries, **extra}
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        return path


def _profile_of(rest: str) -> str:
    """``3g71gb-9-0`` → ``3g.71gb``; ``1g18gb-me-20-0`` → ``1g.18gb+me``."""
    parts = rest.split("-")
    base = parts[0]
    cut = base.index("g") + 1
    profile = f"{base[:cut]}.{base[cut:]}"
    return profile + "+me" if len(parts) > 3 and parts[1] == "me" else profile


def _pod_claim_names(pod: Mapping[str, Any]) -> dict[str, str]:
    """Pod claim name → ResourceClaim name: named ones from the spec, generated ones from the status."""
    names = {c["name"]: c["resourceClaimName"] for c in pod["spec"].get("resourceClaims", ())
             if c.get("resourceClaimName")}
    names.update({s["name"]: s["resourceClaimName"] for s in pod.get("status", {}).get("resourceClaimStatuses", ())
                  if s.get("resourceClaimName")})
    return names


# --- NVIDIA's ComputeDomain CRDs (tests/fixtures/crds) -------------------------------------------------

CRDS = Path(__file__).resolve().parent / "fixtures" / "crds" / "resource.nvidia.com.yaml"
CD_DISCOVERY = "/apis/resource.nvidia.com/v1beta1"


def install_compute_domain_crds(kube: ControlPlane) -> None:
    """Create both CRDs (present already: fine) and wait until the server serves them."""
    for crd in yaml.safe_load_all(CRDS.read_text()):
        status, message = kube.try_create(crd)
        assert status in (201, 409), f"{crd['metadata']['name']}: {status} {message}"

    def served() -> bool:
        status, body = kube.request("GET", CD_DISCOVERY)
        names = {r.get("name") for r in body.get("resources", ())} if status == 200 else set()
        return {"computedomains", "computedomaincliques"} <= names

    kube.wait_for(served, "resource.nvidia.com/v1beta1 served")


def remove_compute_domain_crds(kube: ControlPlane) -> None:
    """Delete both CRDs (and so every ComputeDomain) and wait until the group is no longer served."""
    for crd in yaml.safe_load_all(CRDS.read_text()):
        kube.delete(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{crd['metadata']['name']}")
    kube.wait_for(lambda: kube.request("GET", CD_DISCOVERY)[0] == 404, "resource.nvidia.com/v1beta1 gone")


# --- the chart's ServiceAccounts and ClusterRoles ------------------------------------------------------

@dataclass(frozen=True)
class Identity:
    """A ServiceAccount of the chart, bound to its ClusterRole in the real server, and its token."""

    namespace: str
    account: str
    rules: tuple[dict[str, Any], ...]
    kubeconfig: Path
    token: str

    @property
    def user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.account}"


@contextmanager
def chart_identities(kube: ControlPlane, folder: Path) -> Iterator[dict[str, Identity]]:
    """The chart (cluster mode on) rendered into a namespace of its own and applied: ServiceAccounts,
    ClusterRoles, ClusterRoleBindings; ``{"node": …, "cluster": …}`` with a token kubeconfig each.
    The cluster-scoped objects are deleted afterwards."""
    namespace = kube.namespace("monitoring")
    objects = [o for o in render_chart({"cluster": {"enabled": True}}, namespace=namespace)
               if o["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")]
    for obj in objects:
        kube.create(obj)
    try:
        roles = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ClusterRole"}
        identities = {}
        for binding in (o for o in objects if o["kind"] == "ClusterRoleBinding"):
            (subject,) = binding["subjects"]
            role = roles[binding["roleRef"]["name"]]
            mode = "cluster" if role["metadata"]["labels"].get("app.kubernetes.io/component") == "cluster" else "node"
            token = kube.service_account_token(subject["namespace"], subject["name"])
            identities[mode] = Identity(subject["namespace"], subject["name"], tuple(role["rules"]),
                                        kube.token_kubeconfig(folder / f"{mode}.kubeconfig", token, mode), token)
        assert set(identities) == {"node", "cluster"}
        yield identities
    finally:
        for obj in objects:
            if obj["kind"] != "ServiceAccount":
                kube.delete(f"/apis/rbac.authorization.k8s.io/v1/{obj['kind'].lower()}s/{obj['metadata']['name']}")
