"""`tool_recovery` per agent and per run over HTTP (issue 13 item 1; S-29, S-68, S-10): `options.tool_recovery` is
validated on create, inbox post and fork (400 `invalid_argument`, field `options.tool_recovery`, reason
`not_a_tool_recovery_mode`), wins over `[agents.<name>].tool_recovery`, is fixed on the run at acceptance and shown on
the run view; a steer naming another mode is a change of options (409 `run_configuration_immutable`)."""

from __future__ import annotations

from typing import Any

import pytest

from candor.service.settings import ServiceSettings
from candor.service.store.schema.tables import runs, threads

from commands.helpers import count, run_row
from http_support import TEXT, create_thread, error_of


def _with_agent_modes(api: Any, **modes: str) -> None:
    """Reconfigure the `api` service's agents with these `tool_recovery` settings (the factories stay)."""
    settings = api.service.settings
    agents = {
        name: {"factory": section.factory, "tool_recovery": modes.get(name, section.tool_recovery)}
        for name, section in settings.agents.items()
    }
    api.service.settings = ServiceSettings(database={"url": settings.database.url}, agents=agents)


@pytest.mark.parametrize("value", ["sometimes", "", "DECLARED", 3, None, ["never"], {"mode": "never"}])
async def test_invalid_option_is_400_everywhere(api: Any, value: Any) -> None:
    """Issue 13 item 1: anything but the three modes → 400 `invalid_argument` naming `options.tool_recovery`, on a
    create, an inbox post and a fork alike; nothing is created."""
    key = await api.key()
    options = {"tool_recovery": value}
    response = await create_thread(api.client, key, options=options)
    assert response.status_code == 400
    error = error_of(response)
    assert error["code"] == "invalid_argument"
    assert 'must be one of "declared", "never" or "always"' in error["message"]  # issue 35 item 3
    [problem] = error["details"]["fields"]
    assert problem["field"] == "options.tool_recovery"
    assert await count(api.service, threads) == 0 and await count(api.service, runs) == 0
    created = await create_thread(api.client, key, idempotency_key="ok")
    thread_id, run_id = created.json()["thread"]["id"], created.json()["run"]["id"]
    posted = await api.client.post(
        f"/v1/threads/{thread_id}/inbox", json={"input": TEXT, "options": options}, headers=key.headers("p")
    )
    forked = await api.client.post(
        f"/v1/runs/{run_id}/fork", json={"input": TEXT, "options": options}, headers=key.headers("f")
    )
    for other in (posted, forked):
        assert other.status_code == 400
        assert error_of(other)["details"]["fields"] == [problem]


async def test_string_values_get_the_specific_reason(api: Any) -> None:
    """A string that is not a mode gets the reason `not_a_tool_recovery_mode` (not a generic type error)."""
    key = await api.key()
    response = await create_thread(api.client, key, options={"tool_recovery": "sometimes"})
    assert error_of(response)["details"]["fields"] == [
        {"field": "options.tool_recovery", "reason": "not_a_tool_recovery_mode"}
    ]


@pytest.mark.parametrize(
    ("agent_mode", "option", "expected"),
    [
        (None, None, "declared"),  # nothing configured: the library's default
        ("never", None, "never"),  # the agent's setting
        ("always", None, "always"),
        ("never", "always", "always"),  # the run's option wins over the agent's
        ("always", "declared", "declared"),
    ],
)
async def test_run_records_and_shows_its_mode(
    api: Any, agent_mode: str | None, option: str | None, expected: str
) -> None:
    """Issue 13 item 1: the run's mode is its option, else its agent's setting, else "declared"; it is recorded on
    the run at acceptance and shown on the run view (create response and GET)."""
    if agent_mode is not None:
        _with_agent_modes(api, demo=agent_mode)
    key = await api.key()
    options = {} if option is None else {"tool_recovery": option}
    response = await create_thread(api.client, key, options=options)
    assert response.status_code == 201, response.text
    view = response.json()["run"]
    assert view["tool_recovery"] == expected
    assert (await run_row(api.service, view["id"])).tool_recovery == expected
    fetched = await api.client.get(f"/v1/runs/{view['id']}", headers=key.headers())
    assert fetched.json()["tool_recovery"] == expected


async def test_agent_setting_applies_to_later_runs_only(api: Any) -> None:
    """S-10 by analogy: the mode is fixed at acceptance; a configuration change reaches runs accepted after it."""
    key = await api.key()
    first = (await create_thread(api.client, key)).json()["run"]
    _with_agent_modes(api, demo="never")
    assert (await run_row(api.service, first["id"])).tool_recovery == "declared"
    second = (await create_thread(api.client, key, idempotency_key="second")).json()["run"]
    assert second["tool_recovery"] == "never"


async def test_steer_with_another_mode_is_409(api: Any) -> None:
    """S-68, §8.5: `options.tool_recovery` is part of the options digest; a steer naming other options while the
    run is active → 409 `run_configuration_immutable`; the same options are accepted."""
    key = await api.key()
    created = await create_thread(api.client, key, options={"tool_recovery": "never"})
    thread_id = created.json()["thread"]["id"]
    steer = {"input": TEXT, "delivery": "steer"}
    other = await api.client.post(
        f"/v1/threads/{thread_id}/inbox",
        headers=key.headers("a"),
        json=steer | {"options": {"tool_recovery": "always"}},
    )
    assert other.status_code == 409
    assert error_of(other)["details"]["reason"] == "run_configuration_immutable"
    same = await api.client.post(
        f"/v1/threads/{thread_id}/inbox", headers=key.headers("b"), json=steer | {"options": {"tool_recovery": "never"}}
    )
    assert same.status_code == 201, same.text


def test_agent_setting_is_validated() -> None:
    """`[agents.x] tool_recovery` accepts only the three modes (S-124 style: the setting path is named)."""
    from candor.service.errors import SettingsError

    with pytest.raises(Exception) as caught:
        ServiceSettings(agents={"a": {"factory": "m:f", "tool_recovery": "sometimes"}})
    assert "tool_recovery" in str(caught.value)
    environ = {"CANDOR_AGENTS__A__FACTORY": "m:f", "CANDOR_AGENTS__A__TOOL_RECOVERY": "maybe"}
    with pytest.raises(SettingsError, match=r"agents\.a\.tool_recovery"):
        ServiceSettings.load(environ=environ)
    loaded = ServiceSettings.load(environ=environ | {"CANDOR_AGENTS__A__TOOL_RECOVERY": "never"})
    assert loaded.agents["a"].tool_recovery == "never"
    assert loaded.tool_recovery_for("a", {}) == "never"
    assert loaded.tool_recovery_for("a", {"tool_recovery": "always"}) == "always"
