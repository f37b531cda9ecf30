"""The command line as users meet it: flags, env vars, exit codes, one-line errors."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from dra_exporter import cli, runtime
from dra_exporter.agent import SourceRunner
from dra_exporter.config import Settings


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> list[Settings]:
    """Patch runtime.serve and record the Settings the CLI built."""
    seen: list[Settings] = []
    monkeypatch.setattr(runtime, "serve", lambda settings, **_: seen.append(settings))
    return seen


def invoke(*args: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return CliRunner().invoke(cli.main, list(args), env=env, catch_exceptions=False)


def test_serve_defaults(captured: list[Settings], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "gpu-node-7")  # from the downward API in the DaemonSet
    result = invoke("serve")
    assert result.exit_code == 0, result.output
    (s,) = captured
    assert (s.listen, s.interval, s.node_name, s.simulate, s.kubelet_socket) == (
        "0.0.0.0:9401", 1.0, "gpu-node-7", None, None)


def test_simulate_without_value_means_demo(captured: list[Settings]) -> None:
    assert invoke("serve", "--simulate").exit_code == 0
    assert invoke("serve", "--simulate", "my.yaml").exit_code == 0
    assert [s.simulate for s in captured] == ["demo", "my.yaml"]


def test_every_flag_reads_its_environment_variable(captured: list[Settings]) -> None:
    env = {"DRA_EXPORTER_LISTEN": "127.0.0.1:9999", "DRA_EXPORTER_INTERVAL": "2.5",
           "DRA_EXPORTER_NODE_NAME": "n1", "DRA_EXPORTER_SIMULATE": "demo",
           "DRA_EXPORTER_KUBELET_SOCKET": "/tmp/k.sock", "DRA_EXPORTER_POD_NAMESPACE": "monitoring",
           "DRA_EXPORTER_POD_NAME": "dra-exporter-abc", "DRA_EXPORTER_CLAIM_REFRESH": "900"}
    assert invoke("serve", env=env).exit_code == 0
    (s,) = captured
    assert (s.listen, s.interval, s.node_name, s.simulate, s.kubelet_socket, s.self_pod, s.claim_refresh) == (
        "127.0.0.1:9999", 2.5, "n1", "demo", "/tmp/k.sock", ("monitoring", "dra-exporter-abc"), 900.0)


def test_every_source_but_nvml_has_a_switch_from_the_registry(captured: list[Settings]) -> None:
    all_on = {"nvml", "cdi", "podresources", "kubeapi", "procs"}
    for args, env, off in [
        ((), {}, set()),
        (("--no-source-procs",), {}, {"procs"}),
        (("--no-source-podresources", "--no-source-procs"), {}, {"podresources", "procs"}),
        (("--no-kubeapi",), {}, {"kubeapi"}),  # the older name keeps working
        (("--no-source-kubeapi",), {}, {"kubeapi"}),
        ((), {"DRA_EXPORTER_KUBEAPI": "false"}, {"kubeapi"}),
        ((), {"DRA_EXPORTER_SOURCE_PODRESOURCES": "0"}, {"podresources"}),
        (("--no-source-kubeapi", "--kubeapi"), {}, set()),  # the last one given wins, as for any flag
    ]:
        captured.clear()
        result = invoke("serve", *args, env=env)
        assert result.exit_code == 0, (args, result.output)
        (s,) = captured
        assert s.sources == all_on - off, (args, env)
        assert s.kubeapi is ("kubeapi" not in off)
    result = CliRunner().invoke(cli.main, ["serve", "--no-source-nvml"])
    assert result.exit_code == 2 and "no-source-nvml" in result.output, "NVML is the exporter: no switch"


@pytest.mark.parametrize("args, needle", [
    (["serve", "--listen", "nonsense"], "HOST:PORT"),
    (["serve", "--listen", "0.0.0.0:99999"], "65535"),
    (["serve", "--interval", "0"], "--interval"),
    (["serve", "--claim-refresh", "1"], "--claim-refresh"),
    (["serve", "--pod-name", "x"], "--pod-namespace"),
    (["snapshot", "--format", "xml"], "--format"),
    (["serve", "--no-such-flag"], "no-such-flag"),
    (["serve", "--no-prometheus"], "--otlp-endpoint"),
    (["serve", "--otlp-endpoint", "ftp://x:1"], "OTLP"),
    (["serve", "--otlp-endpoint", "notaurl"], "host:port"),
    (["serve", "--otlp-endpoint", "collector"], "host:port"),
    (["serve", "--otlp-endpoint", "http://c:4317", "--otlp-header", "novalue"], "KEY=VALUE"),
    # A file that exists (a file option refuses a missing one first): the missing key is the error.
    (["serve", "--otlp-endpoint", "http://c:4317", "--otlp-client-certificate", __file__], "key"),
    (["cluster", "--no-prometheus"], "--otlp-endpoint"),
    (["cluster", "--otlp-endpoint", "ftp://x:1"], "OTLP"),
    (["cluster", "--once", "--otlp-endpoint", "http://c:4317"], "--once"),
    (["cluster", "--no-prometheus", "--otlp-endpoint", "http://c:4317", "--web-config", __file__],
     "turns off"),
    (["serve", "--pod-labels", "team,cost center"], "'cost center' is not a Kubernetes label key"),
    (["serve", "--pod-labels", "team,"], "'' is not a Kubernetes label key"),
    (["snapshot", "--pod-labels", "-team"], "not a Kubernetes label key"),
    (["serve", "--pod-labels", "a.b,a_b"], "both the Prometheus label 'label_a_b'"),
])
def test_bad_flags_exit_2_with_a_clear_line(args: list[str], needle: str, captured: list[Settings]) -> None:
    result = CliRunner().invoke(cli.main, args)
    assert result.exit_code == 2
    assert needle in result.output
    assert "Traceback" not in result.output
    assert not captured


def test_pod_labels_come_from_the_flag_or_its_variable_and_default_to_none(captured: list[Settings]) -> None:
    assert invoke("serve", "--pod-labels", "team,cost-center,team").exit_code == 0
    assert invoke("serve", env={"DRA_EXPORTER_POD_LABELS": "app.kubernetes.io/name"}).exit_code == 0
    assert invoke("serve").exit_code == 0
    flag, env, default = (s.pod_labels for s in captured)
    assert (flag.keys, flag.names) == (("cost-center", "team"), ("label_cost_center", "label_team"))
    assert env.names == ("label_app_kubernetes_io_name",)
    assert not default and default.keys == ()


def test_snapshot_with_pod_labels_puts_the_simulated_pods_labels_on_consumer_info() -> None:
    result = invoke("snapshot", "--simulate", "--format", "json", "--pod-labels", "team")
    assert result.exit_code == 0, result.output
    metrics = json.loads(result.output)["metrics"]
    consumers = {s["labels"]["pod"]: s["labels"] for s in metrics["dra_claim_consumer_info"]}
    assert consumers["llama-train-0"]["label_team"] == "platform"
    assert consumers["tokenize-job-7"]["label_team"] == "", "demo's batch pod has no team label"
    assert all("label_cost_center" not in c for c in consumers.values()), "only what is allowlisted"


def test_pod_labels_leave_the_dcgm_names_as_they_are() -> None:
    from dra_exporter import catalog

    result = invoke("snapshot", "--simulate", "--format", "json", "--naming", "dcgm", "--pod-labels", "team")
    assert result.exit_code == 0, result.output
    metrics = json.loads(result.output)["metrics"]
    assert {tuple(s["labels"]) for s in metrics["DCGM_FI_DEV_GPU_UTIL"]} == {catalog.DCGM_LABELS}
    assert {s["labels"]["label_team"] for s in metrics["dra_claim_consumer_info"]} == {"platform", "serving",
                                                                                       "research", ""}


def test_otlp_flags_and_standard_environment(captured: list[Settings], monkeypatch: pytest.MonkeyPatch) -> None:
    assert invoke("serve", "--otlp-endpoint", "http://collector:4318", "--otlp-protocol", "http/protobuf",
                  "--otlp-header", "x-api-key=s3cret", "--otlp-header", "x-tenant=a", "--otlp-interval", "5",
                  "--no-prometheus").exit_code == 0
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://env-collector:4317")
    assert invoke("serve").exit_code == 0
    first, from_env = captured
    assert first.prometheus is False and first.otlp is not None
    assert (first.otlp.endpoint, first.otlp.protocol, first.otlp.interval) == (
        "http://collector:4318", "http/protobuf", 5.0)
    assert first.otlp.headers == (("x-api-key", "s3cret"), ("x-tenant", "a"))
    assert from_env.prometheus is True and from_env.otlp is not None
    assert (from_env.otlp.endpoint, from_env.otlp.protocol) == ("", "grpc"), "the SDK reads the env endpoint"


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "dra_exporter.cli", *args], capture_output=True, text=True,
                          timeout=120)


def test_malformed_scenario_exits_2_with_one_line_naming_the_problem(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("node: n\ngpus:\n  - index: 0\n    mig: [{profile: 9g.999gb, placement_start: 0}]\n")
    result = run_cli("snapshot", "--simulate", str(bad))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "bad.yaml" in lines[0] and "9g.999gb" in lines[0], result.stderr
    missing = run_cli("snapshot", "--simulate", str(tmp_path / "nope.yaml"))
    assert missing.returncode == 2 and "nope.yaml" in missing.stderr and "Traceback" not in missing.stderr


def test_busy_port_is_a_one_line_error() -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli("serve", "--simulate", "--listen", f"127.0.0.1:{port}")
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr and str(port) in result.stderr


def test_snapshot_json_has_attributed_devices() -> None:
    result = invoke("snapshot", "--simulate", "--format", "json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    used = doc["metrics"]["dra_gpu_memory_used_bytes"]
    pods = {s["labels"]["pod"] for s in used}
    assert "llama-train-0" in pods and "" in pods
    # GPM ratios need two samples; snapshot takes them.
    assert doc["metrics"]["dra_gpu_sm_active_ratio"]


def test_snapshot_table_shows_every_device_with_attribution() -> None:
    result = invoke("snapshot", "--simulate", "--format", "table")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].split()[:3] == ["GPU", "UUID", "PROFILE"]
    assert len(lines) == 1 + 8 + 2 + 7  # header, 8 GPUs, 2 + 7 MIG devices
    assert any("llama-train-0" in ln and "trainer" in ln for ln in lines)
    assert any("(shared)" in ln and "shared-notebook-gpu" in ln for ln in lines)


def test_snapshot_prometheus_output_is_deterministic() -> None:
    first = invoke("snapshot", "--simulate", "--format", "prometheus").output
    second = invoke("snapshot", "--simulate", "--format", "prometheus").output
    strip = lambda text: [ln for ln in text.splitlines() if "collect_duration" not in ln]  # noqa: E731
    assert strip(first) == strip(second)
    assert "dra_gpu_utilization_ratio{" in first


def test_doctor_on_the_simulated_node() -> None:
    result = invoke("doctor", "--simulate")
    assert result.exit_code == 0, result.output
    assert "NVIDIA H200" in result.output and "MIG enabled" in result.output
    assert "pod-resources answers" in result.output


def test_doctor_without_gpu_or_kubelet_says_what_to_fix(tmp_path: Path) -> None:
    result = run_cli("doctor", "--kubelet-socket", str(tmp_path / "kubelet.sock"))
    assert result.returncode == 1
    assert "[FAIL] kubelet" in result.stdout and "not found" in result.stdout
    assert "Traceback" not in result.stdout + result.stderr


def test_start_up_log_names_the_node_and_the_scenario_it_was_simulated_from(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stop = threading.Event()
    settings = Settings(listen="127.0.0.1:0", simulate="demo", interval=0.2)
    with caplog.at_level(logging.INFO, logger="dra_exporter.runtime"):
        server = threading.Thread(target=runtime.serve, args=(settings,), kwargs={"stop": stop})
        server.start()
        try:
            deadline = time.monotonic() + 60
            while not any(r.getMessage().startswith("collecting every") for r in caplog.records):
                assert server.is_alive() and time.monotonic() < deadline, "no start-up line"
                time.sleep(0.05)
        finally:
            stop.set()
            server.join(timeout=30)
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("collecting every")]
    assert line == "collecting every 0.2s on node 'sim-node-1' (simulated from scenario demo)"


def test_under_simulate_the_api_server_lines_say_what_the_simulated_cluster_has(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Not "CRDs are not installed" or "serves no DeviceTaintRules": a newcomer reads those as problems."""
    with caplog.at_level(logging.INFO, logger="dra_exporter.sources.kubeapi"):
        runtime.snapshot(Settings(simulate="demo", interval=0.2))
    lines = [r.getMessage() for r in caplog.records if r.name == "dra_exporter.sources.kubeapi"]
    assert not [line for line in lines if "not installed" in line or "serves no" in line], lines
    assert any("simulated cluster has the scenario's ResourceSlices" in line for line in lines), lines
    assert any("simulated cluster has no ComputeDomains" in line for line in lines), lines


def test_a_node_name_a_one_node_scenario_does_not_simulate_is_an_error() -> None:
    """A one-node scenario names its node: --node-name typo is refused (exit 2), not ignored."""
    typo = run_cli("snapshot", "--simulate", "--node-name", "sim-node-l")
    assert typo.returncode == 2 and typo.stderr.count("\n") == 1, typo.stderr
    assert "--node-name 'sim-node-l'" in typo.stderr and "'sim-node-1'" in typo.stderr
    assert run_cli("snapshot", "--simulate", "--node-name", "sim-node-1").returncode == 0


def test_a_recovered_source_is_named_in_the_log_line(caplog: pytest.LogCaptureFixture) -> None:
    outcomes = iter([RuntimeError("socket gone"), "snapshot"])

    class Flaky:
        name = "podresources"

        def collect(self) -> str:
            outcome = next(outcomes)
            if isinstance(outcome, Exception):
                raise outcome
            return outcome

    runner = SourceRunner(Flaky(), keep_last_good=True)
    with caplog.at_level(logging.INFO, logger="dra_exporter.agent"):
        runner.collect_once()
        runner.collect_once()
    # The log format prints the message only (never `extra`): the source must be in it.
    assert [r.getMessage() for r in caplog.records] == [
        "source podresources failed: socket gone", "source podresources recovered"]


def test_no_option_shows_a_type_name_for_its_value_in_help() -> None:
    """``--otlp-interval FINITE FLOAT`` said the type, not what to give: every valued option of every
    command names its value (S, N, FILE …)."""
    from click import Group

    assert isinstance(cli.main, Group)
    for name, command in cli.main.commands.items():
        ctx = click.Context(command, info_name=name)
        for param in command.params:
            if isinstance(param, click.Option) and not param.is_flag and not param.count:
                shown = param.make_metavar(ctx) if "ctx" in param.make_metavar.__code__.co_varnames else \
                    param.make_metavar()  # type: ignore[call-arg]
                assert not {"FLOAT", "INTEGER", "TEXT", "RANGE"} & set(shown.split()), (name, param.opts, shown)
