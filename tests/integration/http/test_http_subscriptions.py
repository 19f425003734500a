"""`/v1/subscriptions` over HTTP (§8.3, §9.3, §9.4, §9.7): S-97, S-98, S-101, S-113, S-114, S-119, S-126, S-128.

Deliveries go through the real outbox loop (`deliver_outbox`) to a real HTTP receiver on 127.0.0.1.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from cryptography.fernet import Fernet
from sqlalchemy import select

from candor.service.core import Service
from candor.service.http import create_app
from candor.service.outbox.delivery import deliver_outbox
from candor.service.outbox.webhooks import verify_signature
from candor.service.signing_keys import KeyRing
from candor.service.store.db.engine import bind_key_ring, write_transaction
from candor.service.store.schema.tables import subscriptions
from candor.service.store.workspaces import auth as auth

from commands.helpers import make_service
from http_support import Key, client_for, create_thread, error_of, new_key
from outbox.support import KEY, KEY_RING, Receiver, outbox_row, outbox_rows

VIEW_FIELDS = {
    "id",
    "name",
    "url",
    "events",
    "filter",
    "enabled",
    "version",
    "created_by_id",
    "updated_by_id",
    "created_at",
    "updated_at",
}
DELIVERY_FIELDS = {
    "id",
    "subscription_id",
    "event_type",
    "status",
    "attempts",
    "available_at",
    "last_error",
    "created_at",
    "delivered_at",
    "settled_at",
}


@dataclass
class Hooks:
    service: Service
    client: httpx.AsyncClient
    admin: Key

    async def create(self, url: str, *, key: Key | None = None, **body: Any) -> httpx.Response:
        payload = {"name": "hooks", "url": url, "events": ["run.accepted"]} | body
        return await self.client.post("/v1/subscriptions", json=payload, headers=(key or self.admin).headers())

    async def write(self, method: str, path: str, version: int | None, **body: Any) -> httpx.Response:
        sub_id = path.split("/")[3]
        extra = {} if version is None else {"If_Match": f'"{sub_id}:{version}"'}
        return await self.client.request(method, path, json=body or None, headers=self.admin.headers(**extra))


def _replace_key_ring(service: Service, keys: list[str]) -> None:
    """As if the operator restarted the service with another `security.keys`."""
    service.key_ring = KeyRing.from_keys(keys)
    bind_key_ring(service.engine, service.key_ring)


async def _hooks(db: Any, *, insecure: bool = True, **sections: Any) -> AsyncIterator[Hooks]:
    sections = {"security": {"keys": [KEY]}} | sections
    service = make_service(db, control={"webhook_allow_insecure": insecure, "subscriptions": 3}, **sections)
    async with client_for(create_app(service, role="all")) as client:
        yield Hooks(service=service, client=client, admin=await new_key(service))


@pytest.fixture
async def hooks(db: Any) -> AsyncIterator[Hooks]:
    async for value in _hooks(db, outbox={"by_kind": {"webhook": {"max_attempts": 1}}}):
        yield value


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    server = await Receiver().start()
    yield server
    await server.stop()


async def test_create_shows_the_signing_secret_once(hooks: Hooks, receiver: Receiver) -> None:
    """§9.3, §8.3: 201 with the signing secret and an ETag; reads and lists never show it; it is stored encrypted
    with the key ring; the filter's null fields are dropped."""
    created = await hooks.create(
        receiver.url, events=["run.failed", "run.accepted"], filter={"agent": "demo", "thread_id": None}
    )
    assert created.status_code == 201
    body = created.json()
    assert set(body) == VIEW_FIELDS | {"signing_secret"}
    assert (body["events"], body["filter"], body["enabled"], body["version"]) == (
        ["run.failed", "run.accepted"],
        {"agent": "demo"},
        True,
        1,
    )
    assert body["created_by_id"] == body["updated_by_id"] == hooks.admin.id
    assert created.headers["etag"] == f'"{body["id"]}:1"'
    secret = body["signing_secret"]
    read = await hooks.client.get(f"/v1/subscriptions/{body['id']}", headers=hooks.admin.headers())
    assert read.headers["etag"] == f'"{body["id"]}:1"' and set(read.json()) == VIEW_FIELDS
    listed = await hooks.client.get("/v1/subscriptions", headers=hooks.admin.headers())
    assert [item["id"] for item in listed.json()["items"]] == [body["id"]]
    assert secret not in read.text + listed.text
    async with hooks.service.engine.connect() as conn:
        stored = (await conn.execute(select(subscriptions.c.signing_secret))).scalar_one()
    assert secret not in stored and KEY_RING.decrypt_secret(stored) == secret


async def test_without_a_key_ring_nothing_is_created(hooks: Hooks, receiver: Receiver) -> None:
    """§9.3: with `security.keys` empty, creation → 409 `conflict` reason `signing_secret_unavailable`; no row."""
    _replace_key_ring(hooks.service, [])
    response = await hooks.create(receiver.url)
    assert response.status_code == 409
    assert error_of(response)["details"] == {
        "reason": "signing_secret_unavailable",
        "kind": "key_ring",
        "id": "security.keys",
    }
    assert (await hooks.client.get("/v1/subscriptions", headers=hooks.admin.headers())).json()["items"] == []


async def test_invalid_subscriptions_are_refused(hooks: Hooks, receiver: Receiver) -> None:
    """S-96, §9.4: unknown fields or events, a refused target → 400 naming the field; a taken name → 409
    `already_exists`; beyond `control.subscriptions` → 409 `subscription_limit`; nothing is created by a refusal."""
    for body, field in (
        ({"secret": "mine"}, "secret"),
        ({"events": ["run.exploded"]}, "events.0"),
        ({"events": []}, "events"),
        ({"url": "ftp://example.com/hook"}, "url"),
        ({"filter": {"tenant": "x"}}, "filter.tenant"),
    ):
        response = await hooks.create(**{"url": receiver.url} | body)
        assert response.status_code == 400, body
        assert field in [problem["field"] for problem in error_of(response)["details"]["fields"]]
    assert (await hooks.create(receiver.url)).status_code == 201
    taken = await hooks.create(receiver.url)
    assert (taken.status_code, error_of(taken)["code"]) == (409, "already_exists")
    for number in range(2):
        assert (await hooks.create(receiver.url, name=f"more-{number}")).status_code == 201
    full = await hooks.create(receiver.url, name="one-too-many")
    assert error_of(full)["details"] == {
        "reason": "subscription_limit",
        "kind": "workspace",
        "id": hooks.admin.workspace_id,
    }
    assert len((await hooks.client.get("/v1/subscriptions", headers=hooks.admin.headers())).json()["items"]) == 3


async def test_http_targets_need_allow_insecure(db: Any) -> None:
    """§9.4: the outbound policy is checked at subscription write: `http://` → 400 field `url` reason
    `target_refused` unless `control.webhook_allow_insecure`, on creation and on edit."""
    async for hooks in _hooks(db, insecure=False):
        refused = await hooks.create("http://hooks.example.com/x")
        assert error_of(refused)["details"]["fields"] == [{"field": "url", "reason": "target_refused"}]
        created = (await hooks.create("https://hooks.example.com/x")).json()
        edit = await hooks.write("PATCH", f"/v1/subscriptions/{created['id']}", 1, url="http://hooks.example.com/x")
        assert (edit.status_code, error_of(edit)["details"]["fields"][0]["reason"]) == (400, "target_refused")


async def test_edit_and_delete_need_the_current_etag(hooks: Hooks, receiver: Receiver) -> None:
    """S-97: PATCH and DELETE without `If-Match` → 428, with a stale one → 412 `current_etag`; a PATCH changes only
    the fields given and increments the version (an empty one changes nothing); DELETE → 204, then 404."""
    created = (await hooks.create(receiver.url)).json()
    path = f"/v1/subscriptions/{created['id']}"
    for method in ("PATCH", "DELETE"):
        missing = await hooks.write(method, path, None, enabled=False)
        assert (missing.status_code, error_of(missing)["code"]) == (428, "precondition_required")
        stale = await hooks.write(method, path, 9, enabled=False)
        assert error_of(stale)["details"] == {"current_etag": f'"{created["id"]}:1"'}
    edited = await hooks.write("PATCH", path, 1, enabled=False, filter={"thread_id": "thr_x"})
    assert edited.status_code == 200 and edited.headers["etag"] == f'"{created["id"]}:2"'
    assert {key: edited.json()[key] for key in ("name", "url", "enabled", "filter", "version")} == {
        "name": "hooks",
        "url": receiver.url,
        "enabled": False,
        "filter": {"thread_id": "thr_x"},
        "version": 2,
    }
    null = await hooks.write("PATCH", path, 2, name=None)
    assert null.status_code == 400
    empty = await hooks.client.patch(path, json={}, headers=hooks.admin.headers(If_Match=f'"{created["id"]}:2"'))
    assert (empty.status_code, empty.json()["version"]) == (200, 2)  # nothing changed: same version
    assert (await hooks.write("DELETE", path, 2)).status_code == 204
    assert (await hooks.client.get(path, headers=hooks.admin.headers())).status_code == 404


async def test_edits_and_deletion_do_not_affect_staged_deliveries(hooks: Hooks) -> None:
    """S-119 through HTTP and the delivery loop: a row staged before an edit goes to the old URL, one staged after
    it to the new URL; after deletion nothing new is staged but staged rows are still delivered, signed with the
    secret shown at creation (S-113)."""
    old, new = await Receiver().start(), await Receiver().start()
    try:
        created = (await hooks.create(old.url)).json()
        path = f"/v1/subscriptions/{created['id']}"
        assert (await create_thread(hooks.client, hooks.admin, idempotency_key="t1")).status_code == 201
        assert (await hooks.write("PATCH", path, 1, url=new.url)).status_code == 200
        assert (await create_thread(hooks.client, hooks.admin, idempotency_key="t2")).status_code == 201
        assert (await hooks.write("DELETE", path, 2)).status_code == 204
        assert (await create_thread(hooks.client, hooks.admin, idempotency_key="t3")).status_code == 201
        staged = await outbox_rows(hooks.service.engine, kind="webhook")
        assert [row["target"] for row in staged] == [old.url, new.url]
        assert (await deliver_outbox(hooks.service))["webhook"] == 2
        for server, row in ((old, staged[0]), (new, staged[1])):
            (request,) = server.received
            assert request.headers["Candor-Delivery-Id"] == row["id"]
            assert verify_signature(created["signing_secret"], request.headers, request.body)
        assert {(await outbox_row(hooks.service.engine, row["id"]))["status"] for row in staged} == {"delivered"}
    finally:
        await old.stop()
        await new.stop()


async def _dead_delivery(hooks: Hooks, receiver: Receiver) -> tuple[str, str]:
    """A subscription and one delivery of it that failed its only attempt (`max_attempts = 1`)."""
    sub_id = (await hooks.create(receiver.url)).json()["id"]
    await create_thread(hooks.client, hooks.admin)
    receiver.script.append(500)
    await deliver_outbox(hooks.service)
    (row,) = await outbox_rows(hooks.service.engine, kind="webhook")
    assert row["status"] == "dead"
    return sub_id, row["id"]


async def test_redeliver_posts_a_dead_delivery_again(
    hooks: Hooks, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    """§9.7, S-114: the deliveries list shows the dead row (no secret); redeliver → `pending`, `attempts = 0`,
    `settled_at` null, same id; the loop POSTs it again with the same `Candor-Delivery-Id`; redelivering a row
    that is not dead → 409 `not_dead`. The redelivery is audited in the log with the principal id."""
    sub_id, delivery_id = await _dead_delivery(hooks, receiver)
    base = f"/v1/subscriptions/{sub_id}/deliveries"
    listed = await hooks.client.get(base, headers=hooks.admin.headers())
    (item,) = listed.json()["items"]
    assert set(item) == DELIVERY_FIELDS and listed.json()["next_cursor"] is None
    assert {name: item[name] for name in ("id", "event_type", "status", "attempts")} == {
        "id": delivery_id,
        "event_type": "run.accepted",
        "status": "dead",
        "attempts": 1,
    }
    assert item["last_error"] == "http_status: 500" and item["settled_at"] is not None
    assert "secret" not in listed.text
    with caplog.at_level(logging.INFO, logger="candor.admin"):
        response = await hooks.client.post(f"{base}/{delivery_id}/redeliver", headers=hooks.admin.headers())
    assert response.status_code == 200
    assert {key: response.json()[key] for key in ("id", "status", "attempts", "settled_at", "delivered_at")} == {
        "id": delivery_id,
        "status": "pending",
        "attempts": 0,
        "settled_at": None,
        "delivered_at": None,
    }
    (record,) = [record for record in caplog.records if record.getMessage() == "Outbox redelivered"]
    logged = vars(record)  # the `extra` fields
    assert (logged["delivery_id"], logged["subscription_id"], logged["principal_id"]) == (
        delivery_id,
        sub_id,
        hooks.admin.id,
    )
    again = await hooks.client.post(f"{base}/{delivery_id}/redeliver", headers=hooks.admin.headers())
    assert error_of(again)["details"] == {"reason": "not_dead", "kind": "delivery", "id": delivery_id}
    assert (await deliver_outbox(hooks.service))["webhook"] == 1
    assert [request.headers["Candor-Delivery-Id"] for request in receiver.received] == [delivery_id, delivery_id]
    assert receiver.received[0].body == receiver.received[1].body
    final = (await hooks.client.get(base, headers=hooks.admin.headers())).json()["items"][0]
    assert (final["status"], final["attempts"]) == ("delivered", 1)


async def test_redeliver_needs_a_readable_secret(hooks: Hooks, receiver: Receiver) -> None:
    """§9.7: a dead delivery whose secret the key ring can no longer decrypt → 409 `signing_secret_unavailable`;
    the row stays dead."""
    sub_id, delivery_id = await _dead_delivery(hooks, receiver)
    _replace_key_ring(hooks.service, [Fernet.generate_key().decode("ascii")])
    path = f"/v1/subscriptions/{sub_id}/deliveries/{delivery_id}/redeliver"
    response = await hooks.client.post(path, headers=hooks.admin.headers())
    assert (response.status_code, error_of(response)["details"]["reason"]) == (409, "signing_secret_unavailable")
    assert (await outbox_row(hooks.service.engine, delivery_id))["status"] == "dead"


async def test_redeliver_whose_row_is_gone_when_read_again_is_internal(
    hooks: Hooks, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S-114: the answer is the row as the redelivery left it; a row gone on the second read is a store defect →
    500 `internal`, and the transaction is rolled back (the delivery stays dead)."""
    from candor.service.store import outbox as outbox_store

    sub_id, delivery_id = await _dead_delivery(hooks, receiver)
    reads: list[str] = []
    get_delivery = outbox_store.get_delivery

    async def gone_when_read_again(conn: Any, **scope: Any) -> Any:
        reads.append(scope["delivery_id"])
        return await get_delivery(conn, **scope) if len(reads) == 1 else None

    monkeypatch.setattr(outbox_store, "get_delivery", gone_when_read_again)
    path = f"/v1/subscriptions/{sub_id}/deliveries/{delivery_id}/redeliver"
    response = await hooks.client.post(path, headers=hooks.admin.headers())
    assert (response.status_code, error_of(response)["code"]) == (500, "internal")
    assert reads == [delivery_id, delivery_id]
    assert (await outbox_row(hooks.service.engine, delivery_id))["status"] == "dead"


async def test_deliveries_are_paged_newest_first(hooks: Hooks, receiver: Receiver) -> None:
    """S-98: deliveries newest first, `limit` and `next_cursor`; a cursor of another subscription → 400."""
    sub_id = (await hooks.create(receiver.url)).json()["id"]
    other_id = (await hooks.create(receiver.url, name="other")).json()["id"]
    for number in range(3):
        await create_thread(hooks.client, hooks.admin, idempotency_key=f"t{number}")
    rows = [row for row in await outbox_rows(hooks.service.engine, kind="webhook") if row["subscription_id"] == sub_id]
    seen, cursor = [], None
    while True:
        params = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        page = (
            await hooks.client.get(
                f"/v1/subscriptions/{sub_id}/deliveries", params=params, headers=hooks.admin.headers()
            )
        ).json()
        seen += [item["id"] for item in page["items"]]
        if (cursor := page["next_cursor"]) is None:
            break
    expected = sorted(rows, key=lambda row: (row["created_at"], row["id"]), reverse=True)
    assert seen == [row["id"] for row in expected]
    first = (
        await hooks.client.get(
            f"/v1/subscriptions/{sub_id}/deliveries", params={"limit": 1}, headers=hooks.admin.headers()
        )
    ).json()["next_cursor"]
    response = await hooks.client.get(
        f"/v1/subscriptions/{other_id}/deliveries", params={"cursor": first}, headers=hooks.admin.headers()
    )
    assert (response.status_code, error_of(response)["code"]) == (400, "invalid_cursor")


async def test_other_workspaces_look_unknown(hooks: Hooks, receiver: Receiver) -> None:
    """S-126: a subscription or delivery id of another workspace → 404 exactly like an unknown id, on every route;
    it never appears in a list. A delivery of another subscription of the same workspace is not found either."""
    sub_id, delivery_id = await _dead_delivery(hooks, receiver)
    mine = await new_key(hooks.service)
    mine_sub = (await hooks.create(receiver.url, key=mine)).json()["id"]
    requests = [
        ("GET", "/v1/subscriptions/{s}"),
        ("PATCH", "/v1/subscriptions/{s}"),
        ("DELETE", "/v1/subscriptions/{s}"),
        ("GET", "/v1/subscriptions/{s}/deliveries"),
        ("POST", "/v1/subscriptions/{s}/deliveries/{d}/redeliver"),
    ]
    for method, template in requests:
        answers = []
        for sub, delivery in ((sub_id, delivery_id), ("sub_" + "0" * 32, "obx_" + "0" * 32)):
            headers = mine.headers(If_Match=f'"{sub}:1"')
            response = await hooks.client.request(
                method,
                template.format(s=sub, d=delivery),
                headers=headers,
                json={"enabled": False} if method == "PATCH" else None,
            )
            error = error_of(response)
            answers.append((response.status_code, error["code"], error["details"]["kind"]))
        assert answers[0] == answers[1] == (404, "not_found", "subscription"), template
    cross = await hooks.client.post(
        f"/v1/subscriptions/{mine_sub}/deliveries/{delivery_id}/redeliver", headers=mine.headers()
    )
    assert (cross.status_code, error_of(cross)["details"]) == (404, {"kind": "delivery", "id": delivery_id})
    listed = await hooks.client.get("/v1/subscriptions", headers=mine.headers())
    assert [item["id"] for item in listed.json()["items"]] == [mine_sub]
    assert (await outbox_row(hooks.service.engine, delivery_id))["status"] == "dead"


async def test_subscriptions_need_admin(hooks: Hooks, receiver: Receiver) -> None:
    """S-101: `read` and `run` keys get 403 `forbidden` (`permission: admin`) on every subscription route."""
    sub_id = (await hooks.create(receiver.url)).json()["id"]
    runner = await new_key(hooks.service, hooks.admin.workspace_id, ["read", "run"])
    for method, path in (
        ("GET", "/v1/subscriptions"),
        ("POST", "/v1/subscriptions"),
        ("GET", f"/v1/subscriptions/{sub_id}"),
        ("DELETE", f"/v1/subscriptions/{sub_id}"),
        ("GET", f"/v1/subscriptions/{sub_id}/deliveries"),
        ("POST", f"/v1/subscriptions/{sub_id}/deliveries/obx_{'0' * 32}/redeliver"),
    ):
        response = await hooks.client.request(method, path, headers=runner.headers(If_Match=f'"{sub_id}:1"'))
        assert (response.status_code, error_of(response)["details"]) == (403, {"permission": "admin"}), path


async def test_archived_workspace_refuses_subscription_writes(hooks: Hooks, receiver: Receiver) -> None:
    """S-128: in an archived workspace creating, editing and redelivering → 422 `disabled`; reads and deletion
    keep working."""
    sub_id, delivery_id = await _dead_delivery(hooks, receiver)
    async with write_transaction(hooks.service.engine) as conn:
        await auth.archive_workspace(conn, hooks.admin.workspace_id)
    path = f"/v1/subscriptions/{sub_id}"
    for response in (
        await hooks.create(receiver.url, name="late"),
        await hooks.write("PATCH", path, 1, enabled=False),
        await hooks.client.post(f"{path}/deliveries/{delivery_id}/redeliver", headers=hooks.admin.headers()),
    ):
        assert (response.status_code, error_of(response)["code"]) == (422, "disabled")
    assert (await hooks.client.get(f"{path}/deliveries", headers=hooks.admin.headers())).status_code == 200
    assert (await hooks.write("DELETE", path, 1)).status_code == 204
