"""`/v1/keys` over HTTP (§4.2, §4.4, §8.3): S-61, S-62, S-97, S-98, S-101, S-126, S-128, S-130."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from candor.service.store.db.engine import write_transaction
from candor.service.store.schema.tables import principals
from candor.service.store.workspaces import auth as auth

from http_support import Key, create_thread, error_of

VIEW_FIELDS = {"id", "name", "permissions", "disabled", "disabled_at", "version", "created_at"}


async def _create(api: Any, admin: Key, **body: Any) -> Any:
    payload = {"name": "ci", "permissions": ["read"]} | body
    return await api.client.post("/v1/keys", json=payload, headers=admin.headers())


async def _patch(api: Any, admin: Key, key_id: str, version: int, **body: Any) -> Any:
    headers = admin.headers(If_Match=f'"{key_id}:{version}"')
    return await api.client.patch(f"/v1/keys/{key_id}", json=body, headers=headers)


async def test_create_shows_the_secret_once_and_stores_only_its_hash(api: Any) -> None:
    """S-130, §4.2: `POST /v1/keys` answers 201 with the secret, which authenticates; lists never show a secret or
    hash; the database holds only the SHA-256 of the secret."""
    admin = await api.key()
    created = await _create(api, admin, name="deploy", permissions=["run", "read", "run"])
    assert created.status_code == 201
    body = created.json()
    assert set(body) == VIEW_FIELDS | {"secret"}
    assert {name: body[name] for name in ("name", "permissions", "disabled", "version")} == {
        "name": "deploy",
        "permissions": ["read", "run"],
        "disabled": False,
        "version": 1,
    }
    assert created.headers["etag"] == f'"{body["id"]}:1"'
    new = {"Authorization": f"Bearer {body['secret']}"}
    assert (await create_thread(api.client, Key(principal=admin.principal, secret=body["secret"]))).status_code == 201
    listed = await api.client.get("/v1/keys", headers=admin.headers())
    assert listed.status_code == 200
    assert [item["id"] for item in listed.json()["items"]] == [admin.id, body["id"]]
    assert all(set(item) == VIEW_FIELDS for item in listed.json()["items"])
    assert body["secret"] not in listed.text and "hash" not in listed.text
    async with api.service.engine.connect() as conn:
        stored = (await conn.execute(select(principals.c.secret_hash).where(principals.c.id == body["id"]))).scalar()
    assert stored == auth.hash_secret(body["secret"]) and body["secret"] not in stored
    assert (await api.client.get("/v1/keys", headers=new)).status_code == 403  # `read`/`run` only: not admin


async def test_list_is_paged_with_cursors_bound_to_the_workspace(api: Any) -> None:
    """S-98: `limit` pages the list oldest first, the last page has `next_cursor: null`; a cursor of another
    collection or workspace → 400 `invalid_cursor`; a `limit` outside 1–100 → 400."""
    admin = await api.key()
    ids = [admin.id] + [(await _create(api, admin, name=f"k{n}")).json()["id"] for n in range(3)]
    seen, cursor = [], None
    while True:
        params = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        page = (await api.client.get("/v1/keys", params=params, headers=admin.headers())).json()
        seen += [item["id"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids
    first = (await api.client.get("/v1/keys", params={"limit": 1}, headers=admin.headers())).json()["next_cursor"]
    other = await api.key()
    for path, key in (("/v1/keys", other), ("/v1/subscriptions", admin)):
        response = await api.client.get(path, params={"cursor": first}, headers=key.headers())
        assert (response.status_code, error_of(response)["code"]) == (400, "invalid_cursor")
    for limit in (0, 101):
        response = await api.client.get("/v1/keys", params={"limit": limit}, headers=admin.headers())
        assert (response.status_code, error_of(response)["code"]) == (400, "invalid_argument")


async def test_a_disabled_key_authenticates_no_more(api: Any) -> None:
    """S-101, S-61: `{"disabled": true}` with the key's ETag disables it (401 from then on, disabling again keeps
    the first `disabled_at`); `{"disabled": false}` enables it again."""
    admin = await api.key()
    created = (await _create(api, admin, permissions=["read", "run"])).json()
    target = Key(principal=admin.principal, secret=created["secret"])
    disabled = await _patch(api, admin, created["id"], 1, disabled=True)
    assert disabled.status_code == 200
    assert (disabled.json()["disabled"], disabled.json()["version"]) == (True, 2)
    assert disabled.headers["etag"] == f'"{created["id"]}:2"'
    response = await create_thread(api.client, target)
    assert (response.status_code, error_of(response)["code"]) == (401, "unauthenticated")
    again = await _patch(api, admin, created["id"], 2, disabled=True)
    assert again.json()["version"] == 2 and again.json()["disabled_at"] == disabled.json()["disabled_at"]
    enabled = await _patch(api, admin, created["id"], 2, disabled=False)
    assert (enabled.json()["disabled"], enabled.json()["version"]) == (False, 3)
    assert (await create_thread(api.client, target)).status_code == 201


async def test_permissions_are_replaced(api: Any) -> None:
    """S-62, S-101: new permissions apply to the next request (a key left with `read` gets 403 on writes)."""
    admin = await api.key()
    created = (await _create(api, admin, permissions=["read", "run"])).json()
    target = Key(principal=admin.principal, secret=created["secret"])
    changed = await _patch(api, admin, created["id"], 1, permissions=["read"])
    assert changed.json()["permissions"] == ["read"]
    response = await create_thread(api.client, target)
    assert (response.status_code, error_of(response)["details"]) == (403, {"permission": "run"})


async def test_patch_needs_the_current_etag(api: Any) -> None:
    """S-97: no `If-Match` → 428; a stale one (or another resource's) → 412 with `details.current_etag`; nothing
    changes."""
    admin = await api.key()
    created = (await _create(api, admin)).json()
    path = f"/v1/keys/{created['id']}"
    missing = await api.client.patch(path, json={"disabled": True}, headers=admin.headers())
    assert (missing.status_code, error_of(missing)["code"]) == (428, "precondition_required")
    for stale in (f'"{created["id"]}:7"', f'"{admin.id}:1"', "*"):
        response = await api.client.patch(path, json={"disabled": True}, headers=admin.headers(If_Match=stale))
        assert response.status_code == 412
        assert error_of(response)["details"] == {"current_etag": f'"{created["id"]}:1"'}
    listed = (await api.client.get("/v1/keys", headers=admin.headers())).json()["items"]
    assert [item["disabled"] for item in listed] == [False, False]


async def test_the_last_admin_key_cannot_be_taken_away(api: Any) -> None:
    """§4.2 (decision documented in docs/operations.md): disabling the workspace's last enabled admin key, or
    removing its `admin`, → 409 `conflict` reason `last_admin_key`; with a second admin key it is allowed, and a
    key that disabled itself authenticates no more (S-101)."""
    admin = await api.key()
    for body in ({"disabled": True}, {"permissions": ["read", "run"]}):
        response = await _patch(api, admin, admin.id, 1, **body)
        assert response.status_code == 409
        assert error_of(response)["details"] == {"reason": "last_admin_key", "kind": "key", "id": admin.id}
    second = (await _create(api, admin, permissions=["admin"])).json()
    assert (await _patch(api, admin, admin.id, 1, disabled=True)).status_code == 200
    assert (await api.client.get("/v1/keys", headers=admin.headers())).status_code == 401
    successor = Key(principal=admin.principal, secret=second["secret"])
    response = await _patch(api, successor, second["id"], 1, permissions=["read"])
    assert error_of(response)["details"]["reason"] == "last_admin_key"


async def test_keys_need_admin_and_stay_in_their_workspace(api: Any) -> None:
    """S-101: without `admin` every `/v1/keys` request → 403; S-126: a key id of another workspace → 404 like an
    unknown id, and never appears in the list."""
    admin = await api.key()
    runner = await api.key(admin.workspace_id, permissions=["read", "run"])
    for response in (
        await api.client.get("/v1/keys", headers=runner.headers()),
        await _create(api, runner),
        await _patch(api, runner, admin.id, 1, disabled=True),
    ):
        assert (response.status_code, error_of(response)["details"]) == (403, {"permission": "admin"})
    foreign = await api.key()
    answers = []
    for key_id in (foreign.id, "key_" + "0" * 32):
        response = await _patch(api, admin, key_id, 1, disabled=True)
        answers.append((response.status_code, error_of(response)["details"]["kind"]))
    assert answers == [(404, "key"), (404, "key")]
    listed = (await api.client.get("/v1/keys", headers=admin.headers())).json()["items"]
    assert foreign.id not in [item["id"] for item in listed]
    assert (await api.client.get("/v1/keys", headers=foreign.headers())).status_code == 200


async def test_bad_bodies_are_400_and_create_nothing(api: Any) -> None:
    """S-96: unknown fields, unknown permissions and blank names → 400 `invalid_argument` naming the field."""
    admin = await api.key()
    for body, field in (
        ({"name": "x", "permissions": ["read"], "secret": "mine"}, "secret"),
        ({"name": "x", "permissions": ["root"]}, "permissions.0"),
        ({"name": "", "permissions": ["read"]}, "name"),
        ({"permissions": ["read"]}, "name"),
    ):
        response = await api.client.post("/v1/keys", json=body, headers=admin.headers())
        assert response.status_code == 400
        assert field in [problem["field"] for problem in error_of(response)["details"]["fields"]]
    response = await _patch(api, admin, admin.id, 1, disabled="maybe")
    assert response.status_code == 400
    assert len((await api.client.get("/v1/keys", headers=admin.headers())).json()["items"]) == 1


async def test_archived_workspace_refuses_new_keys_but_can_disable_them(api: Any) -> None:
    """S-128: creating a key in an archived workspace → 422 `disabled`; disabling a key stays possible there;
    reads keep working."""
    admin = await api.key()
    created = (await _create(api, admin)).json()
    async with write_transaction(api.service.engine) as conn:
        await auth.archive_workspace(conn, admin.workspace_id)
    response = await _create(api, admin)
    assert (response.status_code, error_of(response)["code"]) == (422, "disabled")
    assert (await _patch(api, admin, created["id"], 1, disabled=True)).json()["disabled"] is True
    assert len((await api.client.get("/v1/keys", headers=admin.headers())).json()["items"]) == 2


async def test_create_with_an_idempotency_key_makes_one_key(api: Any) -> None:
    """§8.2, S-90, S-130 (issue 14): a retried create with the same `Idempotency-Key` and body answers 200 with the
    key the first request made and `secret: null` (only its hash exists); another body → 409
    `idempotency_key_reused`; another caller's same key makes its own key. Secret-bearing answers are `no-store`."""
    admin, other = await api.key(), await api.key()
    body = {"name": "deploy", "permissions": ["read"]}
    first = await api.client.post("/v1/keys", json=body, headers=admin.headers("retry-1"))
    again = await api.client.post("/v1/keys", json=body, headers=admin.headers("retry-1"))
    assert (first.status_code, again.status_code) == (201, 200)
    assert first.headers["cache-control"] == "no-store" and again.headers["cache-control"] == "no-store"
    assert first.json()["secret"].startswith("cnd_") and again.json()["secret"] is None
    assert again.json()["id"] == first.json()["id"]
    listed = (await api.client.get("/v1/keys", headers=admin.headers())).json()["items"]
    assert [item["name"] for item in listed].count("deploy") == 1
    changed = await api.client.post("/v1/keys", json=body | {"name": "other"}, headers=admin.headers("retry-1"))
    assert changed.status_code == 409 and error_of(changed)["details"]["reason"] == "idempotency_key_reused"
    theirs = await api.client.post("/v1/keys", json=body, headers=other.headers("retry-1"))
    assert theirs.status_code == 201 and theirs.json()["id"] != first.json()["id"]
    without = await api.client.post("/v1/keys", json=body, headers=admin.headers())
    assert without.status_code == 201 and without.json()["id"] != first.json()["id"]
