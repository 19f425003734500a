"""Failover latency: a worker process killed (SIGKILL) or drained (SIGTERM) mid-run, to the continuation's first
checkpoint on another worker process (issue 8, item 3).

On a fresh PostgreSQL database, one `candor serve --role control` process (it runs `expire_leases` every
`worker.authority_seconds`) and two `candor serve --role worker` processes with `worker.slots` =
`--runs-per-signal`: the active one and a standby kept paused (SIGSTOP) so that the active one claims the round's
runs. Each round submits up to `--runs-per-signal` scripted loop runs (`--steps` tool calls of `--step-seconds`
each); once every one of them is running and has committed `--kill-at` checkpoints, the standby is resumed and the
active worker is sent SIGKILL (kill rounds) or SIGTERM (drain rounds, §7.11). A sample (a "trial") is one run of a
round: the time from that signal (host clock, read just before `kill()`) to the first checkpoint committed by that
run's next attempt (`checkpoints.created_at`, PostgreSQL `clock_timestamp()` on the same host), so one signal yields
one sample per run the worker held, and `--trials 32` needs ceil(32 / runs per signal) kills (p99 of 32 trials, nearest
rank, is the slowest, as it was of 40 and 50: fewer kills keep `make bench`, production_steps included, within its 15
minutes). A kill trial consists of waiting out the lease (renewed at the first heartbeat, every `authority_seconds`,
that finds at most 2/3 of it left, so it runs out 2/3 x `lease_seconds` - `authority_seconds` to `lease_seconds` after
the signal), the next `expire_leases` pass (every `authority_seconds`), the standby's claim (woken by NOTIFY, else its
`scan_seconds` scan), attempt start and the first model turn plus its commit; a drain trial consists of finishing the
step in flight, the yielding commit (S-53), the claim, attempt start and the first commit. Each trial then checks that
the continuation ran on the other worker and that the run completed; the workers stay up between rounds and a fresh
standby process replaces the stopped worker. Targets: kill p99 <= lease_seconds + authority_seconds + 1 s (S-28), drain
p99 <= 1 s.

    python -m bench.failover_latency [--trials 32] [--drain-trials 10] [--runs-per-signal 4] [--lease-seconds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import statistics
import sys
import time
from typing import Any

from rich.console import Console
from sqlalchemy import func, select

from candor.service.protocol.outcomes import recovery_decision
from candor.service.store.schema.tables import checkpoints, run_attempts, runs

from . import _cli, _service, _store

DRAIN_TARGET_SECONDS = 1.0
KILL_MARGIN_SECONDS = 1.0
QUICK_ARGS = ["--trials", "2", "--drain-trials", "1", "--runs-per-signal", "2"]
"""Arguments for a smoke run (`python -m bench.run_all --quick`, tests/e2e/bench/test_bench_smoke.py): one kill
(two runs interrupted at once, so one lease of at least 3 s is waited out) and one drain."""


# ------------------------------------------------------------------------------------------------ pure figures


def round_sizes(trials: int, runs_per_signal: int) -> list[int]:
    """How many runs each signal interrupts so that `trials` samples are taken: full rounds of `runs_per_signal`
    runs, the last one smaller if needed (50 trials at 4 per signal: twelve rounds of 4 and one of 2)."""
    if trials < 0 or runs_per_signal < 1:
        raise ValueError("trials must be >= 0 and runs_per_signal >= 1")
    full, rest = divmod(trials, runs_per_signal)
    return [runs_per_signal] * full + ([rest] if rest else [])


def trial_figures(
    signal_at: float, first: dict[str, Any], second: dict[str, Any], first_checkpoint_at: float
) -> dict[str, float | None]:
    """Seconds from the signal to each event of one trial: the first attempt's lease expiry (kill trials) and end
    (recovery or yield), the next attempt's creation (claim) and start, and its first checkpoint (the figure)."""

    def since(value: float | None) -> float | None:
        return None if value is None else value - signal_at

    return {
        "lease_expiry": since(first["lease_expires_at"]),
        "first_attempt_ended": since(first["finished_at"]),
        "claimed": since(second["created_at"]),
        "started": since(second["started_at"]),
        "first_checkpoint": first_checkpoint_at - signal_at,
    }


def distribution(values: list[float]) -> dict[str, float]:
    """p50, p99 and max of `values` (seconds)."""
    return {"p50": _store.percentile(values, 0.5), "p99": _store.percentile(values, 0.99), "max": max(values)}


def components(trials: list[dict[str, Any]]) -> dict[str, float]:
    """The median of each event time over `trials` (those measured), to show what the figure consists of."""
    out: dict[str, float] = {}
    for name in ("lease_expiry", "first_attempt_ended", "claimed", "started", "first_checkpoint"):
        values = [t[name] for t in trials if t.get(name) is not None]
        if values:
            out[name] = statistics.median(values)
    return out


def verdicts(summary: dict[str, Any]) -> list[dict[str, Any]]:
    settings = summary["settings"]
    out = []
    kill, drain = summary.get("kill"), summary.get("drain")
    if kill:
        bound = settings["lease_seconds"] + settings["authority_seconds"] + KILL_MARGIN_SECONDS
        out.append(
            {
                "target": f"SIGKILL to continuation's first checkpoint p99 <= lease + authority + 1 s ({bound:.1f} s)",
                "value": f"{kill['p99']:.2f} s",
                "met": kill["p99"] <= bound,
            }
        )
    if drain:
        out.append(
            {
                "target": f"SIGTERM (drain handoff) to continuation's first checkpoint p99 <= "
                f"{DRAIN_TARGET_SECONDS:.0f} s",
                "value": f"{drain['p99']:.3f} s",
                "met": drain["p99"] <= DRAIN_TARGET_SECONDS,
            }
        )
    return out


# --------------------------------------------------------------------------------------------------- trials


class Failover:
    """An active worker process and a paused standby on one database; trials swap them."""

    def __init__(self, db: _service.ServiceDatabase, options: dict[str, Any], kill_at: int) -> None:
        self.db = db
        self.options = options
        self.kill_at = kill_at
        self.active: _service.ServiceProcess | None = None
        self.standby: _service.ServiceProcess | None = None
        self.rounds = 0
        self.warm_ups = 0

    async def start(self) -> None:
        self.active, self.standby = await self.db.processes_ready(["worker", "worker"])
        await self._warm_up(self.standby, idle=self.active)  # leaves the standby paused
        await self._sealed(await self.db.submit({**self.options, "steps": 1}, key="warm-up-active"))

    async def _run_row(self, run_id: str) -> Any:
        async with self.db.service.engine.connect() as conn:
            return (await conn.execute(select(runs).where(runs.c.id == run_id))).mappings().one()

    async def _committed_seq(self, run_id: str) -> int:
        """The run's last committed checkpoint seq: plain steps insert checkpoint rows without moving `runs` (§7.8)."""
        async with self.db.service.engine.connect() as conn:
            query = select(func.coalesce(func.max(checkpoints.c.seq), 0)).where(checkpoints.c.run_id == run_id)
            return int((await conn.execute(query)).scalar_one())

    async def _attempts(self, run_id: str) -> list[Any]:
        async with self.db.service.engine.connect() as conn:
            query = select(run_attempts).where(run_attempts.c.run_id == run_id).order_by(run_attempts.c.number)
            return list((await conn.execute(query)).mappings().all())

    async def _first_checkpoint(self, run_id: str, attempt: int) -> float | None:
        async with self.db.service.engine.connect() as conn:
            query = select(func.min(checkpoints.c.created_at)).where(
                checkpoints.c.run_id == run_id, checkpoints.c.attempt == attempt
            )
            value = (await conn.execute(query)).scalar_one()
        return None if value is None else float(value)

    async def _poll(self, check: Any, what: str, timeout: float) -> Any:
        deadline = time.monotonic() + timeout
        while (value := await check()) is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"round {self.rounds}: {what} not seen within {timeout:.0f} s")
            await asyncio.sleep(0.01)
        return value

    async def _sealed(self, run_id: str) -> Any:
        async def sealed() -> Any:
            row = await self._run_row(run_id)
            return row if row["status"] in _service.SEALED else None

        return await self._poll(sealed, f"the end of run {run_id}", 60)

    async def _warm_up(self, fresh: _service.ServiceProcess, *, idle: _service.ServiceProcess) -> None:
        """`fresh` completes one short run while `idle` is paused, then `fresh` is paused as the next standby: a
        standby has run an attempt before, as a long-running worker has (a process's first attempt is slower)."""
        idle.pause()
        self.warm_ups += 1
        await self._sealed(await self.db.submit({**self.options, "steps": 1}, key=f"warm-up-{self.warm_ups}"))
        fresh.pause()
        idle.resume()

    async def signal_round(self, signum: int, size: int) -> list[dict[str, Any]]:
        """Submit `size` runs, signal the active worker once all are mid-run: one sample per run."""
        assert self.active is not None and self.standby is not None
        self.rounds += 1
        run_ids = [await self.db.submit(self.options, key=f"failover-{self.rounds}-{n}") for n in range(size)]

        async def all_mid_run() -> bool | None:
            rows = [await self._run_row(run_id) for run_id in run_ids]
            if any(row["status"] in _service.SEALED for row in rows):
                raise RuntimeError(f"round {self.rounds}: a run ended before the signal; raise --steps")
            running = all(r["status"] == "running" for r in rows)
            return (
                True
                if running and all([await self._committed_seq(run_id) >= self.kill_at for run_id in run_ids])
                else None
            )

        await self._poll(all_mid_run, f"checkpoint {self.kill_at} of runs {', '.join(run_ids)}", 30)
        victim, survivor = self.active, self.standby
        survivor.resume()
        signal_at = time.time()
        victim.signal(signum)
        first_checkpoints = [
            await self._poll(
                lambda run_id=run_id: self._first_checkpoint(run_id, 2),
                f"the first checkpoint of run {run_id}'s continuation",
                60,
            )
            for run_id in run_ids
        ]
        # Every continuation is measured: replace the stopped worker by a fresh paused standby meanwhile.
        exit_status = await victim.wait_exit(30)
        if exit_status is None:
            raise RuntimeError(f"round {self.rounds}: the {signal.Signals(signum).name}ed worker did not exit")
        replacement = self.db.process("worker")
        await replacement.wait_ready()
        self.db.processes.remove(victim)
        sealed = [await self._sealed(run_id) for run_id in run_ids]
        await self._warm_up(replacement, idle=survivor)
        self.active, self.standby = survivor, replacement
        samples = []
        for run_id, run, first_checkpoint_at in zip(run_ids, sealed, first_checkpoints, strict=True):
            first, second = (await self._attempts(run_id))[:2]
            figures = trial_figures(signal_at, first, second, first_checkpoint_at)
            if signum != signal.SIGKILL:
                figures["lease_expiry"] = None  # a handoff waits for no lease: its expiry is no part of the figure
            figures.update(
                completed=run["status"] == "completed" and run["output"] == f"finished {self.options['steps']} steps",
                other_worker=first["worker_id"] != second["worker_id"],
                start_reason=second["start_reason"],
                first_attempt_status=first["status"],
                exit_status=exit_status,
            )
            samples.append(figures)
        return samples


def sections(settings: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The service settings of the figure, as `candor serve` sections."""
    return {
        "database": {"timeout": settings["database_timeout"]},
        "worker": {k: settings[k] for k in ("lease_seconds", "authority_seconds", "scan_seconds", "slots")},
    }


async def measure(
    trials: int,
    drain_trials: int,
    settings: dict[str, Any],
    options: dict[str, Any],
    kill_at: int,
    postgres_url: str,
    console: Console,
) -> dict[str, Any]:
    first_expiry = recovery_decision(
        "failed", cancel_requested=False, attempts=1, max_attempts=3, failure_code="lease_expired"
    )
    settings = {**settings, "retry_delay_seconds": getattr(first_expiry, "delay_seconds", None)}
    summary: dict[str, Any] = {
        "bench": "failover_latency",
        "settings": settings,
        "options": options,
        "kill_at": kill_at,
        "skipped": {},
    }
    reason = await _service.postgres_or_skip(postgres_url)
    if reason is not None:
        summary["skipped"]["failover_latency"] = reason
        summary["verdicts"] = []
        return summary
    summary["postgres_version"] = await _store.postgres_version(postgres_url)
    async with _service.service_database(postgres_url, **sections(settings)) as db:
        await db.processes_ready(["control"])
        failover = Failover(db, options, kill_at)
        await failover.start()
        with _cli.progress_bar(console) as progress:
            for label, signum, count in (("kill", signal.SIGKILL, trials), ("drain", signal.SIGTERM, drain_trials)):
                if count == 0:
                    continue
                task = progress.add_task(f"{label} trials ({signal.Signals(signum).name})", total=count)
                results = []
                sizes = round_sizes(count, settings["slots"])
                for size in sizes:
                    results += await failover.signal_round(signum, size)
                    progress.advance(task, size)
                values = [r["first_checkpoint"] for r in results]
                summary[label] = {
                    **distribution(values),
                    "trials": count,
                    "signals": len(sizes),
                    "components_median": components(results),
                    "completed": sum(r["completed"] for r in results),
                    "other_worker": sum(r["other_worker"] for r in results),
                    "start_reasons": sorted({r["start_reason"] for r in results}),
                    "seconds": values,
                }
    summary["verdicts"] = verdicts(summary)
    return summary


# --------------------------------------------------------------------------------------------------- output


def report(summary: dict[str, Any]) -> str:
    s = summary["settings"]
    lines = [
        f"failover_latency: worker.lease_seconds={s['lease_seconds']}, worker.authority_seconds="
        f"{s['authority_seconds']}, worker.scan_seconds={s['scan_seconds']}, database.timeout={s['database_timeout']}; "
        f"runs of {summary['options']['steps']} steps x {summary['options']['step_seconds']} s, signal after "
        f"checkpoint {summary['kill_at']}; {s['slots']} runs per signal, one sample (trial) per run",
    ]
    for label, name in (
        ("kill", "SIGKILL -> continuation's first checkpoint"),
        ("drain", "SIGTERM (drain) -> continuation's first checkpoint"),
    ):
        figures = summary.get(label)
        if not figures:
            continue
        lines.append(
            f"  {name}: {figures['trials']} trials ({figures['signals']} signals), "
            f"p50 {figures['p50']:.3f} s, p99 {figures['p99']:.3f} s, max {figures['max']:.3f} s"
        )
        parts = ", ".join(f"{k.replace('_', ' ')} {v:+.3f} s" for k, v in figures["components_median"].items())
        lines.append(f"    median time after the signal: {parts}")
        lines.append(
            f"    continued on the other worker: {figures['other_worker']}/{figures['trials']}, completed: "
            f"{figures['completed']}/{figures['trials']}, start reason: {', '.join(figures['start_reasons'])}"
        )
    lines.extend(_cli.target_lines(summary))
    return "\n".join(lines)


def table(summary: dict[str, Any]) -> list[str]:
    """The figures as a Markdown table, for docs/benchmarks.md (targets are added by `bench.run_all`)."""
    s = summary["settings"]
    lines = [
        f"Settings: `worker.lease_seconds` = {s['lease_seconds']}, `worker.authority_seconds` = "
        f"{s['authority_seconds']}, `worker.scan_seconds` = {s['scan_seconds']}, `database.timeout` = "
        f"{s['database_timeout']}; runs of {summary['options']['steps']} steps of "
        f"{summary['options']['step_seconds']} s. A trial (sample) is one run interrupted by the signal: each "
        f"signal hits a worker holding up to {s['slots']} runs mid-run (`worker.slots` = {s['slots']}), and each of "
        "them gives the time from the signal to its continuation's first checkpoint on the other worker.",
        "",
        "| Signal | Trials (signals) | p50 s | p99 s | max s | Lease expiry | First attempt ended | Claimed | Started "
        "| Continued elsewhere | Completed |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, name in (("kill", "SIGKILL"), ("drain", "SIGTERM (drain)")):
        f = summary.get(label)
        if not f:
            continue
        c = f["components_median"]
        events = ("lease_expiry", "first_attempt_ended", "claimed", "started")
        cells = [f"{c[k]:+.3f}" if k in c else "-" for k in events]
        lines.append(
            f"| {name} | {f['trials']} ({f['signals']}) | {f['p50']:.3f} | {f['p99']:.3f} | {f['max']:.3f} | "
            f"{' | '.join(cells)} | {f['other_worker']}/{f['trials']} | {f['completed']}/{f['trials']} |"
        )
    lines += ["", "Event columns: median seconds after the signal."]
    return lines


def reading(summary: dict[str, Any]) -> list[str]:
    """A short reading of the figures, for docs/benchmarks.md (derived from the data, so it stays true)."""
    s, out = summary["settings"], []
    kill, drain = summary.get("kill"), summary.get("drain")
    if kill:
        c = kill["components_median"]
        out.append(
            f"Kill ({kill['trials']} trials from {kill['signals']} SIGKILLs of a worker holding up to "
            f"{s['slots']} runs): the median continuation commits its first checkpoint {kill['p50']:.2f} s after "
            "SIGKILL. Of that, "
            f"{c.get('lease_expiry', float('nan')):.2f} s is the rest of the lease (lease {s['lease_seconds']} s, "
            f"renewed every {s['authority_seconds']} s), the `expire_leases` pass recovers the attempt at "
            f"{c.get('first_attempt_ended', float('nan')):.2f} s, the run is due again "
            f"{s['retry_delay_seconds']} s later (an expired lease is not the run's fault, so the S-31 retry delay "
            f"does not apply to it), the standby claims it at {c.get('claimed', float('nan')):.2f} s and "
            "the rest is attempt start, one model turn and the commit. The lease dominates by design (a shorter "
            "lease fails over faster but renews more often)."
        )
    if drain:
        c = drain["components_median"]
        out.append(
            f"Drain ({drain['trials']} trials from {drain['signals']} SIGTERMs): the median handoff takes "
            f"{drain['p50'] * 1000:.0f} ms from SIGTERM to the continuation's first "
            f"checkpoint: the draining attempt yields at {c.get('first_attempt_ended', float('nan')) * 1000:.0f} ms "
            f"(after the {summary['options']['step_seconds'] * 1000:.0f} ms step in flight and the yielding commit), "
            f"the standby claims the run at {c.get('claimed', float('nan')) * 1000:.0f} ms; no lease is waited out."
        )
    out.extend(_cli.missed_lines(summary))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.failover_latency",
        description="Failover latency of real worker processes: SIGKILL and SIGTERM (drain) to the continuation's "
        "first checkpoint on another worker, on PostgreSQL.",
    )
    parser.add_argument("--trials", type=int, default=32, help="SIGKILL trials (default: 32)")
    parser.add_argument("--drain-trials", type=int, default=10, help="SIGTERM drain-handoff trials (default: 10)")
    parser.add_argument(
        "--runs-per-signal",
        type=int,
        default=4,
        help="runs the active worker holds when signalled, its worker.slots; one trial per run (default: 4)",
    )
    parser.add_argument(
        "--lease-seconds", type=float, default=3.0, help="worker.lease_seconds (default: 3, the smallest allowed)"
    )
    parser.add_argument("--authority-seconds", type=float, default=0.5, help="worker.authority_seconds (default: 0.5)")
    parser.add_argument("--scan-seconds", type=float, default=0.2, help="worker.scan_seconds (default: 0.2)")
    parser.add_argument(
        "--database-timeout",
        type=float,
        default=0.9,
        help="database.timeout (default: 0.9; 3x must stay below the lease)",
    )
    parser.add_argument("--steps", type=int, default=20, help="tool steps per run (default: 20)")
    parser.add_argument("--step-seconds", type=float, default=0.05, help="duration of one tool step (default: 0.05)")
    parser.add_argument(
        "--kill-at", type=int, default=2, help="signal once the run committed this many checkpoints (default: 2)"
    )
    _cli.add_postgres_url(parser)
    _cli.add_json(parser)
    args = parser.parse_args(argv)
    if args.trials < 0 or args.drain_trials < 0 or args.trials + args.drain_trials == 0:
        parser.error("--trials and --drain-trials must be >= 0, and not both 0")
    if not 1 <= args.kill_at < 2 * args.steps:
        parser.error("--kill-at must be between 1 and 2 x --steps - 1 (two checkpoints per step)")
    settings = {
        "lease_seconds": args.lease_seconds,
        "authority_seconds": args.authority_seconds,
        "scan_seconds": args.scan_seconds,
        "database_timeout": args.database_timeout,
        "slots": args.runs_per_signal,
    }
    options = {"script": "loop", "steps": args.steps, "step_seconds": args.step_seconds}
    if (problem := _service.settings_problem(**sections(settings))) is not None:
        parser.error(problem)
    summary = asyncio.run(
        measure(
            args.trials, args.drain_trials, settings, options, args.kill_at, args.postgres_url, Console(stderr=True)
        )
    )
    return _cli.emit(summary, report, args.json)


if __name__ == "__main__":
    sys.exit(main())
