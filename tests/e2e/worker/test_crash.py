"""A real crash of a worker process on PostgreSQL (S-27, S-28, S-29, S-36, S-39, S-43).

The first worker is a separate Python process (`_worker_proc.py`) armed with `CANDOR_FAILPOINTS=before_tool`: it
commits the tool boundary of a response asking for `charge` (not retry-safe) and `lookup` (retry-safe) and dies
before either tool starts. After its lease expires, `expire_leases` recovers the attempt and a second worker (this
process) continues from the last checkpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
from pydantic_ai.messages import ModelRequest, ModelResponse, ToolReturnPart
from sqlalchemy import select

from candor.service.store.checkpoints.incremental import load_state
from candor.service.store.schema.tables import checkpoints
from candor.service.worker import WorkerLoop
from candor.tools import UNKNOWN_OUTCOME_CONTENT

from worker import support
from worker.support import add_thread_run, attempt_rows, run_row

pytestmark = [pytest.mark.crash, pytest.mark.postgres]

PROC = Path(__file__).with_name("_worker_proc.py")


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


@pytest.mark.parametrize("db_kind", ["postgresql"], indirect=True)
async def test_worker_process_dies_before_tools_and_the_run_recovers(db, tenant, control, tmp_path: Path) -> None:
    """S-28, S-29, S-36: the tool-boundary commit survives the crash; after lease expiry the next attempt gives the
    non-retry-safe call an unknown outcome and replays the retry-safe one."""
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, script="tools", options={"workdir": str(tmp_path)})
    await support.run_until_failpoint(
        [str(PROC), db.url, "worker-first"], "before_tool", cwd=str(tmp_path), WORKER_TEST_ROLE="first"
    )

    # The dead worker committed the model boundary and the tool boundary, and no tool ran (S-36).
    run = await run_row(db.engine, ref.run_id)
    assert (run["status"], run["checkpoint_seq"]) == ("running", 2)
    assert _lines(tmp_path / "charge.txt") == [] and _lines(tmp_path / "lookup.txt") == []

    service = support.make_service(db.url, db.engine, lease_seconds=3)

    await support.wait_for_lease_expiry(service)  # S-28: about lease_seconds + authority_seconds
    await support.make_due(db.engine, ref.run_id)
    # the survivor's own lease need not be short: a roomy one keeps a loaded machine from expiring it too
    survivor = support.make_service(db.url, db.engine, lease_seconds=10)
    await WorkerLoop(survivor, worker_id="worker-second").run_until_idle(timeout=30)

    run = await run_row(db.engine, ref.run_id)
    assert (run["status"], run["output"], run["attempts"]) == ("completed", "done", 2)
    # S-29: the charge is never run by the recovering attempt; the retry-safe lookup runs there exactly once
    assert _lines(tmp_path / "charge.txt") == []
    assert _lines(tmp_path / "lookup.txt") == ["inproc call_lookup lookup acme"]
    attempts = await attempt_rows(db.engine, ref.run_id)
    assert [(a["worker_id"], a["status"], a["start_reason"], (a["failure"] or {}).get("code")) for a in attempts] == [
        ("worker-first", "failed", "initial", "lease_expired"),
        ("worker-second", "succeeded", "recovery", None),
    ]
    async with db.engine.connect() as conn:
        rows = (
            await conn.execute(
                select(checkpoints.c.seq, checkpoints.c.attempt)
                .where(checkpoints.c.run_id == ref.run_id)
                .order_by(checkpoints.c.seq)
            )
        ).all()
        tool_boundary = await load_state(
            conn,
            (
                await conn.execute(
                    select(checkpoints.c.id).where(checkpoints.c.run_id == ref.run_id, checkpoints.c.seq == 2)
                )
            ).scalar_one(),
        )
        final = await load_state(conn, run["checkpoint_id"])
    assert [tuple(r) for r in rows] == [(1, 1), (2, 1), (3, 2), (4, 2)]  # S-39
    assert isinstance(tool_boundary.state.message_history[-1], ModelResponse)
    history = final.state.message_history
    # S-43-style continuity: the recovered history extends the crashed worker's checkpoint message for message
    assert history[:2] == tool_boundary.state.message_history
    recovery_request = history[2]
    assert isinstance(recovery_request, ModelRequest)
    returns = {p.tool_call_id: p for p in recovery_request.parts if isinstance(p, ToolReturnPart)}
    assert returns["call_charge"].content == UNKNOWN_OUTCOME_CONTENT
    assert returns["call_charge"].metadata == {"candor.unknown_outcome": True}
    assert returns["call_lookup"].content == "balance of acme: 10"


async def dump_and_kill(process: asyncio.subprocess.Process, communicating: asyncio.Future[Any]) -> str:
    """What a `_worker_proc.py` that hangs is doing: its asyncio tasks' stacks (SIGUSR1), its threads' (SIGUSR2),
    then SIGKILL; the tail of everything it wrote to stderr. If it had exited already (then something else held its
    pipes open), the signals find no process and the exit status says so."""
    exited = process.returncode
    for signum, settle in ((signal.SIGUSR1, 1.0), (signal.SIGUSR2, 0.5), (signal.SIGKILL, 0.0)):
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signum)
        await asyncio.sleep(settle)
    stderr: bytes
    _, stderr = await asyncio.wait_for(communicating, 10)
    return f"exit status before the dump: {exited}\n" + stderr.decode(errors="replace")[-8000:]


@pytest.mark.parametrize("db_kind", ["postgresql"], indirect=True)
async def test_sigterm_drains_a_worker_process_and_hands_off_uncharged(db, tenant, control, tmp_path: Path) -> None:
    """S-52, S-53, S-54, S-32, S-14: a worker process that gets SIGTERM mid-tool finishes the tool, commits the next
    model boundary, yields the run (handoff) and exits; another worker continues it without a charged attempt."""
    async with db.engine.begin() as conn:
        ref = await add_thread_run(conn, tenant, script="slow", options={"workdir": str(tmp_path), "sleep": 1.0})
    env = dict(os.environ, WORKER_TEST_ROLE="first", WORKER_TEST_DRAIN="1")
    env.pop("PYTHONSTARTUP", None)
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        str(PROC),
        db.url,
        "worker-first",
        env=env,
        cwd=str(tmp_path),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:

        async def tool_started() -> bool:
            return bool(_lines(tmp_path / "slow_started.txt"))

        await support.wait_for(tool_started, timeout=30, interval=0.05)
        process.terminate()  # SIGTERM while the tool runs: no handoff at a tool boundary (S-54)
        communicating = asyncio.ensure_future(process.communicate())
        try:  # shielded: on a timeout `dump_and_kill` still collects what the process wrote
            _, stderr = await asyncio.wait_for(asyncio.shield(communicating), 30)
        except TimeoutError:
            pytest.fail(f"the drained worker did not exit within 30 s:\n{await dump_and_kill(process, communicating)}")
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, stderr.decode()[-3000:]
    run = await run_row(db.engine, ref.run_id)
    assert (run["status"], run["attempts"]) == ("accepted", 1)  # S-53: due now, uncharged
    attempts = await attempt_rows(db.engine, ref.run_id)
    assert [(a["status"], a["yield_reason"]) for a in attempts] == [("yielded", "handoff")]

    survivor = support.make_service(db.url, db.engine, lease_seconds=10)
    await WorkerLoop(survivor, worker_id="worker-second").run_until_idle(timeout=30)
    run = await run_row(db.engine, ref.run_id)
    assert (run["status"], run["output"], run["attempts"]) == ("completed", "slow done", 1)  # S-14: handoff is free
    attempts = await attempt_rows(db.engine, ref.run_id)
    assert [(a["start_reason"], a["status"]) for a in attempts] == [("initial", "yielded"), ("handoff", "succeeded")]
    assert _lines(tmp_path / "slow_started.txt") == ["first started"]  # the tool ran once, in the first worker
