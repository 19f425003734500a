"""Service throughput: completed 5-step runs per second with 1, 2 and 4 worker processes (issue 8, item 5).

On a fresh PostgreSQL database for each worker count: one `candor serve --role control` process and N
`candor serve --role worker` processes (service defaults: `worker.slots` = 64, `worker.lease_seconds` = 30,
`worker.scan_seconds` = 1, workers woken by PostgreSQL NOTIFY). After a warm-up of one run per slot, the benchmark
submits `--runs` scripted runs (`--steps` instant tool calls each) through the command layer of `POST /v1/threads`,
closed loop: it keeps at most two runs per slot submitted but not sealed, so the workers are always busy but the
queue stays short. Runs/s = measured runs / (last `sealed_at` - first `created_at`), both from the database
clock. Queue wait = the first attempt's `created_at` (the claim) - the run's `created_at` (its acceptance, when
it became due): what `candor_attempt_queue_wait_seconds` observes. Run time = `sealed_at` - the attempt's
`started_at`. The machine has 2 cores shared by the control process, the workers, PostgreSQL and the submitting
benchmark process itself, so more worker processes than cores cannot scale linearly.

    python -m bench.service_throughput [--workers 1,2,4] [--runs 120] [--steps 5]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from typing import Any

from rich.console import Console
from rich.progress import Progress
from sqlalchemy import select

from candor.service.store.schema.tables import run_attempts, runs

from . import _cli, _service, _store

QUICK_ARGS = ["--workers", "1", "--runs", "4", "--steps", "2"]
"""Arguments for a smoke run (`python -m bench.run_all --quick`, tests)."""
IN_FLIGHT_PER_SLOT = 2


def figures(rows: list[dict[str, float]]) -> dict[str, float]:
    """Throughput and latency figures of the measured runs; each row has the run's `created_at`, `sealed_at`, and
    its first attempt's `claimed_at` and `started_at` (database clock, float seconds)."""
    span = max(r["sealed_at"] for r in rows) - min(r["created_at"] for r in rows)
    waits = [(r["claimed_at"] - r["created_at"]) * 1000 for r in rows]
    run_ms = [(r["sealed_at"] - r["started_at"]) * 1000 for r in rows]
    return {
        "runs_per_s": len(rows) / span,
        "span_s": span,
        "queue_wait_ms_p50": _store.percentile(waits, 0.5),
        "queue_wait_ms_p99": _store.percentile(waits, 0.99),
        "run_ms_p50": statistics.median(run_ms),
    }


async def _measured_rows(db: _service.ServiceDatabase, run_ids: list[str]) -> list[dict[str, Any]]:
    query = (
        select(
            runs.c.id,
            runs.c.status,
            runs.c.created_at,
            runs.c.sealed_at,
            run_attempts.c.created_at.label("claimed_at"),
            run_attempts.c.started_at,
        )
        .join(run_attempts, (run_attempts.c.run_id == runs.c.id) & (run_attempts.c.number == 1))
        .where(runs.c.id.in_(run_ids))
    )
    async with db.service.engine.connect() as conn:
        return [dict(row) for row in (await conn.execute(query)).mappings().all()]


async def measure_workers(
    workers: int, runs_count: int, options: dict[str, Any], postgres_url: str, progress: Progress
) -> dict[str, Any]:
    async with _service.service_database(postgres_url) as db:
        slots = db.service.settings.worker.slots
        task = progress.add_task(f"{workers} worker process(es): starting", total=runs_count)
        await db.processes_ready(["control", *["worker"] * workers])
        progress.update(task, description=f"{workers} worker process(es): warm-up")
        await _service.closed_loop(db, options, workers * slots, workers * slots, prefix="warm-up")
        progress.update(task, description=f"{workers} worker process(es): measuring")
        started, cpu_before = time.perf_counter(), _service.machine_cpu_times()
        run_ids = await _service.closed_loop(
            db,
            options,
            runs_count,
            IN_FLIGHT_PER_SLOT * workers * slots,
            prefix="measured",
            on_sealed=lambda n: progress.update(task, completed=n),
        )
        wall, cpu_busy = time.perf_counter() - started, _service.busy_fraction(cpu_before, _service.machine_cpu_times())
        rows = await _measured_rows(db, run_ids)
    completed = [r for r in rows if r["status"] == "completed"]
    result = {
        "workers": workers,
        "slots_per_worker": slots,
        "runs": runs_count,
        "completed": len(completed),
        "wall_s": wall,
        "machine_cpu_busy": cpu_busy,
        **(figures(completed) if completed else {}),
    }
    return result


def verdicts(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """No numeric target is set for throughput; every measured run must complete."""
    return [
        {
            "target": f"{r['workers']} worker(s): every measured run completed",
            "value": f"{r['completed']}/{r['runs']}",
            "met": r["completed"] == r["runs"],
        }
        for r in results
    ]


async def measure(
    workers_list: list[int], runs_count: int, options: dict[str, Any], postgres_url: str, console: Console
) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "bench": "service_throughput",
        "options": options,
        "runs": runs_count,
        "in_flight_per_slot": IN_FLIGHT_PER_SLOT,
        "results": [],
        "skipped": {},
    }
    reason = await _service.postgres_or_skip(postgres_url)
    if reason is not None:
        summary["skipped"]["service_throughput"] = reason
        summary["verdicts"] = []
        return summary
    summary["postgres_version"] = await _store.postgres_version(postgres_url)
    with _cli.progress_bar(console) as progress:
        for workers in workers_list:
            summary["results"].append(await measure_workers(workers, runs_count, options, postgres_url, progress))
    summary["verdicts"] = verdicts(summary["results"])
    return summary


def report(summary: dict[str, Any]) -> str:
    lines = [
        f"service_throughput: {summary['runs']} runs of {summary['options']['steps']} steps per worker count, "
        f"closed loop with <= {summary['in_flight_per_slot']} unsealed runs per slot; PostgreSQL, service defaults",
        f"  {'workers':>8}{'slots':>7}{'runs/s':>9}{'queue wait p50 ms':>19}{'p99 ms':>9}{'run p50 ms':>12}"
        f"{'completed':>11}{'CPU busy':>10}",
    ]
    for r in summary["results"]:
        if "runs_per_s" not in r:
            lines.append(f"  {r['workers']:>8}{r['workers'] * r['slots_per_worker']:>7}  no run completed")
            continue
        lines.append(
            f"  {r['workers']:>8}{r['workers'] * r['slots_per_worker']:>7}{r['runs_per_s']:>9.1f}"
            f"{r['queue_wait_ms_p50']:>19.1f}{r['queue_wait_ms_p99']:>9.1f}{r['run_ms_p50']:>12.1f}"
            f"{r['completed']:>7}/{r['runs']}{r['machine_cpu_busy']:>10.0%}"
        )
    lines.extend(_cli.target_lines(summary))
    return "\n".join(lines)


def table(summary: dict[str, Any]) -> list[str]:
    """The figures as a Markdown table, for docs/benchmarks.md (targets are added by `bench.run_all`)."""
    lines = [
        "| Worker processes | Slots | Runs/s | Queue wait p50 ms | Queue wait p99 ms | Run p50 ms | Completed "
        "| Machine CPU busy |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in summary["results"]:
        if "runs_per_s" in r:
            lines.append(
                f"| {r['workers']} | {r['workers'] * r['slots_per_worker']} | {r['runs_per_s']:.1f} | "
                f"{r['queue_wait_ms_p50']:.1f} | {r['queue_wait_ms_p99']:.1f} | {r['run_ms_p50']:.1f} | "
                f"{r['completed']}/{r['runs']} | {r['machine_cpu_busy']:.0%} |"
            )
    return lines


def reading(summary: dict[str, Any]) -> list[str]:
    """A short reading of the figures, for docs/benchmarks.md (derived from the data, so it stays true)."""
    measured = [r for r in summary["results"] if "runs_per_s" in r]
    out: list[str] = []
    if measured:
        one = measured[0]
        parts = ", ".join(
            f"{r['workers']} worker(s) {r['runs_per_s']:.1f} runs/s ({r['runs_per_s'] / one['runs_per_s']:.2f}x)"
            for r in measured
        )
        top = max(measured, key=lambda r: r["runs_per_s"])
        out.append(
            f"{parts}. A {summary['options']['steps']}-step run takes {one['run_ms_p50']:.0f} ms once started with "
            f"one worker; the closed loop keeps every slot busy, so queue wait is mostly the time a run waits for a "
            "free slot behind the runs submitted before it."
        )
        busy = ", ".join(f"{r['machine_cpu_busy']:.0%}" for r in measured)
        out.append(
            f"The machine's CPUs were {busy} busy during "
            "the measurements (all processes: workers, control, PostgreSQL, the submitting benchmark, anything else "
            "running); "
            + (
                f"with the CPUs saturated, more worker processes cannot add throughput (best: {top['runs_per_s']:.1f} "
                f"runs/s with {top['workers']})."
                if max(r["machine_cpu_busy"] for r in measured) >= 0.9
                else "the CPUs were not saturated, so latency (database commits, wake-ups) per slot is the limit."
            )
        )
    out.extend(_cli.missed_lines(summary))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.service_throughput",
        description="Completed runs per second with 1, 2 and 4 real worker processes on PostgreSQL, and queue wait.",
    )
    parser.add_argument(
        "--workers", type=_cli.positive_ints, default=[1, 2, 4], help="worker process counts (default: 1,2,4)"
    )
    parser.add_argument("--runs", type=int, default=120, help="measured runs per worker count (default: 120)")
    parser.add_argument("--steps", type=int, default=5, help="tool steps per run (default: 5)")
    _cli.add_postgres_url(parser)
    _cli.add_json(parser)
    args = parser.parse_args(argv)
    if args.runs < 1 or args.steps < 1:
        parser.error("--runs and --steps must be >= 1")
    options = {"script": "loop", "steps": args.steps}
    summary = asyncio.run(measure(args.workers, args.runs, options, args.postgres_url, Console(stderr=True)))
    return _cli.emit(summary, report, args.json)


if __name__ == "__main__":
    sys.exit(main())
