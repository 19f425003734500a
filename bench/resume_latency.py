"""Resume latency: `POST /v1/runs/{id}/resume` over HTTP at 1, 8 and 32 concurrent clients (issue 8, item 4).

On a fresh PostgreSQL database, a `candor serve --role worker` process first brings enough scripted runs to
`waiting` (the model calls a tool that requires approval) and is then stopped, so only the API works while the
resumes are measured. A `candor serve --role control` process (uvicorn, service defaults except
`database.pool_size`, one connection per client of the largest level: docs/operations.md) serves the API; once its
sweeps have settled the outbox rows the preparation staged (a `checkpoint_cleanup` per sealed run), the clients are
aiohttp sessions in the benchmark process, one connection each (keep-alive, opened before the timing starts unless
`--cold-connections`), each sending `--requests` / clients resumes one after the other, each for a different waiting
run, approving its pending call with a fresh `Idempotency-Key`. Every answer must be 201 (a new successor run). The
figure is the client-side time of one request, from sending to the full response. `--warmup` resumes go first,
untimed, from as many clients as the largest level has (so the control process's pool holds that many connections
before any timing). Target: p99 <= 50 ms at 32 concurrent clients. Preparing the waiting runs takes most of this
benchmark's time: 400 requests per level (the p99 is the 5th-slowest of 400) keep `make bench` within its 15
minutes on a slower machine (with 640, 143 s of 1,060 s on one whose 10-million-iteration loop took 0.8 s).

With `--baseline-src DIR` (another candor `src`, e.g. `git archive main src | tar -x -C /tmp/base`) a second
control process importing that code serves the same database, and every client count is measured on both, in
`--rounds` interleaved rounds (alternating which goes first), so before/after figures share the machine's load.
`--profile DIR` records the (non-baseline) control process with py-spy during the largest client count.

    python -m bench.resume_latency [--clients 1,8,32] [--requests 400] [--warmup 64]
                                   [--baseline-src DIR] [--rounds 1] [--profile DIR] [--cold-connections]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console
from rich.progress import Progress
from sqlalchemy import func, select

from candor.service.store.schema.tables import outbox, runs

from . import _agents, _cli, _service, _store

TARGET_P99_MS = 50.0
TARGET_CLIENTS = 32
QUICK_ARGS = ["--clients", "1,2", "--requests", "4", "--warmup", "1"]
"""Arguments for a smoke run (`python -m bench.run_all --quick`, tests)."""
IDLE_SECONDS = 3.0
"""How long the control processes' CPU is sampled with no request, to subtract their sweeps' share."""
RESUME_BODY = {"approvals": {_agents.APPROVAL_CALL_ID: {"action": "approve"}}, "calls": {}}


async def prepare_waiting(db: _service.ServiceDatabase, count: int, progress: Progress) -> list[str]:
    """`count` runs waiting for approval, brought there by a real worker process that is stopped afterwards."""
    task = progress.add_task("preparing waiting runs", total=count)
    worker = db.process("worker")
    await worker.wait_ready()
    await _service.closed_loop(
        db,
        {"script": "approval"},
        count,
        4 * db.service.settings.worker.slots,
        prefix="waiting",
        on_sealed=lambda n: progress.update(task, completed=n),
    )
    await worker.stop()
    async with db.service.engine.connect() as conn:
        query = select(runs.c.id).where(runs.c.status == "waiting").order_by(runs.c.created_at)
        waiting = [row[0] for row in (await conn.execute(query)).all()]
    if len(waiting) != count:
        raise RuntimeError(f"expected {count} waiting runs, found {len(waiting)}")
    return waiting


async def outbox_drained(db: _service.ServiceDatabase, timeout: float = 120.0) -> None:
    """Until the control process's sweeps have settled the outbox rows the preparation staged (each sealed waiting
    run's `checkpoint_cleanup`), so that work is not measured as part of the resumes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        async with db.service.engine.connect() as conn:
            pending = (await conn.execute(select(func.count()).where(outbox.c.status == "pending"))).scalar_one()
        if not pending:
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"{pending} outbox rows still pending after {timeout:.0f} s")


async def resume_all(
    base_url: str,
    secret: str,
    run_ids: list[str],
    clients: int,
    *,
    on_start: Callable[[], None] | None = None,
    cold: bool = False,
) -> list[float]:
    """Resume every run of `run_ids` with `clients` concurrent clients; each request's milliseconds.

    Each client is one aiohttp session holding one keep-alive connection. Unless `cold`, every client first opens
    its connection with a `GET /healthz`, and `on_start` runs once they all have: the timed requests then measure
    the endpoint as a client holding a connection sees it, not 32 TCP handshakes arriving at once (with
    `--requests 160` at 32 clients a fifth of the samples were a connection's first request)."""
    queue: asyncio.Queue[str] = asyncio.Queue()
    for run_id in run_ids:
        queue.put_nowait(run_id)
    latencies: list[float] = []
    headers = {"Authorization": f"Bearer {secret}"}
    body = json.dumps(RESUME_BODY).encode()
    timeout = aiohttp.ClientTimeout(total=30)
    # aiohttp rather than httpx: the clients share the machine's 2 cores with the server, and an httpx request
    # costs ~1 ms of client CPU against ~0.15 ms here; the requests on the wire are the same.
    sessions = [
        aiohttp.ClientSession(base_url, headers=headers, connector=aiohttp.TCPConnector(limit=1), timeout=timeout)
        for _ in range(min(clients, len(run_ids)))
    ]

    async def open_connection(http: aiohttp.ClientSession) -> None:
        async with http.get("/healthz") as response:
            await response.read()

    async def client(http: aiohttp.ClientSession) -> None:
        while not queue.empty():
            run_id = queue.get_nowait()
            started = time.perf_counter()
            async with http.post(
                f"/v1/runs/{run_id}/resume",
                data=body,
                headers={"Idempotency-Key": f"resume-{run_id}", "Content-Type": "application/json"},
            ) as response:
                text = await response.text()
            elapsed = (time.perf_counter() - started) * 1000
            if response.status != 201:
                raise RuntimeError(f"resume of {run_id} answered {response.status}: {text[:500]}")
            latencies.append(elapsed)

    try:
        if not cold:
            await asyncio.gather(*(open_connection(http) for http in sessions))
        if on_start is not None:
            on_start()
        await asyncio.gather(*(client(http) for http in sessions))
    finally:
        await asyncio.gather(*(http.close() for http in sessions))
    return latencies


def process_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds process `pid` has used, from `/proc/<pid>/stat` (fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()  # the name may hold spaces
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def level_figures(
    clients: int,
    latencies: list[float],
    wall: float,
    control_cpu: float,
    machine_busy: float,
    system: str = "candor",
    idle_cpu_per_s: float = 0.0,
) -> dict[str, Any]:
    """One client count's figures. `control_cpu_ms` (the control process's CPU per request) depends far less on
    what else the machine runs than the latencies do; `machine_busy` says how loaded the machine was.
    `control_net_cpu_ms` subtracts what the process spends with no request at all (its sweeps, `idle_cpu_per_s`
    seconds per second, measured before the levels) over the level's wall time: on a loaded machine a level takes
    longer and the sweeps' share of `control_cpu_ms` grows, the requests' own cost does not."""
    return {
        "system": system,
        "clients": clients,
        "requests": len(latencies),
        "p50_ms": _store.percentile(latencies, 0.5),
        "p99_ms": _store.percentile(latencies, 0.99),
        "max_ms": max(latencies),
        "requests_per_s": len(latencies) / wall,
        "control_cpu_ms": control_cpu * 1000 / len(latencies),
        "control_net_cpu_ms": max(0.0, control_cpu - idle_cpu_per_s * wall) * 1000 / len(latencies),
        "machine_busy": machine_busy,
    }


async def idle_cpu_rates(pids: dict[str, int], seconds: float = IDLE_SECONDS) -> dict[str, float]:
    """CPU seconds per second each process spends while no request arrives (its sweeps and timers)."""
    before = {name: process_cpu_seconds(pid) for name, pid in pids.items()}
    await asyncio.sleep(seconds)
    return {name: (process_cpu_seconds(pid) - before[name]) / seconds for name, pid in pids.items()}


def verdicts(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    at = next((r for r in results if r["clients"] == TARGET_CLIENTS and r.get("system", "candor") == "candor"), None)
    if at is None:
        return []
    return [
        {
            "target": f"resume p99 <= {TARGET_P99_MS:.0f} ms at {TARGET_CLIENTS} concurrent clients",
            "value": f"{at['p99_ms']:.1f} ms",
            "met": at["p99_ms"] <= TARGET_P99_MS,
        }
    ]


def start_profiler(pid: int, out_dir: Path, clients: int) -> subprocess.Popen[bytes]:
    """py-spy recording process `pid` (raw collapsed stacks, idle frames left out) until `stop_profiler`.

    `--nonblocking`: py-spy's default pauses the process for every sample, which at 32 clients stretched p99 from
    178 to 790 ms on one machine; the figures of a profiled run are still not the
    unprofiled ones."""
    py_spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"control-{clients}-clients.txt"
    return subprocess.Popen(
        [py_spy, "record", "--nonblocking", "-p", str(pid), "-r", "250", "-f", "raw", "-o", str(target)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


async def stop_profiler(profiler: subprocess.Popen[bytes]) -> None:
    profiler.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
    await asyncio.to_thread(profiler.wait, 60)


@contextmanager
def clients_heap_frozen() -> Iterator[None]:
    """Full collections of this process skip what exists on entry (`gc.freeze`), until the block ends.

    The clients run in this process, which holds everything the preparation built: one full collection stalled
    every client for ~100 ms in the middle of a timed batch (measured with `gc.callbacks`), and the latencies then
    counted this process's pause, not the server's; at 3,000 requests that pause alone was the p99. `serve` does the
    same for the control process (`process._freeze_startup_objects`)."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


class _Window:
    """What a level's figures are measured from: the control process's CPU, the machine's CPU times and the clock,
    read once the clients hold their connections (`resume_all`'s `on_start`)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.start()

    def start(self) -> None:
        self.cpu, self.machine = process_cpu_seconds(self.pid), _service.machine_cpu_times()
        self.started = time.perf_counter()


async def measure(
    levels: list[int],
    requests: int,
    warmup: int,
    postgres_url: str,
    console: Console,
    database: dict[str, Any] | None = None,
    *,
    baseline: Path | None = None,
    rounds: int = 1,
    profile: Path | None = None,
    cold: bool = False,
) -> dict[str, Any]:
    summary: dict[str, Any] = {
        "bench": "resume_latency",
        "requests": requests,
        "warmup": warmup,
        "cold_connections": cold,
        "results": [],
        "skipped": {},
        "verdicts": [],
        "rounds": rounds,
        "baseline_src": None if baseline is None else str(baseline),
    }
    reason = await _service.postgres_or_skip(postgres_url)
    if reason is not None:
        summary["skipped"]["resume_latency"] = reason
        return summary
    summary["postgres_version"] = await _store.postgres_version(postgres_url)
    summary["database_settings"] = database or {}
    systems = {"candor": None} if baseline is None else {"candor": None, "baseline": baseline}
    per_round = [requests // rounds + (1 if r < requests % rounds else 0) for r in range(rounds)]
    async with _service.service_database(postgres_url, **({"database": database} if database else {})) as db:
        with _cli.progress_bar(console) as progress:
            waiting = await prepare_waiting(db, len(systems) * (warmup + requests * len(levels)), progress)
            controls = {name: db.process("control", source) for name, source in systems.items()}
            await asyncio.gather(*(control.wait_ready() for control in controls.values()))
            await outbox_drained(db)
            offset = 0

            def take(count: int) -> list[str]:
                nonlocal offset
                offset += count
                return waiting[offset - count : offset]

            for control in controls.values():
                if warmup:
                    await resume_all(control.base_url, db.secret, take(warmup), min(warmup, max(levels)))
            idle = await idle_cpu_rates({name: control.pid for name, control in controls.items()})
            summary["control_idle_cpu_ms_per_s"] = {name: rate * 1000 for name, rate in idle.items()}
            task = progress.add_task("resume requests", total=requests * len(levels) * len(systems))
            with clients_heap_frozen():
                for clients in levels:
                    totals: dict[str, dict[str, Any]] = {
                        name: {"latencies": [], "wall": 0.0, "cpu": 0.0, "busy": 0.0} for name in systems
                    }
                    profiler = None
                    if profile is not None and clients == max(levels):
                        profiler = start_profiler(controls["candor"].pid, profile, clients)
                    for round_index, count in enumerate(per_round):
                        order = list(systems) if round_index % 2 == 0 else list(reversed(systems))
                        for name in order:
                            control, batch = controls[name], take(count)
                            window = _Window(control.pid)
                            latencies = await resume_all(
                                control.base_url, db.secret, batch, clients, on_start=window.start, cold=cold
                            )
                            total = totals[name]
                            total["wall"] += time.perf_counter() - window.started
                            total["cpu"] += process_cpu_seconds(control.pid) - window.cpu
                            busy = _service.busy_fraction(window.machine, _service.machine_cpu_times())
                            total["busy"] += busy * count
                            total["latencies"] += latencies
                            progress.advance(task, len(batch))
                    if profiler is not None:
                        await stop_profiler(profiler)
                    for name, total in totals.items():
                        summary["results"].append(
                            level_figures(
                                clients,
                                total["latencies"],
                                total["wall"],
                                total["cpu"],
                                total["busy"] / requests,
                                name,
                                idle[name],
                            )
                        )
            summary["load_average"] = os.getloadavg()
    summary["verdicts"] = verdicts(summary["results"])
    return summary


def report(summary: dict[str, Any]) -> str:
    lines = [
        f"resume_latency: POST /v1/runs/{{id}}/resume over HTTP to `candor serve --role control` on PostgreSQL, "
        f"{summary['requests']} timed requests per level after {summary['warmup']} warm-up requests"
        + (", connections opened inside the timed requests" if summary.get("cold_connections") else ""),
        f"  {'system':<10}{'clients':>8}{'requests':>10}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}{'requests/s':>12}"
        f"{'control CPU ms/req':>20}{'net of idle':>13}{'machine busy':>14}",
    ]
    for r in summary["results"]:
        lines.append(
            f"  {r.get('system', 'candor'):<10}{r['clients']:>8}{r['requests']:>10}"
            f"{r['p50_ms']:>9.1f}{r['p99_ms']:>9.1f}{r['max_ms']:>9.1f}"
            f"{r['requests_per_s']:>12.1f}{r['control_cpu_ms']:>20.2f}{r.get('control_net_cpu_ms', 0):>13.2f}"
            f"{r['machine_busy']:>14.0%}"
        )
    for name, rate in summary.get("control_idle_cpu_ms_per_s", {}).items():
        lines.append(f"  {name} control process with no request: {rate:.1f} ms CPU per second")
    if "load_average" in summary:
        averages = ", ".join(f"{v:.2f}" for v in summary["load_average"])
        lines.append(f"  load average at the end (1, 5, 15 min): {averages}")
    lines.extend(_cli.target_lines(summary))
    return "\n".join(lines)


def table(summary: dict[str, Any]) -> list[str]:
    """The figures as a Markdown table, for docs/benchmarks.md (targets are added by `bench.run_all`)."""
    lines = ["| Concurrent clients | Requests | p50 ms | p99 ms | max ms | Requests/s |", "|---|---|---|---|---|---|"]
    lines += [
        f"| {r['clients']} | {r['requests']} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | {r['max_ms']:.1f} | "
        f"{r['requests_per_s']:.1f} |"
        for r in candor_results(summary)
    ]
    return lines


def candor_results(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The figures of this checkout's control process (not the `--baseline-src` one)."""
    return [r for r in summary["results"] if r.get("system", "candor") == "candor"]


def reading(summary: dict[str, Any]) -> list[str]:
    """A short reading of the figures, for docs/benchmarks.md (derived from the data, so it stays true)."""
    out: list[str] = []
    results = candor_results(summary)
    if results:
        one, top = results[0], results[-1]
        out.append(
            f"One client: {one['p50_ms']:.1f} ms per resume (p50), {one['requests_per_s']:.0f} requests/s. At "
            f"{top['clients']} clients the one API process answers {top['requests_per_s']:.0f} requests/s with p50 "
            f"{top['p50_ms']:.1f} ms: the clients send closed loop (each waits for its answer before sending the "
            f"next), so past the point where the process is busy extra clients only queue and latency is about "
            f"clients / throughput ({top['clients']} x {1000 / top['requests_per_s']:.1f} ms). Each resume is one "
            "statement to authenticate, one to read what the resume decides on (the replay and the run, the run's "
            "thread with its state, the key's authority, whether the workspace has webhook subscriptions) and one "
            "guarded write (the thread's update as a CTE, the successor's insert selecting from it), each committing "
            "on its own, outside any transaction; plus JSON validation and the response. On a "
            "shared machine every database round trip also waits for a CPU. The machine's CPUs were "
            f"{top['machine_busy']:.0%} busy during the {top['clients']}-client level (other work included)."
        )
        cpu_ms = top["control_cpu_ms"]
        tail = top["p99_ms"] / top["p50_ms"]
        needed = top["clients"] * tail / (TARGET_P99_MS / 1000)
        if cpu_ms <= 0:  # a handful of requests can fit inside one 10 ms tick of the process's CPU clock
            out.append(
                f"The control process's CPU for the {top['requests']} requests at {top['clients']} clients was under "
                "one tick of its CPU clock (10 ms): too few requests to derive the CPU floor."
            )
            return out + _cli.missed_lines(summary)
        out.append(
            f"The floor: the control process spent {cpu_ms:.2f} ms of CPU per resume, and one process runs on one "
            f"core, so it cannot answer more than {1000 / cpu_ms:,.0f} resumes/s even with nothing else running; "
            f"{top['clients']} closed-loop clients then wait at least {top['clients'] * cpu_ms:.0f} ms per request "
            f"(p50). p99 was {tail:.2f} times p50 here, so a p99 of {TARGET_P99_MS:.0f} ms would need about "
            f"{needed:,.0f} resumes/s, i.e. at most {1000 / needed:.2f} ms of control CPU per resume, with "
            "PostgreSQL and the clients sharing the same 2 cores. Where the control process's time goes, what was "
            "cut (10 database round trips per resume down to 3; every statement on asyncpg directly; no second "
            "access log line; startup objects frozen out of the cyclic garbage collector, whose full collections "
            "had paused the process for ~100 ms; the benchmark's own clients frozen out of it too) and what is "
            "left: "
            "docs/performance.md (`--profile DIR` records it with py-spy, `--baseline-src DIR` measures another "
            "candor source side by side). Further gains need more than one control process (they share nothing "
            "but the database) or less CPU per request outside the database (HTTP handling is about a fifth of "
            "it); key lookups are deliberately not cached (a disabled key answers 401 from its next request, "
            "docs/operations.md)."
        )
    out.extend(_cli.missed_lines(summary))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.resume_latency",
        description="Latency of POST /v1/runs/{id}/resume over HTTP on PostgreSQL at several concurrent clients.",
    )
    parser.add_argument(
        "--clients",
        type=_cli.positive_ints,
        default=[1, 8, TARGET_CLIENTS],
        help="concurrent client counts (default: 1,8,32)",
    )
    parser.add_argument("--requests", type=int, default=400, help="timed resumes per client count (default: 400)")
    parser.add_argument("--warmup", type=int, default=64, help="untimed resumes first (default: 64)")
    parser.add_argument(
        "--pool-size",
        type=int,
        default=None,
        help="database.pool_size of the processes (default: the largest --clients, one connection per concurrent "
        "request, as docs/operations.md advises for a control process)",
    )
    parser.add_argument(
        "--max-overflow",
        type=int,
        default=None,
        help="database.max_overflow of the processes (default: the service default)",
    )
    _cli.add_baseline_src(parser, "a second control process importing that code is measured at every client count")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="interleaved rounds per client count, each --requests / rounds resumes (default: 1)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        default=None,
        help="record the control process with py-spy during the largest client count, into this "
        "directory (raw collapsed stacks)",
    )
    parser.add_argument(
        "--cold-connections",
        action="store_true",
        help="time each client's first request together with opening its connection (as before 2026-12-04); "
        "by default every client opens its connection first, untimed",
    )
    _cli.add_postgres_url(parser)
    _cli.add_json(parser)
    args = parser.parse_args(argv)
    if args.requests < 1 or args.warmup < 0 or not 1 <= args.rounds <= args.requests:
        parser.error("--requests must be >= 1, --warmup >= 0 and --rounds between 1 and --requests")
    pool_size = max(args.clients) if args.pool_size is None else args.pool_size
    database = {
        name: value
        for name, value in (("pool_size", pool_size), ("max_overflow", args.max_overflow))
        if value is not None
    }
    problem = _service.settings_problem(database=database) if database else None
    if problem is not None:
        parser.error(problem)
    summary = asyncio.run(
        measure(
            args.clients,
            args.requests,
            args.warmup,
            args.postgres_url,
            Console(stderr=True),
            database,
            baseline=args.baseline_src,
            rounds=args.rounds,
            profile=args.profile,
            cold=args.cold_connections,
        )
    )
    return _cli.emit(summary, report, args.json)


if __name__ == "__main__":
    sys.exit(main())
