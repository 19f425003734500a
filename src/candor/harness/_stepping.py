"""Stepping an agent run: one node at a time, each in a task of its own that `cancel()` stops at once (H-105)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Callable, Coroutine
from typing import Any

from pydantic_ai import CallToolsNode, ModelRequestNode

__all__ = ("NodeStepper",)

_STEP_DONE = object()


class NodeStepper:
    """Runs the nodes of one `AgentRun` and forwards their events; remembers the node each step returned."""

    def __init__(self, *, model_streams: Callable[[], bool], on_step_end: Callable[[Any], None]) -> None:
        self._model_streams = model_streams
        """Whether a model request node can be streamed (a `FunctionModel` without `stream_function` cannot)."""
        self._on_step_end = on_step_end
        """Called with the run after every step, however it ended (the stream reads the run's usage there)."""
        self.next_node: Any = None
        """The node the last step returned (pydantic-ai's `run.next_node` before the first step)."""
        self.cancel_requested = False
        """`cancel()` was called: no further step starts."""
        self._task: asyncio.Task[Any] | None = None

    def cancel(self) -> None:
        """H-105: stop the running step (or awaited work) now and start no other."""
        self.cancel_requested = True
        if self._task is not None and not self._task.done():
            self._task.cancel()

    async def cancellable(self, work: Coroutine[Any, Any, Any]) -> Any:
        """Await `work` in a task that `cancel()` stops at once (H-105), like a step."""
        if self.cancel_requested:
            work.close()
            raise asyncio.CancelledError
        task = asyncio.ensure_future(work)
        self._task = task
        try:
            return await task
        finally:
            self._task = None

    async def run_quietly(self, run: Any, node: Any) -> Any:
        """Run one node without forwarding its events; returns the next node."""
        async with contextlib.aclosing(self.step(run, node, stream_events=False)) as events:
            async for _ in events:
                pass
        return self.next_node

    async def step(self, run: Any, node: Any, *, stream_events: bool = True) -> AsyncGenerator[Any, None]:
        """Run one node in a cancellable task and forward its events as they come."""
        if self.cancel_requested:
            raise asyncio.CancelledError
        queue: asyncio.Queue[Any] = asyncio.Queue()
        streams = stream_events and (
            isinstance(node, CallToolsNode) or (isinstance(node, ModelRequestNode) and self._model_streams())
        )

        async def execute() -> Any:
            if streams:
                async with node.stream(run.ctx) as events:
                    async for event in events:
                        queue.put_nowait(event)
            return await run.next(node)

        task = asyncio.ensure_future(execute())  # inherits the run's context (capability store)
        # One wake-up per event and one when the step ends: no extra task per event.
        task.add_done_callback(lambda _: queue.put_nowait(_STEP_DONE))
        self._task = task
        try:
            while True:
                item = await queue.get()
                if item is _STEP_DONE:
                    self.next_node = task.result()
                    return
                yield item
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):  # the step's own error is reported elsewhere
                    await task
            self._task = None
            self._on_step_end(run)
