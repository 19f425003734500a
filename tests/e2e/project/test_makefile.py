"""The Makefile's first-run install says what it is doing before the silent pip step (issue 35 item 3)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


def test_first_make_demo_announces_the_install_before_pip(tmp_path: Path) -> None:
    """Issue 35: `make demo` on a checkout without `.venv` prints a line naming the install before pip runs (which
    is quiet for about a minute); `--dry-run` shows the recipe in order without running it."""
    if shutil.which("make") is None:
        pytest.skip("make is not installed")
    result = subprocess.run(
        ["make", "--dry-run", f"VENV={tmp_path / 'venv'}", "demo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    )
    lines = result.stdout.splitlines()
    announce = next(i for i, line in enumerate(lines) if "Installing candor and its dependencies" in line)
    pip = next(i for i, line in enumerate(lines) if "pip install" in line)
    assert lines[announce].lstrip().startswith("echo ") and announce < pip
