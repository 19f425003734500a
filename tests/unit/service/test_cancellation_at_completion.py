"""A task cancelled in the very turn of the event loop in which its bounded work completes must still end cancelled.

On Python 3.11, `asyncio.wait_for` returns the inner result when the outer task is cancelled while the inner one
has just finished, and the cancellation is lost: the task goes on as if nothing had been asked. A worker stopping
(S-52: drain; S-19: shutdown) cancels its supervisor and waits for it; with the lost cancellation the supervisor
kept beating and the worker process never exited (seen in `test_sigterm_drains_a_worker_process_and_hands_off_
uncharged`). Each bounded wait in candor now uses `asyncio.timeout` around an inline await, which keeps the
cancellation (it is what `wait_for` became in Python 3.12). Every test here builds the race deterministically:
the work awaits a future, and the test resolves that future and cancels the task in one synchronous block, so the
work's completion and the cancellation are handled in the same turn of the loop, completion first.
"""

from __future__ import annotations

import ast
import asyncio
import random
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from candor.service.control.sweeps import Sweep, run_sweep
from candor.service.http import readiness
from candor.service.outbox import delivery
from candor.service.runtime import SystemClock
from candor.service.worker.supervisor import Supervisor

SRC = Path(__file__).resolve().parents[3] / "src" / "candor"


class Gate:
    """Work that waits until the test lets it finish; `entered` is set once it waits."""

    def __init__(self) -> None:
        self.entered = asyncio.Event()
        self.release: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

    async def work(self, *args: Any, **kwargs: Any) -> Any:
        self.entered.set()
        return await self.release


async def cancel_as_it_completes(gate: Gate, task: asyncio.Task[Any], result: Any) -> None:
    """Complete the gated work and cancel `task` in one go; the task must end cancelled, and soon."""
    await asyncio.wait_for(gate.entered.wait(), 5)
    gate.release.set_result(result)
    task.cancel()
    done, _ = await asyncio.wait({task}, timeout=5)
    if task not in done:
        task.cancel()  # a second cancellation ends it, so the failure below is reported, not a hang
        await asyncio.wait({task}, timeout=5)
        pytest.fail("the cancellation was lost: the task went on after its bounded work completed")
    assert task.cancelled()


async def test_a_supervisor_cancelled_as_its_heartbeat_completes_stops() -> None:
    """S-52, S-19: a stopping worker cancels its supervisor and waits for it; the heartbeat that completes in the same
    turn must not swallow that cancellation (it left the draining worker process running forever)."""
    service: Any = SimpleNamespace(
        clock=SystemClock(), settings=SimpleNamespace(worker=SimpleNamespace(authority_seconds=0.2))
    )
    supervisor = Supervisor(service, handles=lambda: [])
    gate = Gate()
    supervisor.heartbeat = gate.work  # type: ignore[method-assign]
    task = asyncio.create_task(supervisor.run_forever())
    await cancel_as_it_completes(gate, task, set())


async def test_a_sweep_cancelled_as_its_pass_completes_stops_and_closes() -> None:
    """S-125: a control process stopping cancels its sweeps; a pass completing in the same turn keeps it cancelled,
    and the sweep still releases what it holds."""
    gate = Gate()
    closed: list[bool] = []

    async def close() -> None:
        closed.append(True)

    sweep = Sweep(name="race", period=0.001, run=gate.work, timeout=5, close=close)
    task = asyncio.create_task(run_sweep(sweep, clock=SystemClock(), rng=random.Random(0)))
    await cancel_as_it_completes(gate, task, 0)
    assert closed == [True]


async def test_a_delivery_cancelled_as_its_handler_completes_is_cancelled() -> None:
    """S-108: a delivery pass cancelled at shutdown does not settle a row as if the pass went on."""
    gate = Gate()
    handler: Callable[..., Awaitable[Any]] = gate.work
    row: Any = SimpleNamespace(id="row")
    task = asyncio.create_task(delivery._run_handler(row, handler, ctx=SimpleNamespace(), time_limit=5))  # type: ignore[arg-type]  # a stand-in context
    await cancel_as_it_completes(gate, task, delivery.HandlerResult(outcome="delivered"))


async def test_a_readiness_probe_cancelled_as_the_schema_check_completes_is_cancelled() -> None:
    """A probe cancelled as the server stops ends cancelled, whatever the schema check it waited for answered."""
    gate = Gate()
    watch: Any = SimpleNamespace(is_current=gate.work)
    service: Any = SimpleNamespace(settings=SimpleNamespace(server=SimpleNamespace(readiness_timeout=5)))
    task = asyncio.create_task(readiness._schema_is_current(watch, service))
    await cancel_as_it_completes(gate, task, True)


def _wait_for_calls(path: Path) -> list[int]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr == "wait_for" and getattr(node.value, "id", None) == "asyncio"
    ]


def test_no_asyncio_wait_for_in_candor() -> None:
    """H-105 and the cases above: `asyncio.wait_for` can lose a cancellation on Python 3.11 (the project's Python);
    bounded waits use `asyncio.timeout` (the harness's reconciler call included: a run cancelled as its reconciler
    answers must stop)."""
    found = {str(path.relative_to(SRC)): lines for path in SRC.rglob("*.py") if (lines := _wait_for_calls(path))}
    assert found == {}


@pytest.mark.parametrize("source", ["asyncio.wait_for(x, 1)", "await asyncio.wait_for(work(), timeout=2)"])
def test_the_scan_finds_wait_for(tmp_path: Path, source: str) -> None:
    path = tmp_path / "module.py"
    path.write_text(f"import asyncio\nasync def f():\n    {source}\n", encoding="utf-8")
    assert _wait_for_calls(path) == [3]
