"""The thread stream over HTTP (§8.7): S-102 (keep-alive comments), S-103 (`reset`), S-104 (`gap` on a reconnect
behind the trimmed entries), S-105 (trimming), plus the worker's entries end to end and the headers."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from sqlalchemy import delete, func, insert, select, update

from candor.service.agents import AgentRegistry
from candor.service.control.sweeps import trim_streams
from candor.service.http import stream as http_stream
from candor.service.http.stream import StreamTiming
from candor.service.store.schema.dialect import db_now
from candor.service.store.schema.tables import principals, stream_entries
from candor.service.store.threads.streams import trim_streams as trim_stream_entries
from candor.service.worker import WorkerLoop

from http_support import TEXT, create_thread, error_of
from waiting import wait_until

Event = dict[str, Any]


def parse_sse(body: str) -> list[Event]:
    """Blocks of an SSE body as `{"event", "data", "id"}` dicts; comment blocks as `{"comment": text}`."""
    events: list[Event] = []
    for block in body.replace("\r\n", "\n").split("\n\n"):
        if not block.strip():
            continue
        event: Event = {}
        for line in block.split("\n"):
            if line.startswith(":"):
                event["comment"] = line[1:].strip()
            else:
                name, _, value = line.partition(":")
                event[name] = value[1:] if value.startswith(" ") else value
        if "data" in event:
            event["data"] = json.loads(event["data"])
        events.append(event)
    return events


def named(events: list[Event]) -> list[Event]:
    return [event for event in events if "event" in event]


async def read_stream(
    api: Any, key: Any, thread_id: str, *, last_event_id: str | None = None, **timing: Any
) -> tuple[Any, list[Event]]:
    api.app.state.stream_timing = StreamTiming(**({"poll_seconds": 0.02, "max_seconds": 0.15} | timing))
    headers = key.headers()
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    response = await api.client.get(f"/v1/threads/{thread_id}/stream", headers=headers)
    return response, parse_sse(response.text) if response.status_code == 200 else []


async def new_thread(api: Any, key: Any) -> str:
    response = await create_thread(api.client, key)
    assert response.status_code == 201
    thread_id: str = response.json()["thread"]["id"]
    return thread_id


async def add_entries(api: Any, key: Any, thread_id: str, specs: list[tuple[str, int, int, str]]) -> list[int]:
    """Stored entries `(run_id, attempt, sequence, type)` chained through `prev`, as the worker writes them."""
    ids: list[int] = []
    async with api.service.engine.begin() as conn:
        prev = (
            await conn.execute(select(func.max(stream_entries.c.id)).where(stream_entries.c.thread_id == thread_id))
        ).scalar_one_or_none()
        for run_id, attempt, sequence, kind in specs:
            payload: dict[str, Any] = {"prev": prev}
            payload |= (
                {"event": {"event_kind": "part_delta", "n": sequence}}
                if kind == "delta"
                else {"checkpoint_seq": sequence}
            )
            new_id = (
                await conn.execute(
                    insert(stream_entries)
                    .values(
                        workspace_id=key.workspace_id,
                        thread_id=thread_id,
                        run_id=run_id,
                        attempt=attempt,
                        sequence=sequence,
                        type=kind,
                        payload=payload,
                        created_at=db_now(),
                    )
                    .returning(stream_entries.c.id)
                )
            ).scalar_one()
            ids.append(int(new_id))
            prev = int(new_id)
    return ids


RUN = "run_" + "a" * 32


async def test_stream_headers_and_keep_alive_comments(api: Any) -> None:
    """§8.7, S-102: `text/event-stream`, `Cache-Control: no-store`, `X-Accel-Buffering: no`, and a keep-alive
    comment at least every `keepalive_seconds` (15 s by default; shortened here)."""
    key = await api.key()
    thread_id = await new_thread(api, key)
    response, events = await read_stream(api, key, thread_id, keepalive_seconds=0.05, max_seconds=0.4)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["cache-control"] == "no-store"
    assert response.headers["x-accel-buffering"] == "no"
    assert len([event for event in events if "comment" in event]) >= 3
    assert StreamTiming().keepalive_seconds <= 15


async def test_stream_unknown_thread_and_bad_last_event_id(api: Any) -> None:
    """S-126: another workspace's thread reads as unknown (404); a malformed `Last-Event-ID` → 400."""
    key, other = await api.key(), await api.key()
    thread_id = await new_thread(api, key)
    response, _ = await read_stream(api, other, thread_id)
    assert response.status_code == 404 and error_of(response)["code"] == "not_found"
    response, _ = await read_stream(api, key, thread_id, last_event_id="abc")
    assert response.status_code == 400 and error_of(response)["code"] == "invalid_argument"


async def test_worker_entries_stream_as_deltas_and_boundaries(api: Any) -> None:
    """§7.7 step 7, §7.8 step 7: the worker's deltas and boundary entries reach the stream with the entry id as
    SSE `id`; `Last-Event-ID` replays only what follows."""
    from worker.support import FACTORY

    api.service.agents = AgentRegistry({"demo": FACTORY})
    key = await api.key()
    created = await create_thread(api.client, key, options={"script": "step"})  # model → tool `step` → model
    thread_id = created.json()["thread"]["id"]
    await WorkerLoop(api.service).run_until_idle(timeout=30)
    response, events = await read_stream(api, key, thread_id)
    assert response.status_code == 200
    entries = named(events)
    assert entries, events
    boundaries = [e for e in entries if e["event"] == "boundary"]
    deltas = [e for e in entries if e["event"] == "delta"]
    assert boundaries[0]["data"]["checkpoint_seq"] == 1 and deltas
    run_id = boundaries[0]["data"]["run_id"]
    assert all(e["data"]["run_id"] == run_id and e["data"]["attempt"] == 1 for e in entries)
    assert [e["data"]["sequence"] for e in entries] == list(range(1, len(entries) + 1))
    assert [int(e["id"]) for e in entries] == sorted(int(e["id"]) for e in entries)
    assert [b["data"]["checkpoint_seq"] for b in boundaries] == [1, 2, 3, 4]  # 4: the final, sealing commit
    assert [d["data"]["event"]["event_kind"] for d in deltas] == ["function_tool_call", "function_tool_result"]
    _, replayed = await read_stream(api, key, thread_id, last_event_id=entries[0]["id"])
    assert [e["id"] for e in named(replayed)] == [e["id"] for e in entries[1:]]


async def test_the_sealing_commit_streams_its_boundary_and_trimming_covers_the_run(api: Any) -> None:
    """§7.8 step 7, S-5, S-105: the final commit of a `completed` and of a `waiting` run writes its `boundary`
    entry (the run's last checkpoint) in the sealing transaction, so the stream ends with it, after the last delta;
    once it is older than `worker.stream_trim_seconds` every entry of the run is covered and trimmed."""
    from worker.support import FACTORY, run_row

    api.service.agents = AgentRegistry({"demo": FACTORY})
    key = await api.key()
    for script, status in (("step", "completed"), ("approval", "waiting")):
        created = await create_thread(api.client, key, idempotency_key=script, options={"script": script})
        thread_id, run_id = created.json()["thread"]["id"], created.json()["run"]["id"]
        await WorkerLoop(api.service).run_until_idle(timeout=30)
        run = await run_row(api.service.engine, run_id)
        assert run["status"] == status
        _, events = await read_stream(api, key, thread_id)
        entries = [e for e in named(events) if e["event"] in ("delta", "boundary")]
        assert entries[-1]["event"] == "boundary", entries
        assert entries[-1]["data"] == {
            "run_id": run_id,
            "attempt": 1,
            "sequence": len(entries),
            "checkpoint_seq": run["checkpoint_seq"],
        }
        async with api.service.engine.begin() as conn:
            await conn.execute(
                update(stream_entries)
                .where(stream_entries.c.thread_id == thread_id)
                .values(created_at=stream_entries.c.created_at - 11)
            )
        result = await trim_stream_entries(api.service.engine, trim_seconds=10, ttl_seconds=600, length=100)
        assert result.covered >= len(entries) and result.expired == 0
        _, events = await read_stream(api, key, thread_id)
        assert [e for e in named(events) if e["event"] in ("delta", "boundary")] == []


async def test_reset_precedes_the_first_entry_of_a_new_attempt(api: Any) -> None:
    """S-103: when a run starts another attempt, `reset` for that run comes before the new attempt's first delta,
    in a live stream and on a reconnect after the old attempt's entries."""
    key = await api.key()
    thread_id = await new_thread(api, key)
    first, second = await add_entries(api, key, thread_id, [(RUN, 1, 1, "delta"), (RUN, 2, 1, "delta")])
    _, events = await read_stream(api, key, thread_id)
    assert [(e["event"], e.get("id")) for e in named(events)] == [
        ("delta", str(first)),
        ("reset", None),
        ("delta", str(second)),
    ]
    assert named(events)[1]["data"] == {"run_id": RUN}
    _, events = await read_stream(api, key, thread_id, last_event_id=str(first))
    assert [e["event"] for e in named(events)] == ["reset", "delta"]


async def test_gap_comes_first_when_the_reconnect_point_was_trimmed(api: Any) -> None:
    """S-104: a `Last-Event-ID` before trimmed entries gets `gap` first, then the retained entries; a reconnect
    right behind the oldest retained entry gets no gap."""
    key = await api.key()
    thread_id = await new_thread(api, key)
    ids = await add_entries(api, key, thread_id, [(RUN, 1, n, "delta") for n in (1, 2, 3, 4)])
    async with api.service.engine.begin() as conn:
        await conn.execute(delete(stream_entries).where(stream_entries.c.id.in_(ids[1:3])))
    _, events = await read_stream(api, key, thread_id, last_event_id=str(ids[0]))
    assert [(e["event"], e.get("id")) for e in named(events)] == [("gap", None), ("delta", str(ids[3]))]
    assert named(events)[0]["data"] == {"run_id": RUN}
    _, events = await read_stream(api, key, thread_id, last_event_id=str(ids[2]))
    assert [e["event"] for e in named(events)] == ["delta"]


def count_stream_reads(monkeypatch: Any) -> list[int]:
    """Counts the stream's reads of its entries: one per poll, the first after it took the thread's marker."""
    reads = [0]
    original = http_stream.read_stream_entries  # type: ignore[attr-defined]  # the module's own binding, which the test patches

    async def counted(*args: Any, **kwargs: Any) -> Any:
        reads[0] += 1
        return await original(*args, **kwargs)

    monkeypatch.setattr(http_stream, "read_stream_entries", counted)
    return reads


async def test_changed_when_the_thread_version_moves(api: Any, monkeypatch: Any) -> None:
    """§8.7: `changed` with the new version when the thread changes while the stream is open."""
    key = await api.key()
    thread_id = await new_thread(api, key)
    reads = count_stream_reads(monkeypatch)
    reading = asyncio.create_task(read_stream(api, key, thread_id, max_seconds=5.0))
    await wait_until(lambda: reads[0] >= 1, 5)  # the stream is open and has its starting marker
    posted = await api.client.post(f"/v1/threads/{thread_id}/inbox", json={"input": TEXT}, headers=key.headers("m"))
    assert posted.status_code == 201
    _, events = await reading
    changed = [e for e in named(events) if e["event"] == "changed"]
    assert changed and changed[-1]["data"] == {"version": posted.json()["thread"]["version"]}


async def test_stream_ends_when_access_ends(api: Any, monkeypatch: Any) -> None:
    """§8.7: the stream ends when the caller's access ends (here: the key is disabled)."""
    key = await api.key()
    thread_id = await new_thread(api, key)
    reads = count_stream_reads(monkeypatch)
    reading = asyncio.create_task(read_stream(api, key, thread_id, max_seconds=None, access_seconds=0.05))
    await wait_until(lambda: reads[0] >= 5, 5)  # several polls, with access re-checked in between
    assert not reading.done()
    async with api.service.engine.begin() as conn:
        await conn.execute(update(principals).where(principals.c.id == key.id).values(disabled_at=db_now()))
    response, _ = await asyncio.wait_for(reading, timeout=5)
    assert response.status_code == 200


async def test_trim_streams_removes_covered_expired_and_overflowing_entries(api: Any) -> None:
    """S-105: entries covered by a boundary are removed once it is older than `worker.stream_trim_seconds`;
    entries after the last boundary stay; `worker.stream_ttl` and `worker.stream_length` bound the rest."""
    key = await api.key()
    thread_id = await new_thread(api, key)
    ids = await add_entries(api, key, thread_id, [(RUN, 1, 1, "delta"), (RUN, 1, 2, "boundary"), (RUN, 1, 3, "delta")])

    async def remaining() -> list[int]:
        async with api.service.engine.connect() as conn:
            query = select(stream_entries.c.id).where(stream_entries.c.thread_id == thread_id)
            return sorted((await conn.execute(query)).scalars().all())

    await trim_streams(api.service)  # default trim delay 10 s: nothing is old enough yet
    assert await remaining() == ids
    async with api.service.engine.begin() as conn:
        await conn.execute(
            update(stream_entries)
            .where(stream_entries.c.id.in_(ids))
            .values(created_at=stream_entries.c.created_at - 11)
        )
    result = await trim_streams(api.service)
    assert await remaining() == ids[2:] and result.covered == 2
    async with api.service.engine.begin() as conn:
        await conn.execute(
            update(stream_entries)
            .where(stream_entries.c.id == ids[2])
            .values(created_at=stream_entries.c.created_at - 600)
        )
    await trim_streams(api.service)
    assert await remaining() == []
    more = await add_entries(api, key, thread_id, [(RUN, 2, n, "delta") for n in range(1, 6)])
    result = await trim_stream_entries(api.service.engine, trim_seconds=10, ttl_seconds=600, length=2)
    assert await remaining() == more[-2:] and result.overflow == 3


async def test_trim_streams_is_a_control_sweep(api: Any) -> None:
    """§10.2: `trim_streams` runs every `worker.stream_trim_seconds`."""
    from candor.service.control.sweeps import sweep_table

    (trim,) = [sweep for sweep in sweep_table(api.service) if sweep.name == "trim_streams"]
    assert trim.period == api.service.settings.worker.stream_trim_seconds and trim.timeout >= trim.period


async def test_reset_after_a_recovered_attempt_end_to_end(api: Any, monkeypatch: Any) -> None:
    """S-103 through the worker: attempt 1 writes entries, then its third checkpoint commit finds the database
    unavailable with a fault that is not passing (a refused password: not retried inside the attempt, issue 34;
    recovered as a failed attempt); the stream shows `reset` for the run right before attempt 2's first entry."""
    import asyncpg

    from candor.service.errors import StoreUnavailable
    from candor.service.worker import attempt_store

    from worker import support

    support.reset_control()
    real_commit, calls = attempt_store.commit_checkpoint, []  # type: ignore[attr-defined]  # the module's own binding, which the test patches

    async def flaky_commit(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 3:
            raise StoreUnavailable("scripted outage") from asyncpg.InvalidPasswordError("scripted")
        return await real_commit(*args, **kwargs)

    monkeypatch.setattr(attempt_store, "commit_checkpoint", flaky_commit)
    api.service.agents = AgentRegistry({"demo": support.FACTORY})
    key = await api.key()
    created = await create_thread(api.client, key, options={"script": "step"})
    run_id = created.json()["run"]["id"]
    worker = WorkerLoop(api.service)
    await worker.run_until_idle(timeout=30)
    await support.make_due(api.service.engine, run_id)
    await worker.run_until_idle(timeout=30)
    assert (await support.run_row(api.service.engine, run_id))["status"] == "completed"
    _, events = await read_stream(api, key, created.json()["thread"]["id"])
    entries = named(events)
    attempts = [e["data"]["attempt"] for e in entries if e["event"] in ("delta", "boundary")]
    assert 1 in attempts and 2 in attempts, entries
    first_of_second = next(i for i, e in enumerate(entries) if e["data"].get("attempt") == 2)
    assert entries[first_of_second - 1] == {"event": "reset", "data": {"run_id": run_id}}
    assert [e["event"] for e in entries].count("reset") == 1
