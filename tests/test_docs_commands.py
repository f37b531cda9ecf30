"""Every command the README and docs/ show resolves from a clone set up as the README says (a venv in
``.venv``, never activated): its program, module, script or file exists, and every flag it gives a
``dra-exporter`` command is one that command has. Resolving, not running: the long ones (benchmarks,
slow tests) would take minutes; what they name is what breaks when the docs drift."""

from __future__ import annotations

import importlib.util
import re
import shlex
import tomllib
from pathlib import Path

import click
import pytest

from dra_exporter import cli

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
#: The commands a reader copies: fenced shell blocks, and code spans that start with one of these.
_RUNNABLE = ("python3 ", "python ", ".venv/bin/", "dra-exporter ", "promtool ", "kubectl dra ", "kubectl-dra ")
_OURS = ("python3", "python", ".venv/bin/", "dra-exporter", "promtool", "kubectl-dra", "kubectl")
_SCRIPTS = set(tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"])
#: Tools the test extras install into the venv (pyproject's [test] extra), run by the docs.
_VENV_TOOLS = {"pip", "ruff", "mypy", "lint-imports"}


def _shell_lines(text: str) -> list[str]:
    out: list[str] = []
    for block in re.findall(r"```(?:sh|bash|console|shell)\n(.*?)```", text, re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        out += [line.strip() for line in joined.splitlines()]
    # A span that names a file or flag after the program is a command too (`python3 -m benchmarks.run`).
    out += [span for span in re.findall(r"`([^`\n]+)`", text) if span.startswith(_RUNNABLE)]
    return [line for line in out if line and not line.startswith("#")]


def _commands(line: str) -> list[list[str]]:
    line = re.sub(r"(^|\s)#\s.*$", "", line)  # a trailing comment
    try:
        words = shlex.split(line)
    except ValueError:
        return []  # prose in a span, not a command
    commands, current = [], []
    for word in words:
        if word in ("&&", "||", "|", ";", "&"):
            commands.append(current)
            current = []
        else:
            current.append(word)
    commands.append(current)
    out = []
    for command in commands:
        while command and re.match(r"^[A-Z_][A-Z0-9_]*=", command[0]):
            command = command[1:]  # VAR=value before the program
        if command and command[0].startswith(_OURS) and "…" not in command[0]:
            out.append(command)
    return out


def documented_commands() -> list[tuple[str, list[str]]]:
    seen: dict[str, tuple[str, list[str]]] = {}
    for doc in DOCS:
        for line in _shell_lines(doc.read_text()):
            for command in _commands(line):
                seen.setdefault(" ".join(command), (doc.relative_to(REPO).as_posix(), command))
    return sorted(seen.values(), key=lambda item: (item[0], item[1]))


def _resolve_dra_exporter(args: list[str]) -> None:
    if args[:1] == ["…"]:
        return  # "dra-exporter … --simulate": any command
    if not args or args[0].startswith("-"):
        assert not args or set(args) <= {"--help", "-h", "--version"}, args
        return
    group = cli.main
    assert isinstance(group, click.Group)
    command = group.commands.get(args[0])
    assert command is not None, f"no command {args[0]!r}"
    flags = {o for p in command.params for o in (*p.opts, *p.secondary_opts)} | {"--help", "-h"}
    for word in args[1:]:
        if word.startswith("-") and not re.fullmatch(r"-\d.*", word):
            flag = word.split("=", 1)[0]
            assert flag in flags, f"dra-exporter {args[0]} has no {flag}"


def _resolve_python(args: list[str]) -> None:
    if args[:1] == ["-m"]:
        module = args[1]
        assert importlib.util.find_spec(module) is not None, f"no module {module}"
        if module == "pytest":
            for word in args[2:]:
                path = word.split("::", 1)[0]
                if path.startswith("tests/"):
                    assert (REPO / path).exists(), f"no {path}"
        return
    if args[:1] == ["-c"]:
        return
    assert (REPO / args[0]).is_file(), f"no file {args[0]}"


def resolve(command: list[str]) -> None:
    program, args = command[0], command[1:]
    if program in ("python3", "python"):
        # The README's set-up makes a venv and never activates it: only the venv's python has the
        # package and its extras.
        assert args[:2] == ["-m", "venv"], "a bare python3 lacks the package: use .venv/bin/python"
    elif program in (".venv/bin/python", ".venv/bin/python3"):
        _resolve_python(args)
    elif program in ("dra-exporter", ".venv/bin/dra-exporter"):
        _resolve_dra_exporter(args)
    elif program in ("kubectl-dra", ".venv/bin/kubectl-dra") or (program == "kubectl" and args[:1] == ["dra"]):
        from dra_exporter import kubectl_plugin

        plugin_args = args[1:] if program == "kubectl" else args
        if plugin_args:  # the bare program names the script
            try:
                kubectl_plugin.parse(plugin_args)
            except SystemExit:
                raise AssertionError("kubectl dra refuses it") from None
    elif program.startswith(".venv/bin/"):
        name = program.removeprefix(".venv/bin/")
        assert name in _SCRIPTS | _VENV_TOOLS, f"nothing installs {program}"
    elif program == "promtool":
        for word in args:
            if word.endswith((".yaml", ".yml")):
                assert (REPO / word).is_file() or (REPO / "deploy" / word).is_file(), f"no {word}"


COMMANDS = documented_commands()


def test_the_docs_show_commands() -> None:
    assert len(COMMANDS) > 30
    programs = {c[0] for _, c in COMMANDS}
    assert {".venv/bin/python", "python3"} <= programs


@pytest.mark.parametrize(("doc", "command"), COMMANDS, ids=[" ".join(c)[:90] for _, c in COMMANDS])
def test_every_documented_command_resolves(doc: str, command: list[str]) -> None:
    try:
        resolve(command)
    except AssertionError as exc:
        raise AssertionError(f"{doc}: `{' '.join(command)}`: {exc}") from None


def test_the_usage_block_gives_each_command_only_flags_it_has() -> None:
    text = (REPO / "README.md").read_text()
    usage = text.split("## Usage", 1)[1].split("```", 2)[1]
    by_command: dict[str, list[str]] = {}
    current = ""
    for line in usage.splitlines():
        line = line.split("  # ", 1)[0]
        if line.startswith("dra-exporter "):
            current = line.split()[1]
        if current:
            by_command.setdefault(current, []).extend(re.findall(r"(?<![\w-])(--[a-z][\w-]*)", line))
    assert "explain" in by_command and "serve" in by_command
    for command, flags in by_command.items():
        _resolve_dra_exporter([command, *flags])
    assert len(by_command["serve"]) == len(set(by_command["serve"])), "a flag named twice"


def test_the_docs_figures_are_the_programs() -> None:
    from dra_exporter import demo
    from dra_exporter.sources import kubeapi, kubeapi_cluster
    from dra_exporter_sim.cluster import builtin_cluster

    operating = (REPO / "docs" / "operating.md").read_text()
    readme = (REPO / "README.md").read_text()
    first, last = demo.DEFAULT_BASE_PORT, demo.DEFAULT_BASE_PORT + 3  # gb200-domain: four nodes
    assert f"on ports {first}–{last}" in operating and f"`--base-port` ({first}…{last}" in readme
    nodes = {o["spec"]["nodeName"] for o in builtin_cluster() if o.get("kind") == "ResourceSlice"}
    words = {5: "five", 6: "six", 7: "seven", 8: "eight"}
    assert f"built-in cluster of {words[len(nodes)]} GPU nodes" in operating
    node_cap, cluster_cap = kubeapi.MAX_OBJECTS, kubeapi_cluster.MAX_OBJECTS
    small_cap = cluster_cap * kubeapi_cluster.SMALL_KIND_FACTOR
    assert (f"default {node_cap:,} per kind for\n  a node; for `cluster` and `explain` {cluster_cap:,}, claims and "
            f"pods {small_cap:,})") in readme
    from dra_exporter.runtime import SNAPSHOT_SIM_TIME

    second = f"simulated second {SNAPSHOT_SIM_TIME:g}"
    assert second in readme and second in (REPO / "docs" / "scenarios.md").read_text()
    help_text = " ".join(p.help or "" for p in cli.main.commands["cluster"].params  # type: ignore[attr-defined]
                         if "--max-objects" in p.opts)
    said = f"{node_cap} per kind for a node; for the cluster mode {cluster_cap}, claims and pods {small_cap}"
    assert said in help_text
