"""The test suite needs nothing outside the repository.

A clone is all a contributor or CI has: the recorded NVML answers the tests replay live in
``tests/fixtures/nvml/``, and no file may reach for a checkout beside the clone. Two checks: no
tracked file names such a path, and the tests that replay the recordings pass from a copy of
the repository in a temporary directory with nothing next to it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from deploy_tools import REPO
from nvml_replay import FIXTURES, IDLE, UNDER_LOAD

# Spelled in pieces so that this file does not match its own patterns.
OUTSIDE = re.compile("|".join((r"\.\./" + "shared", "shared/" + "fixtures", "/work" + "/")))
REPLAYING_TESTS = ("tests/test_nvml_source.py", "tests/test_fake_nvml.py")


def repository_files() -> list[str]:
    """What a clone holds: the tracked files and the new ones git does not ignore."""
    if not (REPO / ".git").exists() or not shutil.which("git"):
        pytest.skip("not a git checkout: the files a clone holds are unknown")
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO, capture_output=True, check=True, timeout=60,
    ).stdout.decode()
    return sorted(name for name in set(listed.split("\0")) if name and (REPO / name).is_file())


def test_the_recordings_the_tests_replay_are_in_the_repository() -> None:
    assert FIXTURES.is_relative_to(REPO / "tests")
    for name in (UNDER_LOAD, IDLE, "README.md"):
        assert (FIXTURES / name).is_file(), name


# CI's entry point is the one file that may name the test beds beside the clone: it hands them to the tests
# through KUBEBUILDER_ASSETS, DRA_EXPORTER_TESTBED_NVML and DRA_EXPORTER_TESTBED_NODE, and a clone alone
# skips those tests.
MAY_NAME_THE_TEST_BEDS = {".ci/run"}


def test_no_file_of_the_repository_names_a_path_outside_it() -> None:
    offenders = []
    for name in repository_files():
        if name in MAY_NAME_THE_TEST_BEDS:
            continue
        try:
            text = (REPO / name).read_text()
        except UnicodeDecodeError:
            continue  # binary
        offenders += [f"{name}:{n}: {line.strip()}" for n, line in enumerate(text.splitlines(), 1)
                      if OUTSIDE.search(line)]
    assert not offenders, "paths outside the repository:\n" + "\n".join(offenders)


@pytest.mark.slow
def test_the_replaying_tests_pass_from_a_lone_copy_of_the_repository(tmp_path: Path) -> None:
    copy = tmp_path / "lone" / "dra-exporter"  # nothing beside it
    for name in repository_files():
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / name, copy / name)
    env = {**os.environ, "PYTHONPATH": str(copy)}  # the copy's package, not this checkout's
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "", *REPLAYING_TESTS],
        cwd=copy, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert re.search(r"\b\d+ passed\b", proc.stdout) and " skipped" not in proc.stdout, proc.stdout[-2000:]
