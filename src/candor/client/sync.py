"""`CandorClient`: the blocking client. Each method runs one operation of `_core.Operations` over `httpx.Client`."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any, Concatenate, ParamSpec, TypeVar

import httpx

from ._core import Call, Operation, Operations, RetryPolicy, Sleep, StreamPlan, method_signature
from ._http import client_settings, reply_of
from .models import Run
from .sse import StreamEvent

__all__ = ("CandorClient",)

P = ParamSpec("P")
T = TypeVar("T")


def _blocking(op: Callable[Concatenate[Operations, P], Operation[T]]) -> Callable[Concatenate[CandorClient, P], T]:
    def method(self: CandorClient, /, *args: P.args, **kwargs: P.kwargs) -> T:
        return self._run(op(self._ops, *args, **kwargs))

    # The operation's name, docstring and parameters; it returns the operation's result, not an Operation.
    method.__name__, method.__qualname__, method.__doc__ = op.__name__, f"CandorClient.{op.__name__}", op.__doc__
    method.__signature__ = method_signature(op)  # type: ignore[attr-defined]
    return method


class CandorClient:
    """A client of one candor service with one API key.

        with CandorClient("http://127.0.0.1:8080", api_key=secret) as client:
            accepted = client.create_thread("support", "Please refund order A1.")
            run = client.wait_for_run(accepted.run.id)

    `transport` replaces httpx's (tests pass a mock or a WSGI transport); `retry` bounds the retries.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 30.0,
        retry: RetryPolicy | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self._http = httpx.Client(transport=transport, **client_settings(base_url, api_key, timeout))
        self._ops = Operations(retry=retry or RetryPolicy())

    def __enter__(self) -> CandorClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    create_thread = _blocking(Operations.create_thread)
    post_message = _blocking(Operations.post_message)
    get_thread = _blocking(Operations.get_thread)
    get_run = _blocking(Operations.get_run)
    list_runs = _blocking(Operations.list_runs)
    interrupt_run = _blocking(Operations.interrupt_run)
    resume = _blocking(Operations.resume)
    wait_for_run = _blocking(Operations.wait_for_run)

    def waiting_runs(self, *, page_size: int = 50) -> Iterator[Run]:
        """Every run of the workspace that waits for a resume now, newest first, across pages."""
        cursor = None
        while True:
            page = self.list_runs(awaiting_resume=True, limit=page_size, cursor=cursor)
            yield from page.items
            if page.next_cursor is None:
                return
            cursor = page.next_cursor

    def stream(
        self, thread_id: str, *, last_event_id: str | None = None, reconnect: bool = True
    ) -> Iterator[StreamEvent]:
        """The thread's live events (§8.7). After a disconnect it reconnects with `Last-Event-ID`, so no retained
        entry is lost; `reset` and `gap` events are passed on (see `LiveOutput`). Stop by leaving the loop."""
        plan = StreamPlan(thread_id, last_event_id=last_event_id, policy=self._ops.retry, reconnect=reconnect)
        while True:
            try:
                with self._http.stream("GET", plan.path, headers=plan.headers()) as response:
                    if response.status_code != 200:
                        response.read()
                        plan.refused(reply_of(response))
                    else:
                        plan.connected()
                        for line in response.iter_lines():
                            if (event := plan.feed(line)) is not None:
                                yield event
            except httpx.TransportError as exc:
                plan.failed(exc)
            delay = plan.next_delay()
            if delay is None:
                return
            time.sleep(delay)

    def _run(self, op: Operation[T]) -> T:
        try:
            step = next(op)
            while True:
                if isinstance(step, Sleep):
                    time.sleep(step.seconds)
                    step = op.send(None)
                else:
                    step = op.send(self._send(step))
        except StopIteration as stop:
            return stop.value  # type: ignore[no-any-return]

    def _send(self, call: Call) -> Any:
        try:
            response = self._http.request(
                call.method, call.path, json=call.json, params=call.params, headers=call.headers()
            )
        except httpx.TransportError as exc:
            return exc
        return reply_of(response)
