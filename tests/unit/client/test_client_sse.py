"""The client's SSE parsing and reconnect state (§8.7: `Last-Event-ID`, `reset`, `gap`) — pure, no I/O."""

from __future__ import annotations

from candor.client.sse import LiveOutput, SseParser, StreamCursor, StreamEvent


def _parse(text: str) -> list[StreamEvent]:
    parser = SseParser()
    events = [parser.feed(line) for line in text.split("\n")]
    return [event for event in events if event is not None]


def test_events_comments_and_multiline_data() -> None:
    """§8.7: `event`/`data`/`id` fields, one space after the colon dropped, comments (pings) ignored, data lines
    joined with a newline, a blank line dispatches."""
    text = (
        ": ping - 2026-01-05 09:30:00\n\n"
        'event: delta\nid: 7\ndata: {"run_id": "run_1",\ndata:  "x": 1}\n\n'
        'event: changed\ndata:{"version": 3}\n\n'
    )
    events = _parse(text)
    assert [(e.event, e.id) for e in events] == [("delta", "7"), ("changed", None)]
    assert events[0].data == '{"run_id": "run_1",\n "x": 1}'
    assert events[0].run_id == "run_1" and events[1].json() == {"version": 3} and events[1].run_id is None


def test_an_event_without_data_is_not_dispatched_but_its_id_counts() -> None:
    parser = SseParser()
    for line in ("id: 12", "event: delta", ""):
        assert parser.feed(line) is None
    assert parser.last_event_id == "12"
    assert parser.feed("data: {}") is None
    event = parser.feed("")
    assert event == StreamEvent(event="message", data="{}", id=None)


def test_an_unfinished_event_is_not_dispatched() -> None:
    parser = SseParser()
    assert parser.feed("event: delta") is None and parser.feed("data: {}") is None
    assert parser.last_event_id is None


def test_cursor_sends_the_last_entry_id_and_backs_off_between_reconnects() -> None:
    """§8.7: a reconnect carries `Last-Event-ID` = the last entry id seen; events without an id keep it."""
    cursor = StreamCursor(initial_delay=0.1, max_delay=0.5)
    assert cursor.headers() == {"Accept": "text/event-stream"}
    assert [cursor.next_delay() for _ in range(4)] == [0.1, 0.2, 0.4, 0.5]
    cursor.saw(StreamEvent(event="delta", data="{}", id="41"))
    cursor.saw(StreamEvent(event="changed", data="{}", id=None))
    assert cursor.headers()["Last-Event-ID"] == "41"
    assert cursor.next_delay() == 0.1  # an event arrived: the backoff starts over


def test_live_output_discards_on_reset_and_marks_gaps() -> None:
    """S-103: `reset` discards the run's earlier attempts' output; S-104: `gap` marks it incomplete."""
    live = LiveOutput()

    def delta(run_id: str, n: int) -> StreamEvent:
        return StreamEvent(event="delta", data=f'{{"run_id": "{run_id}", "event": {{"n": {n}}}}}', id=str(n))

    for event in (delta("a", 1), delta("a", 2), delta("b", 3)):
        live.apply(event)
    live.apply(StreamEvent(event="gap", data='{"run_id": "b"}'))
    live.apply(StreamEvent(event="reset", data='{"run_id": "a"}'))
    live.apply(delta("a", 4))
    live.apply(StreamEvent(event="changed", data='{"version": 2}'))
    assert live.deltas == {"a": [{"n": 4}], "b": [{"n": 3}]}
    assert live.incomplete == {"b"}
