"""PID → pod UID and container ID through /proc/<pid>/cgroup, for every shape the kubelet makes."""

from __future__ import annotations

from pathlib import Path

import pytest

from dra_exporter.model import ProcessOwner, bare_container_id
from dra_exporter.sources import SourceError
from dra_exporter.sources.procs import CgroupOwner, ProcsSource, parse_cgroup

UID = "3f1c2a7e-5b9d-4c1a-9e2f-7a6b8c0d1e22"
SYSTEMD_UID = UID.replace("-", "_")
CID = "a" * 40 + "0123456789abcdef01234567"
WANT = CgroupOwner(UID, CID)

# Real path formats, one per (cgroup version, kubelet cgroup driver, runtime, QoS class).
CASES = {
    "v2 systemd containerd burstable":
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYSTEMD_UID}.slice/"
        f"cri-containerd-{CID}.scope\n",
    "v2 systemd containerd guaranteed":
        f"0::/kubepods.slice/kubepods-pod{SYSTEMD_UID}.slice/cri-containerd-{CID}.scope\n",
    "v2 systemd cri-o besteffort":
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SYSTEMD_UID}.slice/"
        f"crio-{CID}.scope\n",
    "v2 systemd docker (cri-dockerd)":
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYSTEMD_UID}.slice/docker-{CID}.scope\n",
    "v2 cgroupfs containerd":
        f"0::/kubepods/burstable/pod{UID}/{CID}\n",
    "v2 cgroupfs guaranteed":
        f"0::/kubepods/pod{UID}/{CID}\n",
    "v2 kubelet in a container (kind)":
        f"0::/system.slice/containerd.service/kubepods-burstable-pod{SYSTEMD_UID}.slice/cri-containerd-{CID}.scope\n",
    "v1 cgroupfs docker":
        f"12:pids:/kubepods/burstable/pod{UID}/{CID}\n11:memory:/kubepods/burstable/pod{UID}/{CID}\n"
        f"1:name=systemd:/kubepods/burstable/pod{UID}/{CID}\n0::/\n",
    "v1 systemd containerd":
        f"12:memory:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYSTEMD_UID}.slice/"
        f"cri-containerd-{CID}.scope\n11:cpu,cpuacct:/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{SYSTEMD_UID}.slice/cri-containerd-{CID}.scope\n",
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_parse_every_kubelet_cgroup_shape(name: str) -> None:
    assert parse_cgroup(CASES[name]) == WANT


@pytest.mark.parametrize("text", [
    "0::/user.slice/user-1000.slice/session-3.scope\n",                         # a login session
    "0::/system.slice/containerd.service\n",                                      # a daemon
    f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYSTEMD_UID}.slice/"
    f"crio-conmon-{CID}.scope\n",                                                # CRI-O's conmon, not a container
    f"0::/kubepods/burstable/pod{UID}\n",                                        # pod level, no container
    "",
    "garbage without colons\n\x00\xff",
])
def test_processes_outside_containers_are_not_attributed(text: str) -> None:
    assert parse_cgroup(text) is None


def test_container_ids_from_pod_status_lose_their_runtime_scheme() -> None:
    assert bare_container_id(f"containerd://{CID}") == CID
    assert bare_container_id(f"cri-o://{CID}") == CID
    assert bare_container_id(CID) == CID


def write_proc(root: Path, pid: int, cgroup: str, start: int = 100) -> None:
    d = root / str(pid)
    d.mkdir(parents=True, exist_ok=True)
    (d / "cgroup").write_text(cgroup)
    # comm with spaces and parentheses, as real ones can have
    (d / "stat").write_text(f"{pid} (python (x) y) S " + " ".join(["1"] * 18) + f" {start} 0 0\n")


def owners(snapshot) -> dict[int, CgroupOwner]:  # type: ignore[no-untyped-def]
    return {o.pid: CgroupOwner(o.pod_uid, o.container_id) for o in snapshot.owners}


def test_source_resolves_counts_unresolved_and_forgets_ended(tmp_path: Path) -> None:
    write_proc(tmp_path, 10, CASES["v2 cgroupfs containerd"])
    write_proc(tmp_path, 11, "0::/system.slice/sshd.service\n")
    source = ProcsSource(lambda: [10, 11, 12], str(tmp_path))
    found = source.collect()  # 12: not visible (no hostPID, or ended)
    assert found.owners == (ProcessOwner(10, UID, CID),)
    assert found.unresolved == (11, 12)
    # A PID reused by another container (new start time) is read again, not served from cache.
    other = "b" * 64
    write_proc(tmp_path, 10, f"0::/kubepods/pod{UID}/{other}\n", start=200)
    assert owners(source.lookup([10]))[10].container_id == other


def test_source_caches_a_pid_while_it_lives(tmp_path: Path) -> None:
    write_proc(tmp_path, 10, CASES["v2 cgroupfs containerd"])
    source = ProcsSource(lambda: [10], str(tmp_path))
    source.collect()
    (tmp_path / "10" / "cgroup").write_text("0::/changed\n")  # same start time: same process
    assert owners(source.collect()) == {10: WANT}


def test_missing_procfs_is_a_source_error(tmp_path: Path) -> None:
    with pytest.raises(SourceError, match="--procfs"):
        ProcsSource(lambda: [1], str(tmp_path / "nope")).collect()


def test_simulated_procfs_resolves_every_scenario_process_in_several_shapes() -> None:
    from dra_exporter_sim import load_scenario
    from dra_exporter_sim.procfs import SimulatedProcfs, shape_for

    scenario = load_scenario("demo")
    procfs = SimulatedProcfs(scenario)
    try:
        want = {p.pid: CgroupOwner(pod.uid, bare_container_id(c.container_id))
                for pod in scenario.pods for c in pod.containers for p in c.processes}
        found = ProcsSource(lambda: [*want, 1], procfs.root).collect()
        assert owners(found) == want
        assert found.unresolved == (1,)
        assert len({shape_for(pod) for pod in scenario.pods}) >= 3, "the demo should exercise several shapes"
    finally:
        procfs.close()
