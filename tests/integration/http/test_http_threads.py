"""Threads and the inbox over HTTP (§8.3, §8.5, §8.2): S-65, S-69, S-73, S-90, S-93, S-97, S-98."""

from __future__ import annotations

from typing import Any

import pytest

from commands.helpers import seal_run
from http_support import TEXT, app_for, client_for, create_thread, error_of, new_key, text


async def test_create_thread(api: Any) -> None:
    """S-65: a new thread's first message starts a run at once; 201 `{thread, entry, run}` with the views of §8.4."""
    key = await api.key()
    response = await create_thread(api.client, key, options={"tone": "brief"})
    assert response.status_code == 201
    body = response.json()
    thread, entry, run = body["thread"], body["entry"], body["run"]
    assert set(thread) == {
        "id",
        "state",
        "origin",
        "origin_thread_id",
        "origin_run_id",
        "agent",
        "current_run_id",
        "last_run_id",
        "archived_at",
        "version",
        "created_at",
        "updated_at",
    }
    assert set(entry) == {
        "id",
        "thread_id",
        "kind",
        "delivery",
        "position",
        "status",
        "agent",
        "assigned_run_id",
        "failure",
        "created_at",
        "finished_at",
    }
    assert set(run) == {
        "id",
        "thread_id",
        "agent",
        "principal_id",
        "status",
        "trigger",
        "lineage",
        "parent_run_id",
        "wait_reason",
        "pending",
        "output",
        "failure",
        "attempts",
        "max_attempts",
        "tool_recovery",
        "cancel_requested_at",
        "current_attempt_id",
        "checkpoint_seq",
        "usage",
        "created_at",
        "started_at",
        "sealed_at",
        "version",
    }
    assert (thread["state"], thread["origin"], thread["current_run_id"]) == ("active", "new", run["id"])
    assert (entry["status"], entry["assigned_run_id"], entry["position"]) == ("assigned", run["id"], 1)
    assert (run["status"], run["trigger"], run["lineage"], run["agent"]) == ("accepted", "input", "root", "demo")
    assert thread["created_at"].endswith("Z") and run["sealed_at"] is None
    read = await api.client.get(f"/v1/threads/{thread['id']}", headers=key.headers())
    assert read.json() == thread
    assert read.headers["etag"] == f'"{thread["id"]}:{thread["version"]}"'


async def test_post_to_idle_thread_starts_a_run(api: Any) -> None:
    """S-65: a message posted to an idle thread starts a run (trigger `input`) and the response contains it."""
    key = await api.key()
    created = (await create_thread(api.client, key)).json()
    await seal_run(api.service, created["run"]["id"], "completed")
    thread_id = created["thread"]["id"]
    response = await api.client.post(
        f"/v1/threads/{thread_id}/inbox", json={"input": text("more")}, headers=key.headers("p")
    )
    assert response.status_code == 201
    body = response.json()
    assert body["run"]["trigger"] == "input" and body["run"]["lineage"] == "continue"
    assert body["run"]["parent_run_id"] == created["run"]["id"]
    assert body["thread"]["state"] == "active" and body["thread"]["current_run_id"] == body["run"]["id"]
    assert body["entry"]["position"] == 2


async def test_post_to_waiting_thread_queues(api: Any) -> None:
    """S-69: while the last run is waiting, a posted message queues: 201 with `run: null`; no run starts."""
    key = await api.key()
    created = (await create_thread(api.client, key)).json()
    await seal_run(api.service, created["run"]["id"], "waiting")
    thread_id = created["thread"]["id"]
    response = await api.client.post(f"/v1/threads/{thread_id}/inbox", json={"input": TEXT}, headers=key.headers("p"))
    assert response.status_code == 201
    body = response.json()
    assert body["run"] is None and body["entry"]["status"] == "pending" and body["thread"]["state"] == "waiting"
    runs = (await api.client.get(f"/v1/threads/{thread_id}/runs", headers=key.headers())).json()
    assert [run["id"] for run in runs["items"]] == [created["run"]["id"]]


async def test_full_inbox_is_429_with_retry_after(db: Any) -> None:
    """S-73: a post beyond `control.inbox_count` → 429 `rate_limited` with `Retry-After: 1` and the counts."""
    app = app_for(db, control={"inbox_count": 2})
    async with client_for(app) as client:
        key = await new_key(app.state.service)
        thread_id = (await create_thread(client, key)).json()["thread"]["id"]
        path = f"/v1/threads/{thread_id}/inbox"
        assert (await client.post(path, json={"input": TEXT}, headers=key.headers("p1"))).status_code == 201
        response = await client.post(path, json={"input": TEXT}, headers=key.headers("p2"))
    assert response.status_code == 429
    assert response.headers["retry-after"] == "1"
    error = error_of(response)
    assert error["code"] == "rate_limited"
    assert error["details"]["retry_after_seconds"] == 1
    assert (error["details"]["count"], error["details"]["count_limit"]) == (2, 2)


async def test_replay_of_a_thread_creation(api: Any) -> None:
    """S-90: the same key and body → 200 naming the thread, entry and run created first, as they are now; a changed
    body → 409 `idempotency_key_reused`."""
    key = await api.key()
    first = await create_thread(api.client, key, idempotency_key="once")
    await seal_run(api.service, first.json()["run"]["id"], "completed")
    again = await create_thread(api.client, key, idempotency_key="once")
    assert (first.status_code, again.status_code) == (201, 200)
    for name in ("thread", "entry", "run"):
        assert again.json()[name]["id"] == first.json()[name]["id"]
    assert again.json()["run"]["status"] == "completed" and again.json()["thread"]["state"] == "idle"
    changed = await create_thread(api.client, key, idempotency_key="once", input=text("other"))
    assert changed.status_code == 409
    assert error_of(changed)["details"]["reason"] == "idempotency_key_reused"


@pytest.mark.parametrize(
    ("headers", "field", "reason"),
    [
        ({}, "Idempotency-Key", "required"),
        ({"Idempotency-Key": ""}, "Idempotency-Key", "missing"),
        ({"Idempotency-Key": "has space"}, "Idempotency-Key", "invalid_characters"),
        ({"Idempotency-Key": "k" * 513}, "Idempotency-Key", "too_long"),
    ],
)
async def test_idempotency_key_is_required_and_checked(
    api: Any, headers: dict[str, str], field: str, reason: str
) -> None:
    """S-93: a keyed endpoint without `Idempotency-Key` → 400; characters outside `!`–`~` or over 512 → 400."""
    key = await api.key()
    created = (await create_thread(api.client, key, idempotency_key="setup")).json()
    requests = [
        ("/v1/threads", {"agent": "demo", "input": TEXT}),
        (f"/v1/threads/{created['thread']['id']}/inbox", {"input": TEXT}),
        (f"/v1/runs/{created['run']['id']}/fork", {"input": TEXT}),
        (f"/v1/runs/{created['run']['id']}/resume", {"approvals": {}, "calls": {}}),
    ]
    for path, body in requests:
        response = await api.client.post(path, json=body, headers=key.headers() | headers)
        assert response.status_code == 400, path
        error = error_of(response)
        assert error["code"] == "invalid_argument"
        assert {"field": field, "reason": reason} in error["details"]["fields"]
    assert (await create_thread(api.client, key, idempotency_key="~" * 512)).status_code == 201


async def test_archive_requires_the_thread_etag(api: Any) -> None:
    """S-97: archive without `If-Match` → 428; with a stale ETag → 412 with `details.current_etag`; with the current
    one → 200 (and archiving again → 200, S-64)."""
    key = await api.key()
    created = (await create_thread(api.client, key)).json()
    thread_id = created["thread"]["id"]
    path = f"/v1/threads/{thread_id}/archive"
    missing = await api.client.post(path, headers=key.headers())
    assert missing.status_code == 428 and error_of(missing)["code"] == "precondition_required"
    await api.client.post(f"/v1/threads/{thread_id}/inbox", json={"input": TEXT}, headers=key.headers("p"))
    current = (await api.client.get(f"/v1/threads/{thread_id}", headers=key.headers())).headers["etag"]
    for stale in (f'"{thread_id}:1"', f'"thr_{"0" * 32}:2"', "*", "garbage"):
        response = await api.client.post(path, headers=key.headers(If_Match=stale))
        assert response.status_code == 412, stale
        assert error_of(response) | {"request_id": None} == {
            "code": "precondition_failed",
            "message": error_of(response)["message"],
            "details": {"current_etag": current},
            "request_id": None,
        }
    archived = await api.client.post(path, headers=key.headers(If_Match=current))
    assert archived.status_code == 200
    assert archived.json()["state"] == "archived" and archived.json()["archived_at"] is not None
    assert archived.headers["etag"] == f'"{thread_id}:{archived.json()["version"]}"'
    run = (await api.client.get(f"/v1/runs/{created['run']['id']}", headers=key.headers())).json()
    assert run["status"] == "cancelled"
    again = await api.client.post(path, headers=key.headers(If_Match=current))
    assert again.status_code == 200 and again.json()["state"] == "archived"
    posted = await api.client.post(f"/v1/threads/{thread_id}/inbox", json={"input": TEXT}, headers=key.headers("q"))
    assert posted.status_code == 409 and error_of(posted)["details"]["reason"] == "archived"


async def _thread_with_runs(api: Any, key: Any, count: int, *, name: str = "t") -> tuple[str, list[str]]:
    created = (await create_thread(api.client, key, idempotency_key=name)).json()
    thread_id, run_ids = created["thread"]["id"], [created["run"]["id"]]
    for number in range(count - 1):
        await seal_run(api.service, run_ids[-1], "completed")
        posted = await api.client.post(
            f"/v1/threads/{thread_id}/inbox", json={"input": TEXT}, headers=key.headers(f"{name}-p{number}")
        )
        run_ids.append(posted.json()["run"]["id"])
    return thread_id, run_ids


async def test_runs_are_paged_with_cursors(api: Any) -> None:
    """S-98: newest first, `limit` pages with an opaque cursor; the last page has `next_cursor: null`."""
    key = await api.key()
    thread_id, run_ids = await _thread_with_runs(api, key, 5)
    path = f"/v1/threads/{thread_id}/runs"
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        params: dict[str, Any] = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        page = (await api.client.get(path, params=params, headers=key.headers())).json()
        seen += [run["id"] for run in page["items"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == list(reversed(run_ids)) and pages == 3
    exact = (await api.client.get(path, params={"limit": 5}, headers=key.headers())).json()
    assert len(exact["items"]) == 5 and exact["next_cursor"] is None
    default = (await api.client.get(path, headers=key.headers())).json()
    assert len(default["items"]) == 5 and default["next_cursor"] is None


async def test_bad_limits_and_cursors(api: Any) -> None:
    """S-98: a `limit` outside 1–100 → 400; a cursor used with another list (another thread, another workspace) or
    a malformed one → 400 `invalid_cursor`."""
    key = await api.key()
    thread_id, _ = await _thread_with_runs(api, key, 3)
    path = f"/v1/threads/{thread_id}/runs"
    for limit in (0, 101, "x"):
        response = await api.client.get(path, params={"limit": limit}, headers=key.headers())
        assert response.status_code == 400
        assert error_of(response)["details"]["fields"][0]["field"] == "limit"
    cursor = (await api.client.get(path, params={"limit": 1}, headers=key.headers())).json()["next_cursor"]
    assert cursor is not None
    other_thread, _ = await _thread_with_runs(api, key, 1, name="other")
    colleague = await api.key(key.workspace_id)
    stranger = await api.key()
    for client_key, other_path, bad in (
        (stranger, path, cursor),
        (key, f"/v1/threads/{other_thread}/runs", cursor),
        (key, path, cursor[:-2]),
        (key, path, "not a cursor"),
        (key, path, "eyJ2IjoxfQ"),
    ):
        response = await api.client.get(other_path, params={"cursor": bad}, headers=client_key.headers())
        assert response.status_code == 400, bad
        assert error_of(response)["code"] == "invalid_cursor"
    # The same list read by another key of the workspace: the cursor is bound to the workspace, not the key.
    shared = await api.client.get(path, params={"cursor": cursor, "limit": 1}, headers=colleague.headers())
    assert shared.status_code == 200 and len(shared.json()["items"]) == 1
