"""DESIGN §2 layering, checked with import-linter (contracts in .importlinter)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_contracts_hold() -> None:
    # The script beside this interpreter first (a venv not on PATH), then any on PATH; importlinter.cli has
    # no __main__, so the last resort calls its entry point directly.
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent)) or shutil.which("lint-imports")
    cmd = [exe] if exe else [sys.executable, "-c", "from importlinter.cli import lint_imports_command as c; c()"]
    result = subprocess.run([*cmd, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout
