"""Runs in flight: one worker process holds 1,000 runs at once (scripted model answering in 1 s) with at most 20
PostgreSQL connections and RSS <= 300 MB (issue 33 item 2, spec §7.8.1).

On a fresh PostgreSQL database, one `candor serve --role control` and one `candor serve --role worker` process with
`worker.slots` = `--runs` and the default pool (`database.pool_size` 10, `max_overflow` 5: a budget of 16 with the
LISTEN connection). The benchmark submits `--runs` scripted runs (each `--steps` tool calls, the model sleeping
`--model-seconds` before every answer, so a run spends nearly all its time waiting on its model), starts the worker
once all are queued (so that how many are in flight at once depends on the worker, not on how fast the benchmark
submits), then, every `--sample-seconds` until every run is sealed, reads:

* the worker's PostgreSQL connections from `pg_stat_activity`, by its `application_name`
  (`candor-worker-<host>-<pid>`, store/db/connections.py): all of them, and those running a statement (`active`);
* the worker's resident set (`VmRSS`, and `VmHWM` at the end) from `/proc/<pid>/status`;
* the runs `running` at that moment (the runs in flight).

Reported: peak runs in flight, peak connections (all and active), peak RSS, runs completed and failed (with their
failure codes), and attempts per run (a run that needed a second attempt was charged one: 1.0 is the target).

    python -m bench.runs_in_flight [--runs 1000] [--steps 10] [--model-seconds 1]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import sys
import time
from collections import Counter
from typing import Any

from sqlalchemy import select, text

from . import _cli, _service, _store

CONNECTION_TARGET = 20
RSS_TARGET_MB = 300.0
IN_FLIGHT_TARGET = 1000
QUICK_ARGS = ["--runs", "20", "--steps", "2", "--model-seconds", "0.3"]
"""Arguments for a smoke run (`python -m bench.run_all --quick`, tests/e2e/bench/test_bench_service_smoke.py)."""

_CONNECTIONS = text(
    "SELECT count(*) AS total, count(*) FILTER (WHERE state = 'active') AS active "
    "FROM pg_stat_activity WHERE application_name = :name"
)


def worker_application_name(pid: int) -> str:
    """The `application_name` of the worker process `pid` started on this machine (`connections.application_name`)."""
    from candor.service.store.db.connections import application_name

    return application_name("worker", pid=pid, host=socket.gethostname())


def attempts_summary(attempts: list[int]) -> dict[str, Any]:
    """Attempts per run (pure): the mean, the most, and how many runs needed more than one."""
    if not attempts:
        return {"mean": None, "max": None, "runs_with_retries": 0}
    return {
        "mean": round(sum(attempts) / len(attempts), 3),
        "max": max(attempts),
        "runs_with_retries": sum(1 for a in attempts if a > 1),
    }


def verdicts(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The issue's targets, judged on the figures (pure). The in-flight target applies at the full size only."""
    peak = summary["peak"]
    out = []
    if summary["runs"] >= IN_FLIGHT_TARGET:
        out.append(
            {
                "target": f"runs in flight on one worker >= {IN_FLIGHT_TARGET}",
                "value": str(peak["in_flight"]),
                "met": peak["in_flight"] >= IN_FLIGHT_TARGET,
            }
        )
    out += [
        {
            "target": f"worker PostgreSQL connections <= {CONNECTION_TARGET}",
            "value": f"{peak['connections']} (at most {peak['active']} running a statement)",
            "met": peak["connections"] <= CONNECTION_TARGET,
        },
        {
            "target": f"worker peak RSS <= {RSS_TARGET_MB:.0f} MB",
            "value": f"{peak['rss_mb']:.1f} MB",
            "met": peak["rss_mb"] <= RSS_TARGET_MB,
        },
        {
            "target": "runs failed = 0",
            "value": f"{summary['failed']} of {summary['runs']}",
            "met": summary["failed"] == 0,
        },
        {
            "target": "attempts per run = 1 (no charged attempt)",
            "value": str(summary["attempts"]["mean"]),
            "met": summary["attempts"]["max"] == 1,
        },
    ]
    return out


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "bench": "runs_in_flight",
        "runs": args.runs,
        "steps": args.steps,
        "model_seconds": args.model_seconds,
        "skipped": {},
        "verdicts": [],
    }
    reason = await _service.postgres_or_skip(args.postgres_url)
    if reason is not None:
        summary["skipped"]["runs_in_flight"] = reason
        return summary
    summary["postgres_version"] = await _store.postgres_version(args.postgres_url)
    worker_settings = {"slots": args.runs, "scan_seconds": 0.2}
    async with _service.service_database(args.postgres_url, worker=worker_settings) as db:
        await db.processes_ready(["control"])
        options = {"script": "loop", "steps": args.steps, "model_seconds": args.model_seconds}
        started = time.perf_counter()
        run_ids = await _submit_all(db, options, args.runs)
        summary["submit_seconds"] = round(time.perf_counter() - started, 2)
        # The worker starts once every run is queued: it claims them as fast as it can, so the runs in flight
        # measure the worker, not how fast this process submits.
        (worker,) = await db.processes_ready(["worker"])
        name = worker_application_name(worker.pid)
        started = time.perf_counter()
        samples: list[dict[str, Any]] = []
        deadline = time.monotonic() + args.max_seconds
        while time.monotonic() < deadline:
            sample = await _sample(db, name, worker)
            samples.append({"seconds": round(time.perf_counter() - started, 2), **sample})
            if sample["sealed"] >= args.runs:
                break
            await asyncio.sleep(args.sample_seconds)
        summary["seconds"] = round(time.perf_counter() - started, 2)
        summary["worker_peak_rss_mb"] = round(worker.memory_kib()["VmHWM"] / 1024, 1)
        summary.update(await _outcomes(db, run_ids))
    summary["samples"] = samples
    summary["peak"] = {
        "in_flight": max(s["running"] for s in samples),
        "connections": max(s["connections"] for s in samples),
        "active": max(s["active"] for s in samples),
        "rss_mb": summary["worker_peak_rss_mb"],
    }
    summary["verdicts"] = verdicts(summary)
    return summary


SUBMITTERS = 8
"""Concurrent submissions: enough to put 1,000 runs in flight within a few seconds, within the bench's own pool."""


async def _submit_all(db: _service.ServiceDatabase, options: dict[str, Any], count: int) -> list[str]:
    """Every run submitted, `SUBMITTERS` at a time; their ids in submission order."""
    indexes = iter(range(count))
    ids: dict[int, str] = {}

    async def submitter() -> None:
        for index in indexes:
            ids[index] = await db.submit(options, key=f"in-flight-{index}")

    await asyncio.gather(*(submitter() for _ in range(SUBMITTERS)))
    return [ids[index] for index in range(count)]


async def _sample(db: _service.ServiceDatabase, name: str, worker: _service.ServiceProcess) -> dict[str, Any]:
    async with db.service.engine.connect() as conn:
        row = (await conn.execute(_CONNECTIONS, {"name": name})).one()
    return {
        "connections": int(row.total),
        "active": int(row.active),
        "running": await db.count_runs("running"),
        "sealed": await db.count_runs(*_service.SEALED),
        "rss_mb": round(worker.memory_kib()["VmRSS"] / 1024, 1),
    }


async def _outcomes(db: _service.ServiceDatabase, run_ids: list[str]) -> dict[str, Any]:
    from candor.service.store.schema.tables import runs

    async with db.service.engine.connect() as conn:
        rows = (
            await conn.execute(select(runs.c.status, runs.c.failure, runs.c.attempts).where(runs.c.id.in_(run_ids)))
        ).all()
    statuses = Counter(r.status for r in rows)
    failures = Counter((r.failure or {}).get("code") for r in rows if r.status == "failed")
    return {
        "statuses": dict(statuses),
        "completed": statuses.get("completed", 0),
        "failed": statuses.get("failed", 0),
        "unsealed": len(run_ids) - sum(statuses[s] for s in _service.SEALED),
        "failure_codes": dict(failures),
        "attempts": attempts_summary([int(r.attempts) for r in rows]),
    }


def report(summary: dict[str, Any]) -> str:
    lines = [
        f"runs_in_flight: one worker, {summary['runs']} runs of {summary['steps']} steps, model "
        f"{summary['model_seconds']} s per answer, PostgreSQL"
    ]
    if "peak" in summary:
        peak = summary["peak"]
        lines += [
            f"  submitted in {summary['submit_seconds']} s; all sealed {summary['seconds']} s after the worker was "
            f"ready: "
            f"{summary['statuses']}",
            f"  peak runs in flight: {peak['in_flight']}; worker connections: {peak['connections']} "
            f"(at most {peak['active']} active); worker peak RSS {peak['rss_mb']} MB",
            f"  attempts per run: {summary['attempts']}; failures: {summary['failure_codes'] or 'none'}",
        ]
    lines.extend(_cli.target_lines(summary))
    return "\n".join(lines)


def table(summary: dict[str, Any]) -> list[str]:
    """The figures as a Markdown table, for docs/benchmarks.md (targets are added by `bench.run_all`)."""
    if "peak" not in summary:
        return []
    peak = summary["peak"]
    return [
        "| Metric | Value |",
        "|---|---|",
        f"| Runs x steps, model seconds | {summary['runs']} x {summary['steps']}, {summary['model_seconds']} |",
        f"| Sealed | {summary['statuses']} in {summary['seconds']} s |",
        f"| Peak runs in flight | {peak['in_flight']} |",
        f"| Worker PostgreSQL connections (peak; active) | {peak['connections']}; {peak['active']} |",
        f"| Worker peak RSS | {peak['rss_mb']} MB |",
        f"| Attempts per run (mean, max) | {summary['attempts']['mean']}, {summary['attempts']['max']} |",
    ]


def reading(summary: dict[str, Any]) -> list[str]:
    out: list[str] = []
    if "peak" in summary:
        peak = summary["peak"]
        out.append(
            f"{peak['in_flight']} runs were in flight at once on one worker, waiting on their model, while the worker "
            f"held at most {peak['connections']} PostgreSQL connections ({peak['active']} running a statement at the "
            f"busiest sample): a waiting run holds no connection (§7.8.1)."
        )
    out.extend(_cli.missed_lines(summary))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.runs_in_flight", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000, help="runs submitted at once = worker.slots (default: 1000)")
    parser.add_argument("--steps", type=int, default=10, help="tool steps per run (default: 10)")
    parser.add_argument("--model-seconds", type=float, default=1.0, help="model latency per answer (default: 1)")
    parser.add_argument("--sample-seconds", type=float, default=0.25, help="sampling period (default: 0.25)")
    parser.add_argument("--max-seconds", type=float, default=180.0, help="longest wait for the runs (default: 180)")
    _cli.add_postgres_url(parser)
    _cli.add_json(parser)
    args = parser.parse_args(argv)
    if args.runs < 1 or args.steps < 1 or args.model_seconds < 0:
        parser.error("--runs and --steps must be >= 1, --model-seconds >= 0")
    if (problem := _service.settings_problem(worker={"slots": args.runs})) is not None:
        parser.error(problem)
    summary = asyncio.run(measure(args))
    return _cli.emit(summary, report, args.json)


if __name__ == "__main__":
    sys.exit(main())
