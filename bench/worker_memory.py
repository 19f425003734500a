"""Worker memory: peak resident set of one worker process (4 slots) completing 64 runs of 80 steps (issue 8,
item 6).

On a fresh PostgreSQL database, one `candor serve --role control` process and one `candor serve --role worker`
process with `worker.slots` = 4. The benchmark submits `--runs` scripted runs of `--steps` instant tool calls
(each result 200 bytes, so an 80-step history holds over 160 messages) closed loop, at most 2 unsealed runs per slot,
and reads the worker's `/proc/<pid>/status` every half second: `VmRSS` (resident now) and `VmHWM` (peak resident
since the process started). Figures: `VmHWM` after the last run (whole process lifetime, startup included), and
`VmRSS` once the first half of the runs has sealed (submitting pauses there) and once all have. Targets: peak
<= 250 MB, and RSS after the second half within 10% of RSS after the first half (no growth with the runs served).
The default of 64 runs (5,120 steps, 2,560 per half) keeps the whole `make bench` inside its 15 minutes on a
slower machine (with 200, this benchmark took 241 s of the 854 s on one; with 160, 186 s of 1,060 s on one whose
10-million-iteration Python loop took 0.8 s).

    python -m bench.worker_memory [--runs 64] [--steps 80] [--slots 4]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

from rich.console import Console

from . import _cli, _service, _store

PEAK_TARGET_MB = 250.0
GROWTH_TARGET = 0.10
IN_FLIGHT_PER_SLOT = 2
SAMPLE_SECONDS = 0.5
POLL_SECONDS = 0.1
"""How often the submitter counts sealed runs: seldom enough that the worker, not the submitter's queries, is what
the machine's CPUs are busy with (2 unsealed runs per slot keep the worker fed between polls)."""
QUICK_ARGS = ["--runs", "4", "--steps", "3"]
"""Arguments for a smoke run (`python -m bench.run_all --quick`, tests)."""


def mib(kib: int) -> float:
    return kib / 1024


def verdicts(peak_kib: int, rss_half_kib: int, rss_end_kib: int) -> list[dict[str, Any]]:
    """The issue's two targets: peak RSS <= 250 MB, and RSS after all runs within 10% of RSS after half of them."""
    growth = (rss_end_kib - rss_half_kib) / rss_half_kib
    return [
        {
            "target": f"peak RSS (VmHWM) of the worker <= {PEAK_TARGET_MB:.0f} MB",
            "value": f"{mib(peak_kib):.1f} MB",
            "met": mib(peak_kib) <= PEAK_TARGET_MB,
        },
        {
            "target": f"RSS after the second half of the runs within {GROWTH_TARGET:.0%} of RSS after the first half",
            "value": f"{growth:+.1%} ({mib(rss_half_kib):.1f} -> {mib(rss_end_kib):.1f} MB)",
            "met": abs(growth) <= GROWTH_TARGET,
        },
    ]


async def measure(runs_count: int, steps: int, slots: int, postgres_url: str, console: Console) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "bench": "worker_memory",
        "runs": runs_count,
        "steps": steps,
        "slots": slots,
        "skipped": {},
        "verdicts": [],
    }
    reason = await _service.postgres_or_skip(postgres_url)
    if reason is not None:
        summary["skipped"]["worker_memory"] = reason
        return summary
    summary["postgres_version"] = await _store.postgres_version(postgres_url)
    half = runs_count // 2
    samples: list[dict[str, float]] = []
    marks: dict[str, dict[str, int]] = {}
    async with _service.service_database(postgres_url, worker={"slots": slots}) as db:
        _, worker = await db.processes_ready(["control", "worker"])
        marks["ready"] = worker.memory_kib()
        started = time.perf_counter()
        last_sample = 0.0
        with _cli.progress_bar(console) as progress:
            task = progress.add_task(f"runs of {steps} steps on one worker", total=runs_count)

            def observe(sealed: int) -> None:
                nonlocal last_sample
                progress.update(task, completed=done + sealed)
                now = time.perf_counter()
                if now - last_sample >= SAMPLE_SECONDS:
                    last_sample = now
                    samples.append({"seconds": now - started, "sealed": done + sealed, **worker.memory_kib()})

            # Two halves, each ending with every run sealed: the two readings see the same (idle) worker.
            done, submitted = 0, 0
            for mark, count in (("half", half), ("end", runs_count - half)):
                run_ids = await _service.closed_loop(
                    db,
                    {"script": "loop", "steps": steps},
                    count,
                    IN_FLIGHT_PER_SLOT * slots,
                    prefix=mark,
                    on_sealed=observe,
                    poll_seconds=POLL_SECONDS,
                )
                done, submitted = done + count, submitted + len(run_ids)
                marks[mark] = worker.memory_kib()
        summary["seconds"] = time.perf_counter() - started
        summary["completed"] = await db.count_runs("completed")
        summary["submitted"] = submitted
    summary.update(
        marks=marks,
        samples=samples,
        peak_kib=marks["end"]["VmHWM"],
        rss_ready_kib=marks["ready"]["VmRSS"],
        rss_half_kib=marks["half"]["VmRSS"],
        rss_end_kib=marks["end"]["VmRSS"],
    )
    summary["verdicts"] = verdicts(summary["peak_kib"], summary["rss_half_kib"], summary["rss_end_kib"])
    return summary


def report(summary: dict[str, Any]) -> str:
    lines = [
        f"worker_memory: one worker process, {summary['slots']} slots, {summary['runs']} runs of "
        f"{summary['steps']} steps on PostgreSQL (/proc/<pid>/status)"
    ]
    if "peak_kib" in summary:
        lines += [
            f"  completed runs: {summary['completed']}/{summary['runs']} in {summary['seconds']:.1f} s",
            f"  RSS when ready: {mib(summary['rss_ready_kib']):.1f} MB; after {summary['runs'] // 2} runs: "
            f"{mib(summary['rss_half_kib']):.1f} MB; after {summary['runs']} runs: "
            f"{mib(summary['rss_end_kib']):.1f} MB",
            f"  peak RSS (VmHWM): {mib(summary['peak_kib']):.1f} MB",
        ]
    lines.extend(_cli.target_lines(summary))
    return "\n".join(lines)


def table(summary: dict[str, Any]) -> list[str]:
    """The figures as a Markdown table, for docs/benchmarks.md (targets are added by `bench.run_all`)."""
    if "peak_kib" not in summary:
        return []
    half = summary["runs"] // 2
    return [
        "| Metric | Value |",
        "|---|---|",
        f"| Runs x steps, slots | {summary['runs']} x {summary['steps']}, {summary['slots']} |",
        f"| Completed | {summary['completed']}/{summary['runs']} in {summary['seconds']:.1f} s |",
        f"| RSS when ready | {mib(summary['rss_ready_kib']):.1f} MB |",
        f"| RSS after {half} runs | {mib(summary['rss_half_kib']):.1f} MB |",
        f"| RSS after {summary['runs']} runs | {mib(summary['rss_end_kib']):.1f} MB |",
        f"| Peak RSS (VmHWM) | {mib(summary['peak_kib']):.1f} MB |",
    ]


def reading(summary: dict[str, Any]) -> list[str]:
    """A short reading of the figures, for docs/benchmarks.md (derived from the data, so it stays true)."""
    out: list[str] = []
    if "peak_kib" in summary:
        out.append(
            f"The worker starts at {mib(summary['rss_ready_kib']):.0f} MB resident (Python, pydantic-ai, SQLAlchemy, "
            f"uvicorn); serving {summary['slots']} runs of {summary['steps']} steps at a time it peaks at "
            f"{mib(summary['peak_kib']):.0f} MB, and its resident set after {summary['runs']} runs is "
            f"{mib(summary['rss_end_kib']):.1f} MB against {mib(summary['rss_half_kib']):.1f} MB after "
            f"{summary['runs'] // 2}"
            + (
                ": each attempt's harness, history and encoded messages are released when it ends."
                if summary["verdicts"][1]["met"]
                else ": it keeps growing with the runs served, a leak to find."
            )
        )
    out.extend(_cli.missed_lines(summary))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.worker_memory",
        description="Peak and steady resident memory of one real worker process serving many long runs on PostgreSQL.",
    )
    parser.add_argument("--runs", type=int, default=64, help="runs to complete (default: 64)")
    parser.add_argument("--steps", type=int, default=80, help="tool steps per run (default: 80)")
    parser.add_argument("--slots", type=int, default=4, help="worker.slots (default: 4)")
    _cli.add_postgres_url(parser)
    _cli.add_json(parser)
    args = parser.parse_args(argv)
    if args.runs < 2 or args.steps < 1:
        parser.error("--runs must be >= 2 (two halves are compared) and --steps >= 1")
    if (problem := _service.settings_problem(worker={"slots": args.slots})) is not None:
        parser.error(problem)
    summary = asyncio.run(measure(args.runs, args.steps, args.slots, args.postgres_url, Console(stderr=True)))
    return _cli.emit(summary, report, args.json)


if __name__ == "__main__":
    sys.exit(main())
