"""`AsyncCandorClient`: the asyncio client. Each method runs one operation of `_core.Operations` over
`httpx.AsyncClient`; the same operations as `CandorClient`, only the I/O differs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any, Concatenate, ParamSpec, TypeVar

import httpx

from ._core import Call, Operation, Operations, RetryPolicy, Sleep, StreamPlan, method_signature
from ._http import client_settings, reply_of
from .models import Run
from .sse import StreamEvent

__all__ = ("AsyncCandorClient",)

P = ParamSpec("P")
T = TypeVar("T")


def _awaitable(
    op: Callable[Concatenate[Operations, P], Operation[T]],
) -> Callable[Concatenate[AsyncCandorClient, P], Coroutine[Any, Any, T]]:
    async def method(self: AsyncCandorClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return await self._run(op(self._ops, *args, **kwargs))

    # The operation's name, docstring and parameters; it returns the operation's result, not an Operation.
    method.__name__, method.__qualname__, method.__doc__ = op.__name__, f"AsyncCandorClient.{op.__name__}", op.__doc__
    method.__signature__ = method_signature(op)  # type: ignore[attr-defined]
    return method


class AsyncCandorClient:
    """The asyncio twin of `CandorClient` (same methods, awaited; `stream` and `waiting_runs` are async
    iterators). `transport` may be `httpx.ASGITransport(app)` to talk to an app in the same process."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._http = httpx.AsyncClient(transport=transport, **client_settings(base_url, api_key, timeout))
        self._ops = Operations(retry=retry or RetryPolicy())

    async def __aenter__(self) -> AsyncCandorClient:
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    create_thread = _awaitable(Operations.create_thread)
    post_message = _awaitable(Operations.post_message)
    get_thread = _awaitable(Operations.get_thread)
    get_run = _awaitable(Operations.get_run)
    list_runs = _awaitable(Operations.list_runs)
    interrupt_run = _awaitable(Operations.interrupt_run)
    resume = _awaitable(Operations.resume)
    wait_for_run = _awaitable(Operations.wait_for_run)

    async def waiting_runs(self, *, page_size: int = 50) -> AsyncIterator[Run]:
        """Every run of the workspace that waits for a resume now, newest first, across pages."""
        cursor = None
        while True:
            page = await self.list_runs(awaiting_resume=True, limit=page_size, cursor=cursor)
            for run in page.items:
                yield run
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    async def stream(
        self, thread_id: str, *, last_event_id: str | None = None, reconnect: bool = True
    ) -> AsyncIterator[StreamEvent]:
        """The thread's live events (§8.7), reconnecting with `Last-Event-ID` like `CandorClient.stream`."""
        plan = StreamPlan(thread_id, last_event_id=last_event_id, policy=self._ops.retry, reconnect=reconnect)
        while True:
            try:
                async with self._http.stream("GET", plan.path, headers=plan.headers()) as response:
                    if response.status_code != 200:
                        await response.aread()
                        plan.refused(reply_of(response))
                    else:
                        plan.connected()
                        async for line in response.aiter_lines():
                            if (event := plan.feed(line)) is not None:
                                yield event
            except httpx.TransportError as exc:
                plan.failed(exc)
            delay = plan.next_delay()
            if delay is None:
                return
            await asyncio.sleep(delay)

    async def _run(self, op: Operation[T]) -> T:
        try:
            step = next(op)
            while True:
                if isinstance(step, Sleep):
                    await asyncio.sleep(step.seconds)
                    step = op.send(None)
                else:
                    step = op.send(await self._send(step))
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    async def _send(self, call: Call) -> Any:
        try:
            response = await self._http.request(
                call.method, call.path, json=call.json, params=call.params, headers=call.headers()
            )
        except httpx.TransportError as exc:
            return exc
        return reply_of(response)
