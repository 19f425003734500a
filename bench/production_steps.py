"""Production-like load: many runs in flight on a slow model, CPU of every process and the database server (issue 33).

What a user sizing a deployment would try: `--runs` runs (default 200) all in flight at once, `--steps` steps each
(default 10: the model asks for one `step` tool call per response, a 200-byte result, then answers), the model
answering in `--model-ms` (default 200 ms, a scripted FunctionModel that sleeps), so every system is bound by CPU,
not by the model. Side by side, in interleaved rounds (each round runs every system once, in a rotated order), each
with fresh processes and a fresh database per round: bare Pydantic AI (`pydantic-ai`, no persistence), the floor of
a durable step (`floor+postgresql`: candor's Harness with a bare INSERT of the new messages at every boundary,
bench/_floor_commit.py), LangGraph + `PostgresSaver` with `durability="sync"` and `"async"`, Pydantic AI's
`DBOSAgent` on PostgreSQL, and the candor service on PostgreSQL and on SQLite (a `candor serve --role control`
process and `--workers` `--role worker` processes with `--slots` slots each; runs posted to `POST /v1/threads`).
The in-process systems run in bench/peers/step_server.py (LangGraph and DBOS from the peers venv, `make
bench-peers`) with their limits lifted to the load: a thread per run in flight, and every system's pools (the
floor's, LangGraph's, DBOS's system database, each candor process's) at `--connections`.

Figures per system: steps/s (steps / wall time from the first run started to the last finished), CPU ms per step of
every process of the system plus the PostgreSQL server's (its backends serving the system's database and a share of
the server's background processes, bench/_server_cpu.py), steps per CPU-second, the added latency of a step (the
time between a run's consecutive model requests less the model's think time, bench/_step_clock.py) at p50 and p99,
and peak RSS (VmHWM) of each process. The benchmark's own process (posting runs, polling candor's `runs` table on a
connection of its own, excluded from the server's CPU) is never counted.

    python -m bench.production_steps [--rounds 2] [--runs 200] [--steps 10] [--model-ms 200] [--systems ...]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from typing import Any

from . import _cli, _service, _store
from ._production_systems import SYSTEMS, Load, RoundResult, measure_round

QUICK_ARGS = [
    "--rounds",
    "1",
    "--runs",
    "4",
    "--steps",
    "2",
    "--model-ms",
    "50",
    "--workers",
    "1",
    "--slots",
    "4",
    "--systems",
    "pydantic-ai,floor+postgresql,candor-service+sqlite",
]
"""A smoke run (`python -m bench.run_all --quick`, tests): tiny sizes, the systems that need no peers venv."""
CANDOR_PG, CANDOR_SQLITE = "candor-service+postgresql", "candor-service+sqlite"
LANGGRAPH_SYNC, FLOOR = "langgraph-sync+postgresql", "floor+postgresql"


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _median_or_none(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def summarize_system(name: str, rounds: list[RoundResult], load: Load) -> dict[str, Any]:
    """One system's figures over its rounds: medians of the per-round figures, latency percentiles over every step
    of every round, the largest peak RSS of each process."""
    steps = load.total_steps
    added = [ms for r in rounds for ms in r.added_latency_ms]
    served = [r.server for r in rounds if r.server is not None]
    return {
        "system": name,
        "rounds": len(rounds),
        "steps_per_s": _median([steps / r.seconds for r in rounds]),
        "cpu_ms_per_step": _median([r.cpu_ms_total / steps for r in rounds]),
        "cpu_ms_per_step_by_round": [r.cpu_ms_total / steps for r in rounds],
        "processes_cpu_ms_per_step": {
            role: _median([r.process_cpu_ms[role] / steps for r in rounds]) for role in rounds[0].process_cpu_ms
        },
        "server_cpu_ms_per_step": _median_or_none([s.total_ms / steps for s in served]),
        "server_backends_ms_per_step": _median_or_none([s.backends_ms / steps for s in served]),
        "server_background_ms_per_step": _median_or_none([s.background_ms / steps for s in served]),
        "server_share": _median_or_none([s.share for s in served]),
        "steps_per_cpu_s": _median([1000 * steps / r.cpu_ms_total for r in rounds if r.cpu_ms_total > 0]),
        "added_latency_ms_p50": _store.percentile(added, 0.5) if added else None,
        "added_latency_ms_p99": _store.percentile(added, 0.99) if added else None,
        "latency_samples": len(added),
        "peak_rss_mib": {role: max(r.peak_rss_kib[role] for r in rounds) / 1024 for role in rounds[0].peak_rss_kib},
        "failed_runs": sum(r.failed_runs for r in rounds),
        "seconds_in_bench": sum(r.round_seconds for r in rounds),
        "versions": rounds[0].versions,
    }


def _by_round_ratio(a: list[float], b: list[float]) -> float:
    """Median of per-round ratios a/b: rounds share the machine's load, so their ratios are what count."""
    return _median([x / y for x, y in zip(a, b, strict=False) if y > 0])


def verdicts(systems: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 33's production-like targets, from this run, for every pair both of whose systems were measured."""
    out = []
    mine, sqlite = systems.get(CANDOR_PG), systems.get(CANDOR_SQLITE)
    floor, langgraph = systems.get(FLOOR), systems.get(LANGGRAPH_SYNC)
    if mine and langgraph:
        # steps per CPU-second is the inverse of CPU per step: candor's over LangGraph's = LangGraph's CPU / candor's
        ratio = _by_round_ratio(langgraph["cpu_ms_per_step_by_round"], mine["cpu_ms_per_step_by_round"])
        out.append(
            {
                "target": f"{CANDOR_PG}: steps per CPU-second >= 1.5x {LANGGRAPH_SYNC} (all processes + PostgreSQL)",
                "value": f"{ratio:.2f}x ({mine['steps_per_cpu_s']:.0f} vs {langgraph['steps_per_cpu_s']:.0f})",
                "met": ratio >= 1.5,
            }
        )
    if mine and floor:
        ratio = _by_round_ratio(mine["cpu_ms_per_step_by_round"], floor["cpu_ms_per_step_by_round"])
        out.append(
            {
                "target": f"{CANDOR_PG}: CPU per step <= 1.3x the floor's (all processes + PostgreSQL)",
                "value": f"{ratio:.2f}x ({mine['cpu_ms_per_step']:.2f} vs {floor['cpu_ms_per_step']:.2f} ms)",
                "met": ratio <= 1.3,
            }
        )
    if mine and sqlite:
        ratio = _by_round_ratio(sqlite["cpu_ms_per_step_by_round"], mine["cpu_ms_per_step_by_round"])
        out.append(
            {
                "target": f"{CANDOR_SQLITE}: CPU per step within 1.2x of {CANDOR_PG}'s",
                "value": f"{ratio:.2f}x ({sqlite['cpu_ms_per_step']:.2f} vs {mine['cpu_ms_per_step']:.2f} ms)",
                "met": ratio <= 1.2,
            }
        )
    if mine and mine["server_cpu_ms_per_step"] is not None:
        server = mine["server_cpu_ms_per_step"]
        out.append(
            {
                "target": f"{CANDOR_PG}: PostgreSQL server CPU per step <= 0.6 ms (a run's acceptance and seal "
                "spread over its steps)",
                "value": f"{server:.2f} ms",
                "met": server <= 0.6,
            }
        )
    return out


def table(summary: dict[str, Any]) -> list[str]:
    load = summary["load"]
    lines = [
        f"{load['runs']} runs in flight x {load['steps']} steps, model {load['model_ms']:g} ms, "
        f"{summary['rounds']} interleaved rounds",
        "",
        "| System | Steps/s | CPU ms per step (all processes + PostgreSQL) | Steps per CPU-second "
        "| Added latency p50 / p99 ms | Peak RSS MiB | Failed runs |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in summary["systems"]:
        parts = [f"{role} {ms:.2f}" for role, ms in s["processes_cpu_ms_per_step"].items()]
        if s["server_cpu_ms_per_step"] is not None:
            parts.append(
                f"PG {s['server_cpu_ms_per_step']:.2f} (backends {s['server_backends_ms_per_step'] or 0:.2f}, "
                f"background {s['server_background_ms_per_step'] or 0:.2f})"
            )
        latency = (
            "-"
            if s["added_latency_ms_p50"] is None
            else f"{s['added_latency_ms_p50']:.1f} / {s['added_latency_ms_p99']:.1f}"
        )
        rss = " + ".join(f"{mib:.0f}" for mib in s["peak_rss_mib"].values())
        lines.append(
            f"| {s['system']} | {s['steps_per_s']:.1f} | **{s['cpu_ms_per_step']:.2f}** ({', '.join(parts)}) "
            f"| {s['steps_per_cpu_s']:.0f} | {latency} | {rss} | {s['failed_runs']} |"
        )
    return lines


def reading(summary: dict[str, Any]) -> list[str]:
    load = summary["load"]
    out = [
        f"Every system ran {load['runs']} runs of {load['steps']} steps at once, per round, on fresh processes and a "
        "fresh database; figures are medians over rounds, ratios medians of per-round ratios (the machine may be "
        "shared: compare systems within this run, not across runs).",
        "CPU ms per step: every process of the system (for candor the control process, which also accepts the "
        "posted runs, and each worker) plus the PostgreSQL server's CPU charged to the system: the backends "
        "serving its database (read from /proc by pid, listed by `pg_stat_activity`), plus the server's background "
        "processes (checkpointer, background writer, walwriter, launchers, and the postmaster, which forks "
        "connections) in proportion to its backends' share of all client backends' CPU in the window. The "
        "benchmark's own process and its observer connections (the status poll, the sampler) are not counted.",
        "Added latency: a step's latency (from one model request of a run to its next) less the model's "
        f"{load['model_ms']:g} ms; a run's wait before its first model request (acceptance, claim) is not a step.",
        "Pydantic AI's DBOS integration (`DBOSAgent`) makes each model request a DBOS step but runs function tools "
        "inline: a tool's result is not checkpointed, so after a crash a finished tool call runs again (unless the "
        "tool opts into a DBOS child workflow through its metadata, which the loop's tool does not, as by default). "
        "Every other durable system here records each tool result before the next model request.",
        f"Every pool is capped at {load['connections']} connections per process (candor: each of its processes), "
        "and each in-process system has a thread per run in flight, so no system is held back by a limit the "
        "others do not have.",
    ]
    spent = ", ".join(f"{s['system']} {s['seconds_in_bench']:.0f} s" for s in summary["systems"])
    out.append(f"Wall time of each system's rounds, from a fresh database to its processes stopped: {spent}.")
    failed = [s["system"] for s in summary["systems"] if s["failed_runs"]]
    if failed:
        out.append(f"Runs failed on {', '.join(failed)}: their figures include the failed runs' partial work.")
    out.extend(_cli.missed_lines(summary))
    return out


def report(summary: dict[str, Any]) -> str:
    return "\n".join(["production_steps:", *table(summary), *_cli.target_lines(summary)])


async def measure(args: argparse.Namespace, progress: list[str]) -> dict[str, Any]:
    load = Load(args.runs, args.steps, args.model_ms / 1000, args.connections, args.workers, args.slots)
    skipped: dict[str, str] = {}
    pg_problem = await _service.postgres_or_skip(args.postgres_url)
    peers = _store.peers_python()
    systems = []
    for name in args.systems:
        if name.endswith("+postgresql") and pg_problem:
            skipped[name] = pg_problem
        elif name.startswith(("langgraph", "dbos")) and not peers.exists():
            skipped[name] = f"peers venv missing ({peers}): run `make bench-peers`"
        else:
            systems.append(name)
    results: dict[str, list[RoundResult]] = {name: [] for name in systems}
    for number in range(args.rounds):
        shift = number % len(systems) if systems else 0
        for name in systems[shift:] + systems[:shift]:
            if name in skipped:
                continue
            try:
                started = time.perf_counter()
                measured_round = await measure_round(name, load, args.postgres_url)
                measured_round.round_seconds = time.perf_counter() - started
                results[name].append(measured_round)
            except Exception as exc:  # noqa: BLE001 - a system that fails is reported, the others still run
                skipped[name] = f"round {number + 1} failed: {type(exc).__name__}: {str(exc)[:300]}"
                results[name] = []
        progress.append(f"  round {number + 1}/{args.rounds} done")
    measured = {name: summarize_system(name, rounds, load) for name, rounds in results.items() if rounds}
    summary: dict[str, Any] = {
        "bench": "production_steps",
        "rounds": args.rounds,
        "load": {**load.__dict__, "model_ms": args.model_ms},
        "systems": list(measured.values()),
        "skipped": skipped,
    }
    summary["verdicts"] = verdicts(measured)
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.production_steps", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds (default: 2)")
    parser.add_argument("--runs", type=int, default=200, help="runs in flight, all started at once (default: 200)")
    parser.add_argument("--steps", type=int, default=10, help="steps (tool calls) per run (default: 10)")
    parser.add_argument("--model-ms", type=float, default=200.0, help="the model's think time (default: 200)")
    parser.add_argument("--connections", type=int, default=20, help="pool size per process (default: 20)")
    parser.add_argument("--workers", type=int, default=2, help="candor worker processes (default: 2)")
    parser.add_argument("--slots", type=int, default=100, help="`worker.slots` of each (default: 100)")
    parser.add_argument(
        "--systems",
        type=lambda text: [s for s in text.split(",") if s],
        default=list(SYSTEMS),
        help=f"comma-separated subset of {','.join(SYSTEMS)}",
    )
    _cli.add_postgres_url(parser)
    _cli.add_json(parser)
    args = parser.parse_args(argv)
    unknown = sorted(set(args.systems) - set(SYSTEMS))
    if unknown:
        parser.error(f"unknown systems {unknown}; known: {', '.join(SYSTEMS)}")
    if min(args.rounds, args.runs, args.steps, args.connections, args.workers, args.slots) < 1 or args.model_ms < 0:
        parser.error("--rounds, --runs, --steps, --connections, --workers and --slots must be >= 1, --model-ms >= 0")
    if args.workers * args.slots < args.runs:
        parser.error(f"--workers x --slots ({args.workers * args.slots}) must hold --runs ({args.runs}) in flight")
    progress: list[str] = []
    summary = asyncio.run(measure(args, progress))
    for line in progress:
        print(line, file=sys.stderr)
    return _cli.emit(summary, report, args.json)


if __name__ == "__main__":
    sys.exit(main())
