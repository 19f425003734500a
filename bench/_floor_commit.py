"""The floor of a durable step on this stack: candor's Harness with the cheapest synchronous write at each boundary.

candor's boundary commit is one statement that fences the lease, compare-and-swaps the run's pointer and inserts
the checkpoint, its message rows, a usage record and the stream entries, under the schema's integrity checks
(docs/performance.md). `FloorSide` keeps the rest of a durable step as the worker has it: the Harness, exporting the
state and encoding the history at every `BoundaryEvent`, and waiting for the write before asking for the next event
(S-35). What it writes is only the new messages' bodies, in one autocommit INSERT on asyncpg into a table with no
key, index, constraint or trigger. A durable design on Pydantic AI, asyncpg and PostgreSQL that writes at each
boundary does not get much below it; against LangGraph it tells what the stack costs from what candor's commit adds.
"""

from __future__ import annotations

import asyncio
import gc
import time
import uuid
from typing import Any

import asyncpg
from pydantic_ai import Agent
from pydantic_ai.usage import UsageLimits

from candor import BoundaryEvent, Harness, HarnessState
from candor.service.store.checkpoints.incremental import EncodedMessage, encode_history_reusing

from . import _store

__all__ = ("FloorSide",)

_TABLE = "bench_floor_writes"


class FloorSide:
    """Runs of one agent with a bare INSERT of the new messages at every boundary, on `url`'s database, through a
    pool of at most `connections` connections. A run holds a connection only while its INSERT runs, not while it
    waits on its model or tool, so runs in flight can outnumber the connections (as a production design would)."""

    def __init__(
        self, url: str, agent: Agent[None, str], limits: UsageLimits, prompt: str, *, connections: int = 1
    ) -> None:
        self.url = url
        self.harness = Harness(agent, usage_limits=limits)
        self.prompt = prompt
        self.connections = connections
        self._pool: asyncpg.Pool | None = None
        self._opening = asyncio.Lock()  # runs that start together must share one pool, not open one each

    async def _connections(self) -> asyncpg.Pool:
        async with self._opening:
            if self._pool is None:
                pool = await asyncpg.create_pool(_store.dsn(self.url), min_size=1, max_size=self.connections)
                await pool.execute(f"CREATE TABLE IF NOT EXISTS {_TABLE} (run_id text, seq integer, body text)")
                self._pool = pool
        return self._pool

    async def run(self, *, collect: bool = True, prompt: str | None = None) -> tuple[str, float]:
        """One run (of `prompt`, default the side's); `collect`: a full garbage collection before the timing starts
        (one run at a time only)."""
        return await self._run(await self._connections(), collect, prompt or self.prompt)

    async def _run(self, pool: asyncpg.Pool, collect: bool, prompt: str) -> tuple[str, float]:
        run_id = f"thr_{uuid.uuid4().hex}"
        insert = f"INSERT INTO {_TABLE} (run_id, seq, body) VALUES ($1, $2, $3)"
        if collect:
            gc.collect()
        started = time.perf_counter()
        seq = 0
        base_encoded: list[EncodedMessage] = []
        base_messages: tuple[Any, ...] = ()
        stream = self.harness.stream(prompt, previous_state=HarnessState.new(run_id), tool_recovery="declared")
        async with stream:
            async for event in stream:
                if not isinstance(event, BoundaryEvent):
                    continue
                history = (await stream.export_state())._history_ref()
                encoded = encode_history_reusing(history, base_messages, base_encoded)
                seq += 1
                await pool.execute(insert, run_id, seq, "\n".join(m.body for m in encoded[len(base_encoded) :]))
                base_encoded, base_messages = encoded, history
        assert stream.outcome is not None and stream.outcome.status == "completed", stream.outcome
        await pool.execute(insert, run_id, seq + 1, str(stream.outcome.output))  # the final answer, as a seal would
        return run_id, time.perf_counter() - started

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None
