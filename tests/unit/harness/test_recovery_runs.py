"""Recovery of unanswered calls, end to end through the public API (spec §4.D–§4.E, §4.G, H-103, H-105).

Every run here uses a scripted `FunctionModel`; tools record each execution in a `Ledger`, so the tests can say
exactly which functions ran, for which call id, and with which `ctx.tool_call_approved`.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
from pydantic_ai import (
    Agent,
    ApprovalRequired,
    DeferredToolRequests,
    DeferredToolResults,
    RunContext,
    SkipToolExecution,
    Tool,
    ToolDenied,
    ToolReturn,
)
from pydantic_ai.capabilities import AbstractCapability, SetToolMetadata
from pydantic_ai.exceptions import ToolFailed
from pydantic_ai.messages import (
    FunctionToolCallEvent,
    FunctionToolResultEvent,
    ModelMessage,
    ModelRequest,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets import ExternalToolset, FunctionToolset, SetMetadataToolset

from candor import BoundaryEvent, DeferredToolResume, Harness, HarnessState, RunBindings, RunResult, RunResultEvent
from candor.errors import RunError
from candor.tools import (
    RECOVERY_RETRY_SAFE_METADATA_KEY,
    UNKNOWN_OUTCOME_CONTENT,
    UNKNOWN_OUTCOME_METADATA_KEY,
    recovery_retryable,
    unknown_outcome_result,
)

from scripted import canonical, consume

SAFE = RECOVERY_RETRY_SAFE_METADATA_KEY
THREAD = "thr_recovery"
FIXED_TS = datetime(2020, 1, 1, tzinfo=UTC)
EXT_SCHEMA = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}

# -- helpers ------------------------------------------------------------------------------------------------


def call(name: str, call_id: str, **args: Any) -> ToolCallPart:
    return ToolCallPart(tool_name=name, args=args, tool_call_id=call_id)


def prompt(text: str = "go") -> ModelRequest:
    return ModelRequest(parts=[UserPromptPart(text)])


def state_of(*messages: ModelMessage) -> HarnessState:
    return HarnessState(schema_version="1", thread_id=THREAD, message_history=list(messages))


def open_state(*calls: ToolCallPart, before: Sequence[ModelMessage] = ()) -> HarnessState:
    """A restored state whose last message is a response holding `calls`, none of them answered."""
    return state_of(*before, prompt(), ModelResponse(parts=list(calls)))


@dataclass
class Exec:
    tool: str
    call_id: str
    x: Any
    approved: bool


class Ledger:
    """Tools whose executions are recorded, in order."""

    def __init__(self) -> None:
        self.execs: list[Exec] = []

    def fn(self, name: str) -> Callable[..., Any]:
        async def tool(ctx: RunContext[Any], x: int) -> str:
            assert ctx.tool_call_id is not None  # set for every tool call
            self.execs.append(Exec(name, ctx.tool_call_id, x, ctx.tool_call_approved))
            return f"{name}:{x}"

        tool.__name__ = name
        return tool

    def tool(self, name: str, *, safe: bool = False, **kwargs: Any) -> Tool[Any]:
        tool = Tool(self.fn(name), name=name, **kwargs)
        return recovery_retryable(tool) if safe else tool

    def ids(self, tool: str | None = None) -> list[str]:
        return [e.call_id for e in self.execs if tool is None or e.tool == tool]


class Script:
    """A scripted model: the i-th request is answered by `steps[i]` (a response, or a function of the messages).

    Once the steps are used up every request is answered with the text `"done"`. `seen` holds what each request
    was sent.
    """

    def __init__(self, *steps: ModelResponse | Callable[[list[ModelMessage], AgentInfo], ModelResponse]) -> None:
        self.steps = list(steps)
        self.seen: list[list[ModelMessage]] = []

    def __call__(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.seen.append(copy.deepcopy(messages))
        if self.steps:
            step = self.steps.pop(0)
            return step(messages, info) if callable(step) else copy.deepcopy(step)
        return ModelResponse(parts=[TextPart("done")])

    @property
    def model(self) -> FunctionModel:
        return FunctionModel(self)


def harness(script: Script, *tools: Any, **agent_kwargs: Any) -> Harness[Any]:
    return Harness(Agent(script.model, tools=list(tools), **agent_kwargs))


def tool_returns(messages: Sequence[ModelMessage]) -> list[ToolReturnPart]:
    return [p for m in messages if isinstance(m, ModelRequest) for p in m.parts if isinstance(p, ToolReturnPart)]


def returns_for(messages: Sequence[ModelMessage], call_id: str) -> list[ToolReturnPart]:
    return [p for p in tool_returns(messages) if p.tool_call_id == call_id]


def only_return(messages: Sequence[ModelMessage], call_id: str) -> ToolReturnPart:
    found = returns_for(messages, call_id)
    assert len(found) == 1, f"{call_id}: expected exactly one return, found {len(found)}"
    return found[0]


def no_ts(part: ToolReturnPart) -> ToolReturnPart:
    return dataclasses.replace(part, timestamp=FIXED_TS)


def is_unknown_for(part: ToolReturnPart, original: ToolCallPart) -> bool:
    """H-43: the part equals §3.10's unknown-outcome result for `original` (timestamps aside)."""
    return no_ts(part) == no_ts(unknown_outcome_result(original))


def assert_prefix(before: HarnessState, after: HarnessState) -> None:
    """H-42: the earlier history is kept message for message (canonical JSON)."""
    old = list(before.message_history)
    new = list(after.message_history)
    assert canonical(new[: len(old)]) == canonical(old)


def every_call_answered_once(messages: Sequence[ModelMessage]) -> None:
    last = [m for m in messages if isinstance(m, ModelResponse)][-1]
    for part in last.parts:
        if isinstance(part, ToolCallPart):
            only_return(messages, part.tool_call_id)


@dataclass
class Watch(AbstractCapability[Any]):
    """Records which calls the tool-execution hooks see; can block chosen call ids."""

    before: list[str] = field(default_factory=list)
    wrapped: list[str] = field(default_factory=list)
    skip: frozenset[str] = frozenset()
    raise_for: frozenset[str] = frozenset()
    no_handler: frozenset[str] = frozenset()

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None

    async def before_tool_execute(
        self, ctx: RunContext[Any], *, call: ToolCallPart, tool_def: ToolDefinition, args: Any
    ) -> Any:
        self.before.append(call.tool_call_id)
        if call.tool_call_id in self.skip:
            raise SkipToolExecution("blocked by policy")
        if call.tool_call_id in self.raise_for:
            raise PermissionError("policy refuses this call")
        return args

    async def wrap_tool_execute(
        self, ctx: RunContext[Any], *, call: ToolCallPart, tool_def: ToolDefinition, args: Any, handler: Any
    ) -> Any:
        self.wrapped.append(call.tool_call_id)
        if call.tool_call_id in self.no_handler:
            return "refused by wrapper"
        return await handler(args)


# -- H-40 and the boundaries of a recovery run -----------------------------------------------------------------


async def test_tool_boundary_state_abandoned_then_recovered_under_declared() -> None:
    """H-40, H-36, H-37, H-46: a state exported at a tool boundary, abandoned and run again under "declared"."""
    ledger = Ledger()
    first_script = Script(
        ModelResponse(parts=[call("charge", "c1", x=1), call("lookup", "c2", x=2), call("notify", "c3", x=3)])
    )
    first = harness(first_script, ledger.tool("charge"), ledger.tool("lookup", safe=True), ledger.tool("notify"))
    saved: str | None = None
    stream = first.stream("pay the invoice")
    async with stream:
        async for event in stream:
            if isinstance(event, BoundaryEvent) and event.kind == "tool":
                exported = await stream.export_state()
                assert isinstance(exported.message_history[-1], ModelResponse)  # H-37
                saved = exported.model_dump_json()
                break  # the process is abandoned here
    assert saved is not None
    assert ledger.execs == []  # H-36: no tool started before the consumer asked for more

    # A new "process": a new agent object, new ledger, the saved JSON.
    ledger2 = Ledger()
    second = harness(Script(), ledger2.tool("charge"), ledger2.tool("lookup", safe=True), ledger2.tool("notify"))
    state = HarnessState.model_validate_json(saved)
    result = await second.run(previous_state=state, tool_recovery="declared")

    assert result.status == "completed"
    assert ledger2.ids() == ["c2"]  # the retry-safe call exactly once; the others never
    assert ledger2.execs[0].approved is False
    assert result.state is not None
    history = result.state.message_history
    c1, _, c3 = state.message_history[-1].parts
    assert isinstance(c1, ToolCallPart) and isinstance(c3, ToolCallPart)
    assert is_unknown_for(only_return(history, "c1"), c1)
    assert is_unknown_for(only_return(history, "c3"), c3)
    assert only_return(history, "c2").content == "lookup:2"
    assert only_return(history, "c2").outcome == "success"
    assert_prefix(state, result.state)


async def test_recovery_run_boundaries() -> None:
    """H-35, H-36, H-37, H-38, H-39, H-58: replays run before the first model boundary; later calls run normally."""
    ledger = Ledger()
    script = Script(ModelResponse(parts=[call("lookup", "n1", x=7)]))
    h = harness(script, ledger.tool("lookup", safe=True))
    state = open_state(call("lookup", "c1", x=1))
    stream = h.stream(previous_state=state)
    events: list[Any] = []
    snapshots: list[HarnessState] = []
    async with stream:
        async for event in stream:
            events.append(event)
            if isinstance(event, BoundaryEvent):
                snapshots.append(await stream.export_state())
                if event.kind == "tool":
                    assert ledger.ids() == ["c1"]  # H-36: n1 has not started yet
                if event.kind == "model":
                    # H-37: every call of the last response has a return
                    every_call_answered_once(snapshots[-1].message_history)
    kinds = [
        (type(e).__name__, getattr(e, "kind", None))
        for e in events
        if isinstance(e, (BoundaryEvent, FunctionToolCallEvent))
    ]
    assert kinds == [
        ("FunctionToolCallEvent", None),  # the replay of c1, before any boundary (H-38: none while it runs)
        ("BoundaryEvent", "model"),
        ("BoundaryEvent", "tool"),
        ("FunctionToolCallEvent", None),  # n1, only after its tool boundary (H-35)
        ("BoundaryEvent", "model"),
    ]
    assert ledger.ids() == ["c1", "n1"]
    assert stream.outcome is not None
    for earlier, later in zip([state, *snapshots], [*snapshots, stream.outcome.state], strict=True):
        assert later is not None
        assert_prefix(earlier, later)  # H-39
    assert [e.index for e in events if isinstance(e, BoundaryEvent)] == [1, 2, 3]


# -- H-41 to H-51 -------------------------------------------------------------------------------------------


async def test_only_the_last_response_is_recovered() -> None:
    """H-41, H-42: a call left open in an earlier response is never touched, under any mode."""
    ledger = Ledger()
    h = harness(Script(), ledger.tool("act"))
    state = state_of(
        prompt(),
        ModelResponse(parts=[call("act", "old", x=0)]),
        prompt("next"),
        ModelResponse(parts=[call("act", "new", x=1)]),
    )
    result = await h.run(previous_state=state, tool_recovery="always")
    assert result.status == "completed"
    assert ledger.ids() == ["new"]
    assert result.state is not None
    assert returns_for(result.state.message_history, "old") == []
    assert only_return(result.state.message_history, "new").content == "act:1"
    assert_prefix(state, result.state)


async def test_existing_messages_are_never_changed() -> None:
    """H-42, H-49: recorded returns keep content and ids; the restored response keeps its parts."""
    ledger = Ledger()
    h = harness(Script(), ledger.tool("act", safe=True))
    earlier: list[ModelMessage] = [
        prompt("first"),
        ModelResponse(parts=[TextPart("checking"), call("act", "e1", x=0)]),
        ModelRequest(parts=[ToolReturnPart("act", "recorded", tool_call_id="e1")]),
    ]
    state = open_state(call("act", "c1", x=1), call("act", "c2", x=2), before=earlier)
    before_json = state.model_dump_json()
    result = await h.run(previous_state=state, tool_recovery="always")
    assert state.model_dump_json() == before_json
    assert result.state is not None
    assert_prefix(state, result.state)
    assert result.state is not None
    assert only_return(result.state.message_history, "e1").content == "recorded"
    assert ledger.ids() == ["c1", "c2"]


async def test_unknown_outcome_results_exact_shape_in_one_request_in_call_order() -> None:
    """H-43, H-44, H-46, H-34: one new request, call order (not id order), stored and in new_messages()."""
    ledger = Ledger()
    script = Script()
    h = harness(script, ledger.tool("a"), ledger.tool("b", safe=True))
    calls = [call("a", "z9", x=1), call("b", "m5", x=2), call("a", "a1", x=3)]
    state = open_state(*calls)
    result = await h.run(previous_state=state)
    assert result.status == "completed"
    assert ledger.ids() == ["m5"]
    new = result.new_messages()
    assert len(new) == 2  # the merged request and the final response
    request = new[0]
    assert isinstance(request, ModelRequest)
    assert [getattr(p, "tool_call_id", None) for p in request.parts] == ["z9", "m5", "a1"]
    for part, original in zip(request.parts, calls, strict=True):
        if original.tool_name == "a":
            assert isinstance(part, ToolReturnPart)
            assert is_unknown_for(part, original)
            assert part.content == UNKNOWN_OUTCOME_CONTENT
            assert part.outcome == "interrupted"
            assert part.metadata == {UNKNOWN_OUTCOME_METADATA_KEY: True}
            assert part.tool_name == original.tool_name
    assert result.state is not None
    assert state is not None
    assert canonical(result.state.message_history[len(state.message_history) :]) == canonical(new)
    assert result.all_messages() == list(result.state.message_history)
    # They were sent to the model, in the same single request.
    sent = script.seen[0][-1]
    assert isinstance(sent, ModelRequest)
    assert [p.tool_call_id for p in sent.parts if isinstance(p, ToolReturnPart)] == ["z9", "m5", "a1"]


async def test_never_executes_nothing() -> None:
    """H-45: "never" closes every unanswered call with an unknown outcome, retry-safe ones included."""
    ledger = Ledger()
    h = harness(Script(), ledger.tool("a"), ledger.tool("b", safe=True))
    calls = [call("a", "c1", x=1), call("b", "c2", x=2)]
    result = await h.run(previous_state=open_state(*calls), tool_recovery="never")
    assert result.status == "completed"
    assert ledger.execs == []
    for original in calls:
        assert result.state is not None
        assert is_unknown_for(only_return(result.state.message_history, original.tool_call_id), original)


async def test_declared_executes_only_retry_safe_calls() -> None:
    """H-46, H-55: only marked tools replay (with `tool_call_approved` False); the rest get unknown outcomes."""
    ledger = Ledger()
    h = harness(Script(), ledger.tool("a"), ledger.tool("b", safe=True))
    calls = [call("b", "c1", x=1), call("a", "c2", x=2), call("b", "c3", x=3)]
    result = await h.run(previous_state=open_state(*calls))
    assert result.status == "completed"
    assert ledger.ids() == ["c1", "c3"]
    assert all(e.approved is False for e in ledger.execs)
    assert result.state is not None
    history = result.state.message_history
    assert is_unknown_for(only_return(history, "c2"), calls[1])
    assert only_return(history, "c1").content == "b:1"
    assert only_return(history, "c3").content == "b:3"


async def test_always_executes_every_offered_call() -> None:
    """H-47, H-44: "always" replays each call once; the returns form one request in call order."""
    ledger = Ledger()
    h = harness(Script(), ledger.tool("a"), ledger.tool("b", safe=True))
    calls = [call("a", "c1", x=1), call("b", "c2", x=2), call("a", "c3", x=3)]
    state = open_state(*calls)
    result = await h.run(previous_state=state, tool_recovery="always")
    assert result.status == "completed"
    assert sorted(ledger.ids()) == ["c1", "c2", "c3"]
    assert result.state is not None
    assert state is not None
    request = result.state.message_history[len(state.message_history)]
    assert isinstance(request, ModelRequest)
    assert all(isinstance(p, ToolReturnPart) for p in request.parts)
    returned = [(p.tool_call_id, p.content) for p in request.parts if isinstance(p, ToolReturnPart)]
    assert returned == [("c1", "a:1"), ("c2", "b:2"), ("c3", "a:3")]


@pytest.mark.parametrize("mode", ["declared", "never", "always"])
async def test_missing_tool_gets_unknown_outcome(mode: str) -> None:
    """H-48: a call naming a tool the current surface no longer offers is closed, whatever the mode."""
    ledger = Ledger()
    h = harness(Script(), ledger.tool("kept", safe=True))
    calls = [call("gone", "c1", x=1), call("kept", "c2", x=2)]
    result = await h.run(previous_state=open_state(*calls), tool_recovery=mode)
    assert result.status == "completed"
    assert result.state is not None
    history = result.state.message_history
    assert is_unknown_for(only_return(history, "c1"), calls[0])
    if mode == "never":
        assert ledger.execs == []
        assert is_unknown_for(only_return(history, "c2"), calls[1])
    else:
        assert ledger.ids() == ["c2"]


async def test_recorded_returns_are_never_reopened() -> None:
    """H-49: an earlier unknown outcome, a pydantic-ai synthesized return, a retried and a failed return stay closed."""
    ledger = Ledger()
    h = harness(Script(), ledger.tool("a", safe=True))
    calls = [call("a", "c1", x=1), call("a", "c2", x=2), call("a", "c3", x=3), call("a", "c4", x=4)]
    closing = ModelRequest(
        parts=[
            unknown_outcome_result(calls[0]),
            ToolReturnPart(
                "a",
                "interrupted by pydantic-ai",
                tool_call_id="c2",
                outcome="interrupted",
                metadata={"pydantic_ai_synthesized_tool_return": True},
            ),
            ToolReturnPart("a", "bad args", tool_call_id="c3", outcome="retried"),
            ToolReturnPart("a", "it failed", tool_call_id="c4", outcome="failed"),
        ]
    )
    state = state_of(prompt(), ModelResponse(parts=calls), closing)
    result = await h.run("again", previous_state=state, tool_recovery="always")
    assert result.status == "completed"
    assert ledger.execs == []
    for original in calls:
        assert result.state is not None
        only_return(result.state.message_history, original.tool_call_id)
    assert result.state is not None
    assert_prefix(state, result.state)


async def test_recovered_state_run_again_with_always_executes_nothing() -> None:
    """H-49: the state a recovery produced (completed, or failed right after recovery) replays nothing."""
    ledger = Ledger()

    def model_down(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        raise RuntimeError("model is down")

    tools = (ledger.tool("a"), ledger.tool("b", safe=True))
    calls = [call("a", "c1", x=1), call("b", "c2", x=2)]
    failed = await harness(Script(model_down), *tools).run(previous_state=open_state(*calls))
    assert failed.status == "failed"
    assert ledger.ids() == ["c2"]
    # the failed state ends with the recovery request: every call is closed
    assert failed.state is not None
    assert isinstance(failed.state.message_history[-1], ModelRequest)
    every_call_answered_once(failed.state.message_history)

    again = await harness(Script(), *tools).run(previous_state=failed.state, tool_recovery="always")
    assert again.status == "completed"
    assert ledger.ids() == ["c2"]
    assert again.state is not None
    every_call_answered_once(again.state.message_history)

    once_more = await harness(Script(), *tools).run("more", previous_state=again.state, tool_recovery="always")
    assert once_more.status == "completed"
    assert ledger.ids() == ["c2"]


async def test_retry_safe_flag_comes_from_the_current_surface() -> None:
    """H-50: the same saved state replays when the tool is marked and yields an unknown outcome when it is not."""
    saved = open_state(call("lookup", "c1", x=1)).model_dump_json()

    marked = Ledger()
    r1 = await harness(Script(), marked.tool("lookup", safe=True)).run(
        previous_state=HarnessState.model_validate_json(saved)
    )
    assert marked.ids() == ["c1"]
    assert r1.state is not None
    assert only_return(r1.state.message_history, "c1").content == "lookup:1"

    unmarked = Ledger()
    r2 = await harness(Script(), unmarked.tool("lookup")).run(previous_state=HarnessState.model_validate_json(saved))
    assert unmarked.execs == []
    c1 = call("lookup", "c1", x=1)
    assert r2.state is not None
    assert is_unknown_for(only_return(r2.state.message_history, "c1"), c1)

    # Something that looks like the flag inside stored messages does not count either.
    stale = state_of(
        prompt(),
        ModelResponse(parts=[c1], provider_details={SAFE: True}, metadata={SAFE: True}),
    )
    unmarked2 = Ledger()
    r3 = await harness(Script(), unmarked2.tool("lookup")).run(previous_state=stale)
    assert unmarked2.execs == []
    assert r3.state is not None
    assert is_unknown_for(only_return(r3.state.message_history, "c1"), c1)


@pytest.mark.parametrize(
    ("value", "replayed"),
    [
        (True, True),
        (1, False),
        (1.0, False),
        ("true", False),
        ("True", False),
        ([True], False),
        ({"v": True}, False),
        (False, False),
        (None, False),
    ],
    ids=repr,
)
async def test_only_boolean_true_marks_a_tool(value: Any, replayed: bool) -> None:
    """H-51: only the boolean `True` marks a tool retry-safe."""
    ledger = Ledger()
    h = harness(Script(), ledger.tool("lookup", metadata={SAFE: value}))
    c1 = call("lookup", "c1", x=1)
    result = await h.run(previous_state=open_state(c1))
    assert result.status == "completed"
    if replayed:
        assert ledger.ids() == ["c1"]
    else:
        assert ledger.execs == []
        assert result.state is not None
        assert is_unknown_for(only_return(result.state.message_history, "c1"), c1)


async def test_recovery_retryable_copies_every_tool_attribute() -> None:
    """H-52: a new Tool with the same function, schema, prepare, settings and metadata plus the key."""

    async def prep(ctx: RunContext[Any], tool_def: ToolDefinition) -> ToolDefinition:
        return tool_def

    async def transfer(ctx: RunContext[Any], amount: int) -> str:
        """Move money."""
        return "ok"

    original = Tool(
        transfer,  # type: ignore[arg-type]  # mypy cannot solve Tool's ParamSpec once prepare= is given
        name="move_money",
        description="Moves money between accounts.",
        prepare=prep,
        requires_approval=True,
        sequential=True,
        timeout=12.5,
        max_retries=4,
        metadata={"team": "payments", "nested": {"a": 1}},
        strict=True,
    )
    original_metadata = copy.deepcopy(original.metadata)
    assert original_metadata is not None and original.metadata is not None
    copied = recovery_retryable(original)
    assert copied is not original
    assert isinstance(copied, Tool)
    assert copied.function is original.function is transfer  # not wrapped
    assert copied.function_schema is original.function_schema
    assert copied.prepare is prep
    assert copied.name == "move_money"
    assert copied.description == "Moves money between accounts."
    assert copied.requires_approval is True
    assert copied.sequential is True
    assert copied.timeout == 12.5
    assert copied.max_retries == 4
    assert copied.strict is True
    assert copied.takes_ctx is True
    assert copied.metadata == {**original_metadata, SAFE: True}
    assert original.metadata == original_metadata  # the original is unchanged
    assert SAFE not in original.metadata
    assert copied.metadata is not original.metadata
    # Every other attribute is carried over unchanged.
    for name, value in vars(original).items():
        if name != "metadata":
            assert getattr(copied, name) is value or getattr(copied, name) == value, name
    # The prepared definition says the same.
    assert copied.tool_def.metadata == {**original_metadata, SAFE: True}
    assert copied.tool_def.kind == "unapproved"
    assert copied.tool_def.sequential is True

    # As a decorator on a plain function, and on a tool without metadata.
    @recovery_retryable
    def lookup(x: int) -> int:
        return x

    assert isinstance(lookup, Tool)
    assert lookup.metadata == {SAFE: True}
    assert lookup.name == "lookup"
    plain = Tool(transfer)
    assert recovery_retryable(plain).metadata == {SAFE: True}
    assert plain.metadata is None


def _marking(mechanism: str, ledger: Ledger) -> tuple[list[Any], dict[str, Any], RunBindings]:
    """(agent tools, extra Agent kwargs, bindings) declaring `lookup` retry-safe by `mechanism`; `other` is not."""
    lookup_fn = ledger.fn("lookup")
    other = ledger.tool("other")
    if mechanism == "recovery_retryable":
        return [recovery_retryable(Tool(lookup_fn, name="lookup")), other], {}, RunBindings()
    if mechanism == "tool_metadata":
        return [Tool(lookup_fn, name="lookup", metadata={SAFE: True}), other], {}, RunBindings()
    if mechanism == "set_tool_metadata_agent":
        cap = SetToolMetadata(tools=["lookup"], **{SAFE: True})
        return [Tool(lookup_fn, name="lookup"), other], {"capabilities": [cap]}, RunBindings()
    if mechanism == "set_tool_metadata_bindings":
        cap = SetToolMetadata(tools=["lookup"], **{SAFE: True})
        return [Tool(lookup_fn, name="lookup"), other], {}, RunBindings(capabilities=[cap])
    if mechanism == "set_tool_metadata_dict_selector":
        cap = SetToolMetadata(tools={"group": "reads"}, **{SAFE: True})
        return (
            [Tool(lookup_fn, name="lookup", metadata={"group": "reads"}), other],
            {"capabilities": [cap]},
            RunBindings(),
        )
    if mechanism == "set_metadata_toolset":
        toolset = SetMetadataToolset(FunctionToolset([Tool(lookup_fn, name="lookup")]), {SAFE: True})
        return [other], {"toolsets": [toolset]}, RunBindings()
    if mechanism == "set_metadata_toolset_bindings":
        toolset = SetMetadataToolset(FunctionToolset([Tool(lookup_fn, name="lookup")]), {SAFE: True})
        return [other], {}, RunBindings(toolsets=[toolset])
    if mechanism == "prepare":

        async def prep(ctx: RunContext[Any], tool_def: ToolDefinition) -> ToolDefinition:
            return dataclasses.replace(tool_def, metadata={**(tool_def.metadata or {}), SAFE: True})

        return [Tool(lookup_fn, name="lookup", prepare=prep), other], {}, RunBindings()
    raise AssertionError(mechanism)


@pytest.mark.parametrize(
    "mechanism",
    [
        "recovery_retryable",
        "tool_metadata",
        "set_tool_metadata_agent",
        "set_tool_metadata_bindings",
        "set_tool_metadata_dict_selector",
        "set_metadata_toolset",
        "set_metadata_toolset_bindings",
        "prepare",
    ],
)
@pytest.mark.parametrize("mode", ["declared", "never"])
async def test_every_marking_mechanism_is_equivalent(mechanism: str, mode: str) -> None:
    """H-53 (with H-45, H-46): SetToolMetadata, SetMetadataToolset, Tool(metadata=...) and prepare behave like
    recovery_retryable."""
    ledger = Ledger()
    tools, agent_kwargs, bindings = _marking(mechanism, ledger)
    h = harness(Script(), *tools, **agent_kwargs)
    calls = [call("lookup", "c1", x=1), call("other", "c2", x=2)]
    result = await h.run(previous_state=open_state(*calls), bindings=bindings, tool_recovery=mode)
    assert result.status == "completed"
    assert result.state is not None
    history = result.state.message_history
    assert is_unknown_for(only_return(history, "c2"), calls[1])
    if mode == "declared":
        assert ledger.ids() == ["c1"]
        assert ledger.execs[0].approved is False
        assert only_return(history, "c1").content == "lookup:1"
    else:
        assert ledger.execs == []
        assert is_unknown_for(only_return(history, "c1"), calls[0])


@pytest.mark.parametrize(
    "args", [{"x": "not a number"}, {"y": 1}, '{"x": 1'], ids=["wrong_type", "missing", "broken_json"]
)
async def test_replayed_call_with_invalid_args_is_retried_not_run(args: Any) -> None:
    """H-54: a replay passes normal argument validation; invalid arguments give `outcome="retried"`."""
    ledger = Ledger()
    script = Script()
    h = harness(script, ledger.tool("lookup", safe=True))
    bad = ToolCallPart(tool_name="lookup", args=args, tool_call_id="c1")
    good = call("lookup", "c2", x=2)
    result = await h.run(previous_state=open_state(bad, good))
    assert result.status == "completed"
    assert ledger.ids() == ["c2"]
    assert result.state is not None
    history = result.state.message_history
    retried = only_return(history, "c1")
    assert retried.outcome == "retried"
    assert retried.metadata is None or UNKNOWN_OUTCOME_METADATA_KEY not in retried.metadata
    assert only_return(history, "c2").content == "lookup:2"
    sent = script.seen[0][-1]
    assert [p.tool_call_id for p in sent.parts if isinstance(p, ToolReturnPart)] == ["c1", "c2"]


# -- H-55, H-56, H-57 ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["declared", "always"])
@pytest.mark.parametrize("sibling", [False, True])
async def test_replay_of_approval_gated_tool_asks_again(mode: str, sibling: bool) -> None:
    """H-55, H-63: a `requires_approval=True` tool suspends with a fresh approval request instead of running;
    approving it through a fresh batch runs it with `tool_call_approved` True. With `sibling`, an unapproved
    sibling call is closed (declared) or replayed (always) in the same start, so the state ends in a request."""
    ledger = Ledger()
    tools = (ledger.tool("wire", safe=True, requires_approval=True), ledger.tool("note"))
    calls = [call("wire", "c1", x=100)] + ([call("note", "c2", x=1)] if sibling else [])
    state = open_state(*calls)
    suspended = await harness(Script(), *tools).run(previous_state=state, tool_recovery=mode)
    assert suspended.status == "suspended"
    assert ledger.ids() == (["c2"] if sibling and mode == "always" else [])
    deferred = suspended.deferred
    assert deferred is not None
    assert [c.tool_call_id for c in deferred.approvals] == ["c1"]
    assert deferred is not None
    assert deferred.calls == []
    assert deferred.kind("c1") == "approval"
    assert suspended.state is not None
    assert returns_for(suspended.state.message_history, "c1") == []
    if sibling:
        only_return(suspended.state.message_history, "c2")
    assert_prefix(state, suspended.state)
    assert suspended.all_messages() == list(suspended.state.message_history)  # H-34
    assert state is not None
    assert canonical(suspended.new_messages()) == canonical(
        suspended.state.message_history[len(state.message_history) :]
    )

    resume = DeferredToolResume(deferred, DeferredToolResults(approvals={"c1": True}))
    done = await harness(Script(), *tools).run(previous_state=suspended.state, deferred_resume=resume)
    assert done.status == "completed"
    wire = [e for e in ledger.execs if e.tool == "wire"]
    assert [(e.call_id, e.approved) for e in wire] == [("c1", True)]
    assert done.state is not None
    assert only_return(done.state.message_history, "c1").content == "wire:100"


async def test_replay_of_tool_raising_approval_required_asks_again() -> None:
    """H-55: inside a replay `ctx.tool_call_approved` is False, so a self-gating tool suspends for approval."""
    attempts: list[bool] = []
    effects: list[tuple[str | None, bool]] = []

    async def guarded(ctx: RunContext[Any], x: int) -> str:
        attempts.append(ctx.tool_call_approved)
        if not ctx.tool_call_approved:
            raise ApprovalRequired(metadata={"reason": "large amount"})
        effects.append((ctx.tool_call_id, ctx.tool_call_approved))
        return f"guarded:{x}"

    tool = recovery_retryable(Tool(guarded))
    suspended = await harness(Script(), tool).run(previous_state=open_state(call("guarded", "c1", x=5)))
    assert suspended.status == "suspended"
    assert attempts == [False]
    assert effects == []
    assert suspended.deferred is not None
    assert [c.tool_call_id for c in suspended.deferred.approvals] == ["c1"]
    assert suspended.deferred is not None
    assert suspended.deferred.metadata.get("c1", {}).get("reason") == "large amount"

    resume = DeferredToolResume(suspended.deferred, DeferredToolResults(approvals={"c1": True}))
    done = await harness(Script(), tool).run(previous_state=suspended.state, deferred_resume=resume)
    assert done.status == "completed"
    assert effects == [("c1", True)]
    assert done.state is not None
    assert only_return(done.state.message_history, "c1").content == "guarded:5"


@pytest.mark.parametrize(("mode", "marked"), [("declared", True), ("always", False)])
@pytest.mark.parametrize("sibling", [False, True])
async def test_replay_of_external_tool_suspends_again(mode: str, marked: bool, sibling: bool) -> None:
    """H-56: a replayed external call ends the run suspended, the call listed in `deferred.calls`; the host's
    answer through a fresh batch is then written into history."""
    ext = ExternalToolset(
        [
            ToolDefinition(
                name="ask_browser",
                parameters_json_schema=EXT_SCHEMA,
                metadata={SAFE: True} if marked else None,
            )
        ]
    )
    ledger = Ledger()
    h = harness(Script(), ledger.tool("note", safe=True))
    bindings = RunBindings(toolsets=[ext])
    calls = [call("ask_browser", "e1", q="weather")] + ([call("note", "c2", x=1)] if sibling else [])
    suspended = await h.run(previous_state=open_state(*calls), bindings=bindings, tool_recovery=mode)
    assert suspended.status == "suspended"
    assert suspended.deferred is not None
    assert [c.tool_call_id for c in suspended.deferred.calls] == ["e1"]
    assert suspended.deferred is not None
    assert suspended.deferred.approvals == []
    assert suspended.deferred.kind("e1") == "external"
    assert ledger.ids() == (["c2"] if sibling else [])
    assert suspended.state is not None
    assert returns_for(suspended.state.message_history, "e1") == []

    resume = DeferredToolResume(suspended.deferred, DeferredToolResults(calls={"e1": {"temp": 21}}))
    done = await h.run(previous_state=suspended.state, deferred_resume=resume, bindings=bindings)
    assert done.status == "completed"
    assert done.state is not None
    assert only_return(done.state.message_history, "e1").content == {"temp": 21}
    assert ledger.ids() == (["c2"] if sibling else [])


async def test_capability_hooks_see_each_replayed_call_once() -> None:
    """H-57: `before_tool_execute` and `wrap_tool_execute` of RunBindings.capabilities see each replay exactly once."""
    ledger = Ledger()
    watch = Watch()
    h = harness(Script(), ledger.tool("a", safe=True), ledger.tool("b"))
    calls = [call("a", "c1", x=1), call("b", "c2", x=2), call("a", "c3", x=3)]
    result = await h.run(previous_state=open_state(*calls), bindings=RunBindings(capabilities=[watch]))
    assert result.status == "completed"
    assert sorted(watch.before) == ["c1", "c3"]
    assert sorted(watch.wrapped) == ["c1", "c3"]
    assert sorted(ledger.ids()) == ["c1", "c3"]


async def test_blocking_hooks_prevent_replayed_execution() -> None:
    """H-57: SkipToolExecution in `before_tool_execute` or a wrapper that does not call the handler blocks a replay."""
    ledger = Ledger()
    watch = Watch(skip=frozenset({"c1"}), no_handler=frozenset({"c3"}))
    h = harness(Script(), ledger.tool("a", safe=True))
    calls = [call("a", "c1", x=1), call("a", "c2", x=2), call("a", "c3", x=3)]
    result = await h.run(previous_state=open_state(*calls), bindings=RunBindings(capabilities=[watch]))
    assert result.status == "completed"
    assert ledger.ids() == ["c2"]
    assert result.state is not None
    history = result.state.message_history
    assert only_return(history, "c1").content == "blocked by policy"
    assert only_return(history, "c3").content == "refused by wrapper"
    assert watch.before.count("c1") == 1 and watch.wrapped.count("c1") == 1


async def test_raising_hook_prevents_replay_and_fails_the_run() -> None:
    """H-57, H-31, H-103: a hook that raises blocks the replay; the failed state closes the calls."""
    ledger = Ledger()
    watch = Watch(raise_for=frozenset({"c1"}))
    h = harness(Script(), ledger.tool("a", safe=True), ledger.tool("b"))
    calls = [call("a", "c1", x=1), call("b", "c2", x=2)]
    result = await h.run(previous_state=open_state(*calls), bindings=RunBindings(capabilities=[watch]))
    assert result.status == "failed"
    assert result.failure is not None
    assert result.failure.code == "agent_run_failed"
    assert result.failure.details["error_type"] == "PermissionError"
    assert ledger.execs == []
    assert result.state is not None
    history = result.state.message_history
    every_call_answered_once(history)
    assert is_unknown_for(only_return(history, "c1"), calls[0])
    assert is_unknown_for(only_return(history, "c2"), calls[1])


async def test_calls_made_later_in_the_run_are_handled_normally() -> None:
    """H-58: recovery happens before the first model request only; the model's new calls run as usual."""
    ledger = Ledger()
    script = Script(ModelResponse(parts=[call("a", "n1", x=10), call("b", "n2", x=20)]))
    h = harness(script, ledger.tool("a"), ledger.tool("b", safe=True))
    c1 = call("a", "c1", x=1)
    result = await h.run(previous_state=open_state(c1), tool_recovery="never")
    assert result.status == "completed"
    assert sorted(ledger.ids()) == ["n1", "n2"]
    assert result.state is not None
    history = result.state.message_history
    assert is_unknown_for(only_return(history, "c1"), c1)
    assert only_return(history, "n1").content == "a:10"
    # the unknown outcome was already in the first model request
    first = script.seen[0][-1]
    assert [p.tool_call_id for p in first.parts if isinstance(p, ToolReturnPart)] == ["c1"]


@pytest.mark.parametrize("mode", ["declared", "always"])
async def test_self_gating_replay_is_denied_when_the_run_cannot_suspend(mode: str) -> None:
    """H-84, H-55: with `deferred_tools_supported=False` a replay raising ApprovalRequired is closed as denied."""
    attempts: list[bool] = []

    async def guarded(ctx: RunContext[Any], x: int) -> str:
        attempts.append(ctx.tool_call_approved)
        if not ctx.tool_call_approved:
            raise ApprovalRequired()
        return "ran"

    h = harness(Script(), recovery_retryable(Tool(guarded)))
    result = await h.run(
        previous_state=open_state(call("guarded", "c1", x=1)),
        tool_recovery=mode,
        bindings=RunBindings(deferred_tools_supported=False),
    )
    assert result.status == "completed"
    assert attempts == [False]
    assert result.state is not None
    assert only_return(result.state.message_history, "c1").outcome == "denied"


@pytest.mark.parametrize("mode", ["declared", "always"])
async def test_approval_gated_replay_when_the_run_cannot_suspend(mode: str) -> None:
    """H-84, H-55: a run that can never suspend closes the re-asked approval as denied instead of suspending."""
    ledger = Ledger()
    h = harness(Script(), ledger.tool("wire", safe=True, requires_approval=True))
    result = await h.run(
        previous_state=open_state(call("wire", "c1", x=1)),
        tool_recovery=mode,
        bindings=RunBindings(deferred_tools_supported=False),
    )
    assert result.status != "suspended"
    assert ledger.execs == []
    if result.status == "completed":
        assert result.state is not None
        assert only_return(result.state.message_history, "c1").outcome == "denied"
    else:
        assert result.failure is not None
        assert result.status == "failed" and result.failure.code == "deferred_tools_unsupported"


@pytest.mark.parametrize("with_function_call", [False, True])
async def test_restored_output_tool_call_is_processed_natively(with_function_call: bool) -> None:
    """§2, H-41, H-46: output-tool calls are never recovered; pydantic-ai processes them natively."""
    from pydantic import BaseModel

    class Answer(BaseModel):
        value: int

    ledger = Ledger()
    script = Script(ModelResponse(parts=[ToolCallPart("final_result", {"value": 2}, tool_call_id="o2")]))
    h = Harness(Agent(script.model, tools=[ledger.tool("a", safe=True)], output_type=Answer))
    parts = ([call("a", "c1", x=1)] if with_function_call else []) + [
        ToolCallPart("final_result", {"value": 1}, tool_call_id="o1")
    ]
    result = await h.run(previous_state=open_state(*parts))
    assert result.status == "completed"
    assert result.output == Answer(value=1)
    assert script.seen == []
    assert result.state is not None
    history = result.state.message_history
    only_return(history, "o1")
    assert not any(isinstance(m, ModelRequest) and not m.parts for m in history)


# -- H-59 to H-62 -------------------------------------------------------------------------------------------


async def test_provider_suspended_response_skips_recovery() -> None:
    """H-59: a final response with `state="suspended"` is continued natively; candor adds no unknown outcomes."""
    ledger = Ledger()
    script = Script(ModelResponse(parts=[TextPart(" and the rest")]))
    h = harness(script, ledger.tool("a"))
    state = state_of(prompt(), ModelResponse(parts=[TextPart("the start")], state="suspended"))
    result = await h.run(previous_state=state, tool_recovery="never")
    assert result.status == "completed"
    assert len(script.seen) == 1
    assert result.state is not None
    assert not any(
        isinstance(p.metadata, dict) and UNKNOWN_OUTCOME_METADATA_KEY in p.metadata
        for p in tool_returns(result.state.message_history)
    )
    assert result.state is not None
    assert_prefix(state, result.state)


async def test_provider_suspended_response_continuation_is_stored() -> None:
    """H-59, H-34: the continued response's content reaches the state; the state no longer ends suspended."""
    script = Script(ModelResponse(parts=[TextPart(" and the rest")]))
    h = harness(script)
    state = state_of(prompt(), ModelResponse(parts=[TextPart("the start")], state="suspended"))
    result = await h.run(previous_state=state)
    assert result.status == "completed"
    assert result.state is not None
    history = result.state.message_history
    texts = [p.content for m in history if isinstance(m, ModelResponse) for p in m.parts if isinstance(p, TextPart)]
    assert " and the rest" in "".join(texts)
    last_response = [m for m in history if isinstance(m, ModelResponse)][-1]
    assert last_response.state != "suspended"
    assert not any(isinstance(m, ModelRequest) and not m.parts for m in history)


async def test_cancel_while_recovery_is_partly_done() -> None:
    """H-60, H-105, H-103: cancelled mid-replay; the state holds earlier returns, produced returns and unknown
    outcomes; running it with "always" executes nothing."""
    done_fast: list[str | None] = []
    slow_started = asyncio.Event()
    slow_cancelled: list[bool] = []
    forever = asyncio.Event()

    async def fast(ctx: RunContext[Any], x: int) -> str:
        done_fast.append(ctx.tool_call_id)
        return f"fast:{x}"

    async def slow(ctx: RunContext[Any], x: int) -> str:
        slow_started.set()
        try:
            await forever.wait()
        except asyncio.CancelledError:
            slow_cancelled.append(True)
            raise
        return "never"

    ledger = Ledger()
    tools = (recovery_retryable(Tool(fast)), recovery_retryable(Tool(slow)), ledger.tool("plain"))
    earlier: list[ModelMessage] = [
        prompt("first"),
        ModelResponse(parts=[call("plain", "e1", x=0)]),
        ModelRequest(parts=[ToolReturnPart("plain", "recorded earlier", tool_call_id="e1")]),
    ]
    calls = [call("fast", "c1", x=1), call("slow", "c2", x=2), call("plain", "c3", x=3)]
    state = open_state(*calls, before=earlier)
    script = Script()
    stream = harness(script, *tools).stream(previous_state=state, tool_recovery="declared")
    events: list[Any] = []
    async with stream:
        async for event in stream:
            events.append(event)
            if isinstance(event, FunctionToolResultEvent) and event.tool_call_id == "c1":
                assert slow_started.is_set()
                stream.cancel()
    result = stream.outcome
    assert result is not None and result.status == "cancelled"
    assert isinstance(events[-1], RunResultEvent) and events[-1].result.status == "cancelled"
    assert script.seen == []  # no model request was sent
    assert slow_cancelled == [True]  # H-105: the running async tool was cancelled
    assert ledger.execs == []
    assert result.state is not None
    history = result.state.message_history
    assert_prefix(state, result.state)
    assert only_return(history, "e1").content == "recorded earlier"
    assert only_return(history, "c1").content == "fast:1"
    assert is_unknown_for(only_return(history, "c2"), calls[1])
    assert is_unknown_for(only_return(history, "c3"), calls[2])
    assert await stream.export_state() == result.state

    # H-60: nothing runs again.
    done_fast.clear()
    again = await harness(Script(), *tools).run(previous_state=result.state, tool_recovery="always")
    assert again.status == "completed"
    assert done_fast == [] and ledger.execs == []
    assert again.state is not None
    every_call_answered_once(again.state.message_history)


@pytest.mark.parametrize("mode", ["declared", "always"])
async def test_open_calls_after_partial_returns_are_replayed(mode: str) -> None:
    """H-46, H-47, H-42: calls left open next to recorded returns of the same response are still replayed."""
    ledger = Ledger()
    h = harness(Script(), ledger.tool("a", safe=True))
    calls = [call("a", "c0", x=0), call("a", "c1", x=1)]
    state = state_of(
        prompt(), ModelResponse(parts=calls), ModelRequest(parts=[ToolReturnPart("a", "recorded", tool_call_id="c0")])
    )
    result = await h.run(previous_state=state, tool_recovery=mode)
    assert result.status == "completed"
    assert result.state is not None
    assert_prefix(state, result.state)
    assert result.state is not None
    assert only_return(result.state.message_history, "c0").content == "recorded"
    assert ledger.ids() == ["c1"]
    assert only_return(result.state.message_history, "c1").content == "a:1"


async def test_open_calls_after_partial_returns_are_closed_once() -> None:
    """H-42, H-45, H-93: with some returns recorded, the others are closed; no id gets two returns."""
    ledger = Ledger()
    h = harness(Script(), ledger.tool("a"))
    calls = [call("a", "c0", x=0), call("a", "c1", x=1), call("a", "c2", x=2)]
    state = state_of(
        prompt(), ModelResponse(parts=calls), ModelRequest(parts=[ToolReturnPart("a", "recorded", tool_call_id="c0")])
    )
    result = await h.run(previous_state=state, tool_recovery="never")
    assert result.status == "completed"
    assert ledger.execs == []
    assert result.state is not None
    assert_prefix(state, result.state)
    assert result.state is not None
    history = result.state.message_history
    assert only_return(history, "c0").content == "recorded"
    assert is_unknown_for(only_return(history, "c1"), calls[1])
    assert is_unknown_for(only_return(history, "c2"), calls[2])


@pytest.mark.parametrize("bad", ["sometimes", "ALWAYS", "Declared", "", None, True, 1, ["never"]], ids=repr)
async def test_invalid_tool_recovery_raises_value_error(bad: Any) -> None:
    """H-61: a value other than the three literals raises ValueError when run()/stream() is called."""
    script = Script()
    h = harness(script)
    state = open_state(call("a", "c1", x=1))
    with pytest.raises(ValueError):
        h.stream(previous_state=state, tool_recovery=bad)
    with pytest.raises(ValueError):
        await h.run(previous_state=state, tool_recovery=bad)
    assert script.seen == []


@pytest.mark.parametrize("mode", ["declared", "never", "always"])
async def test_new_input_follows_the_recovery_returns(mode: str) -> None:
    """H-62, H-44: new input with open calls is accepted: returns first, then the input, in one request."""
    ledger = Ledger()
    script = Script()
    h = harness(script, ledger.tool("a"), ledger.tool("b", safe=True))
    calls = [call("a", "c1", x=1), call("b", "c2", x=2)]
    state = open_state(*calls)
    result = await h.run("what happened?", previous_state=state, tool_recovery=mode)
    assert result.status == "completed"
    new = result.new_messages()
    request = new[0]
    assert isinstance(request, ModelRequest)
    kinds = [(type(p).__name__, getattr(p, "tool_call_id", None)) for p in request.parts]
    assert kinds == [("ToolReturnPart", "c1"), ("ToolReturnPart", "c2"), ("UserPromptPart", None)]
    last = request.parts[-1]
    assert isinstance(last, UserPromptPart) and last.content == "what happened?"
    sent = script.seen[0]
    assert canonical([sent[-1]])[0]["parts"] == canonical([request])[0]["parts"]
    assert (
        sum(
            isinstance(p, UserPromptPart) and p.content == "what happened?"
            for m in sent
            if isinstance(m, ModelRequest)
            for p in m.parts
        )
        == 1
    )


# -- H-90 to H-96: recovery batches ---------------------------------------------------------------------------


def _ext_toolset(*names: str) -> ExternalToolset[Any]:
    return ExternalToolset([ToolDefinition(name=n, parameters_json_schema=EXT_SCHEMA) for n in names])


async def _suspended_pair(
    ledger: Ledger, *, wire_safe: bool, sibling: bool = False, external: bool = True
) -> tuple[Harness[Any], RunBindings, RunResult[Any]]:
    """A real suspended run: `fetch` (external, e1, unless not `external`) and `wire` (approval-gated, a1); with
    `sibling`, `note` (n1) ran in the same step, so the suspended state ends with a request holding its return."""
    parts = ([call("fetch", "e1", q="rate")] if external else []) + [call("wire", "a1", x=100)]
    if sibling:
        parts.append(call("note", "n1", x=1))
    script = Script(ModelResponse(parts=parts))
    h = harness(script, ledger.tool("wire", safe=wire_safe, requires_approval=True), ledger.tool("note"))
    bindings = RunBindings(toolsets=[_ext_toolset("fetch")])
    suspended = await h.run("pay", bindings=bindings)
    assert suspended.status == "suspended"
    assert suspended.deferred is not None
    assert [c.tool_call_id for c in suspended.deferred.calls] == (["e1"] if external else [])
    assert [c.tool_call_id for c in suspended.deferred.approvals] == ["a1"]
    assert ledger.ids() == (["n1"] if sibling else [])
    assert suspended.state is not None
    assert isinstance(suspended.state.message_history[-1], ModelRequest if sibling else ModelResponse)
    return h, bindings, suspended


async def test_recovery_batch_completes_and_is_incorporated() -> None:
    """H-90, H-93, H-94: answers are applied once; the re-offered approval is not a replay; remaining() is None."""
    ledger = Ledger()
    h, bindings, suspended = await _suspended_pair(ledger, wire_safe=False, sibling=True)
    answers = DeferredToolResults(calls={"e1": {"rate": 1.1}}, approvals={"a1": True})
    assert suspended.deferred is not None
    batch = DeferredToolResume(suspended.deferred, answers, recovery=True)
    result = await h.run(previous_state=suspended.state, deferred_resume=batch, bindings=bindings)
    assert result.status == "completed"
    assert ledger.ids() == ["n1"]  # wire never ran
    assert result.state is not None
    history = result.state.message_history
    assert only_return(history, "e1").content == {"rate": 1.1}
    a1 = [c for c in suspended.deferred.approvals if c.tool_call_id == "a1"][0]
    assert is_unknown_for(only_return(history, "a1"), a1)  # H-94: not marked → unknown outcome
    only_return(history, "n1")
    assert batch.remaining(history) is None  # H-90
    assert suspended.state is not None
    assert_prefix(suspended.state, result.state)


@pytest.mark.parametrize("mode", ["never", "declared", "always"])
async def test_recovery_batch_answers_written_once_in_every_form(mode: str) -> None:
    """H-93, H-78, H-79: external results (JSON, ToolReturn, ToolFailed) and denials are applied once, in any mode."""
    ledger = Ledger()
    script = Script(
        ModelResponse(
            parts=[
                call("fetch", "e1", q="a"),
                call("fetch", "e2", q="b"),
                call("fetch", "e3", q="c"),
                call("wire", "a1", x=1),
                call("wire", "a2", x=2),
            ]
        )
    )
    h = harness(script, ledger.tool("wire", safe=True, requires_approval=True))
    bindings = RunBindings(toolsets=[_ext_toolset("fetch")])
    suspended = await h.run("go", bindings=bindings)
    assert suspended.status == "suspended"
    answers = DeferredToolResults(
        calls={
            "e1": {"v": 1},
            "e2": ToolReturn(return_value="value-2", content="extra context", metadata={"src": "browser"}),
            "e3": ToolFailed("nope"),
        },
        approvals={"a1": False, "a2": ToolDenied("not today")},
    )
    assert suspended.deferred is not None
    batch = DeferredToolResume(suspended.deferred, answers, recovery=True)
    result = await h.run(previous_state=suspended.state, deferred_resume=batch, bindings=bindings, tool_recovery=mode)
    assert result.status == "completed"
    assert ledger.execs == []
    assert result.state is not None
    history = result.state.message_history
    e1, e2, e3 = (only_return(history, i) for i in ("e1", "e2", "e3"))
    assert (e1.content, e1.outcome) == ({"v": 1}, "success")
    assert (e2.content, e2.outcome, e2.metadata) == ("value-2", "success", {"src": "browser"})
    assert (e3.content, e3.outcome) == ("nope", "failed")
    a1, a2 = only_return(history, "a1"), only_return(history, "a2")
    assert a1.outcome == "denied"
    assert (a2.content, a2.outcome) == ("not today", "denied")
    extra = [
        p
        for m in history
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, UserPromptPart) and p.content == "extra context"
    ]
    assert len(extra) == 1
    new = result.new_messages()
    assert [p.tool_call_id for p in new[0].parts if isinstance(p, ToolReturnPart)] == ["e1", "e2", "e3", "a1", "a2"]
    assert batch.remaining(history) is None


@pytest.mark.parametrize(
    ("external", "sibling"),
    [
        pytest.param(False, False, id="approval_only"),
        pytest.param(True, False, id="with_external_answer"),
        pytest.param(True, True, id="with_sibling"),
    ],
)
async def test_recovery_batch_approval_asks_again_when_replay_would_happen(external: bool, sibling: bool) -> None:
    """H-94, H-95, H-55, H-93: declared + retry-safe: a new approval request for the same id (the external answer is
    applied); a denial through a fresh batch then gives `outcome="denied"`; the effect never happens and no state
    holds the batch."""
    ledger = Ledger()
    h, bindings, suspended = await _suspended_pair(ledger, wire_safe=True, sibling=sibling, external=external)
    ran_before = ledger.ids()
    answers = DeferredToolResults(
        calls={"e1": {"marker": "ANSWER-MARKER-1"}} if external else {}, approvals={"a1": True}
    )
    assert suspended.deferred is not None
    batch = DeferredToolResume(suspended.deferred, answers, recovery=True)
    asked = await h.run(
        previous_state=suspended.state, deferred_resume=batch, bindings=bindings, tool_recovery="declared"
    )
    assert asked.status == "suspended"
    assert asked.deferred is not None
    assert [c.tool_call_id for c in asked.deferred.approvals] == ["a1"]
    assert asked.deferred is not None
    assert asked.deferred.calls == []
    assert ledger.ids() == ran_before
    if external:
        assert asked.state is not None
        assert only_return(asked.state.message_history, "e1").content == {"marker": "ANSWER-MARKER-1"}
    assert asked.state is not None
    assert returns_for(asked.state.message_history, "a1") == []
    # H-95: the approval is nowhere in the state; no capability namespace holds the batch.
    assert set(asked.state.capabilities) <= {"candor.usage", "candor.recovery"}  # recovery_basis.py: no answers
    assert "ToolApproved" not in asked.state.model_dump_json()

    deny = DeferredToolResume(asked.deferred, DeferredToolResults(approvals={"a1": ToolDenied("changed my mind")}))
    done = await h.run(previous_state=asked.state, deferred_resume=deny, bindings=bindings)
    assert done.status == "completed"
    assert done.state is not None
    a1 = only_return(done.state.message_history, "a1")
    assert (a1.outcome, a1.content) == ("denied", "changed my mind")
    assert ledger.ids() == ran_before


@pytest.mark.parametrize(("mode", "safe"), [("never", True), ("declared", False)])
async def test_recovery_batch_approval_without_replay_is_unknown(mode: str, safe: bool) -> None:
    """H-94: under "never", or for an unmarked tool, the approved call is closed with an unknown outcome."""
    ledger = Ledger()
    h, bindings, suspended = await _suspended_pair(ledger, wire_safe=safe)
    assert suspended.deferred is not None
    batch = DeferredToolResume(
        suspended.deferred, DeferredToolResults(calls={"e1": 1}, approvals={"a1": True}), recovery=True
    )
    result = await h.run(previous_state=suspended.state, deferred_resume=batch, bindings=bindings, tool_recovery=mode)
    assert result.status == "completed"
    assert ledger.execs == []
    a1 = [c for c in suspended.deferred.approvals if c.tool_call_id == "a1"][0]
    assert result.state is not None
    assert is_unknown_for(only_return(result.state.message_history, "a1"), a1)
    assert only_return(result.state.message_history, "e1").content == 1


async def test_incorporated_recovery_batch_is_no_batch() -> None:
    """H-91, H-90: re-offering a batch that history already reflects changes nothing; the run goes on normally."""
    ledger = Ledger()
    h, bindings, suspended = await _suspended_pair(ledger, wire_safe=False, sibling=True)
    assert suspended.deferred is not None
    batch = DeferredToolResume(
        suspended.deferred, DeferredToolResults(calls={"e1": 1}, approvals={"a1": False}), recovery=True
    )
    first = await h.run(previous_state=suspended.state, deferred_resume=batch, bindings=bindings)
    assert first.status == "completed"
    again = await h.run("anything else?", previous_state=first.state, deferred_resume=batch, bindings=bindings)
    assert again.status == "completed"
    assert again.state is not None
    assert len(returns_for(again.state.message_history, "e1")) == 1
    assert ledger.ids() == ["n1"]


async def test_superseded_recovery_batch_lets_ordinary_recovery_proceed() -> None:
    """H-91, H-46: a recovery batch about an older response is ignored; the last response is recovered normally."""
    ledger = Ledger()
    h, bindings, suspended = await _suspended_pair(ledger, wire_safe=False, sibling=True)
    assert suspended.deferred is not None
    batch = DeferredToolResume(
        suspended.deferred, DeferredToolResults(calls={"e1": 1}, approvals={"a1": False}), recovery=True
    )
    first = await h.run(previous_state=suspended.state, deferred_resume=batch, bindings=bindings)
    later = call("note", "n9", x=9)
    assert first.state is not None
    state = state_of(*first.state.message_history, prompt("more"), ModelResponse(parts=[later]))
    result = await h.run(previous_state=state, deferred_resume=batch, bindings=bindings, tool_recovery="declared")
    assert result.status == "completed"
    assert result.state is not None
    assert is_unknown_for(only_return(result.state.message_history, "n9"), later)
    assert ledger.ids() == ["n1"]


async def test_partly_incorporated_recovery_batch_applies_the_rest_once() -> None:
    """H-89, H-93, H-96: only the items history does not reflect are applied; no id gets a second return."""
    ledger = Ledger()
    h, bindings, suspended = await _suspended_pair(ledger, wire_safe=False, sibling=True)
    assert suspended.deferred is not None
    batch = DeferredToolResume(
        suspended.deferred, DeferredToolResults(calls={"e1": 1}, approvals={"a1": False}), recovery=True
    )
    # e1's answer already reached history (a host saved after writing it), a1's did not.
    assert suspended.state is not None
    partial = state_of(
        *suspended.state.message_history, ModelRequest(parts=[ToolReturnPart("fetch", 1, tool_call_id="e1")])
    )
    result = await h.run(previous_state=partial, deferred_resume=batch, bindings=bindings, tool_recovery="never")
    assert result.status == "completed"
    assert result.state is not None
    history = result.state.message_history
    assert only_return(history, "e1").content == 1
    assert only_return(history, "a1").outcome == "denied"
    assert ledger.ids() == ["n1"]


async def test_recovery_batch_checked_against_history() -> None:
    """H-92, H-73: a changed tool name in a recovery batch raises deferred_request_mismatch before any work."""
    ledger = Ledger()
    h, bindings, suspended = await _suspended_pair(ledger, wire_safe=True, sibling=True)
    requests = copy.deepcopy(suspended.deferred)
    assert requests is not None
    requests.calls[0] = dataclasses.replace(requests.calls[0], tool_name="fetch_v2")
    batch = DeferredToolResume(requests, DeferredToolResults(calls={"e1": 1}, approvals={"a1": True}), recovery=True)
    assert suspended.state is not None
    before = suspended.state.model_dump_json()
    with pytest.raises(RunError) as info:
        h.stream(previous_state=suspended.state, deferred_resume=batch, bindings=bindings)
    assert info.value.code == "deferred_request_mismatch"
    with pytest.raises(RunError) as info:
        await h.run(previous_state=suspended.state, deferred_resume=batch, bindings=bindings)
    assert info.value.code == "deferred_request_mismatch"
    assert suspended.state.model_dump_json() == before
    assert ledger.ids() == ["n1"]


async def test_pending_batch_input_survives_cancel_and_is_not_closed() -> None:
    """H-96, H-95, H-103, H-105, H-60: cancelled during a replay next to a pending batch answer; the answer stays
    pending (not closed, not in the state), is readable after shutdown, and a later run applies it once."""
    slow_started = asyncio.Event()
    forever = asyncio.Event()
    executions: list[str | None] = []

    async def slow(ctx: RunContext[Any], x: int) -> str:
        executions.append(ctx.tool_call_id)
        slow_started.set()
        await forever.wait()
        return "never"

    tools = [recovery_retryable(Tool(slow))]
    bindings = RunBindings(toolsets=[_ext_toolset("fetch")])
    script = Script(ModelResponse(parts=[call("fetch", "e1", q="x"), call("slow", "s1", x=1)]))
    h = harness(script, *tools)
    # First run: e1 is deferred, s1 starts; the host cancels it -> s1 is closed with an unknown outcome.
    first = h.stream("go", bindings=bindings)
    async with first:
        async for event in first:
            if isinstance(event, FunctionToolCallEvent) and event.part.tool_call_id == "s1":
                await asyncio.wait_for(slow_started.wait(), 5)
                first.cancel()
    cancelled = first.outcome
    assert cancelled is not None
    assert cancelled.status == "cancelled"
    s1 = call("slow", "s1", x=1)
    e1 = call("fetch", "e1", q="x")
    assert cancelled.state is not None
    assert is_unknown_for(only_return(cancelled.state.message_history, "s1"), s1)
    assert is_unknown_for(only_return(cancelled.state.message_history, "e1"), e1)  # H-103: no batch pending

    # A state with e1 and s1 open, an accepted answer for e1, and s1 blocking again.
    executions.clear()
    slow_started.clear()
    state = open_state(e1, s1)
    requests = DeferredToolRequests(calls=[e1])
    batch = DeferredToolResume(
        requests, DeferredToolResults(calls={"e1": {"marker": "ANSWER-MARKER-2"}}), recovery=True
    )
    stream = harness(Script(), *tools).stream(previous_state=state, deferred_resume=batch, bindings=bindings)
    async with stream:
        pending = stream.pending_deferred_input
        assert pending is not None and pending.recovery is True
        assert pending.results.calls == {"e1": {"marker": "ANSWER-MARKER-2"}}
        async for event in stream:
            if isinstance(event, FunctionToolCallEvent) and event.part.tool_call_id == "s1":
                await asyncio.wait_for(slow_started.wait(), 5)
                stream.cancel()
    result = stream.outcome
    assert result is not None
    assert result.status == "cancelled"
    assert executions == ["s1"]
    assert result.state is not None
    history = result.state.message_history
    assert is_unknown_for(only_return(history, "s1"), s1)
    assert returns_for(history, "e1") == []  # H-103: pending batch input keeps the call open
    assert "ANSWER-MARKER-2" not in result.state.model_dump_json()  # H-95
    after = stream.pending_deferred_input  # H-96: readable after shutdown
    assert after is not None and after.recovery is True
    assert [c.tool_call_id for c in after.requests.calls] == ["e1"]
    assert after.results.calls == {"e1": {"marker": "ANSWER-MARKER-2"}}

    # The host re-offers what is pending: applied once; s1 (unknown outcome) is not run again.
    executions.clear()
    stream2 = harness(Script(), *tools).stream(
        previous_state=result.state, deferred_resume=after, bindings=bindings, tool_recovery="always"
    )
    await consume(stream2)
    final = stream2.outcome
    assert final is not None
    assert final.status == "completed"
    assert executions == []
    assert final.state is not None
    assert only_return(final.state.message_history, "e1").content == {"marker": "ANSWER-MARKER-2"}
    only_return(final.state.message_history, "s1")
    assert stream2.pending_deferred_input is None  # H-96: all incorporated


async def test_fresh_batch_pending_input_is_offered_as_recovery() -> None:
    """H-96: while a fresh batch is not incorporated, `pending_deferred_input` re-offers it with recovery=True."""
    ledger = Ledger()
    h, bindings, suspended = await _suspended_pair(ledger, wire_safe=False)
    assert suspended.deferred is not None
    batch = DeferredToolResume(suspended.deferred, DeferredToolResults(calls={"e1": 1}, approvals={"a1": True}))
    stream = h.stream(previous_state=suspended.state, deferred_resume=batch, bindings=bindings)
    async with stream:
        pending = stream.pending_deferred_input
        assert pending is not None and pending.recovery is True
        assert {c.tool_call_id for c in pending.requests.calls} == {"e1"}
        assert {c.tool_call_id for c in pending.requests.approvals} == {"a1"}
        async for _ in stream:
            pass
    assert stream.outcome is not None
    assert stream.outcome.status == "completed"
    assert stream.pending_deferred_input is None
    assert [(e.call_id, e.approved) for e in ledger.execs if e.tool == "wire"] == [("a1", True)]


async def test_fresh_resume_after_suspension_with_sibling_return() -> None:
    """H-63, H-74, H-96: a suspended step whose sibling ran (its return ends the state) resumes with a fresh batch."""
    ledger = Ledger()
    h, bindings, suspended = await _suspended_pair(ledger, wire_safe=False, sibling=True)
    assert suspended.deferred is not None
    batch = DeferredToolResume(suspended.deferred, DeferredToolResults(calls={"e1": 1}, approvals={"a1": True}))
    result = await h.run(previous_state=suspended.state, deferred_resume=batch, bindings=bindings)
    assert result.status == "completed"
    assert [(e.call_id, e.approved) for e in ledger.execs] == [("n1", False), ("a1", True)]
    assert result.state is not None
    every_call_answered_once(result.state.message_history)


async def test_failed_run_keeps_pending_batch_calls_open() -> None:
    """H-103, H-31, H-96: a replay raising fails the run; the failed state closes the call with an unknown outcome
    but leaves the call whose accepted answer is still pending open."""

    async def boom(x: int) -> str:
        raise RuntimeError("tool exploded")

    bindings = RunBindings(toolsets=[_ext_toolset("fetch")])
    e1, b1 = call("fetch", "e1", q="x"), call("boom", "b1", x=1)
    batch = DeferredToolResume(
        DeferredToolRequests(calls=[e1]), DeferredToolResults(calls={"e1": "answer"}), recovery=True
    )
    stream = harness(Script(), recovery_retryable(Tool(boom))).stream(
        previous_state=open_state(e1, b1), deferred_resume=batch, bindings=bindings
    )
    await consume(stream)
    result = stream.outcome
    assert result is not None
    assert result.status == "failed"
    assert result.failure is not None
    assert result.failure.code == "agent_run_failed"
    assert result.failure.details == {"error_type": "RuntimeError"}
    assert result.state is not None
    history = result.state.message_history
    assert is_unknown_for(only_return(history, "b1"), b1)
    assert returns_for(history, "e1") == []
    assert stream.pending_deferred_input is not None
    assert [c.tool_call_id for c in stream.pending_deferred_input.requests.calls] == ["e1"]


async def test_failed_and_cancelled_candidates_close_open_calls() -> None:
    """H-103, H-105: without pending batch input every unanswered call of a failed or cancelled run is closed."""
    # failed: a tool raises during an ordinary step
    ledger = Ledger()

    async def boom(x: int) -> str:
        raise RuntimeError("tool exploded")

    script = Script(ModelResponse(parts=[call("boom", "b1", x=1), call("a", "c2", x=2)]))
    failed = await harness(script, Tool(boom), ledger.tool("a")).run("go")
    assert failed.status == "failed"
    assert failed.state is not None
    every_call_answered_once(failed.state.message_history)
    assert is_unknown_for(only_return(failed.state.message_history, "b1"), call("boom", "b1", x=1))

    # cancelled: the consumer leaves at a tool boundary
    ledger2 = Ledger()
    script2 = Script(ModelResponse(parts=[call("a", "c1", x=1)]))
    stream = harness(script2, ledger2.tool("a")).stream("go")
    async with stream:
        async for event in stream:
            if isinstance(event, BoundaryEvent) and event.kind == "tool":
                stream.cancel()
    assert stream.outcome is not None
    assert stream.outcome.status == "cancelled"
    assert ledger2.execs == []
    assert stream.outcome.state is not None
    assert is_unknown_for(only_return(stream.outcome.state.message_history, "c1"), call("a", "c1", x=1))


async def test_cancel_at_model_boundary_sends_no_request() -> None:
    """H-105: cancel() takes effect at the earliest point: after a model boundary no request is sent."""
    script = Script()
    stream = harness(script).stream("hello")
    events = []
    async with stream:
        async for event in stream:
            events.append(event)
            if isinstance(event, BoundaryEvent) and event.kind == "model":
                stream.cancel()
    assert script.seen == []
    assert stream.outcome is not None
    assert stream.outcome.status == "cancelled"
    assert isinstance(events[-1], RunResultEvent)
    assert stream.outcome.state is not None
