"""Reads of a thread's stream entries (§8.7) for the SSE route: scoped to the caller's workspace (S-126)."""

from __future__ import annotations

from ..core import Service
from ..protocol.authority import Principal
from ..store.threads import StreamEntry, read_stream

__all__ = ("read_stream_entries",)


async def read_stream_entries(
    service: Service, principal: Principal, thread_id: str, *, after: int | None
) -> list[StreamEntry]:
    """The thread's retained entries with `id > after` (all when `after` is None), oldest first, at most 500."""
    return await read_stream(service.engine, workspace_id=principal.workspace_id, thread_id=thread_id, after=after)
