"""Every file a user names on the command line is read at bounded cost and strictly: a FIFO, a
directory or /dev/zero given to any file option of any command, and a YAML file with a repeated key
given to any YAML one, is refused with exit 2 and one line naming it, at once, before anything runs.

The options are found from the CLI itself (every option of type ``cli.FileOption``), as the
float-flag test finds the float options, so a file option added later is covered too; and every
option that looks like a file (a FILE or PATH metavar, a name in file/config/certificate/key) must
be of that type."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from dra_exporter import cli

FILE_OPTIONS = sorted({(command, next(o for o in param.opts if o.startswith("--")), param.type.yaml)
                       for command, cmd in cli.main.commands.items() for param in cmd.params
                       if isinstance(param.type, cli.FileOption)})

#: Paths that are not files to read: a unix socket the kubelet serves, a /proc directory, the CDI root (a
#: directory of specs, each read with its own bound).
NOT_FILES = {"kubelet_socket", "procfs", "cdi_root"}

#: What a command needs besides the file option to get as far as reading it (nothing is run).
REQUIRED_ARGS = {"report": ["--prometheus-url", "http://127.0.0.1:9"], "explain": ["--all"]}

#: A bound far above what a refusal takes, far below "hangs for ever".
SECONDS = 20


def test_the_file_option_list_has_every_file_a_user_names() -> None:
    found = {(command, flag) for command, flag, _ in FILE_OPTIONS}
    assert {("report", "--price-file"), ("report", "--bearer-token-file"), ("report", "--ca-file"),
            ("report", "--basic-auth-password-file"), ("serve", "--web-config"), ("cluster", "--web-config"),
            ("healthcheck", "--web-config"), ("serve", "--kubeconfig"), ("cluster", "--kubeconfig"),
            ("serve", "--otlp-client-key"), ("snapshot", "--simulate"), ("demo", "--scenario")} <= found, found
    looks_like_a_file = {
        (command, param.name) for command, cmd in cli.main.commands.items() for param in cmd.params
        if isinstance(param, click.Option) and param.name not in NOT_FILES and not param.is_flag
        and (any(m in (param.metavar or "") for m in ("FILE", "PATH", "SCENARIO"))
             or any(w in (param.name or "") for w in ("file", "config", "certificate", "key")))}
    typed = {(command, param.name) for command, cmd in cli.main.commands.items() for param in cmd.params
             if isinstance(param.type, cli.FileOption)}
    assert looks_like_a_file <= typed, looks_like_a_file - typed


@pytest.fixture
def nothing_runs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Any]]:
    """Whatever a command would start records that it was reached instead."""
    from dra_exporter import demo, doctor, healthcheck, report, runtime

    ran: list[Any] = []

    def record(*args: Any, **_: Any) -> Any:
        ran.append(args)
        raise SystemExit(0)

    for module, name in ((runtime, "serve"), (runtime, "snapshot"), (doctor, "run"), (demo, "run"),
                         (healthcheck, "check"), (report, "run")):
        monkeypatch.setattr(module, name, record)
    yield ran


@pytest.fixture
def bounded_time() -> Iterator[None]:
    """Fail (instead of hanging the run) if a reader blocks: the alarm interrupts a blocking open()."""
    def expire(*_: Any) -> None:
        raise TimeoutError(f"still reading after {SECONDS} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(SECONDS)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def _fifo(tmp: Path) -> str:
    path = tmp / "fifo.yaml"
    os.mkfifo(path)  # no writer: a blocking open() would wait for ever
    return str(path)


def _directory(tmp: Path) -> str:
    path = tmp / "dir.yaml"
    path.mkdir()
    return str(path)


def _dev_zero(tmp: Path) -> str:
    return "/dev/zero"  # never ends: read whole, it would eat the machine's memory


def _duplicate_key(tmp: Path) -> str:
    path = tmp / "twice.yaml"
    path.write_text("a: 1\nb: 2\na: 3\n")  # PyYAML's own loader keeps the last `a` without a word
    return str(path)


def _run(command: str, flag: str, path: str) -> click.testing.Result:
    args = [command, *REQUIRED_ARGS.get(command, []), flag, path]
    return CliRunner().invoke(cli.main, args, env={k: None for k in os.environ if k.startswith("DRA_EXPORTER_")})


def _assert_refused(result: click.testing.Result, ran: list[Any], *needles: str) -> None:
    output = result.output
    assert result.exit_code == 2, (result.exit_code, output, result.exception)
    assert "Traceback" not in output
    errors = [ln for ln in output.splitlines() if ln.startswith(("Error:", "dra-exporter: error:"))]
    assert len(errors) == 1, output
    for needle in needles:
        assert needle in errors[0], errors[0]
    assert not ran, "the command ran with a file it could not read"


@pytest.mark.parametrize("make, says", [
    (_fifo, "FIFO"), (_directory, "directory"), (_dev_zero, "character device")], ids=["fifo", "directory", "dev-zero"])
@pytest.mark.parametrize("command, flag, yaml", FILE_OPTIONS, ids=lambda v: v if isinstance(v, str) else None)
def test_a_file_option_given_what_is_not_a_file_is_one_line_exit_2(
        command: str, flag: str, yaml: bool, make: Any, says: str, tmp_path: Path,
        nothing_runs: list[Any], bounded_time: None) -> None:
    path = make(tmp_path)
    _assert_refused(_run(command, flag, path), nothing_runs, path, says)


@pytest.mark.parametrize("command, flag", [(c, f) for c, f, yaml in FILE_OPTIONS if yaml],
                         ids=lambda v: v if isinstance(v, str) else None)
def test_a_yaml_file_option_refuses_a_repeated_key_in_one_line_exit_2(
        command: str, flag: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bounded_time: None) -> None:
    # The file is a regular one, so its reader (the scenario loader, the web-config loader, the
    # price file's) is reached: the real one runs; only what would start for good is held back.
    from dra_exporter import demo, report

    ran: list[Any] = []
    for module in (demo, report):
        monkeypatch.setattr(module, "run", lambda *args, **_: ran.append(args))
    path = _duplicate_key(tmp_path)
    _assert_refused(_run(command, flag, path), ran, path, "duplicate key")
