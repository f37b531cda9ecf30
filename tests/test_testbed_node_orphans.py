"""What the real node holds that no claim accounts for, provoked on the node test bed (a real kubelet
v1.36 with NVIDIA's real gpu-kubelet-plugin on the mock NVML, ``tests/nodetestbed.py``):

* the plugin stopped, then the pods deleted: the kubelet cannot unprepare, the claim from a template is
  deleted and the named claim deallocated, and NVIDIA's CDI specs stay under the CDI root: each device is
  an orphan (``claim_deleted``, ``claim_deallocated``) until the plugin is back and the kubelet unprepares;
* a CDI spec left for a claim that never existed here;
* a process on a GPU no claim holds (the mock NVML's processes come from its runtime overrides).

MIG orphans cannot be provoked here: the mock NVML has no MIG devices (``nvml/`` of the test beds'
README); ``tests/test_orphans.py`` and the simulator's demo (a MIG device made by hand) cover them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from nodetestbed import Exporter, NodeBed

from dra_exporter import catalog as cat

pytestmark = pytest.mark.slow  # each test waits on the real kubelet and plugin: 10-60 s

PREPARED = cat.ORPHAN_PREPARED_DEVICE.name
PROCESS = cat.ORPHAN_GPU_PROCESS.name
PLUGIN = "gpu-kubelet-plugin"


def workload(ns: str) -> list[dict[str, Any]]:
    """A pod whose claim comes from a template (the controller deletes the claim with the pod) and a
    pod of a named claim (the claim stays, deallocated once its pod is gone)."""
    container = {"name": "main", "image": "cuda:12", "command": ["sleep", "infinity"],
                 "resources": {"claims": [{"name": "gpu"}]}}
    request = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}
    return [
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
         "metadata": {"name": "one-gpu", "namespace": ns}, "spec": {"spec": request}},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "from-template", "namespace": ns},
         "spec": {"automountServiceAccountToken": False, "containers": [container],
                  "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}]}},
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "named", "namespace": ns},
         "spec": request},
        {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "of-named", "namespace": ns},
         "spec": {"automountServiceAccountToken": False, "containers": [container],
                  "resourceClaims": [{"name": "gpu", "resourceClaimName": "named"}]}},
    ]


class StoppedPlugin:
    """NVIDIA's kubelet plugin stopped, to be started again exactly as node.sh started it."""

    def __init__(self, bed: NodeBed) -> None:
        self.bed = bed
        pid = bed.pid(PLUGIN)
        self.argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]
        self.env = dict(e.split(b"=", 1) for e in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0") if b"=" in e)
        os.kill(pid, signal.SIGTERM)
        bed.wait_for(lambda: not Path(f"/proc/{pid}").exists(), "the plugin to stop", timeout=20)

    def start(self) -> None:
        log = self.bed.workdir / "logs" / f"{PLUGIN}.log"
        with open(log, "ab") as out:
            proc = subprocess.Popen(self.argv, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, cwd=str(self.bed.workdir / "cwd"), start_new_session=True)
        (self.bed.workdir / "run" / f"{PLUGIN}.pid").write_text(f"{proc.pid}\n")  # node.sh stop ends it


@pytest.fixture
def exporter(node_bed: NodeBed) -> Iterator[Exporter]:
    with node_bed.exporter("--cdi-root", str(node_bed.cdi_root), "--claim-refresh", "10") as running:
        yield running


def orphans(exporter: Exporter, family: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {tuple(sorted(labels.items())): value for _, labels, value in exporter.series(family)}


def spec_files(bed: NodeBed, uid: str) -> list[Path]:
    return [p for p in bed.cdi_root.iterdir() if uid in p.name]


def test_devices_prepared_for_deleted_and_deallocated_claims_are_orphans_until_the_kubelet_unprepares(
        node_bed: NodeBed, exporter: Exporter) -> None:
    bed = node_bed
    ns = bed.namespace("orphans")
    bed.apply(workload(ns))
    for pod in ("from-template", "of-named"):
        bed.wait_running(ns, pod)
    claims = bed.claims(ns)
    (generated,) = [c for name, c in claims.items() if name != "named"]
    named = claims["named"]
    uuid_of = bed.uuid_of()
    expected = {}
    for claim, reason in ((generated, "claim_deleted"), (named, "claim_deallocated")):
        uid = claim["metadata"]["uid"]
        (result,) = claim["status"]["allocation"]["devices"]["results"]
        assert spec_files(bed, uid), f"NVIDIA's plugin wrote no CDI spec for claim {uid}"
        expected[uid] = {"driver": "gpu.nvidia.com", "device": result["device"], "claim_uid": uid, "reason": reason,
                         "uuid": uuid_of[("gpu.nvidia.com", result["pool"], result["device"])]}
    # Prepared for claims in use: accounted for.
    bed.wait_for(lambda: exporter.series(cat.GPU_UP.name), "the first frame")
    time.sleep(1.0)
    assert orphans(exporter, PREPARED) == {}

    plugin = StoppedPlugin(bed)
    try:
        bed.delete([{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": p, "namespace": ns}}
                    for p in ("from-template", "of-named")])
        gone_at = time.monotonic()
        bed.wait_for(lambda: set(bed.claims(ns)) == {"named"}
                     and not bed.claims(ns)["named"].get("status", {}).get("allocation"),
                     "the template's claim deleted and the named claim deallocated", timeout=30)
        assert all(spec_files(bed, uid) for uid in expected), "the kubelet could not unprepare: the specs stay"

        def found() -> dict[str, dict[str, str]] | None:
            now = {dict(k)["claim_uid"]: dict(k) for k in orphans(exporter, PREPARED)}
            return now if now.keys() == expected.keys() else None

        seen = bed.wait_for(found, "both prepared devices reported as orphans", timeout=30)
        print(f"orphans reported {time.monotonic() - gone_at:.1f} s after the pods' deletion")
        assert seen == expected
        first = orphans(exporter, PREPARED)
        assert all(abs(time.time() - since) < 40 for since in first.values())
        time.sleep(1.0)
        assert orphans(exporter, PREPARED) == first, "the first-seen time stays"
    finally:
        plugin.start()
    back_at = time.monotonic()
    # The plugin registers again, the kubelet's pod workers unprepare the claims, the plugin removes the specs.
    bed.wait_for(lambda: not any(spec_files(bed, uid) for uid in expected), "the specs removed", timeout=90)
    bed.wait_for(lambda: not orphans(exporter, PREPARED), "the orphans gone", timeout=10)
    print(f"specs and orphans gone {time.monotonic() - back_at:.1f} s after the plugin's restart")
    bed.delete([{"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                 "metadata": {"name": "named", "namespace": ns}}])


def test_a_cdi_spec_left_for_a_claim_that_never_existed_is_an_orphan_until_removed(
        node_bed: NodeBed, exporter: Exporter) -> None:
    uid = "0b1e5c2a-7d4f-4e8a-9c61-3f2a8d9e7b10"
    # The shape NVIDIA's plugin writes (tests/fixtures/cdi/), for gpu-1.
    template = next((Path(__file__).parent / "fixtures" / "cdi").glob("*.yaml"))
    spec = yaml.safe_load(template.read_text())
    spec["devices"] = [{**spec["devices"][0], "name": f"{uid}-gpu-1"}]
    path = node_bed.cdi_root / f"k8s.gpu.nvidia.com-claim_{uid}.yaml"
    path.write_text(yaml.safe_dump(spec))
    try:
        seen = node_bed.wait_for(lambda: orphans(exporter, PREPARED), "the leftover spec reported", timeout=45)
        gpu_1 = node_bed.uuid_of()[("gpu.nvidia.com", node_bed.node_name, "gpu-1")]
        assert [dict(k) for k in seen] == [{"claim_uid": uid, "device": "gpu-1", "driver": "gpu.nvidia.com",
                                            "reason": "claim_deleted", "uuid": gpu_1}]
    finally:
        path.unlink()
    node_bed.wait_for(lambda: not orphans(exporter, PREPARED), "the orphan gone with its spec", timeout=10)


def test_a_process_on_a_gpu_no_claim_holds_is_an_orphan_one_on_a_claimed_gpu_is_not(
        node_bed: NodeBed, exporter: Exporter) -> None:
    bed = node_bed
    ns = bed.namespace("stray")
    claim, pod = workload(ns)[2:]
    bed.apply([claim, pod])
    bed.wait_running(ns, "of-named")
    (result,) = bed.claims(ns)["named"]["status"]["allocation"]["devices"]["results"]
    uuid_of = bed.uuid_of()
    claimed = uuid_of[("gpu.nvidia.com", result["pool"], result["device"])]
    idle_device = next(d for (_, _, d) in sorted(uuid_of) if d != result["device"])
    idle = uuid_of[("gpu.nvidia.com", bed.node_name, idle_device)]
    index = {d["uuid"]: d["index"] for d in yaml.safe_load(bed.nvml_config.read_text())["devices"]}
    process = {"pid": 4242, "type": "C", "name": "python", "used_memory_mib": 1024, "sm_util": 30, "mem_util": 10}
    overrides = bed.nvml_config.parent / "overrides.yaml"
    overrides.write_text(yaml.safe_dump({"version": 1, "devices": {
        str(index[claimed]): {"processes": [process]}, str(index[idle]): {"processes": [{**process, "pid": 4343}]}}}))
    try:
        seen = bed.wait_for(lambda: orphans(exporter, PROCESS), "the stray process reported", timeout=30)
        assert [dict(k) for k in seen] == [{"gpu": str(index[idle]), "pid": "4343", "uuid": idle}]
    finally:
        overrides.unlink()
        bed.delete([pod])
        bed.delete([claim])
    bed.wait_for(lambda: not orphans(exporter, PROCESS), "the orphan gone with the process", timeout=15)
