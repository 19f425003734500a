"""Client tools over HTTP (§8.8), the schema side: S-133 — malformed `options.client_tools` → 400 naming the field;
well-formed ones reach the run's frozen options exactly as sent."""

from __future__ import annotations

from typing import Any

import pytest

from candor.service.agents import AgentRegistry
from candor.service.store.schema.tables import runs, threads

from commands.helpers import count, run_row
from http_support import TEXT, create_thread, error_of

WEATHER = {
    "name": "get_weather",
    "description": "Local weather.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}


async def test_client_tools_reach_the_run_options(api: Any) -> None:
    """§8.8: `options.client_tools` is part of the run's frozen options, next to the agent's own option keys."""
    key = await api.key()
    options = {"client_tools": [WEATHER, {"name": "no_args", "parameters": {}}], "tone": "brief"}
    response = await create_thread(api.client, key, options=options)
    assert response.status_code == 201
    assert (await run_row(api.service, response.json()["run"]["id"])).options == options


@pytest.mark.parametrize(
    ("tools", "field", "reason"),
    [
        ([WEATHER | {"name": "1bad"}], "options.client_tools.0.name", "string_pattern_mismatch"),
        ([WEATHER | {"name": "x" * 65}], "options.client_tools.0.name", "string_pattern_mismatch"),
        ([WEATHER | {"name": "has space"}], "options.client_tools.0.name", "string_pattern_mismatch"),
        ([WEATHER | {"parameters": "object"}], "options.client_tools.0.parameters", "dict_type"),
        ([WEATHER | {"surprise": 1}], "options.client_tools.0.surprise", "unknown_field"),
        ([{"description": "no name"}], "options.client_tools.0.name", "required"),
        ([WEATHER | {"name": f"t{i}"} for i in range(65)], "options.client_tools", "too_long"),
        ("get_weather", "options.client_tools", "list_type"),
    ],
)
async def test_malformed_client_tools_are_400(api: Any, tools: Any, field: str, reason: str) -> None:
    """S-133: a bad name, a non-object schema, an unknown key or more than 64 tools → 400 `invalid_argument` naming
    the field; nothing is created. The same holds for inbox posts and forks."""
    key = await api.key()
    response = await create_thread(api.client, key, options={"client_tools": tools})
    assert response.status_code == 400
    error = error_of(response)
    assert error["code"] == "invalid_argument"
    assert {"field": field, "reason": reason} in error["details"]["fields"]
    assert await count(api.service, threads) == 0 and await count(api.service, runs) == 0
    thread_id = "thr_" + "0" * 32
    posted = await api.client.post(
        f"/v1/threads/{thread_id}/inbox",
        json={"input": TEXT, "options": {"client_tools": tools}},
        headers=key.headers("p"),
    )
    assert posted.status_code == 400
    forked = await api.client.post(
        f"/v1/runs/run_{'0' * 32}/fork",
        json={"input": TEXT, "options": {"client_tools": tools}},
        headers=key.headers("f"),
    )
    assert forked.status_code == 400


BIG = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 200} for i in range(90)}}


@pytest.mark.parametrize(
    ("tools", "field", "reason"),
    [
        ([WEATHER, WEATHER | {"description": "again"}], "options.client_tools.1.name", "duplicate"),
        ([WEATHER | {"parameters": {"type": "string"}}], "options.client_tools.0.parameters", "not_an_object_schema"),
        (
            [WEATHER | {"parameters": {"type": "object", "properties": {"city": {"type": "town"}}}}],
            "options.client_tools.0.parameters",
            "invalid_schema",
        ),
        (
            [WEATHER | {"parameters": {"type": "object", "required": "city"}}],
            "options.client_tools.0.parameters",
            "invalid_schema",
        ),
        ([WEATHER | {"parameters": BIG}], "options.client_tools.0.parameters", "too_large"),
    ],
)
async def test_invalid_client_tool_schemas_are_400(api: Any, tools: Any, field: str, reason: str) -> None:
    """S-133: a duplicate name, a schema that is not an arguments object schema, or one over 16 KiB → 400
    `invalid_argument` naming the field; nothing is created."""
    key = await api.key()
    response = await create_thread(api.client, key, options={"client_tools": tools})
    assert response.status_code == 400
    assert {"field": field, "reason": reason} in error_of(response)["details"]["fields"]
    assert await count(api.service, threads) == 0 and await count(api.service, runs) == 0


async def test_client_tool_colliding_with_an_agent_tool_is_400(api: Any) -> None:
    """S-133, §8.8: a client tool named like one of the agent's own tools → 400 field `options.client_tools`
    (checked at post time when the agent's factory is importable here); nothing is created."""
    from worker.support import FACTORY

    api.service.agents = AgentRegistry({"demo": FACTORY, "scripted": FACTORY})
    key = await api.key()
    options = {"script": "step", "client_tools": [WEATHER | {"name": "step"}]}
    response = await create_thread(api.client, key, agent="scripted", options=options)
    assert response.status_code == 400
    assert {"field": "options.client_tools", "reason": "name_collision"} in error_of(response)["details"]["fields"]
    assert await count(api.service, threads) == 0 and await count(api.service, runs) == 0
    fine = await create_thread(
        api.client, key, agent="scripted", idempotency_key="ok", options={"script": "step", "client_tools": [WEATHER]}
    )
    assert fine.status_code == 201
