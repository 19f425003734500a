"""A task-owned async generator: generator semantics for a consumer that may await from different tasks.

pydantic-ai enters anyio cancel scopes while a run is open; those must be exited by the task that entered them.
The driver runs the generator in one task of its own and hands out one item per request, so the run pauses
between items exactly as a plain async generator would (H-36), whichever task asks for the next item.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncGenerator, Callable
from typing import Any, Literal

__all__ = ("TaskDrivenGenerator",)

_Reply = tuple[Literal["item", "stop", "error", "closed"], Any]


class TaskDrivenGenerator:
    """Drives `factory()`'s generator in a dedicated task, one item per `next()`."""

    def __init__(self, factory: Callable[[], AsyncGenerator[Any, None]], *, context: contextvars.Context) -> None:
        self._factory = factory
        self._context = context
        self._task: asyncio.Task[None] | None = None
        self._requests: asyncio.Queue[Literal["next", "close"]] = asyncio.Queue()
        self._replies: asyncio.Queue[_Reply] = asyncio.Queue()
        self._abandoned = False

    async def next(self) -> Any:
        """The next item; raises StopAsyncIteration at the end, or what the generator raised."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), context=self._context)
        elif self._task.done():
            raise StopAsyncIteration
        self._requests.put_nowait("next")
        try:
            kind, value = await self._replies.get()
        except asyncio.CancelledError:
            self._task.cancel()  # the consumer gave up: the run must not go on without it
            self._abandoned = True
            raise
        if kind == "item":
            return value
        if kind == "stop":
            raise StopAsyncIteration
        raise value

    async def aclose(self) -> None:
        """Close the generator in its own task; raises what its teardown raised."""
        if self._abandoned and self._task is not None:
            # The consumer was cancelled; the run task was cancelled with it. Its end is not a teardown failure.
            await asyncio.gather(self._task, return_exceptions=True)
            return
        if self._task is None or self._task.done():
            if self._task is not None:
                await asyncio.gather(self._task, return_exceptions=True)
            return
        self._requests.put_nowait("close")
        kind, value = await self._replies.get()
        await asyncio.gather(self._task, return_exceptions=True)
        if kind == "error":
            raise value

    async def _run(self) -> None:
        generator = self._factory()
        while True:
            request = await self._requests.get()
            if request == "close":
                try:
                    await generator.aclose()
                except BaseException as exc:  # noqa: BLE001 - handed to the caller of aclose()
                    self._replies.put_nowait(("error", exc))
                else:
                    self._replies.put_nowait(("closed", None))
                return
            try:
                item = await generator.__anext__()
            except StopAsyncIteration:
                self._replies.put_nowait(("stop", None))
                return
            except BaseException as exc:  # noqa: BLE001 - handed to the caller of next()
                self._replies.put_nowait(("error", exc))
                return
            self._replies.put_nowait(("item", item))
