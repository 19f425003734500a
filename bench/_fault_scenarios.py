"""The fault scenarios of issue 34 item 6, each through real `candor serve` processes (`bench/_faults.py`).

Not a benchmark itself (private module). Each scenario starts one `all` process (or a control and two worker
processes) on its database, submits a few runs of the fault agent (`_faults.factory`), waits until a model call is
under way, injects its fault, waits for every run to seal and returns a `FaultReport`:

* `pg_restart`: the (private) PostgreSQL server restarts (`pg_ctl restart -m fast`) mid-run;
* `connection_exhaustion`: on a private server with a low `max_connections`, every connection it still admits is
  taken and held for `hold_seconds` (shorter than `database.timeout`) while the runs go on;
* `blackhole`: the `all` process (its worker and its sweeps) reaches the database through a `FreezableProxy`, frozen
  for `freeze_seconds`;
* `sqlite_full`: the SQLite database lives on a small tmpfs that is filled for `hold_seconds`, then freed;
* `sigstop`: the worker that is calling the model for a run is frozen (SIGSTOP) until another worker has completed
  the run (well past the lease), then continued (SIGCONT); it must not run the tool the model then asks for;
* `sigstop_in_tool`: the same while the worker runs a long tool that asks `lease_held()` before its effect.

The first four are shorter than the lease (8 s): they must cost no charged attempt, no unknown outcome and no run.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from sqlalchemy import select

from . import _faults, _service

__all__ = (
    "FaultReport",
    "SCENARIOS",
    "LEASE_SECONDS",
    "pg_restart",
    "connection_exhaustion",
    "blackhole",
    "sqlite_full",
    "sigstop",
)

T = TypeVar("T")

LEASE_SECONDS = 8.0
TIMEOUT = 2.5
SETTINGS: dict[str, Any] = {
    "worker": {
        "lease_seconds": LEASE_SECONDS,
        "authority_seconds": 1.0,
        "scan_seconds": 0.2,
        "slots": 8,
        "drain_seconds": 2.0,
    },
    "database": {"timeout": TIMEOUT},
    "control": {"scan_seconds": 0.2},
    "server": {"shutdown_timeout": 10.0},
    "agents": {_faults.FAULT_AGENT: {"factory": _faults.FACTORY, "tool_recovery": "declared"}},
}
"""A lease long enough for every fault shorter than it on a loaded 2-core machine; 3 x timeout < lease (§3.3)."""
SIGSTOP_SETTINGS: dict[str, Any] = {
    **SETTINGS,
    "worker": {**SETTINGS["worker"], "lease_seconds": 3.0, "authority_seconds": 0.5},
    "database": {"timeout": 0.9},
}
"""The shortest lease (3 s): the frozen worker is continued once another one has completed its run."""
SETTLE_SECONDS = 90.0


@dataclass
class FaultReport:
    """What one fault cost. The first four faults must leave every count but `runs`/`completed` at zero."""

    fault: str
    runs: int
    completed: int = 0
    lost: int = 0
    """Runs not sealed `completed` when the scenario ended."""
    charged_attempts: int = 0
    """Attempts that ended `failed` (each one charged to its run), by reason in `charged_reasons`."""
    charged_reasons: dict[str, int] = field(default_factory=dict)
    unknown_outcomes: int = 0
    """Runs whose model was told `charge`'s outcome is unknown."""
    false_unknowns: int = 0
    """Of those, the runs whose `charge` ran (the ledger has it): the service lost a result it had."""
    duplicate_effects: int = 0
    effects_after_lost_lease: int = 0
    seconds: float = 0.0
    evidence: dict[str, Any] = field(default_factory=dict)
    """What shows the fault happened (restart time, refused connections, frozen pid, ...)."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Scene:
    """A scenario in progress: its database, processes, work directory and runs."""

    db: _service.ServiceDatabase
    workdir: Path
    workers: list[_service.ServiceProcess]
    tags: dict[str, str] = field(default_factory=dict)
    """run id → tag."""


async def retrying(call: Callable[[], Awaitable[T]], *, seconds: float = 60.0) -> T:
    """`await call()`, again while the database is unavailable (a restart drops this process's connections too;
    the bench's own client reconnects like the workers do)."""
    from sqlalchemy.exc import DBAPIError

    from candor.service.errors import StoreUnavailable

    deadline = time.monotonic() + seconds
    while True:
        try:
            return await call()
        except (StoreUnavailable, DBAPIError, OSError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)


@contextlib.asynccontextmanager
async def scene(
    url: str,
    *,
    runs: int,
    workers: int = 1,
    settings: Mapping[str, Any] = SETTINGS,
    model_seconds: float = 0.3,
    steps: int = 3,
    tool_seconds: float = 0.0,
    worker_url: str | None = None,
) -> AsyncIterator[Scene]:
    """Processes on `url` (the workers on `worker_url` if given, e.g. a proxy), `runs` submitted runs."""
    workdir = Path(tempfile.mkdtemp(prefix="candor-faults-"))
    workdir.chmod(0o777)
    async with contextlib.AsyncExitStack() as cleanup:
        cleanup.callback(shutil.rmtree, workdir, ignore_errors=True)
        db = await cleanup.enter_async_context(_service.service_database_at(url, **settings))
        env = dict(db.settings_env) if worker_url is None else {**db.settings_env, "CANDOR_DATABASE__URL": worker_url}
        # One worker: a single `all` process (control and worker), one start-up less on a loaded machine. Two: a
        # control process and two workers, so that freezing one worker leaves the sweeps and the other running.
        roles = ["all"] if workers == 1 else ["control", *(["worker"] * workers)]
        started = []
        for role in roles:
            process = _service.ServiceProcess(role, env if role != "control" else db.settings_env, db.log_dir).start()
            db.processes.append(process)
            started.append(process)
        await asyncio.gather(*(p.wait_ready() for p in started))
        current = Scene(db=db, workdir=workdir, workers=[p for p in started if p.role != "control"])
        for index in range(runs):
            tag = f"fault-{index}"
            options = {
                "tag": tag,
                "workdir": str(workdir),
                "steps": steps,
                "model_seconds": model_seconds,
                "tool_seconds": tool_seconds,
            }
            run_id = await retrying(functools.partial(_submit, db, options, tag))
            current.tags[run_id] = tag
        yield current


async def _submit(db: _service.ServiceDatabase, options: dict[str, Any], key: str) -> str:
    from candor.service import commands

    accepted = await commands.create_thread(
        db.service, db.principal, agent=_faults.FAULT_AGENT, input=_service.PROMPT, options=options, key=key
    )
    assert accepted.run is not None
    return accepted.run.id


async def until(check: Callable[[], Any], *, timeout: float, what: str) -> Any:
    """Poll `check()` (sync or async) every 20 ms until it returns something truthy; `TimeoutError` naming `what`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        await asyncio.sleep(0.02)
    raise TimeoutError(f"waited {timeout:.0f} s for {what}")


async def settle(
    current: Scene, fault: str, started: float, evidence: dict[str, Any], lost_lease: tuple[int, float] | None = None
) -> FaultReport:
    """Wait (bounded) for every run to seal, then count what the fault cost."""
    from candor.service.store.schema.tables import run_attempts, runs

    ids = list(current.tags)

    async def unsealed() -> int:
        async with current.db.service.engine.connect() as conn:
            rows = (
                await conn.execute(select(runs.c.id).where(runs.c.id.in_(ids), runs.c.status.in_(_service.SEALED)))
            ).all()
        return len(ids) - len(rows)

    deadline = time.monotonic() + SETTLE_SECONDS
    while time.monotonic() < deadline and await retrying(unsealed) > 0:
        await asyncio.sleep(0.2)

    async def rows() -> tuple[list[Any], list[Any]]:
        async with current.db.service.engine.connect() as conn:
            run_rows = (await conn.execute(select(runs.c.id, runs.c.status).where(runs.c.id.in_(ids)))).all()
            attempt_rows = (
                await conn.execute(
                    select(run_attempts.c.status, run_attempts.c.failure).where(run_attempts.c.run_id.in_(ids))
                )
            ).all()
        return list(run_rows), list(attempt_rows)

    run_rows, attempt_rows = await retrying(rows)
    ledger = _faults.read_ledger(current.workdir)
    told = _faults.read_told(current.workdir)
    charged = Counter(str((a.failure or {}).get("code")) for a in attempt_rows if a.status == "failed")
    completed = sum(1 for r in run_rows if r.status == "completed")
    after = _faults.effects_after(ledger, pid=lost_lease[0], since=lost_lease[1]) if lost_lease else []
    return FaultReport(
        fault=fault,
        runs=len(ids),
        completed=completed,
        lost=len(ids) - completed,
        charged_attempts=sum(charged.values()),
        charged_reasons=dict(charged),
        unknown_outcomes=sum(told.values()),
        false_unknowns=len(_faults.false_unknowns(told, ledger)),
        duplicate_effects=len(_faults.duplicate_effects(ledger)),
        effects_after_lost_lease=len(after),
        seconds=round(time.monotonic() - started, 1),
        evidence=evidence,
    )


async def _first_model_call(current: Scene) -> tuple[str, int]:
    marker: tuple[str, int] = await until(
        lambda: next(iter(_faults.read_markers(current.workdir)), None), timeout=60, what="a model call"
    )
    return marker


# ------------------------------------------------------------------------------------------------ the scenarios


async def pg_restart(*, runs: int = 4) -> FaultReport:
    """The private server restarts while the runs are in flight."""
    async with _faults.private_postgres() as server, scene(server.url, runs=runs) as current:
        started = time.monotonic()
        await _first_model_call(current)
        took = await server.restart()
        return await settle(current, "pg_restart", started, {"restart_seconds": round(took, 2)})


async def connection_exhaustion(*, runs: int = 6, hold_seconds: float = 1.5) -> FaultReport:
    """Every connection the private server (max_connections 30) still admits is held for `hold_seconds` while the
    runs go on. Each process keeps 1 pooled connection and opens up to 5 more under load, closing each when it comes
    back, so the processes keep asking the full server for new connections."""
    pools = {"pool_size": 1, "max_overflow": 5}  # overflow connections are closed when returned: new ones all along
    settings = {**SETTINGS, "database": {**SETTINGS["database"], **pools}}
    async with (
        _faults.private_postgres(max_connections=30) as server,
        scene(server.url, runs=runs, settings=settings) as current,
    ):
        started = time.monotonic()
        await _first_model_call(current)
        async with _faults.hog_connections(server.url) as held:
            await asyncio.sleep(hold_seconds)
        refused = server.log_count("too many clients") + server.log_count("remaining connection slots")
        return await settle(
            current,
            "connection_exhaustion",
            started,
            {"held_connections": held, "hold_seconds": hold_seconds, "refusals_logged": refused},
        )


async def blackhole(url: str, *, runs: int = 4, freeze_seconds: float = 3.0) -> FaultReport:
    """The worker's database traffic goes through a proxy that is frozen for `freeze_seconds` mid-run. `url`: an
    empty database (the control process and this process reach it directly)."""
    parts = urlsplit(url)
    proxy = await _faults.FreezableProxy(parts.hostname or "127.0.0.1", parts.port or 5432).start()
    worker_url = parts._replace(netloc=f"{parts.username or 'postgres'}@127.0.0.1:{proxy.port}").geturl()
    if parts.password:
        worker_url = parts._replace(netloc=f"{parts.username}:{parts.password}@127.0.0.1:{proxy.port}").geturl()
    try:
        async with scene(url, runs=runs, worker_url=worker_url) as current:
            started = time.monotonic()
            await _first_model_call(current)
            proxy.freeze()
            await asyncio.sleep(freeze_seconds)
            proxy.thaw()
            return await settle(
                current,
                "blackhole",
                started,
                {"freeze_seconds": freeze_seconds, "proxied_connections": proxy.connections},
            )
    finally:
        await proxy.close()


async def sqlite_full(*, runs: int = 4, hold_seconds: float = 1.5, size_mb: int = 24) -> FaultReport:
    """The SQLite database's filesystem (a `size_mb` tmpfs) is full for `hold_seconds` mid-run."""
    with _faults.small_tmpfs(size_mb) as where:
        async with scene(f"sqlite:///{where / 'candor.db'}", runs=runs) as current:
            started = time.monotonic()
            await _first_model_call(current)
            filler = _faults.fill_disk(where)
            await asyncio.sleep(hold_seconds)
            filler.unlink()
            return await settle(current, "sqlite_full", started, {"hold_seconds": hold_seconds, "size_mb": size_mb})


async def sigstop(url: str, *, runs: int = 1) -> FaultReport:
    """The worker calling the model for the first run is frozen until the other worker has completed that run,
    then continued; it must not run the tool its model then asks for. `url`: an empty PostgreSQL database."""
    async with scene(url, runs=runs, workers=2, settings=SIGSTOP_SETTINGS, model_seconds=1.0, steps=1) as current:
        return await _freeze_past_the_lease(current, "sigstop", _first_model_call(current))


async def sigstop_in_tool(url: str, *, runs: int = 1) -> FaultReport:
    """The worker running `charge` (a long tool that checks `lease_held()` before its effect) is frozen until the
    other worker has completed the run, then continued: it must not perform the effect. The new attempt finds the
    call interrupted and tells the model its outcome is unknown (§3.10): a true unknown, since nothing was charged."""
    async with scene(url, runs=runs, workers=2, settings=SIGSTOP_SETTINGS, tool_seconds=1.0, steps=1) as current:
        marker = until(
            lambda: next(iter(_faults.read_markers(current.workdir, tool=True)), None),
            timeout=60,
            what="a long tool call",
        )
        return await _freeze_past_the_lease(current, "sigstop_in_tool", marker)


async def _freeze_past_the_lease(current: Scene, fault: str, marker: Awaitable[tuple[str, int]]) -> FaultReport:
    started = time.monotonic()
    tag, pid = await marker
    (frozen,) = [p for p in current.workers if p.pid == pid]
    frozen.pause()
    frozen_at = time.time()
    run_id = next(r for r, t in current.tags.items() if t == tag)

    async def sealed() -> bool:
        from candor.service.store.schema.tables import runs as runs_table

        async with current.db.service.engine.connect() as conn:
            status = (await conn.execute(select(runs_table.c.status).where(runs_table.c.id == run_id))).scalar()
        return status in _service.SEALED

    await until(lambda: retrying(sealed), timeout=60, what="the other worker to complete the frozen run")
    frozen_seconds = time.time() - frozen_at
    frozen.resume()
    await asyncio.sleep(2.0)  # what the frozen worker was waiting for is due at once: give it time to act on it
    evidence = {"frozen_pid": pid, "frozen_seconds": round(frozen_seconds, 1), "lease_seconds": 3.0}
    return await settle(current, fault, started, evidence, lost_lease=(pid, frozen_at))


SCENARIOS = ("pg_restart", "connection_exhaustion", "blackhole", "sqlite_full", "sigstop", "sigstop_in_tool")
