"""A database blip costs a run nothing (issue 34 items 1 and 3), on both dialects.

`Flaky` wraps the store functions an attempt calls (`worker.attempt_store`) so that chosen calls fail with a real
driver or OS error chained in `StoreUnavailable`, as `store.engine` raises it: before the call (the connection was
refused: nothing was written) or after it (the write committed and its answer was lost). The real database does the
rest. `test_real_lock_blip` makes the fault real: another connection holds the lock the commit needs for longer
than `database.timeout`.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import sqlite3
import sys
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg
import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import FunctionModel
from sqlalchemy import select, text

from candor.service import failpoints
from candor.service.agents import AgentRegistry
from candor.service.core import Service
from candor.service.errors import StoreUnavailable
from candor.service.runtime import SeededEntropy
from candor.service.settings import ServiceSettings
from candor.service.store.db.engine import create_engine, unavailable
from candor.service.store.schema.tables import checkpoints, run_attempts
from candor.service.worker import WorkerLoop, attempt_store
from candor.service.worker import supervisor as supervisor_module
from candor.service.worker.handle import AttemptHandle
from candor.service.worker.lease_check import LeaseCheck, LeaseNotHeld, holding, lease_held

from worker import support
from worker.support import add_thread_run, attempt_rows, run_row

REFUSED = ConnectionRefusedError(errno.ECONNREFUSED, "Connect call failed ('127.0.0.1', 5432)")


def _fault(dialect: str) -> BaseException:
    """The driver's own transient error for the dialect (too many clients / database is locked)."""
    if dialect == "postgresql":
        too_many: BaseException = asyncpg.TooManyConnectionsError("sorry, too many clients already")
        return too_many
    error = sqlite3.OperationalError("database is locked")
    error.sqlite_errorcode = 5
    return error


def _raise(error: BaseException) -> StoreUnavailable:
    wrapped = unavailable(error)
    wrapped.__cause__ = error
    return wrapped


class Flaky:
    """Makes named store functions of `attempt_store` fail `before` times before running and `after` times after
    running (the write landed, the answer was lost)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.monkeypatch = monkeypatch
        self.calls: Counter[str] = Counter()

    def fail(self, name: str, *, before: int = 0, after: int = 0, error: BaseException = REFUSED) -> None:
        real: Callable[..., Awaitable[Any]] = getattr(attempt_store, name)
        left = {"before": before, "after": after}

        async def flaky(*args: Any, **kwargs: Any) -> Any:
            self.calls[name] += 1
            if left["before"]:
                left["before"] -= 1
                raise _raise(error)
            result = await real(*args, **kwargs)
            if left["after"]:
                left["after"] -= 1
                raise _raise(ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"))
            return result

        self.monkeypatch.setattr(attempt_store, name, flaky)


async def _checkpoint_attempts(engine: Any, run_id: str) -> list[tuple[int, int]]:
    query = select(checkpoints.c.seq, checkpoints.c.attempt).where(checkpoints.c.run_id == run_id)
    async with engine.connect() as conn:
        return sorted((row.seq, row.attempt) for row in (await conn.execute(query)).all())


async def test_every_call_of_an_attempt_survives_a_blip(db, service, tenant, control, monkeypatch, caplog) -> None:
    """Issue 34 item 1, S-50, S-14, S-39: each of the attempt's reads and writes fails twice with a transient
    error (the driver's own: too many clients / database is locked) and is retried: the run completes on its
    first attempt (nothing charged), every tool ran once, `seq` rises by one per commit; each retry is one log
    line naming the cause in words, without a traceback."""
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, script="tools")
    flaky = Flaky(monkeypatch)
    for name in ("read_authority", "load_attempt_start", "start_attempt", "commit_checkpoint"):
        flaky.fail(name, before=2, error=_fault(db.kind))
    caplog.set_level(logging.INFO, logger="candor.worker")
    await WorkerLoop(service, worker_id="w1").run_until_idle(timeout=30)

    run = await run_row(db.engine, ref.run_id)
    assert (run["status"], run["attempts"], run["output"]) == ("completed", 1, "done")
    assert [(a["number"], a["status"]) for a in await attempt_rows(db.engine, ref.run_id)] == [(1, "succeeded")]
    assert await _checkpoint_attempts(db.engine, ref.run_id) == [(1, 1), (2, 1), (3, 1), (4, 1)]
    assert sorted(control.ledger) == ["inproc call_charge charge 42", "inproc call_lookup lookup acme"]
    retried = [r for r in caplog.records if r.getMessage() == "Database call failed; retrying"]
    words = "too many connections" if db.kind == "postgresql" else "database is locked"
    assert len(retried) == 8 and all(words in r.cause and r.exc_info is None for r in retried)
    assert {r.call for r in retried} == {"authority check", "load start", "start attempt", "checkpoint commit"}


async def test_a_commit_whose_answer_was_lost_is_found_not_repeated(db, service, tenant, control, monkeypatch) -> None:
    """Issue 34 item 1, S-38, S-39, S-22: every commit (the sealing one too) and the start commit, then lose
    their answer; the retry finds its own rows instead of writing twice or declaring the lease lost: four
    checkpoints, seq 1…4 by attempt 1, the run completed, uncharged."""
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, script="tools")
    flaky = Flaky(monkeypatch)
    flaky.fail("start_attempt", after=1)
    flaky.fail("commit_checkpoint", after=4)
    await WorkerLoop(service, worker_id="w1").run_until_idle(timeout=30)

    run = await run_row(db.engine, ref.run_id)
    assert (run["status"], run["attempts"], run["checkpoint_seq"]) == ("completed", 1, 4)
    assert await _checkpoint_attempts(db.engine, ref.run_id) == [(1, 1), (2, 1), (3, 1), (4, 1)]
    assert flaky.calls["commit_checkpoint"] == 4 and flaky.calls["start_attempt"] == 1  # never sent twice
    assert sorted(control.ledger) == ["inproc call_charge charge 42", "inproc call_lookup lookup acme"]


async def test_recovery_and_seal_whose_answer_was_lost(db, service, tenant, monkeypatch, caplog) -> None:
    """Issue 34 item 1, S-30, S-31, S-49: the recovery of a transient failure and a `failed` seal commit and lose
    their answer; the attempt finds its own ending (no crash, no second write); the run is requeued once, then
    sealed failed with the harness's code."""
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, script="unavailable", max_attempts=2)
    flaky = Flaky(monkeypatch)
    flaky.fail("recover_attempt", after=1)
    caplog.set_level(logging.INFO, logger="candor.worker")
    await support.run_one_attempt(service, timeout=30)
    run = await run_row(db.engine, ref.run_id)
    assert (run["status"], run["attempts"]) == ("accepted", 1)
    assert flaky.calls["recover_attempt"] == 1
    assert not [r for r in caplog.records if r.getMessage() == "Attempt crashed"]
    assert any(r.getMessage() == "Database write had committed" for r in caplog.records)

    async with db.engine.begin() as conn:
        failing = await add_thread_run(conn, tenant, script="boom")
    flaky.fail("seal_run", after=1)
    await WorkerLoop(service).run_until_idle(timeout=30)
    sealed = await run_row(db.engine, failing.run_id)
    assert (sealed["status"], sealed["failure"]["code"]) == ("failed", "agent_unavailable")
    assert flaky.calls["seal_run"] == 1
    assert not [r for r in caplog.records if r.getMessage() == "Attempt crashed"]


async def test_an_outage_longer_than_the_window_abandons_without_crashing(db, tenant, monkeypatch, caplog) -> None:
    """Issue 34 items 1 and 4, S-24, S-25, S-51: commits that keep failing are retried only until the window
    closes; then the attempt ends without a seal or a crash ("Attempt ended" names the cause) and the lease is
    left to expire (the run is recovered elsewhere, charged, as after any lost lease)."""
    service = support.make_service(db.url, db.engine, lease_seconds=3, authority_seconds=0.5)
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, script="tools")
    flaky = Flaky(monkeypatch)
    for name in ("commit_checkpoint", "recover_attempt"):  # every write of the attempt, and its renewals
        flaky.fail(name, before=10_000, error=_fault(db.kind))

    async def renewal_refused(*args: Any, **kwargs: Any) -> set[str]:
        raise _raise(REFUSED)

    monkeypatch.setattr(supervisor_module, "renew_leases", renewal_refused)
    caplog.set_level(logging.INFO, logger="candor.worker")
    await WorkerLoop(service, worker_id="w1").run_until_idle(timeout=30)

    run = await run_row(db.engine, ref.run_id)
    assert run["status"] == "running" and run["checkpoint_seq"] == 0
    assert [a["status"] for a in await attempt_rows(db.engine, ref.run_id)] == ["running"]
    assert not [r for r in caplog.records if r.getMessage() == "Attempt crashed"]
    [ended] = [r for r in caplog.records if r.getMessage() == "Attempt ended"]
    assert ended.status == "abandoned" and ended.exc_info is None
    # the supervisor's deadline or the retries' window, whichever came first (S-24, S-25)
    assert ended.reason in ("deadline_cancelled", "store_unavailable", "lease_lost:local_deadline")
    retries = [r for r in caplog.records if r.getMessage() == "Database call failed; retrying"]
    assert len(retries) >= 5 and all(r.exc_info is None for r in retries)


@pytest.mark.slow
async def test_real_lock_blip(db, tenant, control, caplog) -> None:
    """Issue 34 item 1, S-50: another connection holds the lock a commit needs for three times `database.timeout`
    (PostgreSQL: `lock_timeout` → SQLSTATE 55P03; SQLite: busy → "database is locked"); the commits are retried
    and the run completes on its first attempt."""
    engine = create_engine(db.url, timeout=0.3)  # PostgreSQL's lock_timeout, SQLite's busy timeout
    settings = ServiceSettings(
        database={"url": db.url, "timeout": 0.3},
        worker={"lease_seconds": 10, "authority_seconds": 0.5, "scan_seconds": 0.05},
        agents={"scripted": {"factory": support.FACTORY}},
    )
    service = Service(
        settings=settings,
        engine=engine,
        agents=AgentRegistry({"scripted": support.FACTORY}),
        entropy=SeededEntropy(7),
        wakeups=asyncio.Event(),
    )
    try:
        async with db.engine.begin() as conn:
            ref = await add_thread_run(conn, tenant, script="tools")
        control.model_gate = asyncio.Event()
        caplog.set_level(logging.INFO, logger="candor.worker")
        worker = asyncio.create_task(WorkerLoop(service, worker_id="w1").run_until_idle(timeout=30))
        await asyncio.wait_for(control.model_entered.wait(), 10)
        async with _locked(db):
            control.model_gate.set()
            await asyncio.sleep(1.0)
        await worker
    finally:
        await engine.dispose()
    run = await run_row(db.engine, ref.run_id)
    assert (run["status"], run["attempts"]) == ("completed", 1)
    retried = [r for r in caplog.records if r.getMessage() == "Database call failed; retrying"]
    # PostgreSQL: the statement or lock timeout; SQLite: busy, or this process's writer queue waiting on it
    words = ("timed out",) if db.kind == "postgresql" else ("database is locked", "held the SQLite writer")
    assert retried and all(any(w in r.cause for w in words) for r in retried), [r.cause for r in retried]


class _locked:
    """Hold the write lock of the checkpoints table (PostgreSQL) or of the database (SQLite) in another
    connection for the block."""

    def __init__(self, db: Any) -> None:
        self.db = db

    async def __aenter__(self) -> None:
        if self.db.kind == "postgresql":
            self.conn = await self.db.engine.connect()
            await self.conn.begin()
            await self.conn.execute(text("LOCK TABLE checkpoints IN ACCESS EXCLUSIVE MODE"))
        else:  # a plain sqlite3 connection: the engine's own would begin its transaction itself
            # Taken on a thread: the worker runs on this event loop, and a writer of its own may be inside a
            # transaction right now; blocking the loop while SQLite waits for that writer would wait forever.
            path = self.db.url.removeprefix("sqlite:///")
            self.file = sqlite3.connect(path, isolation_level=None, timeout=30, check_same_thread=False)
            await asyncio.to_thread(self.file.execute, "BEGIN IMMEDIATE")

    async def __aexit__(self, *exc: object) -> None:
        if self.db.kind == "postgresql":
            await self.conn.rollback()
            await self.conn.close()
        else:
            self.file.execute("ROLLBACK")
            self.file.close()


# --- issue 34 item 3: no tool starts without the lease ------------------------------------------------------------


class _Handle:
    """What `LeaseCheck` and `lease_held` read of an `AttemptHandle`."""

    def __init__(self, held: bool) -> None:
        self.held, self.cancelled = held, False
        self.monotonic = lambda: 0.0

    def lease_held(self, now: float) -> bool:
        return self.held

    def cancel_for_deadline(self) -> bool:
        self.cancelled = True
        return True


async def test_lease_check_refuses_a_tool_under_a_lost_lease() -> None:
    """Issue 34 item 3, S-24: with the lease lost, the tool's handler is never called and the attempt is cancelled
    without further writes; with the lease held, the tool runs."""
    ran: list[str] = []

    async def handler(args: Any) -> str:
        ran.append("ran")
        return "ok"

    tool_def = type("Def", (), {"name": "charge"})()
    lost = _Handle(held=False)
    with pytest.raises(LeaseNotHeld, match="charge"):
        await LeaseCheck(lost).wrap_tool_execute(None, call=None, tool_def=tool_def, args={}, handler=handler)  # type: ignore[arg-type]  # stand-ins
    assert ran == [] and lost.cancelled
    held = _Handle(held=True)
    assert (
        await LeaseCheck(held).wrap_tool_execute(None, call=None, tool_def=tool_def, args={}, handler=handler)  # type: ignore[arg-type]  # stand-ins
        == "ok"
    )
    assert ran == ["ran"] and not held.cancelled


async def test_lease_held_from_inside_a_tool() -> None:
    """Issue 34 item 3: `lease_held()` answers for the attempt running the code, in tasks and threads it starts;
    True outside any attempt."""
    assert lease_held()
    lost = _Handle(held=False)
    with holding(lost):  # type: ignore[arg-type]  # a stand-in handle
        assert not lease_held()
        assert not await asyncio.create_task(asyncio.to_thread(lease_held))
    assert lease_held()


def test_handle_lease_held_follows_loss_and_deadline(db) -> None:
    """Issue 34 item 3, S-24: a handle holds its lease until a fenced write found it lost, a deadline
    cancellation, or a third of the lease left unconfirmed on the local clock."""
    handle = AttemptHandle(claimed=None, lease_seconds=30, sent_at=100.0)  # type: ignore[arg-type]  # lease_held reads no claim
    assert handle.lease_held(100.0) and handle.lease_held(119.9)
    assert not handle.lease_held(120.0)  # 30 − 20 = a third left
    handle.lease_lost = True
    assert not handle.lease_held(100.0)


async def test_a_tool_never_starts_after_the_lease_deadline(db, service, tenant, control, monkeypatch, caplog) -> None:
    """Issue 34 item 3, S-24, S-36, §13 (fencing alone protects only the database): the worker is frozen (its monotonic clock jumps past the local deadline) right
    after the tool-boundary commit; no tool starts, nothing more is written (no seal), and the attempt ends
    `deadline_cancelled`; a later attempt recovers the run as after a crash at that point (S-29)."""
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, script="tools")
    worker = WorkerLoop(service, worker_id="w1")
    real_hit = failpoints.hit

    def frozen_at_tool(name: str) -> None:
        if name == failpoints.BEFORE_TOOL:
            for handle in worker.live_handles():
                handle.sent_at -= handle.lease_seconds  # as if the process had been stopped for a whole lease
        real_hit(name)

    monkeypatch.setattr(failpoints, "hit", frozen_at_tool)  # the module attempt calls
    caplog.set_level(logging.INFO, logger="candor.worker")
    await worker.run_until_idle(timeout=30)

    assert control.ledger == []
    run = await run_row(db.engine, ref.run_id)
    assert run["status"] == "running" and run["checkpoint_seq"] == 2  # the model and tool boundaries, no seal
    [ended] = [r for r in caplog.records if r.getMessage() == "Attempt ended"]
    assert (ended.status, ended.reason) == ("abandoned", "deadline_cancelled")
    async with db.engine.connect() as conn:
        status = (
            await conn.execute(select(run_attempts.c.status).where(run_attempts.c.run_id == ref.run_id))
        ).scalar_one()
    assert status == "running"  # left to lease expiry (S-28)


PROBES: list[bool] = []
FREEZE: list[Callable[[], None]] = []


def _probe() -> str:
    """What the probe tools do: ask, freeze the worker (the test's hook), ask again."""
    PROBES.append(lease_held())
    for freeze in FREEZE:
        freeze()
    PROBES.append(lease_held())
    return "probed"


def _lease_probe(options: dict[str, Any]) -> Agent[Any, Any]:
    """One tool call: `probe` runs sync in a worker thread (`options["kind"] == "thread"`) or async in the loop."""

    def probe_in_thread() -> str:
        """Probe from a worker thread."""
        return _probe()

    async def probe_in_task() -> str:
        """Probe from the event loop."""
        return _probe()

    name = "probe_in_thread" if options["kind"] == "thread" else "probe_in_task"

    def respond(messages: list[ModelMessage]) -> ModelResponse:
        if not any(isinstance(p, ToolReturnPart) for m in messages for p in m.parts):
            return ModelResponse(parts=[ToolCallPart(name, {}, tool_call_id="probe")])
        return ModelResponse(parts=[TextPart("done")])

    return Agent(FunctionModel(lambda messages, info: respond(messages)), tools=[probe_in_thread, probe_in_task])


@pytest.mark.parametrize("kind", ["thread", "task"])
async def test_tools_ask_lease_held(db, service, tenant, monkeypatch, kind: str) -> None:
    """Issue 34 item 3, S-24: `lease_held()` called from a running attempt's tool (a sync tool in a worker thread,
    an async one in the loop) answers for that attempt: True while the lease holds, False once the worker's clock
    is past the local deadline; the attempt then writes nothing more (no seal)."""
    monkeypatch.setitem(support.SCRIPTS, "lease_probe", _lease_probe)
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, script="lease_probe", options={"kind": kind})
    worker = WorkerLoop(service, worker_id="w1")

    def freeze() -> None:
        for handle in worker.live_handles():
            handle.sent_at -= handle.lease_seconds

    PROBES.clear()
    monkeypatch.setattr(sys.modules[__name__], "FREEZE", [freeze])
    await worker.run_until_idle(timeout=30)
    assert PROBES == [True, False]
    run = await run_row(db.engine, ref.run_id)
    assert run["status"] == "running" and run["checkpoint_seq"] == 2  # nothing committed after the freeze
