"""Hostile input never gets a 5xx and never writes half a request, on SQLite and PostgreSQL (issue 14).

Rules: S-96 (400 `invalid_argument` with field and reason, never 422), §8.1 (the error envelope; details never
repeat unbounded client values), §8.2 / S-93 (the `Idempotency-Key` header), S-73 (inbox limits). The property
tests post arbitrary JSON — strings with NUL and lone surrogates, hostile object keys, deep nesting, non-finite
and huge numbers — to every write route, with hostile path ids too, and check: no 5xx, and on a 4xx every table's
row count and version sum are unchanged.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import pytest
from cryptography.fernet import Fernet
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from candor.service.core import Service
from candor.service.http import create_app
from candor.service.http.edge import MAX_JSON_DEPTH, body_problems, header_problems, media_type_ok
from candor.service.http.errors import bounded
from candor.service.store.db.engine import read_transaction
from candor.service.store.schema.tables import metadata

from commands.helpers import make_service, seal_run
from http_support import TEXT, Key, client_for, create_thread, error_of, new_key, text

HUGE = "\u2063huge\u2063"
"""Stands for the literal `1e400` (a number JSON allows and a double cannot hold) in generated bodies."""
PENDING = {
    "approvals": [
        {"tool_call_id": "call_1", "tool_name": "refund", "arguments": {}, "kind": "approval", "metadata": {}}
    ],
    "calls": [],
}
HOSTILE_TEXT = st.sampled_from(["\x00", "\ud800", "\udfff", "a\x00b", "x" * 300, "", "\u2028", "é"]) | st.text(
    st.characters(codec=None, categories=None), max_size=8
)


def encode(value: Any) -> bytes:
    """JSON bytes as a client would send them; lone surrogates travel as `\\ud800` escapes."""
    return json.dumps(value, ensure_ascii=True, allow_nan=True).replace(json.dumps(HUGE), "1e400").encode("ascii")


def nested(depth: int) -> Any:
    value: Any = 1
    for level in range(depth):
        value = [value] if level % 2 else {"n": value}
    return value


scalars = st.none() | st.booleans() | st.integers() | st.integers(min_value=2**63) | st.floats() | HOSTILE_TEXT
scalars |= st.just(HUGE)
json_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(HOSTILE_TEXT, children, max_size=3),
    max_leaves=8,
) | st.integers(min_value=MAX_JSON_DEPTH - 2, max_value=300).map(nested)


@dataclass
class World:
    service: Service
    client: Any
    admin: Key
    thread_id: str
    entry_id: str
    run_id: str
    sub_id: str

    def valid_bodies(self) -> dict[tuple[str, str], dict[str, Any]]:
        """A valid body per write route: the property mutates one field of it."""
        return {
            ("POST", "/v1/threads"): {"agent": "demo", "input": TEXT, "options": {"a": 1}},
            ("POST", "/v1/threads/{thread}/inbox"): {"input": TEXT, "options": {"a": 1}},
            ("PATCH", "/v1/threads/{thread}/inbox/{entry}"): {"input": TEXT, "options": {"a": 1}},
            ("PUT", "/v1/threads/{thread}/inbox/order"): {"entry_ids": [self.entry_id]},
            ("POST", "/v1/runs/{run}/resume"): {
                "approvals": {"call_1": {"action": "deny", "reason": "no"}},
                "calls": {},
            },
            ("POST", "/v1/runs/{run}/fork"): {"input": TEXT, "options": {"a": 1}},
            ("POST", "/v1/keys"): {"name": "k", "permissions": ["read"]},
            ("PATCH", "/v1/keys/{key}"): {"permissions": ["read", "run", "admin"]},
            ("POST", "/v1/subscriptions"): {"name": "s", "url": "http://127.0.0.1:9/h", "events": ["run.accepted"]},
            ("PATCH", "/v1/subscriptions/{sub}"): {"name": "s2"},
            ("POST", "/v1/threads/{thread}/archive"): {},
            ("POST", "/v1/runs/{run}/interrupt"): {},
            ("DELETE", "/v1/threads/{thread}/inbox/{entry}"): {},
            ("DELETE", "/v1/subscriptions/{sub}"): {},
            ("POST", "/v1/subscriptions/{sub}/deliveries/{delivery}/redeliver"): {},
        }

    def path(self, template: str, hostile_id: str | None) -> str:
        ids = {
            "thread": self.thread_id,
            "entry": self.entry_id,
            "run": self.run_id,
            "key": self.admin.id,
            "sub": self.sub_id,
            "delivery": "dlv_" + "0" * 32,
        }
        if hostile_id is not None:
            ids = dict.fromkeys(ids, hostile_id)
        encoded = {name: quote(value.encode("utf-8", "surrogatepass"), safe="") for name, value in ids.items()}
        return template.format(**encoded)

    def etag_of(self, path: str) -> str:
        parts = path.split("/")
        return f'"{parts[3]}:1"' if len(parts) > 3 else '"x:1"'


SIGNING_KEYS = {"keys": [Fernet.generate_key().decode("ascii")]}
"""The service's webhook signing-key ring: subscriptions (a write route) need one."""


@pytest.fixture
async def world(db: Any) -> AsyncIterator[World]:
    service = make_service(db, control={"webhook_allow_insecure": True}, security=SIGNING_KEYS)
    async with client_for(create_app(service, role="all")) as client:
        admin = await new_key(service)
        created = (await create_thread(client, admin, idempotency_key="setup")).json()
        run_id = created["run"]["id"]
        await seal_run(service, run_id, "waiting", pending=PENDING)
        queued = await client.post(
            f"/v1/threads/{created['thread']['id']}/inbox",
            json={"input": text("later")},
            headers=admin.headers("setup-2"),
        )
        assert queued.status_code == 201, queued.text
        subscription = await client.post(
            "/v1/subscriptions",
            json={"name": "hooks", "url": "http://127.0.0.1:9/h", "events": ["run.accepted"]},
            headers=admin.headers(),
        )
        assert subscription.status_code == 201, subscription.text
        assert subscription.headers["cache-control"] == "no-store"  # it carries the signing secret
        yield World(
            service,
            client,
            admin,
            created["thread"]["id"],
            queued.json()["entry"]["id"],
            run_id,
            subscription.json()["id"],
        )


async def snapshot(service: Service) -> dict[str, tuple[int, int]]:
    """Every table's row count and version sum: a refused request must leave both as they were."""
    counts: dict[str, tuple[int, int]] = {}
    async with read_transaction(service.engine) as conn:
        for table in metadata.sorted_tables:
            versions = func.coalesce(func.sum(table.c.version), 0) if "version" in table.c else func.count()
            row = (await conn.execute(select(func.count(), versions).select_from(table))).one()
            counts[table.name] = (int(row[0]), int(row[1]))
    return counts


def mutated(body: dict[str, Any], mode: str, field: str, value: Any, hostile: str) -> Any:
    """`body` with one hostile change: where a valid request carries free text or free JSON, so the request gets
    past the shape checks to the commands and the database."""
    if mode == "option" and "options" in body:
        return body | {"options": {hostile: value}}
    if mode == "text" and "input" in body:
        return body | {"input": text(hostile)}
    if mode == "text" and "name" in body:
        return body | {"name": hostile}
    if mode == "text" and "approvals" in body:
        return {"approvals": {hostile: {"action": "deny", "reason": hostile}}, "calls": {}}
    if mode == "text" and "entry_ids" in body:
        return {"entry_ids": [hostile]}
    if mode == "whole":
        return value
    return body | {field: value}


@st.composite
def requests(draw: st.DrawFn) -> tuple[tuple[str, str], str, str, Any, str, str | None]:
    route = draw(st.sampled_from(ROUTES))
    mode = draw(st.sampled_from(["option", "option", "text", "text", "field", "whole"]))
    field = draw(
        st.sampled_from(
            [
                "input",
                "options",
                "name",
                "permissions",
                "entry_ids",
                "approvals",
                "calls",
                "url",
                "events",
                "agent",
                "\x00",
            ]
        )
    )
    value = draw(json_values)
    hostile = draw(HOSTILE_TEXT)
    hostile_id = draw(st.none() | st.none() | st.none() | HOSTILE_TEXT)
    return route, mode, field, value, hostile, hostile_id


ROUTES: list[tuple[str, str]] = [
    ("POST", "/v1/threads"),
    ("POST", "/v1/threads/{thread}/inbox"),
    ("PATCH", "/v1/threads/{thread}/inbox/{entry}"),
    ("PUT", "/v1/threads/{thread}/inbox/order"),
    ("POST", "/v1/runs/{run}/resume"),
    ("POST", "/v1/runs/{run}/fork"),
    ("POST", "/v1/keys"),
    ("PATCH", "/v1/keys/{key}"),
    ("POST", "/v1/subscriptions"),
    ("PATCH", "/v1/subscriptions/{sub}"),
    ("POST", "/v1/threads/{thread}/archive"),
    ("POST", "/v1/runs/{run}/interrupt"),
    ("DELETE", "/v1/threads/{thread}/inbox/{entry}"),
    ("DELETE", "/v1/subscriptions/{sub}"),
    ("POST", "/v1/subscriptions/{sub}/deliveries/{delivery}/redeliver"),
]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(request=requests())
async def test_no_write_route_answers_5xx_or_writes_half(world: World, request: Any) -> None:
    """S-96, §8.1, §8.2: any JSON to any write route, with hostile path ids: never 5xx; a 4xx changes nothing."""
    (method, template), mode, field, value, hostile, hostile_id = request
    body = mutated(world.valid_bodies()[(method, template)], mode, field, value, hostile)
    path = world.path(template, hostile_id)
    before = await snapshot(world.service)
    headers = world.admin.headers(f"prop-{id(request)}", If_Match=world.etag_of(path))
    headers["Content-Type"] = "application/json"
    response = await world.client.request(method, path, content=encode(body), headers=headers)
    assert response.status_code < 500, (method, path, response.text)
    if response.status_code >= 400:
        error_of(response)
        assert await snapshot(world.service) == before, (method, path, response.text)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(value=json_values)
async def test_hostile_options_are_refused_or_stored_exactly(world: World, value: Any) -> None:
    """§5.1, S-96: options either come back as sent (a 201) or are refused with a 4xx naming the field."""
    body = {"agent": "demo", "input": TEXT, "options": {"x": value}}
    response = await world.client.post(
        "/v1/threads", content=encode(body), headers=world.admin.headers("opt") | {"Content-Type": "application/json"}
    )
    assert response.status_code < 500, response.text


# --- examples of each class, with the exact answer ------------------------------------------------------------


async def post(world: World, path: str, body: bytes, **headers: str) -> Any:
    all_headers = world.admin.headers("ex") | {"Content-Type": "application/json"} | headers
    return await world.client.post(path, content=body, headers=all_headers)


@pytest.mark.parametrize(
    ("body", "field", "reason"),
    [
        (
            b'{"agent": "demo", "input": {"content": [{"type": "text", "text": "a\\u0000b"}]}}',
            "input.content.0.text",
            "invalid_character",
        ),
        (
            b'{"agent": "demo", "input": {"content": [{"type": "text", "text": "\\ud800"}]}}',
            "input.content.0.text",
            "invalid_character",
        ),
        (
            b'{"agent": "demo", "input": {"content": []}, "options": {"k\\u0000": 1}}',
            "options.k\ufffd",
            "invalid_character",
        ),
        (b'{"agent": "demo", "input": {}, "options": {"x": NaN}}', "options.x", "not_finite"),
        (b'{"agent": "demo", "input": {}, "options": {"x": 1e400}}', "options.x", "not_finite"),
        (b'{"agent": "demo", "input": {}, "options": {"x": -Infinity}}', "options.x", "not_finite"),
        (b'{"options": ' + b"[" * 300 + b"]" * 300 + b"}", "options." + ".".join(["0"] * 62), "too_deep"),
        (b"[" * 100_000 + b"]" * 100_000, "body", "too_deep"),
        (b'{"agent": ', "body", "unparsable"),
    ],
)
async def test_bad_json_is_400_with_field_and_reason(world: World, body: bytes, field: str, reason: str) -> None:
    """S-96: NUL and lone surrogates (keys too), non-finite numbers, nesting beyond 64, unparsable JSON → 400
    `invalid_argument` naming the field and a stable reason, on both databases; nothing is written."""
    before = await snapshot(world.service)
    response = await post(world, "/v1/threads", body)
    assert response.status_code == 400, response.text
    error = error_of(response)
    assert error["code"] == "invalid_argument"
    assert {"field": bounded(field), "reason": reason} in error["details"]["fields"]
    assert await snapshot(world.service) == before


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "application/xml", "application/json; charset=latin-1"],
)
async def test_non_json_media_type_is_415(world: World, content_type: str) -> None:
    """S-96 refined by issue 14: a body that is not declared JSON → 415 `unsupported_media_type`."""
    response = await post(
        world, "/v1/threads", json.dumps({"agent": "demo", "input": TEXT}).encode(), **{"Content-Type": content_type}
    )
    assert response.status_code == 415
    assert error_of(response)["code"] == "unsupported_media_type"


async def test_two_idempotency_keys_are_400(world: World) -> None:
    """§8.2, S-93: two `Idempotency-Key` headers are ambiguous → 400 `duplicated`, not silently the first."""
    headers = [
        ("Authorization", f"Bearer {world.admin.secret}"),
        ("Idempotency-Key", "a"),
        ("Idempotency-Key", "b"),
        ("Content-Type", "application/json"),
    ]
    body = json.dumps({"agent": "demo", "input": TEXT}).encode()
    response = await world.client.post("/v1/threads", content=body, headers=headers)
    assert response.status_code == 400
    assert error_of(response)["details"]["fields"] == [{"field": "Idempotency-Key", "reason": "duplicated"}]


@pytest.mark.parametrize("path", ["/v1/threads/thr_%00", "/v1/runs/a%00b/interrupt", "/v1/keys/%00"])
async def test_nul_in_path_ids_is_400(world: World, path: str) -> None:
    """S-96: a NUL in a path id → 400 `invalid_argument` (field `path`) on both databases, never a driver error."""
    response = await world.client.request("POST" if "interrupt" in path else "GET", path, headers=world.admin.headers())
    assert response.status_code == 400, response.text
    assert error_of(response)["details"]["fields"] == [{"field": "path", "reason": "invalid_character"}]


async def test_errors_never_echo_unbounded_ids(world: World) -> None:
    """§8.1: a 60 KB id in a 404, or 100 KB ids in an inbox order, come back cut to at most 128 characters
    (ending with `…`) and 128 items."""
    response = await world.client.get("/v1/threads/" + "x" * 60_000, headers=world.admin.headers())
    assert response.status_code == 404
    echoed = error_of(response)["details"]["id"]
    assert len(echoed) == 128 and echoed.endswith("…")
    assert len(response.content) < 1000
    order = {"entry_ids": ["y" * 100_000] + [f"ent_{i}" for i in range(1000)]}
    thread = (await world.client.get(f"/v1/threads/{world.thread_id}", headers=world.admin.headers())).json()
    headers = world.admin.headers(If_Match=f'"{world.thread_id}:{thread["version"]}"')
    response = await world.client.put(f"/v1/threads/{world.thread_id}/inbox/order", json=order, headers=headers)
    assert response.status_code == 400, response.text
    assert len(response.content) < 64 * 1024
    assert all(len(value) <= 128 for value in error_of(response)["details"]["unexpected"])


async def test_message_larger_than_the_inbox_is_413(db: Any) -> None:
    """S-73 refined by issues 14 and 34: one message larger than `control.inbox_bytes` can never fit → 413 (not 429
    forever), on a post, a thread create, a fork of a completed run and an edit; nothing is written."""
    service = make_service(db, control={"inbox_bytes": 70 * 1024}, worker={"output_bytes": 4096}, security=SIGNING_KEYS)
    async with client_for(create_app(service, role="all")) as client:
        key = await new_key(service)
        created = (await create_thread(client, key, idempotency_key="t")).json()
        thread, run = created["thread"]["id"], created["run"]["id"]
        await seal_run(service, run, "completed")
        before = await snapshot(service)
        big = {"input": text("x" * 80 * 1024)}
        routes = (
            ("/v1/threads", big | {"agent": "demo"}),
            (f"/v1/threads/{thread}/inbox", big),
            (f"/v1/runs/{run}/fork", big),
        )
        for path, body in routes:
            response = await client.post(path, json=body, headers=key.headers("big"))
            assert response.status_code == 413, response.text
            error = error_of(response)
            assert error["code"] == "payload_too_large" and error["details"]["bytes_limit"] == 70 * 1024
        assert await snapshot(service) == before
        fits = await client.post(f"/v1/runs/{run}/fork", json={"input": text("x" * 1024)}, headers=key.headers("ok"))
        assert fits.status_code == 201, fits.text  # the same run forks with a message that fits


def test_edge_decisions() -> None:
    """The pure checks behind the middleware (S-96)."""
    assert body_problems(b'{"a": [1, 2.5, "ok", {"b": null}]}') == []
    assert body_problems(b"\xff") and body_problems(b"\xff")[0].reason == "unparsable"
    assert [p.reason for p in body_problems(encode(nested(MAX_JSON_DEPTH)))] == []
    assert [p.reason for p in body_problems(encode(nested(MAX_JSON_DEPTH + 1)))] == ["too_deep"]
    assert header_problems([(b"If-Match", b"a"), (b"if-match", b"b"), (b"X", b"1"), (b"x", b"2")])[0].field == (
        "If-Match"
    )
    assert media_type_ok(None) and media_type_ok("application/json") and media_type_ok("application/merge-patch+json")
    assert not media_type_ok("text/json") and not media_type_ok("multipart/form-data")
