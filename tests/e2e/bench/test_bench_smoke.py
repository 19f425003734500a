"""Smoke tests for the benchmarks: they start, finish with tiny sizes, and report what they promise."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
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


IN_PROCESS_BENCHES = ("harness_overhead", "checkpoint_cost", "durable_steps")
"""Run together by one `run_all` test. Every other benchmark starts real processes and has a test of its own: here
the two that time leases of a few seconds under kills (failover_latency, soak), in tests/e2e/bench/test_bench_service_smoke.py
the others. `make test` (`--dist loadfile`) runs a file's tests one after the other on one worker, so the two files'
service benchmarks run at most two at a time, never failover_latency beside soak."""


def run_quick(tmp_path: Path, *names: str) -> tuple[str, dict[str, dict[str, Any]]]:
    """`python -m bench.run_all --quick --only NAME...`: each benchmark with its QUICK_ARGS (tiny sizes) in its own
    process. Checks the report (the machine, each benchmark's section with its output and a reading, the time table)
    and returns it with each benchmark's JSON summary (parsed JSON: Any)."""
    report, summaries = tmp_path / "benchmarks.md", tmp_path / "summaries"
    only = [arg for name in names for arg in ("--only", name)]
    proc = run(
        "-m", "bench.run_all", "--quick", *only, "--output", str(report), "--summaries", str(summaries), timeout=600
    )
    text = report.read_text(encoding="utf-8") if report.exists() else "(no report)"
    assert proc.returncode == 0, proc.stderr[-2000:] + "\n" + text[-6000:]  # the report holds each bench's errors
    needles = [
        "# Benchmarks",
        "## Machine",
        "`nproc`",
        "/proc/meminfo",
        "pydantic-ai-slim",
        "| PostgreSQL |",
        "Reading:",
        "Output:",
        "## Time per benchmark",
        "| **Total** |",
    ]
    for name in names:
        needles += [f"## {name}", f"Command: `python -m bench.{name}", f"| {name} | "]
    for needle in needles:
        assert needle in text, needle
    assert "Not benchmarked yet" not in text
    data = {name: json.loads((summaries / f"{name}.json").read_text(encoding="utf-8")) for name in names}
    assert all(data[name]["bench"] == name for name in names)
    return text, data


def run_service_bench(module: str, tmp_path: Path) -> tuple[str, dict[str, Any]]:
    """One service benchmark through `run_quick`: the report (which holds its stdout) and its summary, in which
    nothing is skipped (no target measured as missing for lack of data)."""
    text, data = run_quick(tmp_path, module)
    assert data[module]["skipped"] == {}, data[module].get("skipped")
    return text, data[module]


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
        ("bench.runs_in_flight", ("--runs", "--steps", "--model-seconds", "--max-seconds")),
        ("bench.soak", ("--runs", "--restart-runs", "--fault-runs")),
        ("bench.outbox_throughput", ("--rows", "--batch", "--parallel", "--scan-seconds")),
        ("bench.step_instructions", ("--steps", "--runs", "--wait-rounds", "--backends", "--baseline-src")),
    ],
)
def test_store_bench_help(module: str, options: tuple[str, ...]) -> None:
    proc = run("-m", module, "--help")
    assert proc.returncode == 0, proc.stderr
    for option in options:
        assert option in proc.stdout


def test_checkpoint_cost_tiny_run_prints_flat_bytes(tmp_path: Path) -> None:
    summary = tmp_path / "cost.json"
    proc = run(
        "-m",
        "bench.checkpoint_cost",
        "--sizes",
        "4,8",
        "--commits",
        "2",
        "--backends",
        "sqlite",
        "--json",
        str(summary),
    )
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
    proc = run(
        "-m",
        "bench.durable_steps",
        "--steps",
        "2,5",
        "--runs",
        "1",
        "--backends",
        "sqlite",
        "--no-langgraph",
        "--json",
        str(summary),
    )
    assert proc.returncode == 0, proc.stderr
    assert "langgraph: SKIPPED (--no-langgraph given)" in proc.stdout
    data = json.loads(summary.read_text(encoding="utf-8"))
    variants = {(r["variant"], r["steps"]) for r in data["rows"]}
    assert variants == {("pydantic-ai", 2), ("candor+sqlite", 2), ("pydantic-ai", 5), ("candor+sqlite", 5)}
    candor = next(r for r in data["rows"] if r["variant"] == "candor+sqlite" and r["steps"] == 5)
    assert candor["steps_per_s"] > 0 and candor["writes_per_run"] == 2 * 5 + 2
    assert len(candor["step_bytes"]) == 5 and all(b > 0 for b in candor["step_bytes"])
    assert candor["stored_bytes"] >= sum(candor["step_bytes"])


@pytest.mark.postgres
def test_durable_steps_measures_the_floor_beside_candor_on_postgresql(tmp_path: Path, postgres_server: str) -> None:
    """Issue 12: the floor variant (the Harness with a bare INSERT per boundary) runs interleaved with candor on
    PostgreSQL and the reading compares candor's commit with it."""
    from bench.durable_steps import reading

    summary = tmp_path / "steps.json"
    proc = run(
        "-m",
        "bench.durable_steps",
        "--steps",
        "3",
        "--runs",
        "2",
        "--backends",
        "postgresql",
        "--no-langgraph",
        "--json",
        str(summary),
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(summary.read_text(encoding="utf-8"))
    floor = next(r for r in data["rows"] if r["variant"] == "floor+postgresql")
    assert floor["steps"] == 3 and len(floor["run_seconds"]) == 2 and floor["steps_per_s"] > 0
    (line,) = [line for line in reading(data) if line.startswith("floor+postgresql, 3 steps")]
    assert "per boundary than that write" in line and "LangGraph" not in line  # no peer measured here


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
@pytest.mark.slow
def test_failover_latency_kills_and_drains_real_workers(tmp_path: Path, postgres_server: str) -> None:
    """S-28: after SIGKILL the run continues on the other worker process from its last checkpoint (a `recovery`
    attempt) and completes; S-53: after SIGTERM the draining attempt hands off (a `handoff` attempt)."""
    stdout, data = run_service_bench("failover_latency", tmp_path)
    for label, reason, trials in (("kill", "recovery", 2), ("drain", "handoff", 1)):
        figures = data[label]
        # One signal per label: the kill interrupts two runs at once, each of them one trial.
        assert figures["other_worker"] == figures["completed"] == figures["trials"] == len(figures["seconds"]) == trials
        assert figures["signals"] == 1
        assert figures["start_reasons"] == [reason] and figures["p50"] > 0
    assert data["kill"]["p50"] > data["settings"]["lease_seconds"] - data["settings"]["authority_seconds"]
    assert "SIGKILL -> continuation's first checkpoint" in stdout and "lease_seconds=3.0" in stdout
    assert len(data["verdicts"]) == 2


def test_every_benchmark_has_a_quick_run_test() -> None:
    from bench.run_all import discover

    source = "".join(p.read_text(encoding="utf-8") for p in sorted(Path(__file__).parent.glob("test_bench*smoke.py")))
    services = [name for name in discover() if name not in IN_PROCESS_BENCHES]
    assert set(IN_PROCESS_BENCHES) <= set(discover())
    assert all(source.count(f'run_service_bench("{name}", tmp_path)') == 1 for name in services), services


def test_baseline_src_must_hold_the_candor_package() -> None:
    """A directory without `candor/` would import this checkout's candor and compare it with itself."""
    proc = run("-m", "bench.resume_latency", "--baseline-src", str(ROOT))
    assert proc.returncode == 2 and "holds no candor package" in proc.stderr
    from bench import _cli

    assert _cli.candor_source(str(ROOT / "src")) == (ROOT / "src").resolve()


@pytest.mark.slow
def test_run_all_quick_writes_a_report(tmp_path: Path) -> None:
    text, _ = run_quick(tmp_path, *IN_PROCESS_BENCHES)
    assert "python -m bench.harness_overhead --steps 2 --reps 2" in text and "--no-langgraph" in text
    assert RATIO.search(text) is not None


def test_soak_figures_count_duplicates_and_failover_from_the_last_kill() -> None:
    """Issue 15 item 2: a run tag with two `charge` lines is a duplicate effect; a failover sample runs from the
    last SIGKILL before the recovery to the next attempt's first checkpoint (S-28)."""
    from bench.soak import duplicate_effects, failover_seconds

    assert duplicate_effects(["a 1", "b 1", "a 2", "", "c 3"]) == {"a": 2}
    assert failover_seconds([10.0, 20.0], [(12.0, 15.0), (25.0, 26.5), (5.0, 6.0), (21.0, None)]) == [5.0, 6.5]


@pytest.mark.postgres
@pytest.mark.crash
@pytest.mark.slow
def test_soak_tiny_run_loses_nothing(tmp_path: Path, postgres_server: str) -> None:
    """Issue 15 item 2 (tiny): workers SIGKILLed and restarted, one drained, then a private PostgreSQL server
    restarted mid-phase: no run lost, no non-retry-safe effect duplicated (S-28, S-29)."""
    stdout, data = run_service_bench("soak", tmp_path)
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


def test_step_instructions_adds_up_every_dump_of_a_process(tmp_path: Path) -> None:
    """callgrind writes a dump per `callgrind_control -d` and one at exit: a process's count is their `totals:`."""
    from bench.step_instructions import counted

    out = tmp_path / "callgrind.worker"
    out.write_text("events: Ir\nsummary: 0\ntotals: 0\n")  # at exit, after instrumentation was switched off
    (tmp_path / "callgrind.worker.1").write_text("events: Ir\nsummary: 7\nfl=x\n1 5\ntotals: 1234\n")
    (tmp_path / "callgrind.workerless").write_text("totals: 99\n")  # another process's file: a different name
    assert counted(out) == 1234


def test_resume_latency_reading_survives_a_level_under_one_cpu_tick() -> None:
    """A quick run's few resumes can take less CPU than one 10 ms tick: the reading says so instead of dividing
    by zero (CI saw that ZeroDivisionError on a fast machine)."""
    from bench import resume_latency

    level: dict[str, float | str] = {
        "clients": 2,
        "requests": 4,
        "p50_ms": 17.9,
        "p99_ms": 18.0,
        "max_ms": 18.0,
        "requests_per_s": 128.9,
    }
    level |= {"control_cpu_ms": 0.0, "machine_busy": 1.0, "system": "candor"}
    summary = {"results": [level], "verdicts": [], "skipped": {}}
    lines = resume_latency.reading(summary)
    assert any("under one tick of its CPU clock" in line for line in lines)


async def test_service_steps_status_poll_counts_sealed_runs_on_sqlite(tmp_path: Path) -> None:
    """The benchmark's status poll (issue 12): how many of the given runs are sealed, in one read on the stdlib
    driver; runs of other ids and unsealed runs do not count."""
    import sqlite3

    from bench.service_steps import Database, StatusPoll

    path = tmp_path / "poll.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE runs (id TEXT PRIMARY KEY, status TEXT NOT NULL)")
        conn.executemany(
            "INSERT INTO runs VALUES (?, ?)",
            [("a", "completed"), ("b", "running"), ("c", "waiting"), ("d", "failed")],
        )
    poll = await StatusPoll.open(Database("sqlite", f"sqlite:///{path}", path=path))
    try:
        assert await poll.sealed(["a", "b", "c"]) == 2
        assert await poll.sealed(["b"]) == 0
        assert poll.statements == 0  # only PostgreSQL polls are commits to leave out
    finally:
        await poll.close()


def test_service_steps_peer_server_is_told_its_shapes_and_names_why_it_exited(tmp_path: Path) -> None:
    """The peers' step server is told the workload shapes up front (DBOS registers one agent per shape before it
    launches), as the keys its workload commands are looked up by, and a server that exits is reported with the
    exception it died of, not just its status."""
    import asyncio
    import importlib.util
    from types import SimpleNamespace

    from bench.service_steps import (
        MODEL_SECONDS_CONCURRENT,
        STEP_SERVER,
        PeerSystem,
        Workload,
        last_error_line,
        shapes_argument,
    )

    spec = importlib.util.spec_from_file_location("step_server", STEP_SERVER)
    assert spec is not None and spec.loader is not None
    step_server = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(step_server)
    asked = [
        Workload("a", 80, 1, 1, 0.0),
        Workload("b", 20, 16, 16, MODEL_SECONDS_CONCURRENT),
        Workload("c", 80, 2, 1, 0.0),
    ]
    command = json.loads(json.dumps({"steps": 20, "model_seconds": MODEL_SECONDS_CONCURRENT}))  # as sent on stdin
    assert step_server.parse_shapes(shapes_argument(asked)) == [(20, 0.02), (80, 0.0)]
    assert (command["steps"], command["model_seconds"]) in step_server.parse_shapes(shapes_argument(asked))

    shapes = [Workload("tiny", 3, 1, 1, 0.0)]
    bare = PeerSystem("pydantic-ai", None, Path(sys.executable), "pydantic-ai", shapes, tmp_path)
    try:
        assert asyncio.run(bare.run(shapes[0])) > 0
    finally:
        asyncio.run(bare.close())
    database: Any = SimpleNamespace(url="postgresql://postgres@127.0.0.1:1/unused")
    with pytest.raises(RuntimeError, match=r"step server exited \(status 1\): ModuleNotFoundError: .*dbos"):
        PeerSystem("dbos+postgresql", database, Path(sys.executable), "dbos", shapes, tmp_path)  # not in this venv
    assert last_error_line("Traceback:\n  File 'x'\nKeyError: (1, 0.02)\n\n") == "KeyError: (1, 0.02)"
    assert last_error_line("") == "(nothing on stderr)"


def test_fault_checks_compare_the_ledger_with_what_the_models_were_told() -> None:
    """Issue 34 item 6 (S-29): a run told `unknown` whose `charge` ran is a false unknown; two executions are a
    duplicate; an execution by a process after it was frozen is an effect after a lost lease."""
    from bench._faults import LedgerLine, duplicate_effects, effects_after, false_unknowns

    ledger = [
        LedgerLine("a", "call_charge", 10, 1.0),
        LedgerLine("b", "call_charge", 11, 2.0),
        LedgerLine("b", "call_charge", 12, 5.0),
    ]
    assert duplicate_effects(ledger) == {"b": 2}
    assert false_unknowns({"a": True, "b": False, "c": True}, ledger) == ["a"]  # c never ran: a true unknown
    assert effects_after(ledger, pid=12, since=4.0) == [ledger[2]]
    assert effects_after(ledger, pid=11, since=4.0) == []


def test_soak_fault_verdicts_spare_the_faults_longer_than_the_lease_their_charged_attempt() -> None:
    """Issue 34 item 6: a fault shorter than the lease must cost no charged attempt; SIGSTOP past the lease may
    (its lease did expire), but never an effect after the lost lease."""
    from bench.soak import fault_verdicts

    zero = {
        "lost": 0,
        "duplicate_effects": 0,
        "effects_after_lost_lease": 0,
        "false_unknowns": 0,
        "unknown_outcomes": 0,
    }
    verdicts = fault_verdicts(
        [
            {**zero, "fault": "pg_restart", "charged_attempts": 1},
            {**zero, "fault": "sigstop", "charged_attempts": 1},
            {**zero, "fault": "sigstop_in_tool", "charged_attempts": 1, "effects_after_lost_lease": 1},
        ]
    )
    assert [v["met"] for v in verdicts] == [False, True, False]
