"""The configured model and its retry policy (docs/providers.md), against the scripted provider over TCP.

`plan_model` is the pure decision (settings + environment → what to build); `build_model` makes the Pydantic AI
`OpenAIChatModel`. Both wire formats (JSON and SSE, with tool calls) are checked with a plain agent, and the
provider failures through `Harness.run`, whose H-31 classification turns them into `model_unavailable`.
"""

from __future__ import annotations

import sys
import time
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel

from candor import Harness, RunBindings
from candor.service.agents import AgentRegistry, AgentUnavailable
from candor.service.providers import ModelPlan, build_model, plan_model
from candor.service.settings import AgentModelSettings, ServiceSettings, SettingsError

from model_provider.agents import FACTORY
from model_provider.scripted_openai import Reply, ScriptedOpenAI, ToolCall, in_order, tool_results


def spec(**values: Any) -> AgentModelSettings:
    return AgentModelSettings(**({"name": "openai:gpt-scripted", "api_key_env": "TEST_KEY"} | values))


def model_for(base_url: str, **values: Any) -> Any:
    plan = plan_model(spec(base_url=base_url, **values), {"TEST_KEY": "sk-test"})
    assert isinstance(plan, ModelPlan)
    return build_model(plan)


# -- the decision -------------------------------------------------------------------------------------------------


def test_plan_reads_the_key_from_the_named_variable_and_hides_it() -> None:
    plan = plan_model(spec(timeout=7.5, max_retries=4, request_timeout=30), {"TEST_KEY": "sk-very-secret"})
    assert isinstance(plan, ModelPlan)
    assert (plan.model_name, plan.base_url, plan.api_key) == ("gpt-scripted", None, "sk-very-secret")
    assert plan.settings == {"timeout": 7.5, "max_retries": 4, "request_timeout": 30}
    assert "sk-very-secret" not in repr(plan)


def test_plan_needs_a_key_for_openai_itself_but_not_for_a_local_server() -> None:
    assert plan_model(spec(), {}) == "api_key_missing"
    assert plan_model(spec(), {"TEST_KEY": ""}) == "api_key_missing"
    local = plan_model(spec(base_url="http://127.0.0.1:8000/v1"), {})
    assert isinstance(local, ModelPlan) and local.api_key is None


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"name": "anthropic:claude"}, "name"),
        ({"name": "openai:"}, "name"),
        ({"name": "gpt-4o"}, "name"),
        ({"base_url": "ftp://host/v1"}, "base_url"),
        ({"base_url": "http://host/v1?key=x"}, "base_url"),
        ({"base_url": "https://user:sk-inline@host/v1"}, "base_url"),
        ({"api_key_env": "CANDOR_KEY"}, "api_key_env"),
        ({"api_key_env": "MY KEY"}, "api_key_env"),
        ({"timeout": 0}, "timeout"),
        ({"max_retries": 11}, "max_retries"),
        ({"max_retries": -1}, "max_retries"),
        ({"request_timeout": 0}, "request_timeout"),
        ({"api_key": "sk-inline"}, "api_key"),  # a key is never a setting
    ],
)
def test_invalid_model_settings_are_refused_naming_the_field(values: dict[str, Any], field: str) -> None:
    """S-124, §3: every model setting is validated; the error names the path, never the value."""
    section = {"factory": FACTORY, "model": {"name": "openai:gpt-4o"} | values}
    with pytest.raises(SettingsError) as raised:
        ServiceSettings.load(environ={"CANDOR_DATABASE__URL": "sqlite:///x.db"} | _env("assistant", section))
    assert f"agents.assistant.model.{field}" in str(raised.value)
    assert "sk-inline" not in str(raised.value)


def _env(agent: str, section: dict[str, Any]) -> dict[str, str]:
    out = {f"CANDOR_AGENTS__{agent.upper()}__FACTORY": section["factory"]}
    for key, value in section["model"].items():
        out[f"CANDOR_AGENTS__{agent.upper()}__MODEL__{key.upper()}"] = str(value)
    return out


def test_model_settings_load_from_the_environment() -> None:
    section = {
        "factory": FACTORY,
        "model": {"name": "openai:gpt-4o", "base_url": "https://llm.internal/v1", "max_retries": 0},
    }
    settings = ServiceSettings.load(environ=_env("assistant", section))
    model = settings.agents["assistant"].model
    assert model is not None
    assert (model.name, model.base_url, model.max_retries, model.api_key_env) == (
        "openai:gpt-4o",
        "https://llm.internal/v1",
        0,
        "OPENAI_API_KEY",
    )


def test_startup_check_refuses_a_missing_key_without_echoing_anything() -> None:
    """S-56: `check_all` builds every configured model; an unset key variable is `agent_unavailable`."""
    registry = AgentRegistry({"assistant": FACTORY}, models={"assistant": spec()}, environ={})
    with pytest.raises(AgentUnavailable) as raised:
        registry.check_all()
    assert raised.value.reason == "api_key_missing"
    assert str(raised.value) == (
        "agent 'assistant' is unavailable: the environment variable its model's API key is read from is not set"
    )
    ready = AgentRegistry({"assistant": FACTORY}, models={"assistant": spec()}, environ={"TEST_KEY": "sk-x"})
    ready.check_all()
    model = ready.model("assistant")
    assert isinstance(model, OpenAIChatModel) and model.model_name == "gpt-scripted"
    assert ready.model("assistant") is model  # one client (and connection pool) per process
    assert AgentRegistry({"assistant": FACTORY}).model("assistant") is None  # no model configured: the agent's own


def test_without_the_openai_extra_the_model_is_unavailable(monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/providers.md: a configured model needs `candor[openai]`; without it startup names the extra."""
    monkeypatch.setitem(sys.modules, "pydantic_ai.models.openai", None)  # what an absent package looks like
    registry = AgentRegistry({"assistant": FACTORY}, models={"assistant": spec()}, environ={"TEST_KEY": "sk-x"})
    with pytest.raises(AgentUnavailable) as raised:
        registry.check_all()
    assert raised.value.reason == "provider_not_installed" and 'pip install "candor[openai]"' in str(raised.value)


# -- the wire formats ----------------------------------------------------------------------------------------------


def charge_card(amount: int) -> str:
    """Charge the card."""
    return f"charged {amount}"


def two_turns(request: Any) -> Reply:
    if tool_results(request):
        return Reply(text="Done: charged 42.")
    return Reply(tool_calls=[ToolCall("charge_card", {"amount": 42}, "call_1")])


async def test_non_streaming_and_streaming_replies_with_tool_calls() -> None:
    with ScriptedOpenAI(two_turns) as server:
        agent = Agent(model_for(server.base_url), tools=[charge_card])
        result = await agent.run("charge 42")
        assert result.output == "Done: charged 42."
        async with agent.run_stream("charge 42") as streamed:
            pieces = [piece async for piece in streamed.stream_text(delta=True, debounce_by=None)]
        requests = server.recorded()
    assert "".join(pieces) == "Done: charged 42." and len(pieces) > 1
    assert [r.body["stream"] for r in requests] == [False, False, True, True]
    assert [tool_results(r) for r in requests] == [{}, {"call_1": "charged 42"}, {}, {"call_1": "charged 42"}]
    assert {r.path for r in requests} == {"/v1/chat/completions"}
    assert requests[0].headers["authorization"] == "Bearer sk-test"
    assert requests[0].body["model"] == "gpt-scripted"


async def test_a_client_error_is_not_retried_and_fails_the_run_for_good() -> None:
    """H-31: 401 (a wrong key) is not transient: one request, `agent_run_failed`, which seals the run (S-49)."""
    with ScriptedOpenAI(in_order(Reply(status=401))) as server:
        result = await Harness(Agent()).run("hi", bindings=RunBindings(model=model_for(server.base_url)))
        requests = len(server.recorded())
    assert result.failure is not None and (result.status, result.failure.code) == ("failed", "agent_run_failed")
    assert requests == 1


# -- the retry policy ----------------------------------------------------------------------------------------------


async def test_a_429_is_retried_after_its_retry_after() -> None:
    """docs/providers.md: the client waits what `Retry-After` asks (1 s here) before the retry."""
    with ScriptedOpenAI(in_order(Reply(status=429, headers={"Retry-After": "1"}), Reply(text="ok"))) as server:
        result = await Harness(Agent()).run("hi", bindings=RunBindings(model=model_for(server.base_url)))
        first, second = server.recorded()
    assert (result.status, result.output) == ("completed", "ok")
    assert second.at - first.at >= 1.0


async def test_5xx_is_retried_with_backoff_then_succeeds() -> None:
    replies = in_order(Reply(status=500), Reply(status=503), Reply(text="ok"))
    with ScriptedOpenAI(replies) as server:
        result = await Harness(Agent()).run("hi", bindings=RunBindings(model=model_for(server.base_url)))
        times = [r.at for r in server.recorded()]
    assert (result.status, result.output, len(times)) == ("completed", "ok", 3)
    assert times[1] - times[0] >= 0.3 and times[2] - times[1] >= 0.6  # 0.5 s then 1 s, minus up to 25 % jitter


@pytest.mark.parametrize(
    "failing",
    [
        pytest.param(Reply(status=502), id="5xx"),
        pytest.param(Reply(status=429, headers={"Retry-After": "0.1"}), id="429"),
        pytest.param(Reply(hang=True), id="hang"),
        pytest.param(Reply(text="a long answer that is cut", drop_after=3), id="cut-mid-stream"),
    ],
)
async def test_exhausted_retries_end_the_run_model_unavailable(failing: Reply) -> None:
    """H-31: what the client gives up on (after `max_retries`) ends the run `failed` / `model_unavailable`; a
    hanging provider is cut by `timeout`, a stream cut mid-way is a connection error, not a shorter answer."""
    with ScriptedOpenAI(in_order(failing)) as server:
        model = model_for(server.base_url, max_retries=1, timeout=0.3)
        started = time.monotonic()
        async with Harness(Agent()).stream("hi", bindings=RunBindings(model=model)) as stream:
            async for _ in stream:
                pass
        elapsed = time.monotonic() - started
        requests = len(server.recorded())
    result = stream.outcome
    assert result is not None and result.status == "failed" and result.failure is not None
    assert (result.failure.code, result.failure.retry_hint) == ("model_unavailable", "new_run")
    # a response that started streaming is never re-sent by the client: the attempt fails (the service retries it)
    assert requests == (1 if failing.drop_after is not None else 2) and elapsed < 10
