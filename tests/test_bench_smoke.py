"""Smoke tests for the benchmarks: they start, finish with tiny sizes, and report what they promise."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
RATIO = re.compile(r"median ratio \(Harness/bare, per pair\): (\d+\.\d+)")


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120, check=False
    )


def test_harness_overhead_help() -> None:
    proc = run("-m", "bench.harness_overhead", "--help")
    assert proc.returncode == 0, proc.stderr
    for option in ("--steps", "--reps"):
        assert option in proc.stdout


def test_harness_overhead_tiny_run_prints_a_ratio() -> None:
    proc = run("-m", "bench.harness_overhead", "--steps", "2", "--reps", "2")
    assert proc.returncode == 0, proc.stderr
    match = RATIO.search(proc.stdout)
    assert match is not None, proc.stdout
    assert float(match.group(1)) > 0
    assert "bare Agent.run" in proc.stdout and "Harness.run" in proc.stdout


def test_run_all_quick_writes_a_report(tmp_path: Path) -> None:
    report = tmp_path / "benchmarks.md"
    proc = run("-m", "bench.run_all", "--quick", "--output", str(report))
    assert proc.returncode == 0, proc.stderr
    text = report.read_text(encoding="utf-8")
    for needle in ("# Benchmarks", "## Machine", "`nproc`", "/proc/meminfo", "pydantic-ai-slim", "## harness_overhead",
                   "python -m bench.harness_overhead --steps 2 --reps 2"):
        assert needle in text
    assert RATIO.search(text) is not None
