"""Server-sent events (spec §8.7): a pure line parser and the reconnect state of a thread stream.

`SseParser.feed(line)` takes one line (without its line break) and returns the event it completes, following the
WHATWG event-stream rules the service relies on: `field: value` lines (one space after the colon is dropped),
`data` lines joined with `\\n`, comments (`: ping`) ignored, a blank line dispatches, an event without data is
not dispatched, and an `id` field (without NUL) becomes the last event id even on such an event.

`StreamCursor` is what a reconnect needs: the last entry id seen, sent back as `Last-Event-ID`, and the backoff
between reconnects (reset by every event that arrives).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ("StreamEvent", "SseParser", "StreamCursor", "LiveOutput")


@dataclass(frozen=True, slots=True)
class StreamEvent:
    """One event of the thread stream: `delta`, `boundary`, `changed`, `reset` or `gap` (§8.7)."""

    event: str
    data: str
    id: str | None = None

    def json(self) -> Any:
        """`data` parsed as JSON (every event of the thread stream carries a JSON object)."""
        return json.loads(self.data)

    @property
    def run_id(self) -> str | None:
        """The run the event is about (`delta`, `boundary`, `reset`, `gap`); None for `changed`."""
        try:
            value = self.json()
        except ValueError:
            return None
        run_id = value.get("run_id") if isinstance(value, dict) else None
        return run_id if isinstance(run_id, str) else None


@dataclass(slots=True)
class SseParser:
    """Incremental parser: one line in, at most one dispatched event out."""

    last_event_id: str | None = None
    _event: str = ""
    _data: list[str] = field(default_factory=list)
    _id_seen: bool = False

    def feed(self, line: str) -> StreamEvent | None:
        if line == "":
            return self._dispatch()
        if line.startswith(":"):
            return None  # a comment: the keep-alive ping
        name, colon, value = line.partition(":")
        if colon and value.startswith(" "):
            value = value[1:]
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        elif name == "id" and "\x00" not in value:
            self.last_event_id = value or None
            self._id_seen = True
        # `retry` and unknown fields are ignored: reconnect timing is the client's own policy.
        return None

    def _dispatch(self) -> StreamEvent | None:
        event, data, id_seen = self._event, self._data, self._id_seen
        self._event, self._data, self._id_seen = "", [], False
        if not data:
            return None
        return StreamEvent(event=event or "message", data="\n".join(data), id=self.last_event_id if id_seen else None)


@dataclass(slots=True)
class StreamCursor:
    """Where a thread stream continues after a disconnect, and how long to wait before reconnecting."""

    last_event_id: str | None = None
    initial_delay: float = 0.1
    max_delay: float = 5.0
    _delay: float = 0.0

    def headers(self) -> dict[str, str]:
        headers = {"Accept": "text/event-stream"}
        if self.last_event_id is not None:
            headers["Last-Event-ID"] = self.last_event_id
        return headers

    def saw(self, event: StreamEvent) -> None:
        if event.id is not None:
            self.last_event_id = event.id
        self._delay = 0.0

    def next_delay(self) -> float:
        """The wait before the next reconnect: doubling from `initial_delay` up to `max_delay`."""
        self._delay = min(self.max_delay, self._delay * 2 if self._delay else self.initial_delay)
        return self._delay


@dataclass(slots=True)
class LiveOutput:
    """The live output of each run on a thread, kept the way §8.7 asks a reader to keep it.

    `apply(event)` records a `delta`'s pydantic-ai event under its run; `reset` discards that run's earlier
    attempts' output (a new attempt starts over); `gap` marks the run's output as incomplete (trimmed entries were
    skipped). The durable record is the run itself: read it once it is sealed.
    """

    deltas: dict[str, list[Any]] = field(default_factory=dict)
    incomplete: set[str] = field(default_factory=set)

    def apply(self, event: StreamEvent) -> None:
        run_id = event.run_id
        if run_id is None:
            return
        if event.event == "delta":
            self.deltas.setdefault(run_id, []).append(event.json()["event"])
        elif event.event == "reset":
            self.deltas[run_id] = []
            self.incomplete.discard(run_id)
        elif event.event == "gap":
            self.incomplete.add(run_id)
