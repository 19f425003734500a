"""The crash matrix (issue 15 item 1): every run-related failpoint × every hit that lands on a different boundary ×
`tool_recovery` declared/never/always × SQLite and PostgreSQL. In each cell a real worker process (forked from a
pre-imported spawner, `_worker_zygote.py`) is killed with SIGKILL by its failpoint; its lease is then moved into the
past (instead of waiting it out), the `expire_leases` sweep recovers the attempt and another worker finishes the
run.

Rules: S-27, S-28 (expiry and recovery), S-29 with H-45/H-46/H-47 (open tool calls per mode), S-30/S-14 (the
recovery attempt is charged), S-35/S-36 (commit before the next event, no tool before its boundary), S-39 (one
checkpoint per boundary, no duplicated message), issue 13 item 1 (the run's own mode is used).

The agent (`tools` script of support.py) answers one prompt with calls to `charge` (not retry-safe) and `lookup`
(retry-safe), then says "done"; each tool appends a line to a side file before it returns, so the effects that
happened are known whatever was committed. A clean run commits: seq 1 (model boundary), seq 2 (tool boundary),
seq 3 (model boundary with the returns), seq 4 (final commit with the seal).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, ToolCallPart, ToolReturnPart, UserPromptPart
from sqlalchemy import update

from candor.service import failpoints
from candor.service.agents import AgentRegistry
from candor.service.control.sweeps import expire_leases
from candor.service.core import Service
from candor.service.protocol.tool_recovery import TOOL_RECOVERY_MODES
from candor.service.runtime import SeededEntropy
from candor.service.store.checkpoints.incremental import load_state
from candor.service.store.db.engine import create_engine
from candor.service.store.schema.dialect import db_now
from candor.service.store.schema.tables import run_attempts
from candor.service.worker import WorkerLoop
from candor.tools import UNKNOWN_OUTCOME_CONTENT

from worker import support
from worker.support import add_thread_run, attempt_rows, run_row

pytestmark = [pytest.mark.crash]

ZYGOTE = Path(__file__).with_name("_worker_zygote.py")
PARALLEL_CELLS = {"sqlite": 3, "postgresql": 8}
"""Cells run side by side. SQLite takes one writer at a time, so more cells there only queue on its lock (and a
long queue times a transaction out, an `attempt_failed` retry that is not the crash under test)."""
CELL_TIMEOUT = 120.0
DYING_LEASE = 60.0
"""The dying worker's lease. Long, so that a loaded machine never lets it expire while the worker still lives (that
would be a second, unplanned recovery); once the worker is dead the test moves its expiry into the past instead of
waiting it out (the wait itself, S-28, is what bench/failover_latency.py measures)."""
SURVIVOR_LEASE = 20.0
SPAWN_SPACING = 0.5


@dataclass(frozen=True)
class Crash:
    """Where the dying worker is killed, and what that leaves behind."""

    point: str
    hit: int
    boundary: str
    committed_seq: int
    """`runs.checkpoint_seq` once the worker is dead."""
    tools_ran: bool
    """The dying worker ran both tools (their effects happened)."""
    open_calls: bool
    """The recovering attempt finds the two calls unanswered in the last committed checkpoint."""


CRASHES = (
    Crash(failpoints.CHECKPOINT_BEFORE_COMMIT, 1, "inside the first model boundary's commit", 0, False, False),
    Crash(failpoints.CHECKPOINT_AFTER_COMMIT, 1, "first model boundary committed", 1, False, False),
    Crash(failpoints.AFTER_MODEL_RESPONSE, 1, "calls received, tool boundary not committed", 1, False, False),
    Crash(failpoints.CHECKPOINT_BEFORE_COMMIT, 2, "inside the tool boundary's commit", 1, False, False),
    Crash(failpoints.CHECKPOINT_AFTER_COMMIT, 2, "tool boundary committed, tools not started", 2, False, True),
    Crash(failpoints.BEFORE_TOOL, 1, "tools about to start (H-36)", 2, False, True),
    Crash(failpoints.CHECKPOINT_BEFORE_COMMIT, 3, "tools ran, their returns' commit rolled back", 2, True, True),
    Crash(failpoints.CHECKPOINT_AFTER_COMMIT, 3, "tool returns committed", 3, True, False),
    Crash(failpoints.BEFORE_SEAL, 1, "final answer classified, before the final commit", 3, True, False),
    Crash(failpoints.CHECKPOINT_BEFORE_COMMIT, 4, "inside the final commit (checkpoint + seal)", 3, True, False),
)
RUN_POINTS = failpoints.POINTS - {failpoints.OUTBOX_BEFORE_SETTLE}
MODES = tuple(sorted(TOOL_RECOVERY_MODES))


@dataclass(frozen=True)
class Expected:
    charge_effects: int
    lookup_effects: int
    unknown: frozenset[str]
    """Tool call ids answered unknown-outcome."""


def expected(crash: Crash, mode: str) -> Expected:
    """S-29, H-45…H-47: open calls are re-run per mode; committed results and closed calls never are."""
    if not crash.open_calls:  # nothing is open: whatever ran, ran once, and its result is the real one
        return Expected(charge_effects=1, lookup_effects=1, unknown=frozenset())
    before = int(crash.tools_ran)
    rerun = {"call_charge": mode == "always", "call_lookup": mode != "never"}
    return Expected(
        charge_effects=before + rerun["call_charge"],
        lookup_effects=before + rerun["call_lookup"],
        unknown=frozenset(call for call, again in rerun.items() if not again),
    )


def test_matrix_covers_every_run_failpoint_and_boundary() -> None:
    """The cells name every run-related failpoint, each hit once, and each lands on its own boundary state."""
    assert {c.point for c in CRASHES} == RUN_POINTS
    assert len({(c.point, c.hit) for c in CRASHES}) == len(CRASHES)
    assert {(c.committed_seq, c.tools_ran, c.open_calls) for c in CRASHES} == {
        (0, False, False),
        (1, False, False),
        (2, False, True),
        (2, True, True),
        (3, True, False),
    }
    # The interesting cell: effects happened, nothing committed. Declared answers the unsafe call unknown.
    lost = next(c for c in CRASHES if c.tools_ran and c.open_calls)
    assert expected(lost, "declared") == Expected(1, 2, frozenset({"call_charge"}))
    assert expected(lost, "never") == Expected(1, 1, frozenset({"call_charge", "call_lookup"}))
    assert expected(lost, "always") == Expected(2, 2, frozenset())


# --- the spawner -------------------------------------------------------------------------------------------------


class Zygote:
    """Client of `_worker_zygote.py`: fork a worker, wait for its end."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.started: asyncio.Queue[int] = asyncio.Queue()
        self.ended: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.lock = asyncio.Lock()
        self.reader = asyncio.create_task(self._read())

    def _future(self, pid: int) -> asyncio.Future[dict[str, Any]]:
        return self.ended.setdefault(pid, asyncio.get_running_loop().create_future())

    async def _read(self) -> None:
        assert self.process.stdout is not None
        async for line in self.process.stdout:
            message = json.loads(line)
            if "started" in message:
                self.started.put_nowait(message["started"])
            elif "ended" in message:
                self._future(message["ended"]).set_result(message)

    async def spawn(self, **request: Any) -> int:
        assert self.process.stdin is not None
        async with self.lock:  # answers come in request order
            self.process.stdin.write((json.dumps(request) + "\n").encode())
            await self.process.stdin.drain()
            pid = await asyncio.wait_for(self.started.get(), 30)
            # Spaced starts: a burst of workers opening connections and claiming at once on one SQLite file can
            # time out a first transaction (an `attempt_failed` retry) on a loaded machine, which is not a crash.
            await asyncio.sleep(SPAWN_SPACING)
            return pid

    async def wait_end(self, pid: int, timeout: float) -> dict[str, Any]:
        return await asyncio.wait_for(asyncio.shield(self._future(pid)), timeout)


@contextlib.asynccontextmanager
async def zygote(log: Path) -> AsyncIterator[Zygote]:
    with log.open("wb") as errors:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            str(ZYGOTE),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=errors,
        )
    try:
        assert process.stdout is not None
        ready = await asyncio.wait_for(process.stdout.readline(), 120)
        assert "ready" in json.loads(ready or b'{"error": "no ready line"}'), log.read_text()[-3000:]
        spawner = Zygote(process)
        yield spawner
    finally:
        if process.stdin is not None:
            process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), 10)
        except TimeoutError:
            process.kill()
            await process.wait()


def _service(url: str, engine: Any, agent: str) -> Service:
    return Service(
        settings=support.crash_settings(url, lease_seconds=SURVIVOR_LEASE),
        engine=engine,
        agents=AgentRegistry({agent: support.FACTORY}),
        entropy=SeededEntropy(hash(agent) & 0xFFFF),
        wakeups=asyncio.Event(),
    )


async def _sweep_expired(service: Service, stop: asyncio.Event) -> None:
    """The control process's `expire_leases` (every `authority_seconds`; faster here)."""
    while not stop.is_set():
        with contextlib.suppress(Exception):
            await expire_leases(service)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.25)


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


# --- one cell ----------------------------------------------------------------------------------------------------


async def _cell(db: Any, engine: Any, tenant: Any, spawner: Zygote, crash: Crash, mode: str, workdir: Path) -> None:
    workdir.mkdir()
    agent = f"cell_{crash.point}_{crash.hit}_{mode}"
    async with db.engine.begin() as conn:
        ref = await add_thread_run(
            conn,
            tenant,
            script="tools",
            agent=agent,
            tool_recovery=mode,
            options={"workdir": str(workdir), "tool_recovery": mode},
        )
    log = workdir / "dying.log"
    pid = await spawner.spawn(
        url=db.url,
        worker_id=f"dying-{agent}",
        agent=agent,
        log=str(log),
        lease_seconds=DYING_LEASE,
        failpoints=f"{crash.point}:sigkill@{crash.hit}",
    )
    ended = await spawner.wait_end(pid, CELL_TIMEOUT / 2)
    context = f"{crash.point}@{crash.hit} ({crash.boundary}), tool_recovery={mode}: "
    assert ended["signal"] == 9, context + f"{ended}\n{log.read_text()[-3000:]}"

    # Where it died: the committed boundary, and which effects happened (S-35, S-36).
    dead = await run_row(db.engine, ref.run_id)
    assert (dead["status"], dead["checkpoint_seq"]) == ("running", crash.committed_seq), context
    ran = int(crash.tools_ran)
    assert (len(_lines(workdir / "charge.txt")), len(_lines(workdir / "lookup.txt"))) == (ran, ran), context

    # S-27, S-28: the lease runs out, the sweep recovers the attempt, the run is due again at once.
    async with db.engine.begin() as conn:  # moving an expiry earlier is allowed; extending one is not (S-9)
        await conn.execute(
            update(run_attempts).where(run_attempts.c.run_id == ref.run_id).values(lease_expires_at=db_now() - 1)
        )

    async def requeued() -> bool:
        status: str = (await run_row(db.engine, ref.run_id))["status"]
        return status == "accepted"

    await support.wait_for(requeued, timeout=CELL_TIMEOUT / 2, interval=0.1)
    await WorkerLoop(_service(db.url, engine, agent), worker_id=f"survivor-{agent}", slots=1).run_until_idle(
        timeout=CELL_TIMEOUT / 2
    )

    run = await run_row(db.engine, ref.run_id)
    attempts = await attempt_rows(db.engine, ref.run_id)
    ends = [
        (a["worker_id"].split("-")[0], a["status"], a["start_reason"], (a["failure"] or {}).get("code"))
        for a in attempts
    ]
    assert ends == [("dying", "failed", "initial", "lease_expired"), ("survivor", "succeeded", "recovery", None)], (
        context + str(ends)
    )
    assert (run["status"], run["output"], run["attempts"], run["tool_recovery"]) == ("completed", "done", 2, mode), (
        context
    )

    want = expected(crash, mode)
    charges, lookups = _lines(workdir / "charge.txt"), _lines(workdir / "lookup.txt")
    assert (len(charges), len(lookups)) == (want.charge_effects, want.lookup_effects), context + f"{charges} {lookups}"

    async with db.engine.connect() as conn:
        history = (await load_state(conn, run["checkpoint_id"])).state.message_history
    # No duplicated message (S-39): prompt, calls, returns, answer; exactly one return per call.
    assert [type(m) for m in history] == [ModelRequest, ModelResponse, ModelRequest, ModelResponse], context
    assert sum(isinstance(p, UserPromptPart) for m in history for p in m.parts) == 1, context
    calls = [p.tool_call_id for m in history for p in m.parts if isinstance(p, ToolCallPart)]
    returns = [p for m in history for p in m.parts if isinstance(p, ToolReturnPart)]
    assert sorted(calls) == sorted(p.tool_call_id for p in returns) == ["call_charge", "call_lookup"], context
    unknown = {p.tool_call_id for p in returns if (p.metadata or {}).get("candor.unknown_outcome")}
    assert unknown == want.unknown, context
    for part in returns:  # never an invented success: unknown is the fixed content, a result is the tool's own
        real = {"call_charge": "charged 42", "call_lookup": "balance of acme: 10"}[part.tool_call_id]
        assert part.content == (UNKNOWN_OUTCOME_CONTENT if part.tool_call_id in unknown else real), context
    assert [p.content for p in history[-1].parts if isinstance(p, TextPart)] == ["done"], context


@pytest.mark.slow
async def test_crash_matrix(db: Any, tenant: Any, tmp_path: Path) -> None:
    """Issue 15 item 1, S-27…S-30, S-35, S-36, S-39, H-45…H-47: every cell completes with exactly one return per
    call, unknown-outcome where a call's fate is not known (per mode), no committed result re-run, no duplicate."""
    cells = [(crash, mode) for crash in CRASHES for mode in MODES]
    started = time.monotonic()
    limit = asyncio.Semaphore(PARALLEL_CELLS[db.kind])
    stop = asyncio.Event()
    engine = create_engine(db.url, timeout=SURVIVOR_LEASE / 3.2)  # the survivors' and the sweep's, like a process's
    sweeper = asyncio.create_task(_sweep_expired(_service(db.url, engine, "sweeper"), stop))

    async def bounded(index: int, crash: Crash, mode: str, spawner: Zygote) -> None:
        async with limit:
            cell = _cell(db, engine, tenant, spawner, crash, mode, tmp_path / f"cell{index}")
            await asyncio.wait_for(cell, CELL_TIMEOUT)

    try:
        async with zygote(tmp_path / "zygote.log") as spawner:
            results = await asyncio.gather(
                *(bounded(i, crash, mode, spawner) for i, (crash, mode) in enumerate(cells)), return_exceptions=True
            )
    finally:
        stop.set()
        await sweeper
        await engine.dispose()
    failures = [(cells[i], r) for i, r in enumerate(results) if isinstance(r, BaseException)]
    if failures:
        (crash, mode), first = failures[0]
        for _, failure in failures:
            print(f"{type(failure).__name__}: {str(failure).splitlines()[0] if str(failure) else ''}")
        raise AssertionError(
            f"{len(failures)} of {len(cells)} cells failed; first: {crash.point}@{crash.hit} {mode}"
        ) from first
    print(f"crash matrix on {db.kind}: {len(cells)} cells in {time.monotonic() - started:.1f} s")
