"""The run inspector's reads (issue 35 item 1, docs/http-api.md): `GET /v1/threads` with its filters and cursor,
`GET /v1/runs/{id}/answers` (who answered a waiting run, and when) and `GET /v1/runs/{id}/tools` (which tools are
declared retry-safe) — on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
from typing import Any

from candor.service.agents import AgentRegistry
from candor.service.core import Service
from candor.service.http import create_app
from candor.service.runtime import SystemEntropy
from candor.service.settings import ServiceSettings

from commands.helpers import seal_run
from http_support import TEXT, client_for, create_thread, error_of, new_key

ANSWERS = {
    "approvals": {"a1": {"action": "deny", "reason": "not today"}},
    "calls": {"c1": {"status": "returned", "value": 42}},
}


async def _threads(api: Any, key: Any, **query: Any) -> Any:
    response = await api.client.get("/v1/threads", params=query, headers=key.headers())
    assert response.status_code == 200, response.text
    return response.json()


def _ids(page: Any) -> list[str]:
    return [thread["id"] for thread in page["items"]]


async def test_threads_list_pages_newest_first_and_filters(api: Any) -> None:
    """S-98, S-126, §5.6: the workspace's threads newest first, paged by a cursor bound to the filters; `agent`,
    `state` (each derived state, the same as the ThreadView says), `id_prefix` and `origin_thread_id` filter; another
    workspace's threads are never listed."""
    key = await api.key()
    made = []
    for index, agent in enumerate(("demo", "demo", "other", "demo", "demo")):
        created = await create_thread(api.client, key, idempotency_key=f"t{index}", agent=agent)
        made.append(created.json())
    ids = [created["thread"]["id"] for created in made]
    runs = [created["run"]["id"] for created in made]
    stranger = await api.key(workspace_id=None)
    await create_thread(api.client, stranger, idempotency_key="x")

    first = await _threads(api, key, limit=2)
    assert _ids(first) == ids[::-1][:2] and first["next_cursor"]
    second = await _threads(api, key, limit=2, cursor=first["next_cursor"])
    third = await _threads(api, key, limit=2, cursor=second["next_cursor"])
    assert _ids(first) + _ids(second) + _ids(third) == ids[::-1] and third["next_cursor"] is None
    misused = await api.client.get(
        "/v1/threads", params={"agent": "demo", "cursor": first["next_cursor"]}, headers=key.headers()
    )
    assert misused.status_code == 400 and error_of(misused)["code"] == "invalid_cursor"

    assert _ids(await _threads(api, key, agent="other")) == [ids[2]]
    assert _ids(await _threads(api, key, id_prefix=ids[1])) == [ids[1]]
    assert _ids(await _threads(api, key, id_prefix="thr_%")) == []  # LIKE wildcards match literally
    assert _ids(await _threads(api, key, id_prefix="nothing")) == []

    # One thread per derived state: accepted (active), waiting, failed (paused), completed (idle), archived.
    await seal_run(api.service, runs[1], "waiting")
    await seal_run(api.service, runs[2], "failed")
    await seal_run(api.service, runs[3], "completed")
    etag = (await api.client.get(f"/v1/threads/{ids[4]}", headers=key.headers())).headers["etag"]
    archived = await api.client.post(f"/v1/threads/{ids[4]}/archive", headers=key.headers(If_Match=etag))
    assert archived.status_code == 200
    expected = {"active": ids[0], "waiting": ids[1], "paused": ids[2], "idle": ids[3], "archived": ids[4]}
    for state, thread_id in expected.items():
        page = await _threads(api, key, state=state)
        assert _ids(page) == [thread_id], state
        assert page["items"][0]["state"] == state
    both = await _threads(api, key, state="idle", agent="other")
    assert both["items"] == []

    forked = await api.client.post(f"/v1/runs/{runs[3]}/fork", json={"input": TEXT}, headers=key.headers("f"))
    assert forked.status_code == 201, forked.text
    children = await _threads(api, key, origin_thread_id=ids[3])
    assert _ids(children) == [forked.json()["thread"]["id"]]
    assert children["items"][0]["origin"] == "fork" and children["items"][0]["origin_run_id"] == runs[3]

    bad = await api.client.get("/v1/threads", params={"state": "sleeping"}, headers=key.headers())
    assert bad.status_code == 400 and error_of(bad)["code"] == "invalid_argument"
    reader = await api.key(workspace_id=key.workspace_id, permissions=("read",))
    assert len((await _threads(api, reader, limit=100))["items"]) == 6  # read permission suffices (§4.2)


async def test_state_filter_agrees_with_the_derived_state(api: Any) -> None:
    """§5.6, S-64, S-69, S-70, S-86: the SQL of the `state` filter and `protocol.thread_state` agree, over threads
    reaching each state every way the table allows: a running run (active), a waiting run, a waiting run whose
    successor runs (active) or completed (idle), failed or cancelled last runs (paused), a completed one (idle),
    archived while waiting and while idle (archived)."""
    key = await api.key()

    async def thread(name: str) -> tuple[str, str]:
        created = (await create_thread(api.client, key, idempotency_key=name)).json()
        return created["thread"]["id"], created["run"]["id"]

    async def resumed(name: str) -> str:
        _, run_id = await thread(name)
        await seal_run(api.service, run_id, "waiting")
        answered = await api.client.post(f"/v1/runs/{run_id}/resume", json=ANSWERS, headers=key.headers(name))
        assert answered.status_code == 201, answered.text
        return str(answered.json()["id"])

    async def archive(thread_id: str) -> None:
        etag = (await api.client.get(f"/v1/threads/{thread_id}", headers=key.headers())).headers["etag"]
        assert (
            await api.client.post(f"/v1/threads/{thread_id}/archive", headers=key.headers(If_Match=etag))
        ).is_success

    await thread("active")
    await seal_run(api.service, (await thread("waiting"))[1], "waiting")
    await resumed("successor-running")
    await seal_run(api.service, await resumed("successor-completed"), "completed")
    await seal_run(api.service, await resumed("successor-waiting"), "waiting")
    await seal_run(api.service, (await thread("failed"))[1], "failed")
    cancelled = (await thread("cancelled"))[1]
    assert (await api.client.post(f"/v1/runs/{cancelled}/interrupt", headers=key.headers())).is_success
    await seal_run(api.service, (await thread("completed"))[1], "completed")
    waiting_archived, run_id = await thread("archived-waiting")
    await seal_run(api.service, run_id, "waiting")
    await archive(waiting_archived)
    idle_archived, run_id = await thread("archived-idle")
    await seal_run(api.service, run_id, "completed")
    await archive(idle_archived)

    every = (await _threads(api, key, limit=100))["items"]
    derived = {thread["id"]: thread["state"] for thread in every}
    assert sorted(derived.values()) == sorted(
        ["active", "waiting", "active", "idle", "waiting", "paused", "paused", "idle", "archived", "archived"]
    )
    for state in ("archived", "active", "waiting", "paused", "idle"):
        listed = _ids(await _threads(api, key, state=state, limit=100))
        assert sorted(listed) == sorted(t for t, s in derived.items() if s == state), state


async def test_answers_name_the_key_and_the_time_of_a_resume(api: Any) -> None:
    """§8.6, S-80: a resume successor's answers as sent, the id of the key that sent them and when; the waiting run
    itself (started by its input, not a resume) answers 404 kind `answers`; another workspace's run 404 kind `run`."""
    key = await api.key()
    created = (await create_thread(api.client, key)).json()
    waiting = await seal_run(api.service, created["run"]["id"], "waiting")
    approver = await api.key(workspace_id=key.workspace_id, permissions=("read", "run"))
    resumed = await api.client.post(f"/v1/runs/{waiting.id}/resume", json=ANSWERS, headers=approver.headers("r"))
    assert resumed.status_code == 201, resumed.text
    successor = resumed.json()
    assert successor["principal_id"] == key.id  # the run acts for its waiting run's key (S-80) ...

    answers = await api.client.get(f"/v1/runs/{successor['id']}/answers", headers=key.headers())
    assert answers.status_code == 200, answers.text
    body = answers.json()
    assert body["answered_by"] == approver.id  # ... while the answers name the key that gave them
    assert body["run_id"] == successor["id"] and body["answered_run_id"] == waiting.id
    assert body["approvals"] == ANSWERS["approvals"] and body["calls"] == ANSWERS["calls"]
    assert body["input"] is None and body["answered_at"] == successor["created_at"]

    none = await api.client.get(f"/v1/runs/{waiting.id}/answers", headers=key.headers())
    assert none.status_code == 404 and error_of(none)["details"] == {"kind": "answers", "id": waiting.id}
    stranger = await api.key(workspace_id=None)
    hidden = await api.client.get(f"/v1/runs/{successor['id']}/answers", headers=stranger.headers())
    assert hidden.status_code == 404 and error_of(hidden)["details"]["kind"] == "run"


async def test_tools_say_which_are_retry_safe(db: Any, tmp_path: Any) -> None:
    """H-50–H-52, §8.8: the tools of the run's agent built with the run's options — a tool needing approval, a
    `recovery_retryable` one — and the run's client tools; `complete` is false (client tools only) when the factory
    cannot run here."""
    factories = {"e2e": "serve_agents:factory"}
    service = Service(
        settings=ServiceSettings(database={"url": db.url}, agents={"e2e": {"factory": factories["e2e"]}}),
        engine=db.engine,
        agents=AgentRegistry(factories),
        entropy=SystemEntropy(),
        wakeups=asyncio.Event(),
    )
    key = await new_key(service, None, ("read", "run"))
    weather = {"name": "get_weather", "description": "Local weather.", "parameters": {"type": "object"}}
    async with client_for(create_app(service, role="all")) as client:
        built = await create_thread(
            client, key, agent="e2e", idempotency_key="a", options={"workdir": str(tmp_path), "client_tools": [weather]}
        )
        tools = await client.get(f"/v1/runs/{built.json()['run']['id']}/tools", headers=key.headers())
        assert tools.status_code == 200, tools.text
        assert tools.json()["complete"] is True
        declared = {
            tool["name"]: (tool["kind"], tool["retry_safe"], tool["reconciler"]) for tool in tools.json()["items"]
        }
        assert declared == {
            "delete_file": ("approval", False, False),
            "slow_step": ("function", True, False),
            "get_weather": ("external", False, False),
        }
        # Without `workdir` the factory raises: only what the run itself says (its client tools) is listed.
        broken = await create_thread(client, key, agent="e2e", idempotency_key="b", options={"client_tools": [weather]})
        partial = (await client.get(f"/v1/runs/{broken.json()['run']['id']}/tools", headers=key.headers())).json()
        assert partial["complete"] is False and [tool["name"] for tool in partial["items"]] == ["get_weather"]
