"""``kubectl dra explain``: the ``kubectl-dra`` console script kubectl runs for ``kubectl dra``, with
kubectl's flags, against a (simulated) API server named by a kubeconfig whose contexts set namespaces."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from dra_exporter import kubectl_plugin
from dra_exporter_sim import SimClock, SimulatedApiServer, load_cluster

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The built-in cluster behind a kubeconfig with two contexts: ``research`` (current) and ``inference``."""
    with SimulatedApiServer(load_cluster(None), SimClock(0.0, frozen=True), taint_rule_versions=None) as server:
        config = yaml.safe_load(Path(server.kubeconfig_path).read_text())
        context = config["contexts"][0]["context"]
        config["contexts"] = [{"name": ns, "context": {**context, "namespace": ns}} for ns in ("research", "inference")]
        config["current-context"] = "research"
        path = tmp_path_factory.mktemp("kube") / "config"
        path.write_text(yaml.safe_dump(config))
        yield path


@pytest.fixture
def kubectl_dra(capsys: pytest.CaptureFixture[str]) -> Callable[..., Result]:
    """What kubectl runs for ``kubectl dra …``: the console script's entry point (here in this process)."""
    def run(*args: str) -> Result:
        with pytest.raises(SystemExit) as exited:
            kubectl_plugin.main(list(args))
        out, err = capsys.readouterr()
        return Result(int(exited.value.code or 0), out, err)
    return run


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def claims(result: Result) -> set[str]:
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    return {f"{o['namespace']}/{o['claim']}" for o in (out if isinstance(out, list) else [out])}


def test_the_package_installs_kubectl_dra() -> None:
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["kubectl-dra"] == "dra_exporter.kubectl_plugin:main"


def test_all_is_the_current_contexts_namespace_and_context_picks_another(
        kubeconfig: Path, kubectl_dra: Callable[..., Result]) -> None:
    research = claims(kubectl_dra("explain", "--all", "--kubeconfig", str(kubeconfig), "-o", "json"))
    assert research and {c.split("/")[0] for c in research} == {"research"}
    inference = claims(kubectl_dra("explain", "--all", "--kubeconfig", str(kubeconfig), "--context", "inference",
                                   "-o", "json"))
    assert inference and {c.split("/")[0] for c in inference} == {"inference"}
    everything = claims(kubectl_dra("explain", "-A", "--kubeconfig", str(kubeconfig), "-o", "json"))
    assert research | inference <= everything and len({c.split("/")[0] for c in everything}) > 2
    # -n wins over the context's namespace; $KUBECONFIG is read as kubectl reads it.
    assert claims(kubectl_dra("explain", "--all", "-n", "inference", "--kubeconfig", str(kubeconfig), "-o",
                              "json")) == inference


def test_the_installed_script_reads_kubeconfig_as_kubectl_does(kubeconfig: Path) -> None:
    script = Path(sys.executable).parent / "kubectl-dra"  # kubectl finds it on PATH
    assert script.is_file(), "pip install -e . installs it"
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"} | {"KUBECONFIG": str(kubeconfig)}
    result = subprocess.run([str(script), "explain", "--all", "-o", "json"], capture_output=True, text=True,
                            timeout=120, env=env, check=False)
    assert result.returncode == 0, result.stderr
    assert {o["namespace"] for o in json.loads(result.stdout)} == {"research"}


def test_one_claim_by_name_in_the_contexts_namespace_or_whole(kubeconfig: Path,
                                                              kubectl_dra: Callable[..., Result]) -> None:
    first = sorted(claims(kubectl_dra("explain", "--all", "--kubeconfig", str(kubeconfig), "-o", "json")))[0]
    namespace, name = first.split("/")
    by_name = kubectl_dra("explain", name, "--kubeconfig", str(kubeconfig), "-o", "json")
    assert claims(by_name) == {first} and isinstance(json.loads(by_name.stdout), dict)
    text = kubectl_dra("explain", first, "--kubeconfig", str(kubeconfig))
    assert text.returncode == 0 and text.stdout.startswith(f"{first}: "), text.stderr
    missing = kubectl_dra("explain", "no-such-claim", "--kubeconfig", str(kubeconfig))
    assert missing.returncode == 2 and f"{namespace}/no-such-claim" in missing.stderr


@pytest.mark.parametrize("args", [["explain"], ["explain", "a", "--all"], ["explain", "ns/a", "-n", "other"],
                                  ["explain", "-A", "-n", "x"], ["explain", "--bogus"], ["explain", "-o", "yaml", "a"],
                                  ["nope"]])
def test_what_kubectl_would_refuse_is_one_line_and_exit_2(args: list[str], kubectl_dra: Callable[..., Result]) -> None:
    result = kubectl_dra(*args)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("kubectl dra") and result.stderr.count("\n") == 1, result.stderr


def test_the_context_namespace_defaults_as_kubectls(tmp_path: Path, kubeconfig: Path) -> None:
    assert kubectl_plugin.context_namespace(str(tmp_path / "none"), None) == "default"
    assert kubectl_plugin.context_namespace(str(kubeconfig), None) == "research"
    assert kubectl_plugin.context_namespace(str(kubeconfig), "inference") == "inference"
    assert kubectl_plugin.context_namespace(str(kubeconfig), "unknown") == "default"
