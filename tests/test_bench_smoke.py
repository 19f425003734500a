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
if str(ROOT) not in sys.path:  # the tests below import `bench` helpers in process too
    sys.path.insert(0, str(ROOT))
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
RATIO = re.compile(r"median ratio \(Harness/bare, per pair\): (\d+\.\d+)")


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture(scope="module")
def postgres_server() -> str:
    """The server the service benchmarks create their scratch databases on; skips (or fails, with
    `CANDOR_REQUIRE_POSTGRES=1`) when it does not answer."""
    import asyncio

    from bench import _store

    reason = asyncio.run(_store.postgres_unreachable(_store.DEFAULT_POSTGRES_URL))
    if reason is not None:
        message = f"PostgreSQL not reachable at {_store.dsn(_store.DEFAULT_POSTGRES_URL)}: {reason}"
        if os.environ.get("CANDOR_REQUIRE_POSTGRES") == "1":
            pytest.fail(message + " (CANDOR_REQUIRE_POSTGRES=1)", pytrace=False)
        pytest.skip(message + " (set CANDOR_REQUIRE_POSTGRES=1 to fail instead)")
    return _store.DEFAULT_POSTGRES_URL


def run_service_bench(module: str, tmp_path: Path, *args: str) -> tuple[str, dict[str, object]]:
    """Run a service benchmark with tiny sizes; its stdout and its JSON summary (nothing skipped, no target
    measured as missing for lack of data)."""
    summary = tmp_path / f"{module}.json"
    proc = run("-m", f"bench.{module}", *args, "--json", str(summary), timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    data = json.loads(summary.read_text(encoding="utf-8"))
    assert data["bench"] == module and data["skipped"] == {}, data.get("skipped")
    return proc.stdout, data


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
        ("bench.failover_latency", ("--trials", "--drain-trials", "--lease-seconds", "--authority-seconds")),
        ("bench.resume_latency", ("--clients", "--requests", "--warmup")),
        ("bench.service_throughput", ("--workers", "--runs", "--steps")),
        ("bench.worker_memory", ("--runs", "--steps", "--slots")),
        ("bench.outbox_throughput", ("--rows", "--batch", "--parallel", "--scan-seconds")),
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


def test_service_bench_refuses_settings_serve_would_refuse() -> None:
    """S-56: a lease not above 3 x authority_seconds is refused before any process or database is made."""
    proc = run("-m", "bench.failover_latency", "--lease-seconds", "3", "--authority-seconds", "1")
    assert proc.returncode == 2
    assert "3 × worker.authority_seconds must be less than worker.lease_seconds" in proc.stderr


def test_read_memory_kib_parses_proc_status() -> None:
    from bench._service import read_memory_kib

    status = "Name:\tpython\nVmPeak:\t  900 kB\nVmHWM:\t  145012 kB\nVmRSS:\t  120000 kB\nThreads:\t4\n"
    assert read_memory_kib(status) == {"VmHWM": 145012, "VmRSS": 120000}
    with pytest.raises(ValueError, match="VmHWM"):
        read_memory_kib("VmRSS:\t1 kB\n")


def test_failover_round_sizes_take_every_trial_from_full_rounds_first() -> None:
    """S-28: the kill trials are runs a signalled worker held; 50 trials at 4 runs per signal need 13 kills."""
    from bench.failover_latency import round_sizes

    assert round_sizes(50, 4) == [4] * 12 + [2]
    assert round_sizes(8, 4) == [4, 4] and round_sizes(1, 4) == [1] and round_sizes(0, 4) == []
    with pytest.raises(ValueError, match="runs_per_signal"):
        round_sizes(5, 0)


def test_run_all_time_table_gives_each_bench_and_the_budget_verdict() -> None:
    from bench.run_all import BUDGET_SECONDS, BenchRun, time_table

    runs = [BenchRun("a", [], 0, 300.0, "", ""), BenchRun("b", [], 1, 100.0, "", "")]
    lines = time_table(runs, 400.0)
    assert lines[2:4] == ["| a | 300.0 | 75% | 0 |", "| b | 100.0 | 25% | 1 |"]
    assert lines[-1].endswith("within the 15-minute budget: yes |") and "**400.0**" in lines[-1]
    assert time_table(runs, BUDGET_SECONDS + 1.0)[-1].endswith("budget: **no** |")


def test_percentile_is_nearest_rank() -> None:
    from bench._store import percentile

    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 0.5), percentile(values, 0.99), percentile([7.0], 0.99)) == (51.0, 99.0, 7.0)


@pytest.mark.postgres
@pytest.mark.crash
def test_failover_latency_kills_and_drains_real_workers(tmp_path: Path, postgres_server: str) -> None:
    """S-28: after SIGKILL the run continues on the other worker process from its last checkpoint (a `recovery`
    attempt) and completes; S-53: after SIGTERM the draining attempt hands off (a `handoff` attempt)."""
    stdout, data = run_service_bench("failover_latency", tmp_path, "--trials", "2", "--drain-trials", "1",
                                     "--runs-per-signal", "2")
    for label, reason, trials in (("kill", "recovery", 2), ("drain", "handoff", 1)):
        figures = data[label]
        # One signal per label: the kill interrupts two runs at once, each of them one trial.
        assert figures["other_worker"] == figures["completed"] == figures["trials"] == len(figures["seconds"]) == trials
        assert figures["signals"] == 1
        assert figures["start_reasons"] == [reason] and figures["p50"] > 0
    assert data["kill"]["p50"] > data["settings"]["lease_seconds"] - data["settings"]["authority_seconds"]
    assert "SIGKILL -> continuation's first checkpoint" in stdout and "lease_seconds=3.0" in stdout
    assert len(data["verdicts"]) == 2


@pytest.mark.postgres
def test_resume_latency_resumes_waiting_runs_over_http(tmp_path: Path, postgres_server: str) -> None:
    """S-80: every resume of a waiting run answers 201 (a new successor), measured at each client count."""
    stdout, data = run_service_bench("resume_latency", tmp_path, "--clients", "1,2", "--requests", "4",
                                     "--warmup", "1")
    assert [(r["clients"], r["requests"]) for r in data["results"]] == [(1, 4), (2, 4)]
    assert all(0 < r["p50_ms"] <= r["p99_ms"] <= r["max_ms"] for r in data["results"])
    assert data["verdicts"] == []  # the target is set at 32 clients, not measured here
    assert "p99 ms" in stdout


def test_baseline_src_must_hold_the_candor_package(tmp_path: Path) -> None:
    """A directory without `candor/` would import this checkout's candor and compare it with itself."""
    proc = run("-m", "bench.resume_latency", "--baseline-src", str(ROOT))
    assert proc.returncode == 2 and "holds no candor package" in proc.stderr
    from bench import _cli

    assert _cli.candor_source(str(ROOT / "src")) == (ROOT / "src").resolve()


@pytest.mark.postgres
def test_resume_latency_measures_a_baseline_source_side_by_side(tmp_path: Path, postgres_server: str) -> None:
    """`--baseline-src`: a second control process importing that source is measured at every client count, in
    interleaved rounds; only this checkout's figures count for the target and docs/benchmarks.md's table."""
    stdout, data = run_service_bench("resume_latency", tmp_path, "--clients", "2", "--requests", "4", "--warmup",
                                     "1", "--rounds", "2", "--baseline-src", str(ROOT / "src"))
    assert [(r["system"], r["clients"], r["requests"]) for r in data["results"]] == [("candor", 2, 4),
                                                                                     ("baseline", 2, 4)]
    assert all(r["control_net_cpu_ms"] <= r["control_cpu_ms"] for r in data["results"])
    assert set(data["control_idle_cpu_ms_per_s"]) == {"candor", "baseline"}
    assert "baseline" in stdout and "load average" in stdout
    from bench import resume_latency

    assert len(resume_latency.table(data)) == 3  # header, rule, this checkout's one level


@pytest.mark.postgres
def test_service_throughput_completes_every_run(tmp_path: Path, postgres_server: str) -> None:
    """S-12: one worker process with 4 slots completes every submitted run; runs/s and queue wait are reported."""
    stdout, data = run_service_bench("service_throughput", tmp_path, "--workers", "1", "--runs", "4", "--steps", "2")
    (result,) = data["results"]
    assert result["completed"] == result["runs"] == 4 and result["slots_per_worker"] == 4
    assert result["runs_per_s"] > 0 and 0 <= result["queue_wait_ms_p50"] <= result["queue_wait_ms_p99"]
    assert all(v["met"] for v in data["verdicts"])
    assert "runs/s" in stdout


@pytest.mark.postgres
def test_worker_memory_reads_the_worker_process_memory(tmp_path: Path, postgres_server: str) -> None:
    """S-19: slots come back after every run (all runs complete); the worker's RSS is read from /proc."""
    stdout, data = run_service_bench("worker_memory", tmp_path, "--runs", "4", "--steps", "3")
    assert data["completed"] == 4
    assert 0 < data["rss_ready_kib"] <= data["peak_kib"] and data["rss_end_kib"] <= data["peak_kib"]
    assert [v["target"].split(" ")[0] for v in data["verdicts"]] == ["peak", "RSS"]
    assert "peak RSS (VmHWM)" in stdout


@pytest.mark.postgres
def test_outbox_throughput_delivers_every_row_once(tmp_path: Path, postgres_server: str) -> None:
    """S-108: every staged webhook row is POSTed, answered 2xx and settled `delivered`; the receiver saw each
    delivery id once."""
    stdout, data = run_service_bench("outbox_throughput", tmp_path, "--rows", "20", "--batch", "8",
                                     "--parallel", "4")
    assert data["statuses"] == {"delivered": 20}
    assert data["receiver"] == {"requests": 20, "deliveries": 20, "duplicates": 0}
    assert data["passes"] >= 3 and data["rows_per_pass_mean"] <= 8  # batch bounds a pass (§9.2)
    assert data["verdicts"][1]["met"]
    assert "deliveries/s" in stdout


@pytest.mark.postgres
def test_service_steps_measures_every_system_side_by_side(tmp_path: Path, postgres_server: str) -> None:
    """Issue 12: the service (control + worker processes) on both databases and the in-process systems run the same
    workloads in one run; CPU per step of every process, commits, bytes and created -> claim are reported."""
    systems = "pydantic-ai,harness,candor-service+sqlite,candor-service+postgresql"
    stdout, data = run_service_bench("service_steps", tmp_path, "--rounds", "2", "--sequential-steps", "2",
                                     "--concurrent", "2x2", "--systems", systems)
    by_system = {(r["system"], r["workload"]): r for r in data["results"]}
    assert {system for system, _ in by_system} == set(systems.split(","))
    service = by_system[("candor-service+postgresql", "sequential 2 steps")]
    assert set(service["cpu_ms_per_step"]) == {"control", "worker"} and len(service["steps_per_s_by_round"]) == 2
    assert by_system[("pydantic-ai", "2 concurrent x 2 steps, 20 ms model")]["steps_per_s"] > 0
    stats = {s["system"]: s for s in data["systems"]}
    assert stats["candor-service+postgresql"]["commits_per_step"] > 0
    assert stats["candor-service+sqlite"]["claims"] == 2 and stats["candor-service+sqlite"]["bytes_per_run"] > 0
    assert any("created -> first claim" in v["target"] for v in data["verdicts"])
    assert "service_steps:" in stdout


def test_run_all_quick_writes_a_report(tmp_path: Path) -> None:
    report = tmp_path / "benchmarks.md"
    proc = run("-m", "bench.run_all", "--quick", "--output", str(report), timeout=600)
    text = report.read_text(encoding="utf-8") if report.exists() else "(no report)"
    assert proc.returncode == 0, proc.stderr[-2000:] + "\n" + text[-6000:]  # the report holds each bench's errors
    for needle in ("# Benchmarks", "## Machine", "`nproc`", "/proc/meminfo", "pydantic-ai-slim", "## harness_overhead",
                   "python -m bench.harness_overhead --steps 2 --reps 2", "| PostgreSQL |", "## checkpoint_cost",
                   "## durable_steps", "--no-langgraph", "Reading:", "## failover_latency", "## resume_latency",
                   "## service_throughput", "## service_steps", "## worker_memory", "## outbox_throughput", "## Time per benchmark",
                   "| **Total** |"):
        assert needle in text
    assert "Not benchmarked yet" not in text
    assert RATIO.search(text) is not None


def test_soak_figures_count_duplicates_and_failover_from_the_last_kill() -> None:
    """Issue 15 item 2: a run tag with two `charge` lines is a duplicate effect; a failover sample runs from the
    last SIGKILL before the recovery to the next attempt's first checkpoint (S-28)."""
    from bench.soak import duplicate_effects, failover_seconds

    assert duplicate_effects(["a 1", "b 1", "a 2", "", "c 3"]) == {"a": 2}
    assert failover_seconds([10.0, 20.0], [(12.0, 15.0), (25.0, 26.5), (5.0, 6.0), (21.0, None)]) == [5.0, 6.5]


@pytest.mark.postgres
@pytest.mark.crash
def test_soak_tiny_run_loses_nothing(tmp_path: Path, postgres_server: str) -> None:
    """Issue 15 item 2 (tiny): workers SIGKILLed and restarted, one drained, then a private PostgreSQL server
    restarted mid-phase: no run lost, no non-retry-safe effect duplicated (S-28, S-29)."""
    stdout, data = run_service_bench("soak", tmp_path, "--runs", "12", "--restart-runs", "6", "--kill-every", "2",
                                     "--steps", "10", "--max-seconds", "40", "--settle-seconds", "60", "--in-flight", "6")
    phases = {p["phase"]: p for p in data["phases"]}
    assert set(phases) == {"kills", "pg restart"}
    for phase in phases.values():
        assert phase["submitted"] == phase["runs_asked"] and phase["lost"] == 0, phase
        assert phase["duplicate_effects"] == 0 and phase["rss_mb"]["max"] > 0, phase
    assert phases["kills"]["kills"] >= 1
    assert any("SIGTERM" in event for event in phases["kills"]["events"])
    assert any("PostgreSQL restarted" in event for event in phases["pg restart"]["events"])
    assert phases["pg restart"]["statuses"] == {"completed": 6}
    assert "lost runs = 0" in stdout
