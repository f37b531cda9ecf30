"""Every DRA_EXPORTER_* variable means one thing: whichever command reads it, the same type,
the same range, the same choices. A variable read two ways breaks one program for whoever sets it
for another (DRA_EXPORTER_PROMETHEUS was a flag for serve and a URL for report; the node agent's
0.05 s interval was out of the cluster mode's range). Walked from the CLI itself, so an option
added later is held to it too."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import click
import pytest
from click.testing import CliRunner

from dra_exporter import cli, config, runtime


def _commands(group: click.Group = cli.main, prefix: str = "") -> list[tuple[str, click.Command]]:
    out: list[tuple[str, click.Command]] = []
    for name, cmd in group.commands.items():
        out.append((prefix + name, cmd))
        if isinstance(cmd, click.Group):
            out.extend(_commands(cmd, f"{prefix}{name} "))
    return out


def _envvars(param: click.Parameter) -> list[str]:
    if not param.envvar:
        return []
    return [param.envvar] if isinstance(param.envvar, str) else list(param.envvar)


def _meaning(param: click.Parameter) -> tuple[Any, ...]:
    """What a value of the variable is read as: the type, its range or choices (a file: which kind), flag or list."""
    t = param.type
    bounds = tuple(getattr(t, a, None) for a in ("min", "max", "min_open", "max_open", "clamp",
                                                 "yaml", "or_name", "library_parses"))
    choices = tuple(getattr(t, "choices", ()) or ())
    option = isinstance(param, click.Option)
    return (type(t).__name__, bounds, choices, option and param.is_flag, option and param.multiple, param.nargs)


READERS: dict[str, list[tuple[str, str, tuple[Any, ...]]]] = defaultdict(list)
for _command, _cmd in _commands():
    for _param in _cmd.params:
        for _var in _envvars(_param):
            READERS[_var].append((_command, _param.name or "", _meaning(_param)))


def test_the_walk_finds_the_shared_variables() -> None:
    assert {"DRA_EXPORTER_INTERVAL", "DRA_EXPORTER_CLUSTER_INTERVAL", "DRA_EXPORTER_PROMETHEUS",
            "DRA_EXPORTER_PROMETHEUS_URL", "DRA_EXPORTER_LISTEN", "DRA_EXPORTER_FORMAT"} <= set(READERS)
    assert len(READERS["DRA_EXPORTER_INTERVAL"]) >= 3, READERS["DRA_EXPORTER_INTERVAL"]


@pytest.mark.parametrize("envvar", sorted(READERS))
def test_no_environment_variable_is_read_with_two_meanings(envvar: str) -> None:
    meanings = {meaning for _, _, meaning in READERS[envvar]}
    assert len(meanings) == 1, f"{envvar} is read as: " + "; ".join(
        f"{command} --{name}: {meaning}" for command, name, meaning in READERS[envvar])


@pytest.mark.parametrize("command, expected", [
    ("serve", config.NODE_INTERVAL_RANGE), ("snapshot", config.NODE_INTERVAL_RANGE),
    ("doctor", config.NODE_INTERVAL_RANGE), ("demo", config.NODE_INTERVAL_RANGE),
    ("cluster", config.CLUSTER_INTERVAL_RANGE),
])
def test_each_programs_interval_has_one_type_and_says_its_range(command: str, expected: tuple[float, float]) -> None:
    param = next(p for p in cli.main.commands[command].params if p.name == "interval")
    assert isinstance(param.type, cli.Interval)
    assert (param.type.min, param.type.max) == expected
    help_text = CliRunner().invoke(cli.main, [command, "--help"], terminal_width=200).output
    assert f"{expected[0]:g} to {expected[1]:g}" in " ".join(help_text.split())


def test_a_node_interval_in_the_environment_does_not_reach_the_cluster_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[Any] = []
    monkeypatch.setattr(runtime, "serve", lambda settings, *_: ran.append(settings))
    result = CliRunner().invoke(cli.main, ["cluster"], env={"DRA_EXPORTER_INTERVAL": "0.05"})
    assert result.exit_code == 0, result.output
    assert ran[0].interval == config.DEFAULT_CLUSTER_INTERVAL

    result = CliRunner().invoke(cli.main, ["cluster"], env={"DRA_EXPORTER_CLUSTER_INTERVAL": "0.05"})
    assert result.exit_code == 2
    assert "DRA_EXPORTER_CLUSTER_INTERVAL" in result.output and "1.0<=x<=3600.0" in result.output, result.output
    assert len(ran) == 1
