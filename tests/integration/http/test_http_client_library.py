"""`candor.client.AsyncCandorClient` against the real app over `httpx.ASGITransport`, on SQLite and PostgreSQL:
creating and steering threads, the workspace's waiting runs (`GET /v1/runs`), strict resume built from the pending
list (with edited arguments), replays, typed errors, and the stream with reconnects (§8.2, §8.3, §8.6, §8.7,
§12.1; S-78, S-81, S-98, S-103)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from candor.client import (
    AsyncCandorClient,
    Conflict,
    InvalidArgument,
    LiveOutput,
    NotFound,
    ResumeBatch,
    RetryPolicy,
    Unauthenticated,
)
from candor.service.http.stream import StreamTiming
from candor.service.store.schema.tables import runs

from commands.helpers import count, pending_of, seal_run
from http_support import BASE_URL, error_of
from integration.http.test_http_stream import RUN, add_entries


def client_of(api: Any, secret: str) -> AsyncCandorClient:
    return AsyncCandorClient(
        BASE_URL,
        secret,
        transport=httpx.ASGITransport(app=api.app),
        retry=RetryPolicy(attempts=2, initial_delay=0.01, jitter=0),
    )


async def test_create_wait_list_and_resume_with_the_batch(api: Any) -> None:
    """§8.3, §8.6, S-78, S-81: the waiting run is listed with its pending items; the batch answers every item
    (one approval with edited arguments); a replay with the same key answers the same successor; the resumed run
    leaves `awaiting=resume` but stays listed under `status=waiting`."""
    key = await api.key()
    async with client_of(api, key.secret) as client:
        accepted = await client.create_thread("demo", "Please refund order A1.", idempotency_key="refund-a1")
        assert accepted.created and accepted.run is not None and accepted.run.status == "accepted"
        replay = await client.create_thread("demo", "Please refund order A1.", idempotency_key="refund-a1")
        assert not replay.created and replay.run is not None and replay.run.id == accepted.run.id
        await seal_run(api.service, accepted.run.id, "waiting", pending=pending_of(("a1", "a2"), ("c1",)))

        waiting = [run async for run in client.waiting_runs()]
        assert [run.id for run in waiting] == [accepted.run.id]
        run = waiting[0]
        assert run.principal_id == key.id  # the key the run acts for, as the console shows it
        assert [(item.tool_call_id, item.kind, item.tool_name) for item in run.pending] == [
            ("a1", "approval", "delete"),
            ("a2", "approval", "delete"),
            ("c1", "external", "lookup"),
        ]
        assert run.pending[0].arguments == {"path": "/x"}

        batch = ResumeBatch(run.pending).approve("a1", arguments={"path": "/y"}).deny("a2", reason="no")
        batch.answer("c1", {"found": True})
        successor = await client.resume(run.id, batch, idempotency_key="answer-1")
        assert (successor.status, successor.parent_run_id) == ("accepted", run.id)
        again = await client.resume(run.id, batch, idempotency_key="answer-1")
        assert again.id == successor.id
        stored = await count(api.service, runs, runs.c.parent_run_id == run.id)
        assert stored == 1
        assert (await client.list_runs(awaiting_resume=True)).items == []
        assert [r.id for r in (await client.list_runs(status="waiting")).items] == [run.id]


async def test_server_refusals_are_typed(api: Any) -> None:
    """§12.1: a coverage mismatch is an InvalidArgument with its details; resuming a resumed run is a Conflict
    with reason `not_idle_waiting_run`; an unknown id is a NotFound; a bad key is Unauthenticated."""
    key = await api.key()
    async with client_of(api, key.secret) as client:
        accepted = await client.create_thread("demo", "hi")
        assert accepted.run is not None
        await seal_run(api.service, accepted.run.id, "waiting")
        with pytest.raises(InvalidArgument) as mismatch:
            await client.resume(accepted.run.id, {"approvals": {}, "calls": {}})
        error = mismatch.value
        assert (error.status, error.reason, error.details["missing"]) == (
            400,
            "pending_coverage_mismatch",
            ["a1", "c1"],
        )
        assert error.request_id is not None and error.request_id.startswith("req_")
        run = await client.get_run(accepted.run.id)
        body = ResumeBatch(run.pending).approve("a1").answer("c1", 1)
        await client.resume(run.id, body)
        with pytest.raises(Conflict) as conflict:
            await client.resume(run.id, body)
        assert conflict.value.reason == "not_idle_waiting_run"
        with pytest.raises(NotFound) as missing:
            await client.get_run("run_nope")
        assert missing.value.details == {"kind": "run", "id": "run_nope"}
    async with client_of(api, "not-a-key") as stranger:
        with pytest.raises(Unauthenticated):
            await stranger.get_run(accepted.run.id)


async def test_steer_and_wait(api: Any) -> None:
    """§8.5: a post to a thread whose run is active waits in the inbox (`run` is None); `wait_for_run` returns the
    sealed run."""
    key = await api.key()
    async with client_of(api, key.secret) as client:
        accepted = await client.create_thread("demo", "first")
        assert accepted.run is not None
        queued = await client.post_message(accepted.thread_id, "also this", steer=True)
        assert queued.run is None and queued.entry["delivery"] == "steer"
        await seal_run(api.service, accepted.run.id, "completed")
        done = await client.wait_for_run(accepted.run.id, timeout=5)
        assert done.status == "completed" and done.output == "done"


async def test_workspace_run_list_is_paged_and_checked(api: Any) -> None:
    """§8.1, S-98: `GET /v1/runs` pages newest first; a cursor is bound to its filters; bad filters answer 400."""
    key = await api.key()
    other = await api.key()  # another workspace: its runs are never listed
    async with client_of(api, key.secret) as client, client_of(api, other.secret) as stranger:
        ids: list[str] = []
        for i in range(3):
            run = (await client.create_thread("demo", f"t{i}")).run
            assert run is not None
            ids.append(run.id)
        await stranger.create_thread("demo", "elsewhere")
        first = await client.list_runs(limit=2)
        second = await client.list_runs(limit=2, cursor=first.next_cursor)
        assert [r.id for r in first.items + second.items] == ids[::-1] and second.next_cursor is None
        with pytest.raises(InvalidArgument) as bound:
            await client.list_runs(status="accepted", limit=2, cursor=first.next_cursor)
        assert bound.value.code == "invalid_cursor"
    bad = await api.client.get("/v1/runs?status=bogus", headers=key.headers())
    assert bad.status_code == 400 and error_of(bad)["details"]["fields"] == [
        {"field": "status", "reason": "literal_error"}
    ]
    bad = await api.client.get("/v1/runs?awaiting=answer", headers=key.headers())
    assert bad.status_code == 400


async def test_stream_reconnects_after_the_last_entry_seen(api: Any) -> None:
    """§8.7, S-103: when a connection ends the client reconnects with `Last-Event-ID`: no entry twice, none lost;
    the `reset` of a new attempt discards the earlier attempt's output."""
    key = await api.key()
    api.app.state.stream_timing = StreamTiming(poll_seconds=0.02, max_seconds=0.15)
    async with client_of(api, key.secret) as client:
        thread_id = (await client.create_thread("demo", "hi")).thread_id
        first = await add_entries(api, key, thread_id, [(RUN, 1, 1, "delta"), (RUN, 1, 2, "delta")])
        live = LiveOutput()
        seen: list[tuple[str, str | None]] = []
        later: list[int] = []
        async for event in client.stream(thread_id):
            live.apply(event)
            seen.append((event.event, event.id))
            if event.id == str(first[-1]):
                # The first connection ends (max_seconds); these arrive over the reconnect.
                later = await add_entries(api, key, thread_id, [(RUN, 2, 1, "delta")])
            if later and event.id == str(later[-1]):
                break
    deltas = [event_id for name, event_id in seen if name == "delta"]
    assert deltas == [str(i) for i in first + later]
    assert ("reset", None) in seen
    assert live.deltas[RUN] == [{"event_kind": "part_delta", "n": 1}]
