"""Smoke tests for the benchmarks: they start, finish with tiny sizes, and report what they promise."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

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


@pytest.mark.parametrize(
    ("module", "options"),
    [
        ("bench.checkpoint_cost", ("--sizes", "--commits", "--backends")),
        ("bench.durable_steps", ("--steps", "--runs", "--backends", "--no-langgraph")),
    ],
)
def test_store_bench_help(module: str, options: tuple[str, ...]) -> None:
    proc = run("-m", module, "--help")
    assert proc.returncode == 0, proc.stderr
    for option in options:
        assert option in proc.stdout


def test_checkpoint_cost_tiny_run_prints_flat_bytes(tmp_path: Path) -> None:
    summary = tmp_path / "cost.json"
    proc = run("-m", "bench.checkpoint_cost", "--sizes", "4,8", "--commits", "2", "--backends", "sqlite",
               "--json", str(summary))
    assert proc.returncode == 0, proc.stderr
    assert "bytes/commit" in proc.stdout and "commit ms p50" in proc.stdout
    data = json.loads(summary.read_text(encoding="utf-8"))
    rows = data["results"]
    assert [r["size"] for r in rows] == [4, 8] and all(r["backend"] == "sqlite" for r in rows)
    # the commit's own count of bytes matches what SQL reads back, and it does not grow with the history
    assert all(r["bytes_median"] == r["bytes_read_back_median"] > 0 for r in rows)
    assert rows[0]["bytes_median"] == rows[1]["bytes_median"]


def test_durable_steps_tiny_run_candor_side_only(tmp_path: Path) -> None:
    summary = tmp_path / "steps.json"
    proc = run("-m", "bench.durable_steps", "--steps", "2,5", "--runs", "1", "--backends", "sqlite",
               "--no-langgraph", "--json", str(summary))
    assert proc.returncode == 0, proc.stderr
    assert "langgraph: SKIPPED (--no-langgraph given)" in proc.stdout
    data = json.loads(summary.read_text(encoding="utf-8"))
    variants = {(r["variant"], r["steps"]) for r in data["rows"]}
    assert variants == {("pydantic-ai", 2), ("candor+sqlite", 2), ("pydantic-ai", 5), ("candor+sqlite", 5)}
    candor = next(r for r in data["rows"] if r["variant"] == "candor+sqlite" and r["steps"] == 5)
    assert candor["steps_per_s"] > 0 and candor["writes_per_run"] == 2 * 5 + 2
    assert len(candor["step_bytes"]) == 5 and all(b > 0 for b in candor["step_bytes"])
    assert candor["stored_bytes"] >= sum(candor["step_bytes"])


def test_durable_steps_reports_a_missing_peers_venv_as_skipped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bench import _store, durable_steps

    monkeypatch.setattr(_store, "peers_python", lambda: tmp_path / "no-venv" / "bin" / "python")
    peers, error = durable_steps._langgraph([2], 1, _store.DEFAULT_POSTGRES_URL, ["sqlite"])
    assert peers is None and "peers venv missing" in error


def test_run_all_quick_writes_a_report(tmp_path: Path) -> None:
    report = tmp_path / "benchmarks.md"
    proc = run("-m", "bench.run_all", "--quick", "--output", str(report))
    assert proc.returncode == 0, proc.stderr
    text = report.read_text(encoding="utf-8")
    for needle in ("# Benchmarks", "## Machine", "`nproc`", "/proc/meminfo", "pydantic-ai-slim", "## harness_overhead",
                   "python -m bench.harness_overhead --steps 2 --reps 2", "| PostgreSQL |", "## checkpoint_cost",
                   "## durable_steps", "--no-langgraph", "Reading:"):
        assert needle in text
    assert RATIO.search(text) is not None
