"""Runs over HTTP (§7.12, §8.3, §8.6): reads, messages, interrupt, fork and the strict resume — S-77–S-84, S-98."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from pydantic_ai import ModelMessagesTypeAdapter
from pydantic_ai.messages import ModelRequest, ModelResponse, TextPart, UserPromptPart

from candor.service.store.schema.tables import runs

from commands.helpers import claim_run, commit_history, count, pending_of, run_row, seal_run
from http_support import TEXT, create_thread, error_of, text

_T = datetime(2025, 1, 1, tzinfo=UTC)
ANSWERS: dict[str, Any] = {
    "approvals": {"a1": {"action": "approve"}},
    "calls": {"c1": {"status": "returned", "value": 42}},
}


async def _waiting(api: Any, key: Any, name: str = "k", **pending: Any) -> Any:
    """A thread whose only run is sealed `waiting` (pending approval `a1` and call `c1` unless told otherwise)."""
    created = (await create_thread(api.client, key, idempotency_key=name)).json()
    return await seal_run(api.service, created["run"]["id"], "waiting", pending=pending_of(**pending))


async def _resume(api: Any, key: Any, run_id: str, body: Any, idempotency_key: str = "r") -> Any:
    return await api.client.post(f"/v1/runs/{run_id}/resume", json=body, headers=key.headers(idempotency_key))


async def test_read_run_and_attempts(api: Any) -> None:
    """§8.4: RunView with its ETag (naming the key the run acts for, §4.3); the attempts list in number order,
    unpaged."""
    key = await api.key()
    created = (await create_thread(api.client, key)).json()
    run_id = created["run"]["id"]
    assert created["run"]["principal_id"] == key.id
    read = await api.client.get(f"/v1/runs/{run_id}", headers=key.headers())
    assert read.status_code == 200 and read.json() == created["run"] | {"recovery": []}
    assert read.headers["etag"] == f'"{run_id}:{created["run"]["version"]}"'
    empty = (await api.client.get(f"/v1/runs/{run_id}/attempts", headers=key.headers())).json()
    assert empty == {"items": [], "next_cursor": None}
    attempt_id = await claim_run(api.service, run_id)
    attempts = (await api.client.get(f"/v1/runs/{run_id}/attempts", headers=key.headers())).json()["items"]
    assert [a["id"] for a in attempts] == [attempt_id]
    assert set(attempts[0]) == {
        "id",
        "run_id",
        "number",
        "status",
        "start_reason",
        "replaces_attempt_id",
        "worker_id",
        "lease_expires_at",
        "yield_reason",
        "failure",
        "created_at",
        "started_at",
        "finished_at",
    }
    assert (attempts[0]["number"], attempts[0]["status"], attempts[0]["start_reason"]) == (1, "leased", "initial")
    running = (await api.client.get(f"/v1/runs/{run_id}", headers=key.headers())).json()
    assert (running["status"], running["current_attempt_id"], running["attempts"]) == ("running", attempt_id, 1)


async def test_interrupt(api: Any) -> None:
    """§7.12, S-58, S-59: accepted → cancelled at once (200); again → 200 unchanged; completed → 409 `run_completed`."""
    key = await api.key()
    created = (await create_thread(api.client, key)).json()
    run_id = created["run"]["id"]
    first = await api.client.post(f"/v1/runs/{run_id}/interrupt", headers=key.headers())
    assert first.status_code == 200 and first.json()["status"] == "cancelled"
    assert first.json()["failure"]["code"] == "cancelled"
    again = await api.client.post(f"/v1/runs/{run_id}/interrupt", headers=key.headers())
    assert again.status_code == 200 and again.json() == first.json()
    other = (await create_thread(api.client, key, idempotency_key="k2")).json()["run"]["id"]
    await seal_run(api.service, other, "completed")
    refused = await api.client.post(f"/v1/runs/{other}/interrupt", headers=key.headers())
    assert refused.status_code == 409
    assert error_of(refused)["details"] == {"reason": "run_completed", "kind": "run", "id": other}


async def test_fork(api: Any) -> None:
    """§8.3: fork of a sealed run → 201 `{thread, entry, run}` (origin `fork`, lineage `fork`); a replay → 200; an
    unsealed origin → 409 `run_accepted`."""
    key = await api.key()
    created = (await create_thread(api.client, key)).json()
    origin = created["run"]["id"]
    unsealed = await api.client.post(f"/v1/runs/{origin}/fork", json={"input": TEXT}, headers=key.headers("f0"))
    assert unsealed.status_code == 409 and error_of(unsealed)["details"]["reason"] == "run_accepted"
    await seal_run(api.service, origin, "completed")
    forked = await api.client.post(f"/v1/runs/{origin}/fork", json={"input": text("branch")}, headers=key.headers("f"))
    assert forked.status_code == 201
    body = forked.json()
    assert (body["thread"]["origin"], body["thread"]["origin_run_id"]) == ("fork", origin)
    assert body["thread"]["origin_thread_id"] == created["thread"]["id"]
    assert (body["run"]["lineage"], body["run"]["parent_run_id"], body["run"]["trigger"]) == ("fork", origin, "input")
    replay = await api.client.post(f"/v1/runs/{origin}/fork", json={"input": text("branch")}, headers=key.headers("f"))
    assert replay.status_code == 200 and replay.json()["thread"]["id"] == body["thread"]["id"]


async def test_resume_creates_the_successor(api: Any) -> None:
    """S-80: 201 with the successor (trigger `resume`, lineage `continue`, parent = the waiting run, same agent,
    options, principal and authority, `resumed_by_id` = caller, the body stored as `resume`)."""
    owner = await api.key()
    helper = await api.key(owner.workspace_id, permissions=["read", "run"])
    waiting = await _waiting(api, owner)
    body = ANSWERS | {"input": text("go on")}
    response = await _resume(api, helper, waiting.id, body)
    assert response.status_code == 201
    view = response.json()
    assert (view["status"], view["trigger"], view["lineage"]) == ("accepted", "resume", "continue")
    assert view["parent_run_id"] == waiting.id and view["agent"] == waiting.agent
    assert view["principal_id"] == owner.id  # the key the run acts for, not the one that answered
    assert response.headers["etag"] == f'"{view["id"]}:{view["version"]}"'
    stored = await run_row(api.service, view["id"])
    assert (stored.options, stored.principal_id, stored.authority) == (
        waiting.options,
        waiting.principal_id,
        waiting.authority,
    )
    assert stored.resumed_by_id == helper.id and stored.resume == body
    assert (await run_row(api.service, waiting.id)).status == "waiting"
    thread = (await api.client.get(f"/v1/threads/{waiting.thread_id}", headers=owner.headers())).json()
    assert thread["state"] == "active" and thread["current_run_id"] == view["id"]


async def test_resume_of_a_run_that_is_not_the_last_waiting_one(api: Any) -> None:
    """S-77: a run that is not waiting (or not the thread's last) → 409 `not_idle_waiting_run`."""
    key = await api.key()
    created = (await create_thread(api.client, key)).json()
    run_id = created["run"]["id"]
    response = await _resume(api, key, run_id, ANSWERS)
    assert response.status_code == 409
    assert error_of(response)["details"] == {"reason": "not_idle_waiting_run", "kind": "run", "id": run_id}
    waiting = await _waiting(api, key, "k2")
    assert (await _resume(api, key, waiting.id, ANSWERS, "first")).status_code == 201
    second = await _resume(api, key, waiting.id, ANSWERS, "second")
    assert second.status_code == 409 and error_of(second)["details"]["reason"] == "not_idle_waiting_run"


async def test_resume_coverage_mismatch(api: Any) -> None:
    """S-78, S-85: missing or unexpected ids → 400 `pending_coverage_mismatch` listing every differing id across
    approvals and calls in one error; nothing changes."""
    key = await api.key()
    waiting = await _waiting(api, key)
    cases: list[tuple[dict[str, Any], dict[str, Any]]] = [
        ({"approvals": {}, "calls": ANSWERS["calls"]}, {"field": "approvals", "missing": ["a1"], "unexpected": []}),
        (
            ANSWERS | {"calls": {"c1": ANSWERS["calls"]["c1"], "zz": {"status": "failed", "message": "no"}}},
            {"field": "calls", "missing": [], "unexpected": ["zz"]},
        ),
        (
            {"approvals": {"a2": {"action": "deny"}}, "calls": {}},
            {"field": "body", "missing": ["a1", "c1"], "unexpected": ["a2"], "misplaced": []},
        ),
        (
            {"approvals": {"c1": {"action": "approve"}}, "calls": {"a1": {"status": "returned", "value": 1}}},
            {
                "field": "body",
                "missing": ["a1", "c1"],
                "unexpected": ["a1", "c1"],
                "misplaced": ["a1", "c1"],
                "by_field": {
                    "approvals": {"missing": ["a1"], "unexpected": ["c1"]},
                    "calls": {"missing": ["c1"], "unexpected": ["a1"]},
                },
            },
        ),
    ]
    for number, (body, expected) in enumerate(cases):
        response = await _resume(api, key, waiting.id, body, f"r{number}")
        assert response.status_code == 400
        error = error_of(response)
        assert error["code"] == "invalid_argument"
        details = error["details"]
        assert {name: details[name] for name in expected} == expected
        assert details["reason"] == "pending_coverage_mismatch"
    assert await count(api.service, runs) == 1
    assert (await run_row(api.service, waiting.id)) == waiting
    thread = (await api.client.get(f"/v1/threads/{waiting.thread_id}", headers=key.headers())).json()
    assert thread["state"] == "waiting"


async def test_resume_shape_limits(api: Any) -> None:
    """S-79: an id in both maps, more than 128 results, or a body over 256 KiB → 400; missing maps → 400."""
    key = await api.key()
    waiting = await _waiting(api, key)
    many = {f"c{i}": {"status": "returned", "value": i} for i in range(129)}
    huge = ANSWERS | {"calls": {"c1": {"status": "returned", "value": "x" * (256 * 1024)}}}
    cases: list[tuple[dict[str, Any], dict[str, Any] | None]] = [
        (
            ANSWERS | {"calls": {"a1": {"status": "returned", "value": 1}}},
            {"field": "calls", "reason": "id_also_in_approvals"},
        ),
        ({"approvals": {}, "calls": many}, {"field": "body", "reason": "too_many_results"}),
        (huge, {"field": "body", "reason": "too_large"}),
        ({"calls": ANSWERS["calls"]}, {"field": "approvals", "reason": "required"}),
        ({"approvals": {"a1": {"action": "maybe"}}, "calls": {}}, None),
        (ANSWERS | {"extra": True}, {"field": "extra", "reason": "unknown_field"}),
    ]
    for number, (body, field) in enumerate(cases):
        response = await _resume(api, key, waiting.id, body, f"r{number}")
        assert response.status_code == 400, body.keys()
        fields = error_of(response)["details"]["fields"]
        assert field is None or field in fields, fields
    assert await count(api.service, runs) == 1


async def test_resume_replay(api: Any) -> None:
    """S-81: the same key and body → 200 with the original successor, also once that successor has been sealed."""
    key = await api.key()
    waiting = await _waiting(api, key)
    first = await _resume(api, key, waiting.id, ANSWERS)
    assert first.status_code == 201
    await seal_run(api.service, first.json()["id"], "completed")
    again = await _resume(api, key, waiting.id, dict(ANSWERS))
    assert again.status_code == 200
    assert again.json()["id"] == first.json()["id"] and again.json()["status"] == "completed"
    # An explicit `"input": null` is the same request as no input at all.
    assert (await _resume(api, key, waiting.id, ANSWERS | {"input": None})).status_code == 200


async def test_resume_key_reuse(api: Any) -> None:
    """S-82: a resume key reused for another body or another run → 409 `idempotency_key_reused`."""
    key = await api.key()
    waiting = await _waiting(api, key)
    assert (await _resume(api, key, waiting.id, ANSWERS)).status_code == 201
    other_body = ANSWERS | {"approvals": {"a1": {"action": "deny", "reason": "no"}}}
    other_run = await _waiting(api, key, "k2")
    for run_id, body in ((waiting.id, other_body), (other_run.id, ANSWERS)):
        response = await _resume(api, key, run_id, body)
        assert response.status_code == 409
        assert error_of(response)["details"]["reason"] == "idempotency_key_reused"


async def test_racing_identical_resumes(api: Any) -> None:
    """S-83: two identical resumes racing over HTTP → one successor; one caller gets 201 and the other 200."""
    key = await api.key()
    waiting = await _waiting(api, key)
    responses = await asyncio.gather(*(_resume(api, key, waiting.id, ANSWERS) for _ in range(2)))
    assert sorted(r.status_code for r in responses) == [200, 201]
    assert len({r.json()["id"] for r in responses}) == 1
    assert await count(api.service, runs, runs.c.parent_run_id == waiting.id) == 1


async def test_resume_on_an_archived_thread(api: Any) -> None:
    """S-84: a resume on an archived thread → 409 `archived`."""
    key = await api.key()
    waiting = await _waiting(api, key)
    thread_path = f"/v1/threads/{waiting.thread_id}"
    etag = (await api.client.get(thread_path, headers=key.headers())).headers["etag"]
    assert (await api.client.post(f"{thread_path}/archive", headers=key.headers(If_Match=etag))).status_code == 200
    response = await _resume(api, key, waiting.id, ANSWERS)
    assert response.status_code == 409
    assert error_of(response)["details"] == {"reason": "archived", "kind": "thread", "id": waiting.thread_id}
    assert (await run_row(api.service, waiting.id)).status == "waiting"


async def test_waiting_run_view_shows_pending(api: Any) -> None:
    """§5.7, §8.4: a waiting run's view has `wait_reason` and the pending items (id, tool name, arguments)."""
    key = await api.key()
    waiting = await _waiting(api, key, approvals=(), calls=("c1", "c2"))
    view = (await api.client.get(f"/v1/runs/{waiting.id}", headers=key.headers())).json()
    assert view["status"] == "waiting" and view["wait_reason"] == "call"
    assert view["pending"]["approvals"] == []
    assert [(c["tool_call_id"], c["tool_name"], c["arguments"]) for c in view["pending"]["calls"]] == [
        ("c1", "lookup", {"q": "x"}),
        ("c2", "lookup", {"q": "x"}),
    ]


async def test_run_messages_are_paged_by_index(api: Any) -> None:
    """§8.3, S-98: `GET /v1/runs/{id}/messages` answers the messages the run added (pydantic-ai JSON), rebuilt from
    its latest checkpoint, in pages whose cursor is bound to the run; the last page has no cursor. Each message's
    `run_id` is candor's run id, not pydantic-ai's internal one (issue 14)."""
    key = await api.key()
    imported = [ModelRequest(parts=[UserPromptPart(content="imported", timestamp=_T)])]
    created = (await create_thread(api.client, key, message_history=_as_json(imported))).json()
    run_id = created["run"]["id"]
    path = f"/v1/runs/{run_id}/messages"
    empty = await api.client.get(path, headers=key.headers())
    assert empty.status_code == 200 and empty.json() == {"items": [], "next_cursor": None}
    await claim_run(api.service, run_id)
    added = [
        ModelResponse(parts=[TextPart(content=f"answer {n}")], timestamp=_T, run_id="pydantic-ai-internal")
        for n in range(3)
    ]
    run = await run_row(api.service, run_id)
    assert run.start_checkpoint_id is not None
    await commit_history(api.service, run, [*imported, *added], base=(run.start_checkpoint_id, imported), seq=1)
    first = (await api.client.get(f"{path}?limit=2", headers=key.headers())).json()
    rest = (await api.client.get(f"{path}?limit=2&cursor={first['next_cursor']}", headers=key.headers())).json()
    assert {item["run_id"] for item in first["items"] + rest["items"]} == {run_id}
    ours = [replace(message, run_id=run_id) for message in added]
    assert ModelMessagesTypeAdapter.validate_python(first["items"]) == ours[:2] and first["next_cursor"]
    assert ModelMessagesTypeAdapter.validate_python(rest["items"]) == ours[2:] and rest["next_cursor"] is None
    other = (await create_thread(api.client, key, idempotency_key="other")).json()["run"]["id"]
    misused = await api.client.get(f"/v1/runs/{other}/messages?cursor={first['next_cursor']}", headers=key.headers())
    assert misused.status_code == 400 and error_of(misused)["code"] == "invalid_cursor"
    stranger = await api.key()
    hidden = await api.client.get(path, headers=stranger.headers())
    assert hidden.status_code == 404 and error_of(hidden)["details"] == {"kind": "run", "id": run_id}


def _as_json(messages: Any) -> Any:
    return ModelMessagesTypeAdapter.dump_python(messages, mode="json")
