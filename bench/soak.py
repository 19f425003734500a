"""Soak: many runs over PostgreSQL while worker processes are SIGKILLed and restarted, one is drained, and (second
phase) the PostgreSQL server itself restarts.

Phase "kills": one `candor serve --role control` and `--workers` (3) `candor serve --role worker` processes on a
scratch database; `--runs` runs are submitted (at most `--in-flight` unsealed at a time). As soon as a run is
running, and then every `--kill-every` seconds (counted from the moment the previous replacement is ready), a random
worker gets SIGKILL and a fresh one is started in its place; once, half-way, one gets SIGTERM
(a drain handoff, §7.11) and is replaced too. Phase "pg restart": the same with `--restart-runs` runs and no kills,
on a private PostgreSQL server (initdb'd for the bench in a temporary directory, so that restarting it disturbs no
one else) that is restarted (`pg_ctl restart -m fast`) while the runs are in flight; the processes must reconnect
by themselves. Each run (`soak` script below) first calls `charge` (not retry-safe: it appends one line per call to
a ledger file) and then `--steps` retry-safe `step` calls, hosted with `tool_recovery = "declared"`.

Reported per phase: lost runs (submitted but not sealed when the phase ends, or unknown to the database: must be
0), duplicate effects of the non-retry-safe `charge` (runs whose ledger holds more than one line: must be 0), runs
sealed `failed` with their failure code (`max_attempts` reached after repeated kills shows as `lease_expired`),
lease-expired attempts and failover times (from the last SIGKILL before an attempt's recovery to the first
checkpoint of the run's next attempt: p50/p99), and the workers' RSS sampled every `--rss-every` seconds. Time is
bounded by `--max-seconds` per phase: submission stops there and the runs already submitted are waited for (at
most `--settle-seconds`).

Then the fault phases (`bench/_fault_scenarios.py`, shared with tests/e2e/service/test_faults.py), each
with `--fault-runs` runs: a PostgreSQL restart, connection exhaustion on a server with a low `max_connections`, a
black-holed network between a worker and the database, a full SQLite filesystem (root only), and a worker SIGSTOPped
past its lease (in a model call, and in a long tool). Reported per fault: charged attempts, unknown outcomes (and
false ones: the ledger shows the tool ran), duplicate effects, effects after a lost lease, lost runs.

    python -m bench.soak [--runs 1000] [--restart-runs 200] [--workers 3] [--kill-every 4] [--max-seconds 35]
                         [--fault-runs 4]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

from pydantic_ai import Agent, RunContext, Tool
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import UsageLimits
from sqlalchemy import func, select

from candor import Harness
from candor.tools import recovery_retryable

from . import _cli, _fault_scenarios, _faults, _service, _store

FACTORY = "bench.soak:factory"  # not `__name__`: run as `-m bench.soak` this module is `__main__`
QUICK_ARGS = [
    "--runs",
    "12",
    "--restart-runs",
    "6",
    "--kill-every",
    "2",
    "--steps",
    "10",
    "--max-seconds",
    "40",
    "--settle-seconds",
    "60",
    "--in-flight",
    "6",
    "--fault-runs",
    "0",
]
"""Arguments for a smoke run (`python -m bench.run_all --quick`, tests/e2e/bench/test_bench_smoke.py). The fault
phases are left out: tests/e2e/service/test_faults.py runs each of them."""
SETTINGS: dict[str, dict[str, Any]] = {
    "worker": {"lease_seconds": 8.0, "authority_seconds": 1.0, "scan_seconds": 0.2, "slots": 8, "drain_seconds": 5.0},
    "database": {"timeout": 2.5},
    "server": {"shutdown_timeout": 10.0},
}
"""Roomier than failover_latency's 3 s lease: the soak runs three workers with eight slots each on two cores, and a
heartbeat that misses its `authority_seconds` bound there lets healthy leases expire (charged attempts that are
not the kills under test)."""
RSS_LIMIT_MB = 250.0


# ------------------------------------------------------------------------------------------------ the agent


def soak_agent(tag: str, ledger: str, steps: int, step_seconds: float) -> Agent[None, str]:
    """`charge` once (not retry-safe, one ledger line per execution), then `steps` retry-safe steps, then done."""

    def script(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        done = sum(isinstance(m, ModelResponse) for m in messages)
        if done == 0:
            return ModelResponse(parts=[ToolCallPart("charge", {"amount": 1}, tool_call_id="call_charge")])
        if done <= steps:
            return ModelResponse(parts=[ToolCallPart("step", {"n": done}, tool_call_id=f"call_{done:04d}")])
        return ModelResponse(parts=[TextPart("soaked")])

    async def charge(ctx: RunContext[None], amount: int) -> str:
        """Charge (an external effect; not safe to repeat)."""
        line = f"{tag} {os.getpid()}\n".encode()
        fd = os.open(Path(ledger) / f"{os.getpid()}.txt", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line)  # one small O_APPEND write: whole, and on disk before the tool returns
            os.fsync(fd)
        finally:
            os.close(fd)
        return "charged"

    async def step(n: int) -> str:
        """One unit of work (safe to repeat)."""
        await asyncio.sleep(step_seconds)
        return "ok"

    return Agent(FunctionModel(script, model_name="soak"), tools=[Tool(charge), recovery_retryable(Tool(step))])


def factory(options: dict[str, Any]) -> Harness[Any]:
    steps = int(options.get("steps", 3))
    agent = soak_agent(str(options["tag"]), str(options["ledger"]), steps, float(options.get("step_seconds", 0.05)))
    return Harness(agent, usage_limits=UsageLimits(request_limit=steps + 10))


# ------------------------------------------------------------------------------------------------ pure figures


def duplicate_effects(ledger_lines: list[str]) -> dict[str, int]:
    """Run tag → executions of `charge`, for the tags executed more than once."""
    counts = Counter(line.split()[0] for line in ledger_lines if line.strip())
    return {tag: n for tag, n in counts.items() if n > 1}


def failover_seconds(kills: list[float], recoveries: list[tuple[float, float | None]]) -> list[float]:
    """For each recovered attempt `(recovered_at, next_first_checkpoint_at)`: the time from the last kill before its
    recovery to the next attempt's first checkpoint (None: never continued, left out)."""
    out = []
    for recovered_at, continued_at in recoveries:
        before = [k for k in kills if k <= recovered_at]
        if before and continued_at is not None:
            out.append(continued_at - before[-1])
    return out


# ------------------------------------------------------------------------------------------------ one phase


async def phase(
    name: str,
    postgres_url: str,
    *,
    runs: int,
    workers: int,
    in_flight: int,
    steps: int,
    kill_every: float | None,
    drain: bool,
    restart: Any,
    max_seconds: float,
    rss_every: float,
    settle_seconds: float,
) -> dict[str, Any]:
    ledger = Path(tempfile.mkdtemp(prefix="candor-soak-ledger-"))
    os.chmod(ledger, 0o777)
    sections = {**SETTINGS, "agents": {"soak": {"factory": FACTORY, "tool_recovery": "declared"}}}
    out: dict[str, Any] = {"phase": name, "runs_asked": runs}
    rng = random.Random(15)
    async with _service.service_database(postgres_url, **sections) as db:
        await db.processes_ready(["control"])
        pool = await db.processes_ready(["worker"] * workers)
        kills: list[float] = []
        events: list[str] = []
        rss: list[tuple[float, int]] = []
        submitted: list[str] = []
        start = time.monotonic()
        wall0 = time.time()

        async def submit_all() -> None:
            while len(submitted) < runs and time.monotonic() - start < max_seconds:
                sealed = await _fault_scenarios.retrying(lambda: db.count_runs(*_service.SEALED))
                while len(submitted) < runs and len(submitted) - sealed < in_flight:
                    index = len(submitted)
                    tag = f"{name.replace(' ', '-')}-{index}"  # an Idempotency-Key and a ledger word: no spaces
                    options = {"tag": tag, "ledger": str(ledger), "steps": steps}
                    accepted = await _submit(db, options, key=tag)
                    submitted.append(accepted)
                await asyncio.sleep(0.05)

        planned = asyncio.Event()  # the drain, the restart and a first kill have happened

        async def chaos() -> None:
            drained = not drain
            last = time.monotonic()
            restarted = restart is None
            while True:
                if drained and restarted and (kill_every is None or kills):
                    planned.set()
                await asyncio.sleep(0.2)
                elapsed = time.monotonic() - start
                halfway = len(submitted) >= runs // 2 or elapsed >= max_seconds / 2
                if not restarted and halfway:
                    restarted = True
                    took = await restart()
                    events.append(f"PostgreSQL restarted at +{elapsed:.1f} s (took {took:.1f} s)")
                if not drained and halfway:
                    drained = True
                    victim = rng.randrange(len(pool))
                    pool[victim].signal(signal.SIGTERM)
                    events.append(f"SIGTERM (drain) to worker {pool[victim].pid} at +{elapsed:.1f} s")
                    pool[victim] = db.process("worker")
                # The first kill lands as soon as a run is running (a short phase would otherwise seal every run
                # before `kill_every` passes, and test no failover), at the latest after `kill_every`; later ones
                # every `kill_every`.
                waited = time.monotonic() - last >= kill_every if kill_every is not None else False
                if kill_every is not None and (
                    waited or (not kills and await _fault_scenarios.retrying(lambda: _running(db)) > 0)
                ):
                    victim = rng.randrange(len(pool))
                    kills.append(time.time())
                    pool[victim].signal(signal.SIGKILL)
                    pool[victim] = db.process("worker")  # its replacement starts at once
                    # The next kill is `kill_every` after the replacement is ready: killing workers that are still
                    # importing would only measure start-up, and leave no worker to fail over to.
                    with contextlib.suppress(RuntimeError):
                        await pool[victim].wait_ready(timeout=120)
                    last = time.monotonic()

        async def sample_rss() -> None:
            while True:
                for process in db.processes:
                    if process.role == "worker" and process.alive():
                        with contextlib.suppress(OSError, ValueError):
                            rss.append((time.monotonic() - start, process.memory_kib()["VmRSS"]))
                await asyncio.sleep(rss_every)

        background = [asyncio.create_task(chaos()), asyncio.create_task(sample_rss())]
        try:
            await submit_all()
            deadline = time.monotonic() + settle_seconds
            # A short phase may seal its runs before its planned disturbances: it waits for them (they hit runs
            # still in flight when there are any), so every phase reports what it was asked to do.
            while time.monotonic() < deadline and (
                not planned.is_set() or await _fault_scenarios.retrying(lambda: _unsealed(db, submitted)) > 0
            ):
                await asyncio.sleep(0.25)
        finally:
            for task in background:
                task.cancel()
            await asyncio.gather(*background, return_exceptions=True)
        out["seconds"] = round(time.monotonic() - start, 1)
        out.update(await _fault_scenarios.retrying(lambda: _figures(db, submitted, kills, wall0)))
        lines = [line for f in ledger.glob("*.txt") for line in f.read_text().splitlines()]
        duplicates = duplicate_effects(lines)
        out["duplicate_effects"] = len(duplicates)
        out["charges"] = len(lines)
        out["kills"] = len(kills)
        out["events"] = events
        out["rss_mb"] = _rss_summary(rss)
    shutil.rmtree(ledger, ignore_errors=True)
    return out


async def _submit(db: _service.ServiceDatabase, options: dict[str, Any], key: str) -> str:
    from candor.service import commands

    async def once() -> commands.Accepted:
        return await commands.create_thread(
            db.service, db.principal, agent="soak", input=_service.PROMPT, options=options, key=key
        )

    accepted = await _fault_scenarios.retrying(once)  # keyed: a retry never creates a second thread
    assert accepted.run is not None
    return accepted.run.id


async def _unsealed(db: _service.ServiceDatabase, run_ids: list[str]) -> int:
    from candor.service.store.schema.tables import runs

    async with db.service.engine.connect() as conn:
        rows = (await conn.execute(select(runs.c.id).where(runs.c.status.in_(_service.SEALED)))).all()
    return len(set(run_ids) - {r.id for r in rows})


async def _running(db: _service.ServiceDatabase) -> int:
    return await db.count_runs("running")


async def _figures(
    db: _service.ServiceDatabase, run_ids: list[str], kills: list[float], wall0: float
) -> dict[str, Any]:
    from candor.service.store.schema.tables import checkpoints, run_attempts, runs

    async with db.service.engine.connect() as conn:
        run_rows = {
            r.id: r
            for r in (await conn.execute(select(runs.c.id, runs.c.status, runs.c.failure, runs.c.attempts))).all()
        }
        attempts = (
            await conn.execute(
                select(run_attempts.c.run_id, run_attempts.c.number, run_attempts.c.failure, run_attempts.c.finished_at)
            )
        ).all()
        firsts = {
            (r.run_id, r.attempt): r.first
            for r in (
                await conn.execute(
                    select(
                        checkpoints.c.run_id, checkpoints.c.attempt, func.min(checkpoints.c.created_at).label("first")
                    ).group_by(checkpoints.c.run_id, checkpoints.c.attempt)
                )
            ).all()
        }
    lost = [rid for rid in run_ids if rid not in run_rows or run_rows[rid].status not in _service.SEALED]
    statuses = Counter(run_rows[rid].status for rid in run_ids if rid in run_rows)
    failed = Counter(
        f"{(run_rows[rid].failure or {}).get('code')} after {run_rows[rid].attempts} attempts"
        for rid in run_ids
        if rid in run_rows and run_rows[rid].status == "failed"
    )
    expired = [a for a in attempts if (a.failure or {}).get("code") == "lease_expired"]
    recoveries = [(a.finished_at, firsts.get((a.run_id, a.number + 1))) for a in expired if a.finished_at]
    failovers = failover_seconds(kills, recoveries)
    return {
        "submitted": len(run_ids),
        "lost": len(lost),
        "statuses": dict(statuses),
        "failed_by_reason": dict(failed),
        "lease_expired_attempts": len(expired),
        "failover_p50": round(_store.percentile(failovers, 0.5), 3) if failovers else None,
        "failover_p99": round(_store.percentile(failovers, 0.99), 3) if failovers else None,
        "failover_samples": len(failovers),
    }


def _rss_summary(samples: list[tuple[float, int]]) -> dict[str, Any]:
    """Worker RSS over time: per tenth of the phase, the largest sample (MB)."""
    if not samples:
        return {}
    end = max(t for t, _ in samples) or 1.0
    buckets: dict[int, int] = {}
    for t, kib in samples:
        bucket = min(9, int(10 * t / end))
        buckets[bucket] = max(buckets.get(bucket, 0), kib)
    return {
        "max": round(max(k for _, k in samples) / 1024, 1),
        "by_tenth": [round(buckets[b] / 1024, 1) for b in sorted(buckets)],
    }


# ------------------------------------------------------------------------------------------------ report


def verdicts(phases: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for p in phases:
        out.append(
            {
                "target": f"{p['phase']}: lost runs = 0",
                "value": f"{p['lost']} of {p['submitted']}",
                "met": p["lost"] == 0,
            }
        )
        out.append(
            {
                "target": f"{p['phase']}: duplicate effects of the non-retry-safe tool = 0",
                "value": f"{p['duplicate_effects']} ({p['charges']} executions)",
                "met": p["duplicate_effects"] == 0,
            }
        )
        if p["rss_mb"]:
            out.append(
                {
                    "target": f"{p['phase']}: worker RSS <= {RSS_LIMIT_MB:.0f} MB",
                    "value": f"{p['rss_mb']['max']} MB",
                    "met": p["rss_mb"]["max"] <= RSS_LIMIT_MB,
                }
            )
    return out


def table(summary: dict[str, Any]) -> list[str]:
    lines = [
        "| Phase | Runs | Seconds | Statuses | Failed (reason) | Kills | Lease-expired attempts | "
        "Failover p50 s | "
        "p99 s | Worker RSS MB by tenth (max) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for p in summary["phases"]:
        rss = p["rss_mb"]
        lines.append(
            f"| {p['phase']} | {p['submitted']} | {p['seconds']} | {p['statuses']} | {p['failed_by_reason'] or '-'} | "
            f"{p['kills']} | {p['lease_expired_attempts']} | {p['failover_p50']} | {p['failover_p99']} | "
            f"{rss.get('by_tenth')} ({rss.get('max')}) |"
        )
    events = [f"{p['phase']}: {e}" for p in summary["phases"] for e in p["events"]]
    return [*lines, "", *(f"Event: {e}" for e in events), "", *fault_table(summary.get("faults", []))]


def fault_table(reports: list[dict[str, Any]]) -> list[str]:
    if not reports:
        return []
    lines = [
        "| Fault | Runs | Completed | Charged attempts (reason) | Unknown outcomes (false) | Duplicate effects | "
        "Effects after a lost lease | Seconds | Evidence |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in reports:
        lines.append(
            f"| {r['fault']} | {r['runs']} | {r['completed']} | {r['charged_attempts']} "
            f"({r['charged_reasons'] or '-'}) | {r['unknown_outcomes']} ({r['false_unknowns']}) | "
            f"{r['duplicate_effects']} | {r['effects_after_lost_lease']} | {r['seconds']} | {r['evidence']} |"
        )
    return [*lines, ""]


def reading(summary: dict[str, Any]) -> list[str]:
    out = []
    for p in summary["phases"]:
        out.append(
            f"{p['phase']}: {p['submitted']} of {p['runs_asked']} runs submitted in {p['seconds']} s; "
            f"{p['lost']} lost, {p['duplicate_effects']} duplicated `charge` effects; "
            f"{p['failover_samples']} failover samples after {p['kills']} SIGKILLs."
        )
    out.extend(_cli.missed_lines(summary))
    return out


def report(summary: dict[str, Any]) -> str:
    lines = [f"soak: {summary['settings']}"]
    for p in summary["phases"]:
        lines.append(f"  {p['phase']}: {p}")
    for r in summary.get("faults", []):
        lines.append(f"  fault {r['fault']}: {r}")
    return "\n".join([*lines, *_cli.target_lines(summary)])


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    summary: dict[str, Any] = {"bench": "soak", "settings": SETTINGS, "skipped": {}, "phases": []}
    reason = await _service.postgres_or_skip(args.postgres_url)
    if reason is not None:
        summary["skipped"]["soak"] = reason
        summary["verdicts"] = []
        return summary
    common = dict(
        workers=args.workers,
        in_flight=args.in_flight,
        steps=args.steps,
        max_seconds=args.max_seconds,
        rss_every=args.rss_every,
        settle_seconds=args.settle_seconds,
    )
    summary["phases"].append(
        await phase(
            "kills", args.postgres_url, runs=args.runs, kill_every=args.kill_every, drain=True, restart=None, **common
        )
    )
    if args.restart_runs:
        try:
            async with _faults.private_postgres() as server:
                summary["phases"].append(
                    await phase(
                        "pg restart",
                        server.url,
                        runs=args.restart_runs,
                        kill_every=None,
                        drain=False,
                        restart=server.restart,
                        **common,
                    )
                )
        except (RuntimeError, subprocess.CalledProcessError, OSError) as exc:
            summary["skipped"]["pg restart"] = f"no private PostgreSQL server: {type(exc).__name__}: {exc}"
    summary["faults"] = await fault_phases(args.postgres_url, args.fault_runs, summary["skipped"])
    summary["verdicts"] = verdicts(summary["phases"]) + fault_verdicts(summary["faults"])
    return summary


async def fault_phases(postgres_url: str, runs: int, skipped: dict[str, str]) -> list[dict[str, Any]]:
    """Each fault scenario of `_fault_scenarios` with `runs` runs; none when `runs` is 0."""
    if runs < 1:
        return []
    reports = []
    for name in _fault_scenarios.SCENARIOS:
        scenario = getattr(_fault_scenarios, name)
        try:
            if name in ("blackhole", "sigstop", "sigstop_in_tool"):  # on a scratch database of the given server
                async with _store.scratch_postgres(postgres_url, prefix="candor_soak_fault") as url:
                    report = await scenario(url, runs=1 if name.startswith("sigstop") else runs)
            else:
                report = await scenario(runs=runs)
        except _faults.FaultUnsupported as why:
            skipped[f"fault {name}"] = str(why)
            continue
        reports.append(report.as_dict())
    return reports


HARMLESS_FAULTS = ("pg_restart", "connection_exhaustion", "blackhole", "sqlite_full")
"""Faults shorter than the lease: they must cost no charged attempt and tell no model a false unknown."""


def fault_verdicts(reports: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per fault: nothing lost, no duplicate effect, no effect after a lost lease; for the faults shorter than the
    lease also no charged attempt and no unknown outcome (pure)."""
    out = []
    for r in reports:
        counts = {
            "lost runs": r["lost"],
            "duplicate effects": r["duplicate_effects"],
            "effects after a lost lease": r["effects_after_lost_lease"],
            "false unknowns": r["false_unknowns"],
        }
        if r["fault"] in HARMLESS_FAULTS:
            counts.update({"charged attempts": r["charged_attempts"], "unknown outcomes": r["unknown_outcomes"]})
        value = ", ".join(f"{name} {n}" for name, n in counts.items())
        out.append({"target": f"fault {r['fault']}: all of these = 0", "value": value, "met": not any(counts.values())})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000, help="runs in the kill phase (default: 1000)")
    parser.add_argument(
        "--restart-runs",
        type=int,
        default=200,
        help="runs in the PostgreSQL restart phase (default: 200; 0 skips the phase)",
    )
    parser.add_argument("--workers", type=int, default=3, help="worker processes (default: 3)")
    parser.add_argument("--in-flight", type=int, default=24, help="unsealed runs at a time (default: 24)")
    parser.add_argument("--steps", type=int, default=3, help="retry-safe steps per run after the charge (default: 3)")
    parser.add_argument("--kill-every", type=float, default=4.0, help="seconds between SIGKILLs (default: 4)")
    parser.add_argument(
        "--max-seconds",
        type=float,
        default=35.0,
        help="submission time bound per phase "
        "(default: 35; with the settle bound and start-ups the whole soak fits about 2.5 minutes, "
        "which `make bench`'s 15-minute budget leaves it)",
    )
    parser.add_argument(
        "--settle-seconds",
        type=float,
        default=20.0,
        help="longest wait for the submitted runs to seal after submission ends (default: 20)",
    )
    parser.add_argument("--rss-every", type=float, default=2.0, help="RSS sampling period (default: 2)")
    parser.add_argument(
        "--fault-runs",
        type=int,
        default=4,
        help="runs per fault phase (PostgreSQL restart, connection exhaustion, black-holed network, full SQLite "
        "filesystem, SIGSTOP past the lease; default: 4, 0 skips them)",
    )
    _cli.add_postgres_url(parser)
    _cli.add_json(parser)
    args = parser.parse_args(argv)
    if min(args.runs, args.workers, args.in_flight) < 1 or min(args.restart_runs, args.fault_runs) < 0:
        parser.error("--runs, --workers and --in-flight must be >= 1, --restart-runs and --fault-runs >= 0")
    summary = asyncio.run(measure(args))
    return _cli.emit(summary, report, args.json)


if __name__ == "__main__":
    sys.exit(main())
