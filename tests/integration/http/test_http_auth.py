"""Authentication, permissions and workspaces over HTTP (§4.2, §4.4): S-91, S-101, S-126, S-128, S-129."""

from __future__ import annotations

from typing import Any

from candor.service.store.db.engine import write_transaction
from candor.service.store.workspaces import auth as auth

from commands.helpers import pending_of, seal_run
from http_support import TEXT, create_thread, error_of

ANSWERS = {"approvals": {"a1": {"action": "approve"}}, "calls": {"c1": {"status": "returned", "value": 1}}}


async def test_missing_or_unknown_secret_is_401(api: Any) -> None:
    """S-101: no `Authorization`, another scheme, an unknown or a disabled key → 401 `unauthenticated`."""
    key = await api.key()
    disabled = await api.key(key.workspace_id)
    async with write_transaction(api.service.engine) as conn:
        await auth.disable_principal(conn, principal_id=disabled.id)
    thread_path = "/v1/threads/thr_" + "0" * 32
    for headers in (
        {},
        {"Authorization": f"Basic {key.secret}"},
        {"Authorization": "Bearer "},
        {"Authorization": "Bearer cnd_unknown"},
        disabled.headers(),
    ):
        for response in (
            await api.client.get(thread_path, headers=headers),
            await api.client.post("/v1/threads", json={"agent": "demo", "input": TEXT}, headers=headers),
        ):
            assert response.status_code == 401, headers
            assert error_of(response)["code"] == "unauthenticated"
            assert response.headers["www-authenticate"] == "Bearer"
            assert key.secret not in response.text


async def test_authentication_is_not_cached_between_requests(api: Any) -> None:
    """S-61, S-101, S-128: every request reads the key afresh: a key that just resumed a run is refused on its very
    next request once disabled, and a key whose workspace was just archived gets 422 `disabled` for its next resume."""
    key = await api.key()
    waiting = []
    for name in ("t1", "t2"):
        created = (await create_thread(api.client, key, idempotency_key=name)).json()
        waiting.append(await seal_run(api.service, created["run"]["id"], "waiting", pending=pending_of()))
    first = await api.client.post(f"/v1/runs/{waiting[0].id}/resume", json=ANSWERS, headers=key.headers("r1"))
    assert first.status_code == 201
    async with write_transaction(api.service.engine) as conn:
        await auth.archive_workspace(conn, key.workspace_id)
    archived = await api.client.post(f"/v1/runs/{waiting[1].id}/resume", json=ANSWERS, headers=key.headers("r2"))
    assert archived.status_code == 422 and error_of(archived)["code"] == "disabled"
    async with write_transaction(api.service.engine) as conn:
        await auth.disable_principal(conn, principal_id=key.id)
    refused = await api.client.post(f"/v1/runs/{waiting[1].id}/resume", json=ANSWERS, headers=key.headers("r3"))
    assert refused.status_code == 401 and error_of(refused)["code"] == "unauthenticated"


async def test_missing_permission_is_403(api: Any) -> None:
    """S-101, §4.2: `read` for every GET, `run` for thread and run commands; otherwise 403 `forbidden` (before the
    body is looked at)."""
    owner = await api.key()
    reader = await api.key(owner.workspace_id, permissions=["read"])
    runner = await api.key(owner.workspace_id, permissions=["run"])
    thread = (await create_thread(api.client, owner)).json()["thread"]
    forbidden = [
        await create_thread(api.client, reader),
        await api.client.post("/v1/threads", json={"bogus": 1}, headers=reader.headers("k")),
        await api.client.post(f"/v1/threads/{thread['id']}/inbox", json={"input": TEXT}, headers=reader.headers("p")),
        await api.client.post(f"/v1/runs/{thread['current_run_id']}/interrupt", headers=reader.headers()),
        await api.client.get(f"/v1/threads/{thread['id']}", headers=runner.headers()),
        await api.client.get(f"/v1/runs/{thread['current_run_id']}", headers=runner.headers()),
    ]
    for response in forbidden:
        assert response.status_code == 403
        assert error_of(response) | {"request_id": None} == {
            "code": "forbidden",
            "message": error_of(response)["message"],
            "request_id": None,
            "details": {"permission": "run" if response.request.method == "POST" else "read"},
        }
    assert (await api.client.get(f"/v1/threads/{thread['id']}", headers=reader.headers())).status_code == 200
    assert (await create_thread(api.client, runner, idempotency_key="r")).status_code == 201


async def test_other_workspaces_look_unknown(api: Any) -> None:
    """S-126: a thread or run id of another workspace answers 404 exactly like an unknown id; lists stay empty of it."""
    mine = await api.key()
    theirs = await api.key()
    created = (await create_thread(api.client, theirs)).json()
    thread_id, run_id = created["thread"]["id"], created["run"]["id"]
    unknown_thread, unknown_run = "thr_" + "0" * 32, "run_" + "0" * 32

    def shape(response: Any, id: str) -> dict[str, Any]:
        error = error_of(response)
        assert error["details"].pop("id") == id
        return {"status": response.status_code, **error, "request_id": None}

    requests = [
        ("GET", "/v1/threads/{t}", None),
        ("GET", "/v1/threads/{t}/runs", None),
        ("POST", "/v1/threads/{t}/inbox", {"input": TEXT}),
        ("GET", "/v1/runs/{r}", None),
        ("GET", "/v1/runs/{r}/attempts", None),
        ("POST", "/v1/runs/{r}/interrupt", None),
        ("POST", "/v1/runs/{r}/fork", {"input": TEXT}),
        ("POST", "/v1/runs/{r}/resume", ANSWERS),
    ]
    for number, (method, template, body) in enumerate(requests):
        answers = []
        for t, r in ((thread_id, run_id), (unknown_thread, unknown_run)):
            path = template.format(t=t, r=r)
            response = await api.client.request(method, path, json=body, headers=mine.headers(f"k{number}-{t}"))
            answers.append(shape(response, r if "{r}" in template else t))
        assert answers[0] == answers[1], template
        assert answers[0]["status"] == 404 and answers[0]["code"] == "not_found"
    # Archive takes an If-Match: the foreign ETag is as good as any, the thread is still not found.
    etag = f'"{thread_id}:1"'
    response = await api.client.post(f"/v1/threads/{thread_id}/archive", headers=mine.headers(If_Match=etag))
    assert response.status_code == 404
    # The owner still sees everything unchanged.
    assert (await api.client.get(f"/v1/threads/{thread_id}", headers=theirs.headers())).json()["state"] == "active"


async def test_archived_workspace_refuses_writes_and_keeps_reads(api: Any) -> None:
    """S-128: after archiving a workspace, creating a thread, posting, resuming and forking answer 422 `disabled`;
    GET requests keep working; the waiting run stays waiting."""
    key = await api.key()
    created = (await create_thread(api.client, key)).json()
    waiting = await seal_run(api.service, created["run"]["id"], "waiting", pending=pending_of())
    forked_from = (await create_thread(api.client, key, idempotency_key="k2")).json()
    await seal_run(api.service, forked_from["run"]["id"], "completed")
    async with write_transaction(api.service.engine) as conn:
        await auth.archive_workspace(conn, key.workspace_id)
    refused = [
        await create_thread(api.client, key, idempotency_key="new"),
        await api.client.post(f"/v1/threads/{waiting.thread_id}/inbox", json={"input": TEXT}, headers=key.headers("p")),
        await api.client.post(f"/v1/runs/{waiting.id}/resume", json=ANSWERS, headers=key.headers("r")),
        await api.client.post(
            f"/v1/runs/{forked_from['run']['id']}/fork", json={"input": TEXT}, headers=key.headers("f")
        ),
    ]
    for response in refused:
        assert response.status_code == 422
        assert error_of(response)["code"] == "disabled"
        assert error_of(response)["details"] == {"kind": "workspace", "id": key.workspace_id}
    run = await api.client.get(f"/v1/runs/{waiting.id}", headers=key.headers())
    assert run.status_code == 200 and run.json()["status"] == "waiting"
    thread = await api.client.get(f"/v1/threads/{waiting.thread_id}", headers=key.headers())
    assert thread.status_code == 200 and thread.json()["state"] == "waiting"
    runs = await api.client.get(f"/v1/threads/{waiting.thread_id}/runs", headers=key.headers())
    assert [item["id"] for item in runs.json()["items"]] == [waiting.id]
    # S-94: a replay is recognised before the workspace check.
    assert (await create_thread(api.client, key)).status_code == 200


async def test_same_key_in_two_workspaces_creates_two_threads(api: Any) -> None:
    """S-129: one `Idempotency-Key` used by principals of two workspaces creates two independent resources."""
    first, second = await api.key(), await api.key()
    a = await create_thread(api.client, first, idempotency_key="shared")
    b = await create_thread(api.client, second, idempotency_key="shared")
    assert (a.status_code, b.status_code) == (201, 201)
    assert a.json()["thread"]["id"] != b.json()["thread"]["id"]
    assert (
        await api.client.get(f"/v1/threads/{a.json()['thread']['id']}", headers=second.headers())
    ).status_code == 404


async def test_keys_are_scoped_per_principal(api: Any) -> None:
    """S-91: the same key from another principal of the same workspace creates new resources."""
    first = await api.key()
    second = await api.key(first.workspace_id)
    a = await create_thread(api.client, first, idempotency_key="same")
    b = await create_thread(api.client, second, idempotency_key="same")
    assert (a.status_code, b.status_code) == (201, 201)
    assert a.json()["thread"]["id"] != b.json()["thread"]["id"]
    replay = await create_thread(api.client, second, idempotency_key="same")
    assert replay.status_code == 200 and replay.json()["thread"]["id"] == b.json()["thread"]["id"]
