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
    """Drives `factory()`'s generator in a dedicated task, one item per `next()`.

    One request and one reply are in flight at a time, so each is a bare future rather than a queue: every item
    crosses between the two tasks twice, at every event of every step.
    """

    def __init__(self, factory: Callable[[], AsyncGenerator[Any, None]], *, context: contextvars.Context) -> None:
        self._factory = factory
        self._context = context
        self._task: asyncio.Task[None] | None = None
        self._request: Literal["next", "close"] | None = None
        self._request_ready: asyncio.Future[None] | None = None
        """Set while the driving task waits for a request."""
        self._reply: asyncio.Future[_Reply] | None = None
        self._abandoned = False

    async def next(self) -> Any:
        """The next item; raises StopAsyncIteration at the end, or what the generator raised."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), context=self._context)
        elif self._task.done():
            raise StopAsyncIteration
        reply = self._send("next")
        try:
            kind, value = await reply
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
        kind, value = await self._send("close")
        await asyncio.gather(self._task, return_exceptions=True)
        if kind == "error":
            raise value

    def _send(self, request: Literal["next", "close"]) -> asyncio.Future[_Reply]:
        self._request, self._reply = request, asyncio.get_running_loop().create_future()
        if self._request_ready is not None and not self._request_ready.done():
            self._request_ready.set_result(None)
        return self._reply

    def _answer(self, kind: Literal["item", "stop", "error", "closed"], value: Any) -> None:
        reply, self._reply = self._reply, None
        if reply is not None and not reply.done():  # a cancelled consumer no longer waits for it
            reply.set_result((kind, value))

    async def _next_request(self) -> Literal["next", "close"]:
        if self._request is None:
            self._request_ready = asyncio.get_running_loop().create_future()
            try:
                await self._request_ready
            finally:
                self._request_ready = None
        request, self._request = self._request, None
        assert request is not None
        return request

    async def _run(self) -> None:
        generator = self._factory()
        while True:
            request = await self._next_request()
            if request == "close":
                try:
                    await generator.aclose()
                except BaseException as exc:  # noqa: BLE001 - handed to the caller of aclose()
                    self._answer("error", exc)
                else:
                    self._answer("closed", None)
                return
            try:
                item = await generator.__anext__()
            except StopAsyncIteration:
                self._answer("stop", None)
                return
            except BaseException as exc:  # noqa: BLE001 - handed to the caller of next()
                self._answer("error", exc)
                return
            self._answer("item", item)
