"""`RunBindings.model`: the model a run uses instead of the agent's own (docs/providers.md; extends spec §3.6).

A service binds the provider model (which holds the API key) per run, so agents built by factories need no model
of their own, and a state never holds one.
"""

from __future__ import annotations

from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, SystemPromptPart, TextPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from candor import Harness, RunBindings
from candor.errors import RunError


def answering(label: str, seen: list[list[ModelMessage]] | None = None) -> FunctionModel:
    def respond(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        if seen is not None:
            seen.append(messages)
        return ModelResponse(parts=[TextPart(f"{label} answers")])

    async def stream(messages: list[ModelMessage], info: AgentInfo) -> Any:
        if seen is not None:
            seen.append(messages)
        for piece in (label, " answers"):
            yield piece

    return FunctionModel(respond, stream_function=stream)


async def test_an_agent_without_a_model_runs_and_continues_on_the_bound_model() -> None:
    """H-107 with a bound model: the continuation refreshes the system prompt with the run's model (the agent has
    none), and the bound model streams its text."""
    seen: list[list[ModelMessage]] = []
    harness = Harness(Agent(system_prompt="Be brief."))
    bindings = RunBindings(model=answering("bound", seen))
    first = await harness.run("hello", bindings=bindings)
    assert (first.status, first.output) == ("completed", "bound answers")
    second = await harness.run("again", previous_state=first.state, bindings=bindings)
    assert (second.status, second.output) == ("completed", "bound answers")
    prompts = [p.content for p in seen[-1][0].parts if isinstance(p, SystemPromptPart)]
    assert prompts == ["Be brief."]


async def test_the_bound_model_replaces_the_agent_model() -> None:
    harness = Harness(Agent(answering("own")))
    assert (await harness.run("hi")).output == "own answers"
    assert (await harness.run("hi", bindings=RunBindings(model=answering("bound")))).output == "bound answers"


def test_a_model_that_is_not_a_model_object_is_refused() -> None:
    """H-97: a model name string is not a binding (it would read keys from the environment inside the harness)."""
    with pytest.raises(RunError) as raised:
        Harness(Agent()).stream("hi", bindings=RunBindings(model="openai:gpt-4o"))  # type: ignore[arg-type]
    assert raised.value.code == "run_bindings_invalid" and raised.value.details == {"fields": ["model"]}
