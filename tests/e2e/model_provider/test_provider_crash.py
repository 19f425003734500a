"""kill -9 of a worker process that talks to the (scripted) OpenAI-wire provider, on SQLite and PostgreSQL.

The first worker is a real process (`_provider_worker.py`); the test SIGKILLs it at a marker, waits for its lease to
expire (`expire_leases`, lease 7 s) and lets a worker in this process continue the run from the last checkpoint
(S-27, S-28, S-29, S-36, S-50):

* after `charge_card` ran (its ledger line is written) but before its result was committed: the recovering attempt
  never runs the charge again and the model is sent the unknown-outcome result for it;
* while the provider streams the answer that follows the committed charge: the recovering attempt sends the model
  request again, with the committed tool result; the charge is not repeated.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from candor.service.store.threads.streams import read_stream
from candor.service.worker import WorkerLoop
from candor.tools import UNKNOWN_OUTCOME_CONTENT

from model_provider.agents import AGENT, WORKER_ENV, charges
from model_provider.scripted_openai import Reply, Request, ScriptedOpenAI, ToolCall, tool_results
from model_provider.support import KEY_ENV, provider_service
from worker.support import add_thread_run, attempt_rows, make_due, run_row, wait_for_lease_expiry

pytestmark = [pytest.mark.crash]

PROC = Path(__file__).with_name("_provider_worker.py")
FINAL = "Charged. Your receipt is on its way."


class Billing:
    """Charge first, then the final answer; `slow` streams the answer with 0.3 s between chunks."""

    def __init__(self, *, slow: bool) -> None:
        self.slow = slow

    def __call__(self, request: Request) -> Reply:
        if tool_results(request):
            return Reply(text=FINAL, chunk_chars=6, chunk_delay=0.3 if self.slow else 0.0)
        return Reply(tool_calls=[ToolCall("charge_card", {"amount": 42}, "call_charge")])


async def _start_worker(db_url: str, base_url: str, api_key: str, cwd: Path) -> asyncio.subprocess.Process:
    env = dict(os.environ, **{WORKER_ENV: "first", KEY_ENV: api_key})
    env.pop("PYTHONSTARTUP", None)
    env.pop("CANDOR_FAILPOINTS", None)
    return await asyncio.create_subprocess_exec(
        sys.executable,
        str(PROC),
        db_url,
        "worker-first",
        base_url,
        env=env,
        cwd=str(cwd),
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )


async def _kill_when(process: asyncio.subprocess.Process, marker: Any, timeout: float = 60) -> None:
    """SIGKILL `process` as soon as `marker()` holds; fails (with its stderr) if it ended first or timed out."""
    reached = False
    try:
        async with asyncio.timeout(timeout):
            while process.returncode is None and not (reached := marker()):
                await asyncio.sleep(0.02)
    except TimeoutError:
        pass
    if process.returncode is None:
        process.send_signal(signal.SIGKILL)
    await process.wait()
    assert process.stderr is not None
    stderr = (await process.stderr.read()).decode()[-3000:]
    assert reached and process.returncode == -signal.SIGKILL, stderr


async def _recover(db: Any, base_url: str, run_id: str) -> None:
    """Lease expiry recovers the killed attempt (charged); a worker in this process runs the next one."""
    sweeper = provider_service(db, base_url)

    await wait_for_lease_expiry(sweeper, timeout=30)
    await make_due(db.engine, run_id)
    await WorkerLoop(provider_service(db, base_url), worker_id="worker-second").run_until_idle(timeout=60)


async def _first_attempt_failed_then_completed(db: Any, run_id: str) -> None:
    run = await run_row(db.engine, run_id)
    assert (run["status"], run["output"], run["attempts"]) == ("completed", FINAL, 2)
    attempts = await attempt_rows(db.engine, run_id)
    assert [(a["worker_id"], a["status"], (a["failure"] or {}).get("code")) for a in attempts] == [
        ("worker-first", "failed", "lease_expired"),
        ("worker-second", "succeeded", None),
    ]


@pytest.mark.slow
async def test_kill_after_the_charge_ran_gives_the_model_an_unknown_outcome(db, tenant, api_key, tmp_path) -> None:
    """S-29, S-36: killed after `charge_card` executed, before its result was committed: charged once, and the
    model's next request carries the unknown-outcome result for the call."""
    with ScriptedOpenAI(Billing(slow=False)) as provider:
        async with db.engine.begin() as conn:
            ref = await add_thread_run(
                conn, tenant, agent=AGENT, options={"workdir": str(tmp_path), "charge_seconds": 30}
            )
        process = await _start_worker(db.url, provider.base_url, api_key, tmp_path)
        await _kill_when(process, lambda: charges(tmp_path) != [])  # the charge happened; its result is not saved
        assert len(provider.recorded()) == 1
        await _recover(db, provider.base_url, ref.run_id)
        requests = provider.recorded()

    await _first_attempt_failed_then_completed(db, ref.run_id)
    assert charges(tmp_path) == ["first call_charge 42"]  # never charged again
    assert len(requests) == 2
    assert tool_results(requests[1]) == {"call_charge": UNKNOWN_OUTCOME_CONTENT}


@pytest.mark.slow
async def test_kill_mid_stream_resends_the_request_without_charging_again(db, tenant, api_key, tmp_path) -> None:
    """S-36, §7.11: killed while the provider streams the answer after the committed charge: the deltas already on
    the thread stream belong to attempt 1; attempt 2 sends the same request (with the committed `charged 42`) and
    completes; the charge ran once."""
    billing = Billing(slow=True)
    with ScriptedOpenAI(billing) as provider:
        async with db.engine.begin() as conn:
            ref = await add_thread_run(conn, tenant, agent=AGENT, options={"workdir": str(tmp_path)})
        process = await _start_worker(db.url, provider.base_url, api_key, tmp_path)
        chunks_before_answer: list[int] = []

        def mid_answer() -> bool:
            if len(provider.recorded()) < 2:
                return False
            if not chunks_before_answer:
                chunks_before_answer.append(provider.chunks_sent)
            return provider.chunks_sent >= chunks_before_answer[0] + 3  # role + two pieces of text sent

        await _kill_when(process, mid_answer)
        assert provider.streams_finished == 1  # the charge response only: the answer was cut
        partial = await read_stream(db.engine, workspace_id=tenant.workspace_id, thread_id=ref.thread_id, after=None)
        billing.slow = False
        await _recover(db, provider.base_url, ref.run_id)
        requests = provider.recorded()

    await _first_attempt_failed_then_completed(db, ref.run_id)
    assert charges(tmp_path) == ["first call_charge 42"]
    assert len(requests) == 3
    assert tool_results(requests[1]) == tool_results(requests[2]) == {"call_charge": "charged 42"}
    assert requests[1].body["messages"] == requests[2].body["messages"]  # the same request, sent again
    assert {entry.attempt for entry in partial} == {1}
