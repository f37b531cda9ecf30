"""Scale benchmark of the cluster mode: a generated cluster served by the simulated API server.

``python3 -m benchmarks.bench_cluster [--nodes 5000]``: per node 8 GPUs (NVIDIA slices as the driver
publishes them), a quarter of all GPUs MIG-split into 7 x 1g devices; 12 claims per node (60,000 at
5,000 nodes), 1,000 of them pending (scaled with the node count), the rest allocated and reserved;
per claim the pod that uses it or waits for it (Running or Pending; GPU pods carry a nodeSelector and
tolerate the GPU taint, as GPU workloads do), and per node pods the cluster mode does not keep: 3 of
daemon sets (no claims) and 2 of finished jobs (Succeeded; the list leaves them out). Per node a Node
as a GPU node carries it: ~40 labels (node feature discovery's and GPU feature discovery's, most
shared by every node), the GPU taint, status (capacity, conditions, images); one node in 100 cordoned.
The simulated API server runs in a child process (its memory is not the exporter's); this process
is the exporter: the real cluster source (paged lists, then watches) and the capacity core.

Before and after in one run (``--compare``, the default): the cluster mode without Nodes (the
simulated server refuses them with 403, as an older ClusterRole does: node filters unknown) and with
them, each in its own process so that neither's memory is the other's.

Measured: RSS after the first frame (and its growth over the lists), time to first frame (lists
included, so it includes the simulated server's work), CPU of one cycle when nothing changed (the
source hands out the same state) and when the state changed (a new state object, slices unchanged:
every family is recomputed but CEL results are reused), and of that the claim states (claims against
pods), series count, API requests by kind; with Nodes, the node filters for every distinct pod filter
over every node (``node_filters_s``: what trying each waiting pod only on the nodes it may go to costs),
and the same for as many distinct filters as there are pending claims, each pod pinned to a node of its
own (``node_filters_pinned_s``).
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
import resource
import subprocess
import sys
import time
from dataclasses import replace
from typing import Any

GPUS_PER_NODE = 8
CLAIMS_PER_NODE = 12
DAEMON_PODS_PER_NODE = 3
FINISHED_PODS_PER_NODE = 2
GROUP = "resource.k8s.io"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
CORDONED_EVERY = 100


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def generate(nodes: int) -> list[dict[str, Any]]:
    """The cluster's objects (see the module docstring)."""
    from dra_exporter_sim.cluster import DEVICE_CLASSES

    objects: list[dict[str, Any]] = [dict(c) for c in DEVICE_CLASSES]
    common = {"productName": {"string": "NVIDIA H100 80GB HBM3"}, "brand": {"string": "Nvidia"},
              "architecture": {"string": "Hopper"}, "driverVersion": {"version": "580.82.7"},
              "cudaComputeCapability": {"version": "9.0.0"}}
    pending_total = max(1, nodes // 5)  # 1,000 at 5,000 nodes
    gpu_index = 0
    for n in range(nodes):
        node = f"gpu-node-{n:05d}"
        objects.append(_node(node, n))
        devices, allocatable = [], []
        for g in range(GPUS_PER_NODE):
            mig = gpu_index % 4 == 0  # a quarter of the GPUs
            gpu_index += 1
            parent = f"GPU-{n:05d}-{g}-0000-0000-000000000000"
            if mig:
                for m in range(7):
                    devices.append({"name": f"gpu-{g}-mig-1g10gb-19-{m}", "attributes": {
                        "type": {"string": "mig"}, "uuid": {"string": f"MIG-{n:05d}-{g}-{m}"},
                        "parentUUID": {"string": parent}, "profile": {"string": "1g.10gb"}, **common},
                        "capacity": {"memory": {"value": "10Gi"}, "multiprocessors": {"value": "16"}}})
                    allocatable.append(devices[-1]["name"])
            else:
                devices.append({"name": f"gpu-{g}", "attributes": {
                    "type": {"string": "gpu"}, "uuid": {"string": parent}, **common},
                    "capacity": {"memory": {"value": "80Gi"}}})
                allocatable.append(devices[-1]["name"])
        objects.append({"apiVersion": f"{GROUP}/v1", "kind": "ResourceSlice",
                        "metadata": {"name": f"{node}-gpu.nvidia.com-0", "uid": f"slice-{n}"},
                        "spec": {"driver": "gpu.nvidia.com", "nodeName": node,
                                 "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                                 "devices": devices}})
        for c in range(CLAIMS_PER_NODE):
            index = n * CLAIMS_PER_NODE + c
            pending = index % (nodes * CLAIMS_PER_NODE // pending_total) == 0
            device = allocatable[c % len(allocatable)]
            cls = "mig.nvidia.com" if "mig" in device else "gpu.nvidia.com"
            claim: dict[str, Any] = {
                "apiVersion": f"{GROUP}/v1", "kind": "ResourceClaim",
                "metadata": {"namespace": f"team-{n % 50}", "name": f"job-{index}", "uid": f"claim-{index}",
                             "creationTimestamp": "2027-01-15T08:00:00Z"},
                "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": cls}}]}},
                "status": {}}
            if not pending:
                claim["status"] = {
                    "allocation": {"devices": {"results": [{"request": "gpu", "driver": "gpu.nvidia.com",
                                                            "pool": node, "device": device}]}},
                    "reservedFor": [{"resource": "pods", "name": f"job-{index}-0", "uid": f"pod-{index}"}]}
            objects.append(claim)
            objects.append(_pod(claim["metadata"]["namespace"], f"job-{index}-0", node, f"pod-{index}",
                                "Pending" if pending else "Running", claim=f"job-{index}", gpu_pod=True))
        for d in range(DAEMON_PODS_PER_NODE):
            objects.append(_pod("kube-system", f"daemon-{d}-{node}", node, f"daemon-{d}-{n}", "Running"))
        for f in range(FINISHED_PODS_PER_NODE):
            objects.append(_pod(f"team-{n % 50}", f"done-{f}-{node}", node, f"done-{f}-{n}", "Succeeded",
                                claim=f"done-{f}-{node}"))
    return objects


def _node(name: str, n: int) -> dict[str, Any]:
    """A GPU Node as the API server has it: NFD's and GFD's labels, the GPU taint, a status."""
    zone = f"zone-{n % 3}"
    labels = {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
              "beta.kubernetes.io/os": "linux", "beta.kubernetes.io/arch": "amd64",
              "node.kubernetes.io/instance-type": "p5.48xlarge", "topology.kubernetes.io/region": "eu-west-1",
              "topology.kubernetes.io/zone": zone, "failure-domain.beta.kubernetes.io/zone": zone,
              "nvidia.com/gpu.present": "true", "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
              "nvidia.com/gpu.count": str(GPUS_PER_NODE), "nvidia.com/gpu.memory": "81559",
              "nvidia.com/gpu.family": "hopper", "nvidia.com/gpu.compute.major": "9",
              "nvidia.com/gpu.compute.minor": "0", "nvidia.com/cuda.driver.major": "580",
              "nvidia.com/cuda.driver.minor": "82", "nvidia.com/cuda.driver.rev": "07",
              "nvidia.com/cuda.runtime.major": "13", "nvidia.com/cuda.runtime.minor": "0",
              "nvidia.com/mig.capable": "true", "nvidia.com/mig.strategy": "mixed",
              "nvidia.com/gpu.deploy.dra-driver": "true", "rack": f"rack-{n // 40:04d}",
              **{f"feature.node.kubernetes.io/cpu-cpuid.{f}": "true" for f in (
                  "AVX", "AVX2", "AVX512F", "AVX512BW", "AVX512VL", "AMXBF16", "AMXINT8", "FMA3", "SHA", "VAES")},
              "feature.node.kubernetes.io/kernel-version.full": "6.8.0-1015-aws",
              "feature.node.kubernetes.io/pci-10de.present": "true",
              "feature.node.kubernetes.io/system-os_release.ID": "ubuntu",
              "feature.node.kubernetes.io/system-os_release.VERSION_ID": "24.04"}
    resources = {"cpu": "192", "memory": "2097152Mi", "pods": "250", "ephemeral-storage": "3Ti"}
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "uid": f"node-{n}", "creationTimestamp": "2027-01-15T07:00:00Z",
                         "labels": labels, "annotations": {
                             "node.alpha.kubernetes.io/ttl": "0",
                             "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                             "nfd.node.kubernetes.io/feature-labels": ",".join(sorted(labels))[:2000]}},
            "spec": {"providerID": f"aws:///eu-west-1a/i-{n:017x}", "taints": [GPU_TAINT],
                     **({"unschedulable": True} if n % CORDONED_EVERY == CORDONED_EVERY - 1 else {})},
            "status": {"capacity": resources, "allocatable": resources,
                       "conditions": [{"type": t, "status": "False" if t != "Ready" else "True",
                                       "lastHeartbeatTime": "2027-01-15T08:00:00Z",
                                       "lastTransitionTime": "2027-01-15T07:00:00Z", "reason": f"Kubelet{t}",
                                       "message": f"kubelet reports {t}"}
                                      for t in ("MemoryPressure", "DiskPressure", "PIDPressure", "Ready")],
                       "addresses": [{"type": "InternalIP", "address": f"10.{n // 65536}.{n // 256 % 256}.{n % 256}"},
                                     {"type": "Hostname", "address": name}],
                       "nodeInfo": {"kubeletVersion": "v1.36.2", "containerRuntimeVersion": "containerd://2.1.4",
                                    "kernelVersion": "6.8.0-1015-aws", "osImage": "Ubuntu 24.04.2 LTS",
                                    "architecture": "amd64", "operatingSystem": "linux"},
                       "images": [{"names": [f"registry.example.com/image-{i}@sha256:{i:064x}",
                                             f"registry.example.com/image-{i}:1.0"], "sizeBytes": 10**9}
                                  for i in range(10)]}}


def _pod(namespace: str, name: str, node: str, uid: str, phase: str, claim: str = "",
         gpu_pod: bool = False) -> dict[str, Any]:
    """A pod as the API server has it: spec and status carry what a real one does around what is read."""
    container: dict[str, Any] = {"name": "main", "image": "registry.example.com/train:1.0",
                                 "resources": {"claims": [{"name": "gpu"}]} if claim else {}}
    spec: dict[str, Any] = {"containers": [container], "restartPolicy": "Never", "schedulerName": "default-scheduler",
                            "serviceAccountName": "default", "terminationGracePeriodSeconds": 30}
    if claim:
        spec["resourceClaims"] = [{"name": "gpu", "resourceClaimName": claim}]
    if gpu_pod:  # as GPU workloads are written: GPU nodes only, the GPU taint tolerated
        spec["nodeSelector"] = {"nvidia.com/gpu.present": "true"}
        spec["tolerations"] = [GPU_TOLERATION, {"key": "node.kubernetes.io/not-ready", "operator": "Exists",
                                                "effect": "NoExecute", "tolerationSeconds": 300}]
    status: dict[str, Any] = {"phase": phase, "qosClass": "BestEffort"}
    if phase != "Pending":
        spec["nodeName"] = node
        status.update({"hostIP": "10.0.0.1", "podIP": "10.1.0.1", "startTime": "2027-01-15T08:00:05Z",
                       "conditions": [{"type": t, "status": "True", "lastTransitionTime": "2027-01-15T08:00:05Z"}
                                      for t in ("PodScheduled", "Initialized", "ContainersReady", "Ready")]})
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"namespace": namespace, "name": name, "uid": uid, "creationTimestamp": "2027-01-15T08:00:00Z",
                         "labels": {"app": name.rsplit("-", 1)[0]}},
            "spec": spec, "status": status}


def _serve(nodes: int, ready: Any, stop: Any, read_nodes: bool = True) -> None:
    from dra_exporter_sim.apiserver import SimulatedApiServer
    from dra_exporter_sim.clock import SimClock
    from dra_exporter_sim.cluster import cluster_scenario

    scenario = cluster_scenario(tuple(generate(nodes)), f"bench-{nodes}")
    with SimulatedApiServer(scenario, SimClock(0.0, frozen=True), taint_rule_versions=("v1",),
                            forbidden=() if read_nodes else ("nodes",)) as server:
        ready.send(server.kubeconfig_path)
        stop.wait()


def run(nodes: int, cycles: int = 5, read_nodes: bool = True) -> dict[str, Any]:
    from dra_exporter import catalog as cat
    from dra_exporter.cluster import claims
    from dra_exporter.cluster.capacity import Capacity
    from dra_exporter.cluster.cel_worker import CelWorker
    from dra_exporter.sources.kubeapi_cluster import ClusterSource

    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    stop = ctx.Event()
    server = ctx.Process(target=_serve, args=(nodes, child, stop, read_nodes), daemon=True)
    server.start()
    try:
        kubeconfig = parent.recv()
        gc.collect()
        rss_before = _rss_mib()
        source = ClusterSource(kubeconfig=kubeconfig)
        capacity = Capacity(CelWorker())  # as the cluster mode runs CEL: in its worker process
        started, cpu0 = time.perf_counter(), time.process_time()
        state = source.collect()
        frame = capacity.frame(state, time.time())
        first_frame_s, first_cpu_s = time.perf_counter() - started, time.process_time() - cpu0
        gc.collect()
        rss = _rss_mib()
        series = sum(len(f.samples) for f in frame.families)

        def cpu_of(step: Any) -> float:
            best = float("inf")
            for _ in range(cycles):
                t = time.process_time()
                step()
                best = min(best, time.process_time() - t)
            return best

        unchanged = cpu_of(lambda: capacity.frame(source.collect(), time.time()))
        changed = cpu_of(lambda: capacity.frame(replace(state), time.time()))

        def claim_states() -> None:
            statuses = claims.claim_statuses(state.claims, state.pods)
            claims.claim_families(lambda *_: None, statuses, {})

        claim_states_cpu = cpu_of(claim_states)  # the part of a changed frame that the pods add to
        from dra_exporter.cluster.explain import explain

        started = time.perf_counter()
        explained = explain(state, (), CelWorker())  # `explain --all`: every unallocated claim
        explain_all_s = time.perf_counter() - started
        node_filters_s = node_filters_pinned_s = None
        admitted: dict[Any, int] = {}
        pending_count = sum(1 for c in state.claims if not c.allocated)
        if state.nodes is not None:
            from dra_exporter.cluster.nodes import NodeFilters

            started = time.perf_counter()
            filters = NodeFilters(state.nodes)
            admitted = {p.node_filters: len(filters.admission(p.node_filters).nodes) for p in state.pods}
            node_filters_s = round(time.perf_counter() - started, 3)
            # The worst shape: every pending pod pinned to a node of its own (distinct filters each).
            from dra_exporter.model import PodNodeFilters

            gpu = state.pods[0].node_filters.tolerations
            pinned = [PodNodeFilters((("kubernetes.io/hostname", n.name),), None, gpu)
                      for n in state.nodes[:pending_count]]
            started = time.perf_counter()
            for f in pinned:
                filters.admission(f)
            node_filters_pinned_s = round(time.perf_counter() - started, 3)
        time.sleep(1.0)  # let the watches start
        requests = dict(source.requests)
        source.close()
        return {
            "nodes": nodes, "nodes_read": state.nodes is not None, "gpus": nodes * GPUS_PER_NODE,
            "devices": sum(len(s.devices) for s in state.slices), "claims": len(state.claims),
            "pending": sum(s.value for s in frame.family(cat.CLUSTER_CLAIMS.name).samples
                           if dict(s.labels)["state"] == "pending"),
            "pods_kept": len(state.pods),
            "rss_mib": round(rss, 1), "rss_growth_mib": round(rss - rss_before, 1),
            "rss_mib_per_node": round((rss - rss_before) / nodes, 4),
            "first_frame_s": round(first_frame_s, 2), "first_frame_cpu_s": round(first_cpu_s, 2),
            "cycle_cpu_unchanged_s": round(unchanged, 4), "cycle_cpu_changed_s": round(changed, 3),
            "claim_states_cpu_s": round(claim_states_cpu, 3),
            "explain_all_s": round(explain_all_s, 2), "explained_claims": len(explained),
            "placeable_explained": sum(o.placeable for o in explained),
            "node_filters_s": node_filters_s, "pod_filters": len(admitted),
            "node_filters_pinned_s": node_filters_pinned_s, "pinned_pods": pending_count,
            "nodes_admitting": sorted(set(admitted.values())),
            "series": series, "api_requests": requests,
        }
    finally:
        stop.set()
        server.join(30)
        if server.is_alive():
            server.kill()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--cycles", type=int, default=5)
    parser.add_argument("--compare", action=argparse.BooleanOptionalAction, default=True,
                        help="first without Nodes (403), then with them, each in its own process")
    parser.add_argument("--read-nodes", action=argparse.BooleanOptionalAction, default=True,
                        help="without --compare: whether the server lets the cluster mode read Nodes")
    args = parser.parse_args(argv)
    if not args.compare:
        print(json.dumps(run(args.nodes, args.cycles, args.read_nodes), indent=2))
        return 0
    results = {}
    for label, flag in (("without_nodes", "--no-read-nodes"), ("with_nodes", "--read-nodes")):
        # A fresh process each: its RSS is this variant's alone.
        done = subprocess.run([sys.executable, "-m", "benchmarks.bench_cluster", "--nodes", str(args.nodes),
                               "--cycles", str(args.cycles), "--no-compare", flag],
                              capture_output=True, text=True, check=True)
        results[label] = json.loads(done.stdout)
    before, after = results["without_nodes"], results["with_nodes"]
    results["with_over_without"] = {
        key: round(after[key] / before[key], 3) for key in (
            "rss_mib", "first_frame_cpu_s", "cycle_cpu_unchanged_s", "cycle_cpu_changed_s", "explain_all_s")
        if before.get(key)}
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    sys.exit(main())
