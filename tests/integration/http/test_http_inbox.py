"""Inbox entry management over HTTP (§8.3, §8.4, §8.5): list and read entries; edit, withdraw and reorder them
with the thread's ETag. S-73, S-74, S-75, S-76, S-92, S-96, S-97, S-98, S-126."""

from __future__ import annotations

from typing import Any

from commands.helpers import seal_run
from http_support import TEXT, app_for, client_for, create_thread, error_of, new_key, text

ENTRY_FIELDS = {
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


async def _waiting_thread(client: Any, service: Any, key: Any, posts: int = 2) -> tuple[str, list[str]]:
    """A thread whose run waits, so posted messages stay pending (S-69); the ids of the `posts` pending entries."""
    created = (await create_thread(client, key, idempotency_key="create")).json()
    await seal_run(service, created["run"]["id"], "waiting")
    thread_id = created["thread"]["id"]
    ids = []
    for i in range(posts):
        posted = await client.post(
            f"/v1/threads/{thread_id}/inbox", json={"input": text(f"m{i}")}, headers=key.headers(f"p{i}")
        )
        ids.append(posted.json()["entry"]["id"])
    return thread_id, ids


async def _etag(client: Any, key: Any, thread_id: str) -> str:
    etag: str = (await client.get(f"/v1/threads/{thread_id}", headers=key.headers())).headers["etag"]
    return etag


async def test_list_and_read_entries(api: Any) -> None:
    """§8.3, §8.4, S-98: EntryViews in position order, cursor-paged, filterable by status; the last page has no
    cursor and a cursor reused with another filter → 400 `invalid_cursor`."""
    key = await api.key()
    thread_id, ids = await _waiting_thread(api.client, api.service, key, posts=2)
    path = f"/v1/threads/{thread_id}/inbox"
    first = (await api.client.get(f"{path}?limit=2", headers=key.headers())).json()
    assert [entry["position"] for entry in first["items"]] == [1, 2] and first["next_cursor"]
    assert set(first["items"][0]) == ENTRY_FIELDS and first["items"][0]["kind"] == "message"
    rest = (await api.client.get(f"{path}?limit=2&cursor={first['next_cursor']}", headers=key.headers())).json()
    assert [entry["id"] for entry in rest["items"]] == [ids[1]] and rest["next_cursor"] is None
    pending = (await api.client.get(f"{path}?status=pending", headers=key.headers())).json()
    assert [entry["id"] for entry in pending["items"]] == ids
    reused = await api.client.get(f"{path}?status=pending&cursor={first['next_cursor']}", headers=key.headers())
    assert reused.status_code == 400 and error_of(reused)["code"] == "invalid_cursor"
    bad = await api.client.get(f"{path}?status=nonsense", headers=key.headers())
    assert bad.status_code == 400 and error_of(bad)["code"] == "invalid_argument"
    one = await api.client.get(f"{path}/{ids[0]}", headers=key.headers())
    assert one.status_code == 200 and one.json() == pending["items"][0]


async def test_edit_a_pending_entry(api: Any) -> None:
    """S-74, S-75: PATCH with the thread's ETag edits the entry and answers the thread's new ETag; `null` agent or
    options clear them; an empty or unknown-field body → 400."""
    key = await api.key()
    thread_id, ids = await _waiting_thread(api.client, api.service, key)
    etag = await _etag(api.client, key, thread_id)
    path = f"/v1/threads/{thread_id}/inbox/{ids[0]}"
    body = {"input": text("edited"), "delivery": "steer", "agent": "demo", "options": {"tone": "brief"}}
    edited = await api.client.patch(path, json=body, headers=key.headers(If_Match=etag))
    assert edited.status_code == 200, edited.text
    entry = edited.json()
    assert set(entry) == ENTRY_FIELDS
    assert (entry["delivery"], entry["agent"], entry["status"]) == ("steer", "demo", "pending")
    version = int(etag.strip('"').rpartition(":")[2])
    assert edited.headers["etag"] == f'"{thread_id}:{version + 1}"' == await _etag(api.client, key, thread_id)
    cleared = await api.client.patch(path, json={"agent": None}, headers=key.headers(If_Match=edited.headers["etag"]))
    assert cleared.status_code == 200 and cleared.json()["agent"] is None
    bad: dict[str, Any]
    for bad in ({}, {"status": "consumed"}, {"input": {"content": []}}, {"agent": "missing"}):
        refused = await api.client.patch(path, json=bad, headers=key.headers(If_Match=cleared.headers["etag"]))
        assert refused.status_code == 400, (bad, refused.text)
        assert error_of(refused)["code"] == "invalid_argument"


async def test_preconditions(api: Any) -> None:
    """S-97, S-75: no `If-Match` → 428; the ETag from before another inbox change → 412 with the current one."""
    key = await api.key()
    thread_id, ids = await _waiting_thread(api.client, api.service, key)
    before = await _etag(api.client, key, thread_id)
    entry_path = f"/v1/threads/{thread_id}/inbox/{ids[0]}"
    missing = await api.client.delete(entry_path, headers=key.headers())
    assert missing.status_code == 428 and error_of(missing)["code"] == "precondition_required"
    withdrawn = await api.client.delete(f"/v1/threads/{thread_id}/inbox/{ids[1]}", headers=key.headers(If_Match=before))
    assert withdrawn.status_code == 200 and withdrawn.json()["status"] == "withdrawn"
    for response in (
        await api.client.delete(entry_path, headers=key.headers(If_Match=before)),
        await api.client.patch(entry_path, json={"input": TEXT}, headers=key.headers(If_Match=before)),
        await api.client.put(
            f"/v1/threads/{thread_id}/inbox/order", json={"entry_ids": [ids[0]]}, headers=key.headers(If_Match=before)
        ),
    ):
        assert response.status_code == 412
        assert error_of(response)["details"] == {"current_etag": withdrawn.headers["etag"]}


async def test_non_pending_and_foreign_entries(api: Any) -> None:
    """S-74, S-76: a withdrawn (or assigned) entry → 409 `entry_<status>`; another key's entry → 403; another
    workspace's ids → 404."""
    key = await api.key()
    thread_id, ids = await _waiting_thread(api.client, api.service, key)
    etag = await _etag(api.client, key, thread_id)
    etag = (
        await api.client.delete(f"/v1/threads/{thread_id}/inbox/{ids[1]}", headers=key.headers(If_Match=etag))
    ).headers["etag"]
    again = await api.client.delete(f"/v1/threads/{thread_id}/inbox/{ids[1]}", headers=key.headers(If_Match=etag))
    assert again.status_code == 409
    assert error_of(again)["details"] == {"reason": "entry_withdrawn", "kind": "entry", "id": ids[1]}
    colleague = await api.key(key.workspace_id)
    other = await api.client.patch(
        f"/v1/threads/{thread_id}/inbox/{ids[0]}", json={"input": TEXT}, headers=colleague.headers(If_Match=etag)
    )
    assert other.status_code == 403 and error_of(other)["details"]["reason"] == "not_submitter"
    stranger = await api.key()
    for response in (
        await api.client.get(f"/v1/threads/{thread_id}/inbox", headers=stranger.headers()),
        await api.client.get(f"/v1/threads/{thread_id}/inbox/{ids[0]}", headers=stranger.headers()),
        await api.client.delete(f"/v1/threads/{thread_id}/inbox/{ids[0]}", headers=stranger.headers(If_Match=etag)),
    ):
        assert response.status_code == 404 and error_of(response)["details"]["kind"] == "thread"


async def test_reorder(api: Any) -> None:
    """S-74, S-75: PUT …/inbox/order listing exactly the pending entries reorders them; anything else → 400 naming
    the missing and unexpected ids; an archived thread → 409 `archived`."""
    key = await api.key()
    thread_id, ids = await _waiting_thread(api.client, api.service, key, posts=3)
    path = f"/v1/threads/{thread_id}/inbox/order"
    etag = await _etag(api.client, key, thread_id)
    wrong = await api.client.put(path, json={"entry_ids": [ids[0], "ent_x"]}, headers=key.headers(If_Match=etag))
    assert wrong.status_code == 400
    details = error_of(wrong)["details"]
    assert (details["reason"], details["missing"], details["unexpected"]) == (
        "inbox_order_mismatch",
        ids[1:],
        ["ent_x"],
    )
    order = [ids[2], ids[1], ids[0]]
    reordered = await api.client.put(path, json={"entry_ids": order}, headers=key.headers(If_Match=etag))
    assert reordered.status_code == 200, reordered.text
    body = reordered.json()
    assert [entry["id"] for entry in body["items"]] == order and body["next_cursor"] is None
    assert [entry["position"] for entry in body["items"]] == [2, 3, 4]
    assert reordered.headers["etag"] != etag
    listed = (await api.client.get(f"/v1/threads/{thread_id}/inbox?status=pending", headers=key.headers())).json()
    assert [entry["id"] for entry in listed["items"]] == order
    archived = await api.client.post(
        f"/v1/threads/{thread_id}/archive", headers=key.headers(If_Match=reordered.headers["etag"])
    )
    late = await api.client.put(path, json={"entry_ids": []}, headers=key.headers(If_Match=archived.headers["etag"]))
    assert late.status_code == 409 and error_of(late)["details"]["reason"] == "archived"


async def test_edit_beyond_the_inbox_bytes_is_429(db: Any) -> None:
    """S-73: an edit that would take the inbox over `control.inbox_bytes` → 429 with `Retry-After: 1`; an edit
    whose entry alone exceeds it → 413 `payload_too_large` (it could never fit, issue 14)."""
    app = app_for(db, control={"inbox_bytes": 300})
    async with client_for(app) as client:
        key = await new_key(app.state.service)
        thread_id, ids = await _waiting_thread(client, app.state.service, key, posts=2)
        etag = await _etag(client, key, thread_id)
        response = await client.patch(
            f"/v1/threads/{thread_id}/inbox/{ids[0]}",
            json={"input": text("x" * 250)},
            headers=key.headers(If_Match=etag),
        )
        too_large = await client.patch(
            f"/v1/threads/{thread_id}/inbox/{ids[0]}",
            json={"input": text("x" * 400)},
            headers=key.headers(If_Match=etag),
        )
    assert response.status_code == 429 and response.headers["retry-after"] == "1", response.text
    assert error_of(response)["code"] == "rate_limited"
    assert too_large.status_code == 413 and error_of(too_large)["code"] == "payload_too_large"
