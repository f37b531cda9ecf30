"""``dra-exporter explain``: the command an operator runs when a claim is pending."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest


def explain(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dra_exporter.cli", "explain", *args], capture_output=True,
                          text=True, timeout=timeout, check=False)


def test_a_pending_claim_of_the_simulated_cluster_is_explained_blocking_reason_first() -> None:
    done = explain("training/typo-job", "--simulate")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[:2] == [
        "training/typo-job: NOT placeable",
        "  blocked first by: request gpu: device class gpu.nvidia.con does not exist: did you mean gpu.nvidia.com? "
        "[class_missing]"]
    # The last line says what the verdict covers of the scheduler's filters (the simulated cluster serves Nodes).
    last = done.stdout.splitlines()[-1]
    assert last.startswith("(the verdicts cover the scheduler's filters DynamicResources (devices)")
    assert "NodeResourcesFit (CPU and memory fit)" in last.partition("; not: ")[2]


def test_json_says_placeable_for_scripts() -> None:
    done = explain("inference/mig-either", "--simulate", "cluster", "--format", "json")
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert (got["claim"], got["placeable"], got["pod_waits"], got["blocking"]) == ("mig-either", True, True, None)
    assert got["devices"] and got["node"]
    assert "DynamicResources (devices)" in got["scheduler_filters"]["covered"]
    assert "PodTopologySpread (topology spread)" in got["scheduler_filters"]["not_covered"]


def test_all_lists_every_unallocated_claim() -> None:
    done = explain("--all", "--simulate", "--format", "json")
    assert done.returncode == 0, done.stderr
    got = {(o["namespace"], o["claim"]): o["placeable"] for o in json.loads(done.stdout)}
    assert got[("training", "typo-job")] is False and got[("inference", "mig-either")] is True
    assert all(not o["allocated"] for o in json.loads(done.stdout))


@pytest.mark.parametrize("args, says", [
    (("ml/no-such-claim", "--simulate"), "no ResourceClaim or Pod ml/no-such-claim in the cluster"),
    (("not-a-claim-name", "--simulate"), "expected NAMESPACE/CLAIM"),
    (("--simulate",), "name one claim as NAMESPACE/CLAIM, or give --all"),
    (("ml/x", "--all", "--simulate"), "name one claim as NAMESPACE/CLAIM, or give --all"),
    (("--simulate", "ml/x"), "put the claim before it"),
])
def test_bad_input_and_a_claim_that_does_not_exist_exit_2_with_one_line(args: tuple[str, ...], says: str) -> None:
    done = explain(*args)
    assert done.returncode == 2
    assert says in done.stderr and "Traceback" not in done.stderr


def test_no_api_server_is_nothing_usable_exit_1(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        f"clusters: [{{name: c, cluster: {{server: 'http://127.0.0.1:{port}'}}}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\nusers: [{name: u, user: {token: t}}]\n")
    done = explain("ml/x", "--kubeconfig", str(kubeconfig), timeout=180)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "nothing to show" in done.stderr and len(done.stderr.strip().splitlines()) == 1


def test_a_pods_name_explains_its_claims() -> None:
    done = explain("training/typo-job-0", "--simulate", "--format", "json")
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout)
    assert (got["claim"], got["pod"], got["placeable"]) == ("typo-job", "training/typo-job-0", False)
    assert got["blocking"] == {"request": "gpu", "reason": "class_missing"}
