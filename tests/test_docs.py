"""The README's metric table is generated from the catalogue; this keeps them in step."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from dra_exporter.catalog import (
    CATALOG,
    DCGM_NAMINGS,
    dcgm_markdown_table,
    dcgm_rename_markdown_table,
    markdown_table,
)

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_metrics_table_matches_the_catalogue() -> None:
    text = README.read_text()
    start, end = text.index("<!-- metrics:start -->\n"), text.index("<!-- metrics:end -->")
    table = text[start + len("<!-- metrics:start -->\n"):end].strip()
    assert table == markdown_table(), "regenerate with: python -m dra_exporter.catalog"


def test_every_catalogue_name_is_unique_and_counters_end_in_total() -> None:
    names = [s.name for s in CATALOG]
    assert len(names) == len(set(names))
    for s in CATALOG:
        assert s.name.startswith("dra_")
        assert (s.kind == "counter") == s.name.endswith("_total"), s.name
        assert len(s.labels) <= 15, s.name
        assert s.help.endswith("."), s.name


def _block(name: str) -> str:
    text = README.read_text()
    start, end = text.index(f"<!-- {name}:start -->\n"), text.index(f"<!-- {name}:end -->")
    return text[start + len(f"<!-- {name}:start -->\n"):end].strip()


@pytest.mark.parametrize("naming", list(DCGM_NAMINGS))
def test_readme_dcgm_tables_match_the_catalogue(naming: str) -> None:
    assert _block(naming) == dcgm_markdown_table(naming), f"regenerate with: python -m dra_exporter.catalog {naming}"


def test_readme_rename_table_matches_the_catalogue() -> None:
    assert _block("dcgm-renames") == dcgm_rename_markdown_table(), (
        "regenerate with: python -m dra_exporter.catalog dcgm-renames")


@pytest.mark.parametrize("naming", list(DCGM_NAMINGS))
def test_dcgm_names_are_dcgms_raw_field_names(naming: str) -> None:
    for source, d in DCGM_NAMINGS[naming].forms:
        assert d.name.startswith(("DCGM_FI_DEV_", "DCGM_FI_PROF_")) and d.name.isupper(), d.name
        assert not d.name.endswith("_total"), d.name
        assert source in CATALOG, source.name


def _readme_commands() -> list[str]:
    block = README.read_text().split("```sh\n", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip() and not line.startswith("#")]


def test_readme_first_commands_need_only_python3_and_venv() -> None:
    run, test = _readme_commands()
    for command in (run, test):
        # No system-wide pip (PEP 668 refuses it on stock Debian/Ubuntu): everything in a venv.
        assert command.startswith("python3 -m venv .venv && .venv/bin/pip install -e "), command
        assert "python3 -m pip" not in command
    assert run.endswith(".venv/bin/dra-exporter serve --simulate")
    assert test.endswith(".venv/bin/python -m pytest -q")


def test_ci_runs_the_tests_the_way_the_readme_says() -> None:
    ci = (README.parent / ".ci" / "run").read_text()
    _, test = _readme_commands()
    venv, install, pytest_run = (part.strip() for part in test.split("&&"))
    assert venv in ci
    assert install.replace("pip install", "pip install --quiet") in ci
    # Debian's prometheus package, where promtool or prometheus is missing.
    assert "packages+=(prometheus)" in ci and 'apt-get install -y "${packages[@]}"' in ci
    # The README's command leaves the slow tests out (pyproject's addopts); CI runs it with every test.
    addopts = tomllib.loads((README.parent / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    assert '-m "not slow"' in addopts
    ci_runs = [line.strip() for line in ci.splitlines() if line.strip().startswith(pytest_run)]
    assert ci_runs == [f'{pytest_run} -m ""'], ci_runs
    assert "-m slow" in README.read_text(), "the README says how to run the slow tests"
    # Lint (the whole repository: dashboards/generate.py and typings/ too) and types, with the project's
    # own settings.
    assert "\n.venv/bin/ruff check --config pyproject.toml .\n" in ci
    assert "\n.venv/bin/mypy\n" in ci


def test_readme_usage_names_every_flag_and_every_source() -> None:
    from click import Group

    from dra_exporter import cli
    from dra_exporter.sinks import otlp
    from dra_exporter.sources import registry

    text = README.read_text()
    usage = text.split("## Usage", 1)[1].split("```", 2)[1]
    assert isinstance(cli.main, Group)
    for name, command in cli.main.commands.items():
        assert f"dra-exporter {name}" in usage, name
        for param in command.params:
            # An on/off pair (--kubeapi/--no-kubeapi) is named by the side that is not the default.
            flags = [o for o in (*param.opts, *param.secondary_opts) if o.startswith("--") and o != "--help"]
            assert not flags or any(f in usage for f in flags), f"{name}: {flags}"
    # Every registered source (a new one must be documented, alerted on and in the runbook), and the push.
    sources = {spec.name for spec in registry.sources()} | {otlp.SOURCE}
    assert sources >= {"nvml", "podresources", "procs", "kubeapi", "otlp"}
    rules = (README.parent / "deploy" / "prometheus-rules.yaml").read_text()
    runbook = (README.parent / "docs" / "operating.md").read_text().split("### Runbook: DraExporterSourceDown")[1]
    for source in sources:
        assert f"`{source}`" in text, f"README does not name the {source} source"
        assert f"{source}:" in rules, f"DraExporterSourceDown does not say what {source} failing means"
        assert f"- `{source}`:" in runbook, f"the runbook has no entry for {source}"


def test_ci_looks_for_the_test_beds_before_it_installs_anything() -> None:
    ci = (README.parent / ".ci" / "run").read_text()
    # The check of the folder beside the clone (only .ci/run may name it: test_self_contained).
    check = re.search(r"\[ -d \S+/testbeds \] \|\|", ci)
    assert check is not None, ".ci/run does not check for the test beds' folder"
    first = check.start()
    assert first < ci.index("apt-get") and first < ci.index(".venv/bin/pip install"), "no test beds: fail first"
