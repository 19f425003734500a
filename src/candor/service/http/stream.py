"""The thread stream (§8.7): `GET /v1/threads/{thread_id}/stream` as server-sent events.

The endpoint polls the thread's retained stream entries and its row and sends `delta`, `boundary`, `gap`, `reset`
and `changed` events (`thread_stream_response` says when each is sent). The stream ends when the caller's access
ends (the key is disabled or loses `read`, the thread is no longer visible), checked every `access_seconds`.
Timings live in `StreamTiming` on `app.state.stream_timing`, so tests can shorten them; `max_seconds` (tests only)
ends the stream after that long.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from sse_starlette import EventSourceResponse, ServerSentEvent
from starlette.requests import Request

from .. import commands
from ..commands.rows import StreamEntry, ThreadRow
from ..commands.streams import read_stream_entries
from ..errors import InvalidArgument, NotFound
from ..protocol.authority import Principal

__all__ = ("StreamTiming", "KEEPALIVE_SECONDS", "timing_of", "thread_stream_response", "parse_last_event_id")

KEEPALIVE_SECONDS = 15.0
"""§8.7, S-102: the longest silence between keep-alive comments."""


@dataclass(frozen=True, kw_only=True, slots=True)
class StreamTiming:
    keepalive_seconds: float = KEEPALIVE_SECONDS
    poll_seconds: float = 0.25
    """How often new entries and thread changes are looked for."""
    access_seconds: float = 5.0
    """How often the caller's access is checked again."""
    max_seconds: float | None = None
    """Tests only: end the stream after this long."""


def timing_of(request: Request) -> StreamTiming:
    timing = getattr(request.app.state, "stream_timing", None)
    return timing if isinstance(timing, StreamTiming) else StreamTiming()


def parse_last_event_id(value: str | None) -> int | None:
    """`Last-Event-ID`: an entry id this stream sent (a non-negative integer); empty means none."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    if not text.isascii() or not text.isdigit() or len(text) > 18:
        raise InvalidArgument(fields=[("Last-Event-ID", "invalid")])
    return int(text)


def _event(name: str, data: dict[str, Any], id: int | None = None) -> ServerSentEvent:  # noqa: A002
    return ServerSentEvent(
        data=json.dumps(data, separators=(",", ":"), ensure_ascii=False),
        event=name,
        id=None if id is None else str(id),
    )


@dataclass(kw_only=True)
class _Cursor:
    """What this connection has sent: the last entry id and, per run, the newest attempt."""

    last_id: int | None
    attempts: dict[str, int]

    def events_for(self, entry: StreamEntry) -> list[ServerSentEvent]:
        out: list[ServerSentEvent] = []
        if self.last_id is not None and entry.prev != self.last_id:
            out.append(_event("gap", {"run_id": entry.run_id}))  # S-104
        seen = self.attempts.get(entry.run_id)
        if (seen is not None and entry.attempt > seen) or (seen is None and entry.attempt > 1 and entry.sequence == 1):
            out.append(_event("reset", {"run_id": entry.run_id}))  # S-103
        if seen is None or entry.attempt > seen:
            self.attempts[entry.run_id] = entry.attempt
        out.append(_event(entry.type, entry.data(), entry.id))
        self.last_id = entry.id
        return out


def _marker(thread: ThreadRow) -> tuple[int, str | None, str | None]:
    return (thread.version, thread.current_run_id, thread.last_run_id)


async def _still_allowed(request: Request, secret: str, thread_id: str) -> ThreadRow | None:
    """The thread as the caller may still read it, or None once the caller's access has ended."""
    service = request.app.state.service
    found = await commands.authenticate(service, secret)
    if found is None or not found.principal.can("read"):
        return None
    try:
        return await commands.get_thread(service, found.principal, thread_id)
    except NotFound:
        return None


async def thread_stream_response(
    request: Request, principal: Principal, secret: str, thread_id: str, last_event_id: int | None
) -> EventSourceResponse:
    """Answer 404 now for an unknown thread (S-126); otherwise the event stream.

    The endpoint polls the thread's retained stream entries and its row:

    * `delta` / `boundary` for each entry, with the entry id as SSE `id` (a client reconnects with `Last-Event-ID`
      and receives the entries after it);
    * `gap` before an entry whose predecessor on the thread (its stored `prev`) is not the last entry this client saw:
      the entries in between were trimmed (S-104);
    * `reset` before the first entry of a run's later attempt (S-103): discard the live output of earlier attempts;
    * `changed` when the thread's version (or its current / last run) changed since the previous poll;
    * a comment line at least every `keepalive_seconds` (≤ 15 s, S-102), sent by sse-starlette's ping.
    """
    service = request.app.state.service
    thread = await commands.get_thread(service, principal, thread_id)
    timing = timing_of(request)
    clock = service.clock

    async def events() -> AsyncIterator[ServerSentEvent]:
        cursor = _Cursor(last_id=last_event_id, attempts={})
        marker = _marker(thread)
        started = checked = clock.monotonic()
        while True:
            entries = await read_stream_entries(service, principal, thread_id, after=cursor.last_id)
            for entry in entries:
                for event in cursor.events_for(entry):
                    yield event
            now = clock.monotonic()
            if now - checked >= timing.access_seconds:
                checked = now
                if await _still_allowed(request, secret, thread_id) is None:
                    return  # §8.7: the stream ends when the caller's access ends
            try:
                current = await commands.get_thread(service, principal, thread_id)
            except NotFound:
                return
            if _marker(current) != marker:
                marker = _marker(current)
                yield _event("changed", {"version": current.version})
            if timing.max_seconds is not None and clock.monotonic() - started >= timing.max_seconds:
                return
            if len(entries) < 500:
                await clock.sleep(timing.poll_seconds)

    return EventSourceResponse(
        events(),
        ping=timing.keepalive_seconds,
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )
