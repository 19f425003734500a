"""Tests for `candor.harness.stream`: RunStream boundaries, checkpoints, misuse, steering and cancel.

Rules: H-35 to H-39 (safe boundaries and append-only checkpoints), H-97 to H-100 (stream misuse, export_state,
result/outcome), H-104 (steering), H-105 (cancel). Every behaviour is checked with a non-streaming
`FunctionModel` and, where model events matter, with a streaming one.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from dataclasses import dataclass
from typing import Any

import pytest
from pydantic import JsonValue
from pydantic_ai import Agent, Tool
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

from candor import BoundaryEvent, Harness, HarnessState, RunBindings, RunResultEvent, RunStream
from candor.errors import RunError, StateError
from candor.tools import UNKNOWN_OUTCOME_CONTENT, recovery_retryable

from scripted import boundaries, calls, canonical, consume, make_agent, script, text, tool_call

STREAMING = pytest.mark.parametrize("stream_model", [False, True], ids=["request", "streamed"])


def open_calls(history: tuple[Any, ...] | list[Any]) -> list[ToolCallPart]:
    """Calls of the last response without a later return."""
    index = max((i for i, m in enumerate(history) if isinstance(m, ModelResponse)), default=None)
    if index is None:
        return []
    answered = {
        p.tool_call_id
        for m in history[index + 1 :]
        if isinstance(m, ModelRequest)
        for p in m.parts
        if isinstance(p, ToolReturnPart)
    }
    return [p for p in history[index].parts if isinstance(p, ToolCallPart) and p.tool_call_id not in answered]


def two_step_agent(
    log: list[Any], *, stream_model: bool = False, delay: float = 0.0, extra: tuple[Any, ...] = ()
) -> Any:
    """Model: add → (echo, add) → "done". Tools and model append to `log`."""

    async def logged_add(a: int, b: int) -> int:
        log.append(("tool-start", "add"))
        await asyncio.sleep(delay)
        log.append(("tool-end", "add"))
        return a + b

    async def logged_echo(value: str) -> str:
        log.append(("tool-start", "echo"))
        await asyncio.sleep(delay)
        log.append(("tool-end", "echo"))
        return value

    def step(response: ModelResponse) -> Any:
        def respond(messages: Any, info: Any) -> ModelResponse:
            log.append(("model",))
            return response

        return respond

    model = script(
        step(calls(tool_call("logged_add", {"a": 1, "b": 2}, "c1"))),
        step(calls(tool_call("logged_echo", {"value": "v"}, "c2"), tool_call("logged_add", {"a": 3, "b": 4}, "c3"))),
        step(text("done")),
        stream=stream_model,
    )
    return make_agent(model, logged_add, logged_echo, *extra)


# ---------------------------------------------------------------------------------------------- H-35, H-38


@STREAMING
async def test_boundaries_come_before_every_request_and_tool_step(stream_model: bool) -> None:
    """H-35, H-38: model boundary before each request (first included), tool boundary before each tool step."""
    log: list[Any] = []
    agent = two_step_agent(log, stream_model=stream_model, delay=0.01)
    async with Harness(agent).stream("go") as stream:
        async for event in stream:
            if isinstance(event, BoundaryEvent):
                log.append(("boundary", event.kind, event.index, event.message_count))
            elif isinstance(event, RunResultEvent):
                log.append(("result",))
    assert stream.outcome is not None
    assert stream.outcome.status == "completed"
    second_tools = log[8:12]
    assert log[:8] == [
        ("boundary", "model", 1, 1),
        ("model",),
        ("boundary", "tool", 2, 2),
        ("tool-start", "add"),
        ("tool-end", "add"),
        ("boundary", "model", 3, 3),
        ("model",),
        ("boundary", "tool", 4, 4),
    ]
    assert sorted(second_tools) == sorted(
        [("tool-start", "echo"), ("tool-end", "echo"), ("tool-start", "add"), ("tool-end", "add")]
    )
    assert log[12:] == [("boundary", "model", 5, 5), ("model",), ("result",)]


@STREAMING
async def test_no_boundary_while_tools_run(stream_model: bool) -> None:
    """H-38: between the first tool call event and the last tool result of a response no BoundaryEvent appears."""
    log: list[Any] = []
    agent = two_step_agent(log, stream_model=stream_model, delay=0.01)
    running = 0
    events: list[Any] = []
    async with Harness(agent).stream("go") as stream:
        async for event in stream:
            events.append(event)
            if isinstance(event, BoundaryEvent):
                starts = sum(1 for entry in log if entry[0] == "tool-start")
                ends = sum(1 for entry in log if entry[0] == "tool-end")
                running = starts - ends
                assert running == 0
    open_ids: set[str] = set()
    for event in events:
        if isinstance(event, FunctionToolCallEvent):
            open_ids.add(event.part.tool_call_id)
        elif isinstance(event, FunctionToolResultEvent):
            open_ids.discard(event.tool_call_id)
        elif isinstance(event, BoundaryEvent):
            assert not open_ids, f"boundary {event} while {open_ids} ran"


@STREAMING
async def test_stream_forwards_pydantic_ai_events(stream_model: bool) -> None:
    """H-35 (§3.7): pydantic-ai's own events are forwarded; RunResultEvent is last."""
    events = await consume(Harness(two_step_agent([], stream_model=stream_model)).stream("go"))
    kinds = {type(e).__name__ for e in events}
    assert {"FunctionToolCallEvent", "FunctionToolResultEvent", "BoundaryEvent", "RunResultEvent"} <= kinds
    if stream_model:
        assert "PartStartEvent" in kinds
    assert isinstance(events[-1], RunResultEvent)
    assert sum(isinstance(e, RunResultEvent) for e in events) == 1
    assert [b.index for b in boundaries(events)] == [1, 2, 3, 4, 5]


async def test_output_tool_call_has_no_tool_boundary_requirement() -> None:
    """H-35: a run with structured output still has a model boundary before every request."""
    from pydantic import BaseModel

    class Answer(BaseModel):
        value: int

    agent = make_agent(
        script(calls(tool_call("add", {"a": 1, "b": 2})), calls(tool_call("final_result", {"value": 3}, "c9"))),
        output_type=Answer,
    )
    stream = Harness(agent).stream("go")
    events = await consume(stream)
    assert stream.outcome is not None
    assert stream.outcome.output == Answer(value=3)
    kinds = [b.kind for b in boundaries(events)]
    assert kinds[:3] == ["model", "tool", "model"]
    assert kinds.count("model") == 2


# ---------------------------------------------------------------------------------------------- H-36


@STREAMING
async def test_run_waits_for_the_consumer_after_a_boundary(stream_model: bool) -> None:
    """H-36: after a BoundaryEvent nothing (no model request, no tool) happens until the next event is asked for."""
    log: list[Any] = []
    agent = two_step_agent(log, stream_model=stream_model)
    async with Harness(agent).stream("go") as stream:
        async for event in stream:
            if isinstance(event, BoundaryEvent):
                before = list(log)
                for _ in range(20):
                    await asyncio.sleep(0)
                await asyncio.sleep(0.02)
                assert log == before, f"work happened after {event}"
    assert stream.outcome is not None
    assert stream.outcome.status == "completed"


# ---------------------------------------------------------------------------------------------- H-37


@STREAMING
async def test_export_state_at_boundaries(stream_model: bool) -> None:
    """H-37: at a tool boundary the last message is that response with every call open; at a model boundary none is."""
    log: list[Any] = []
    agent = two_step_agent(log, stream_model=stream_model)
    checked: list[str] = []
    async with Harness(agent).stream("go") as stream:
        async for event in stream:
            if not isinstance(event, BoundaryEvent):
                continue
            history = (await stream.export_state()).message_history
            assert len(history) == event.message_count
            if event.kind == "tool":
                last = history[-1]
                assert isinstance(last, ModelResponse)
                call_ids = [p.tool_call_id for p in last.parts if isinstance(p, ToolCallPart)]
                assert call_ids and [c.tool_call_id for c in open_calls(history)] == call_ids
            else:
                assert open_calls(history) == []
                assert isinstance(history[-1], ModelRequest)
            checked.append(event.kind)
    assert checked == ["model", "tool", "model", "tool", "model"]


# ---------------------------------------------------------------------------------------------- H-39


def echo_value(value: str) -> str:
    return value


def _assert_append_only(states: list[HarnessState]) -> None:
    for earlier, later in itertools.pairwise(states):
        before = canonical(earlier.message_history)
        after = canonical(later.message_history)
        assert after[: len(before)] == before


APPEND_SCENARIOS = {
    "fresh": lambda: (None, None),
    "continued": lambda: (
        HarnessState(
            schema_version="1",
            thread_id="thr_prev",
            message_history=[ModelRequest(parts=[UserPromptPart("hello")]), ModelResponse(parts=[TextPart("hi")])],
        ),
        "go",
    ),
    "recovered": lambda: (
        HarnessState(
            schema_version="1",
            thread_id="thr_open",
            message_history=[
                ModelRequest(parts=[UserPromptPart("hello")]),
                ModelResponse(parts=[tool_call("echo", {"value": "x"}, "c0")]),
            ],
        ),
        "go",
    ),
    "replayed": lambda: (
        HarnessState(
            schema_version="1",
            thread_id="thr_open",
            message_history=[
                ModelRequest(parts=[UserPromptPart("hello")]),
                ModelResponse(
                    parts=[tool_call("echo", {"value": "x"}, "c0"), tool_call("safe_echo", {"value": "y"}, "c1")]
                ),
            ],
        ),
        None,
    ),
}


@STREAMING
@pytest.mark.parametrize("scenario", list(APPEND_SCENARIOS))
async def test_histories_grow_append_only(stream_model: bool, scenario: str) -> None:
    """H-39: each boundary's history starts with the previous boundary's history (canonical JSON equal)."""
    previous, prompt = APPEND_SCENARIOS[scenario]()
    agent = two_step_agent(
        [], stream_model=stream_model, extra=(recovery_retryable(Tool(echo_value, name="safe_echo")),)
    )
    states: list[HarnessState] = [previous] if previous is not None else []
    async with Harness(agent).stream(prompt or "go", previous_state=previous) as stream:
        async for event in stream:
            if isinstance(event, BoundaryEvent):
                states.append(await stream.export_state())
                if event.index == 2:
                    await stream.steer("also this", key="k1")
    assert stream.outcome is not None and stream.outcome.state is not None
    states.append(stream.outcome.state)
    assert stream.outcome.status == "completed"
    _assert_append_only(states)
    assert len(states[-1].message_history) > len(states[0].message_history)


async def test_failed_and_cancelled_states_extend_the_last_boundary() -> None:
    """H-39: the state of a failed or cancelled run also starts with the last boundary's history."""

    async def broken() -> str:
        raise RuntimeError("x")

    agent = make_agent(
        script(calls(tool_call("add", {"a": 1, "b": 2})), calls(tool_call("broken", call_id="c2"))), broken
    )
    states: list[HarnessState] = []
    async with Harness(agent).stream("go") as stream:
        async for event in stream:
            if isinstance(event, BoundaryEvent):
                states.append(await stream.export_state())
    assert stream.outcome is not None
    assert stream.outcome.status == "failed"
    assert stream.outcome is not None and stream.outcome.state is not None
    _assert_append_only([*states, stream.outcome.state])

    agent = two_step_agent([])
    states = []
    async with Harness(agent).stream("go") as stream:
        async for event in stream:
            if isinstance(event, BoundaryEvent):
                states.append(await stream.export_state())
                if event.index == 4:
                    stream.cancel()
    assert stream.outcome is not None
    assert stream.outcome.status == "cancelled"
    assert stream.outcome is not None and stream.outcome.state is not None
    _assert_append_only([*states, stream.outcome.state])


# ---------------------------------------------------------------------------------------------- H-97


def simple_agent() -> Any:
    return make_agent(script(text("done"), text("again")))


async def test_entering_twice_raises_reused() -> None:
    """H-97: a RunStream can be entered once; entering again (open or closed) → run_stream_reused."""
    stream = Harness(simple_agent()).stream("go")
    async with stream:
        with pytest.raises(RunError) as info:
            await stream.__aenter__()
        assert info.value.code == "run_stream_reused"
        async for _ in stream:
            pass
    with pytest.raises(RunError) as info:
        async with stream:
            pass
    assert info.value.code == "run_stream_reused"


async def _drain(iterator: Any) -> None:
    """Consume an already opened iterator (`async for` would open a second one)."""
    while True:
        try:
            await iterator.__anext__()
        except StopAsyncIteration:
            return


async def test_second_iterator_raises_reused() -> None:
    """H-97: opening a second iterator → run_stream_reused."""
    async with Harness(simple_agent()).stream("go") as stream:
        iterator = stream.__aiter__()
        with pytest.raises(RunError) as info:
            stream.__aiter__()
        assert info.value.code == "run_stream_reused"
        await _drain(iterator)
    assert stream.outcome is not None
    assert stream.outcome.status == "completed"


async def test_concurrent_next_raises() -> None:
    """H-97: a second __anext__ while one is pending → run_stream_concurrent_next; the first one is unaffected."""
    started = asyncio.Event()
    release = asyncio.Event()

    async def slow_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        # No event can reach the consumer while the model request is held open.
        started.set()
        await release.wait()
        return ModelResponse(parts=[TextPart("done")])

    agent = Agent(FunctionModel(slow_model))
    async with Harness(agent).stream("go") as stream:
        iterator = stream.__aiter__()
        event = await iterator.__anext__()
        assert isinstance(event, BoundaryEvent) and event.kind == "model"
        pending = asyncio.ensure_future(iterator.__anext__())
        await asyncio.wait_for(started.wait(), timeout=5)
        with pytest.raises(RunError) as info:
            await iterator.__anext__()
        assert info.value.code == "run_stream_concurrent_next"
        release.set()
        await asyncio.wait_for(pending, timeout=5)
        await _drain(iterator)
    assert stream.outcome is not None
    assert stream.outcome.status == "completed"
    assert stream.outcome.output == "done"


async def _assert_refused_before_model_work(code: str, *args: Any, **options: Any) -> None:
    """stream(*args, **options) raises RunError(code) at once, run() raises it too, and no model request is made."""
    model = script(text("never"))
    harness = Harness(make_agent(model))
    with pytest.raises(RunError) as info:
        harness.stream(*args, **options)
    assert info.value.code == code
    with pytest.raises(RunError) as info:
        await harness.run(*args, **options)
    assert info.value.code == code
    assert model.seen == []


async def test_input_and_input_factory_conflict() -> None:
    """H-97: both input and input_factory → input_source_conflict, raised by run() and stream() at once."""

    async def factory() -> str:
        return "lazy"

    await _assert_refused_before_model_work("input_source_conflict", "eager", input_factory=factory)


async def test_input_factory_supplies_the_input_lazily() -> None:
    """H-97 (§3.5): input_factory is called once, at run start, and its value is the input."""
    calls_made: list[str] = []

    async def factory() -> str:
        calls_made.append("called")
        return "lazy input"

    model = script(text("done"))
    stream = Harness(make_agent(model)).stream(input_factory=factory)
    assert calls_made == []
    await consume(stream)
    assert calls_made == ["called"]
    prompts = [p.content for m in model.seen[0] for p in m.parts if isinstance(p, UserPromptPart)]
    assert prompts == ["lazy input"]


async def test_input_factory_failure() -> None:
    """H-97: an input_factory that raises → RunError(input_factory_failed); no model request is made."""

    async def factory() -> str:
        raise OSError("secret")

    model = script(text("never"))
    with pytest.raises(RunError) as info:
        await Harness(make_agent(model)).run(input_factory=factory)
    assert info.value.code == "input_factory_failed"
    assert "secret" not in json.dumps(info.value.details)
    assert model.seen == []
    stream = Harness(make_agent(model)).stream(input_factory=factory)
    with pytest.raises(RunError) as info:
        async with stream:
            async for _ in stream:
                pass
    assert info.value.code == "input_factory_failed"


class NotAProvider:
    async def restore(self, data: Any) -> None: ...


@pytest.mark.parametrize(
    "bindings",
    [
        {"deps": 1},
        "bindings",
        RunBindings(toolsets=[object()]),  # type: ignore[list-item]
        RunBindings(capabilities=[object()]),  # type: ignore[list-item]
        RunBindings(environments={"m": NotAProvider()}),  # type: ignore[dict-item]
        RunBindings(environments={"": NotAProvider()}),  # type: ignore[dict-item]
        RunBindings(environments=[("m", 1)]),  # type: ignore[arg-type]
        RunBindings(deferred_tools_supported="yes"),  # type: ignore[arg-type]
    ],
    ids=["dict", "str", "toolset", "capability", "provider", "blank-mount", "env-list", "flag"],
)
async def test_invalid_bindings(bindings: Any) -> None:
    """H-97: invalid bindings → RunError(run_bindings_invalid), from stream() and run(), before model work."""
    await _assert_refused_before_model_work("run_bindings_invalid", "go", bindings=bindings)


async def test_steer_on_inactive_stream() -> None:
    """H-97: steer() before entering or after close → RunError(run_not_active)."""
    stream = Harness(simple_agent()).stream("go")
    with pytest.raises(RunError) as info:
        await stream.steer("early")
    assert info.value.code == "run_not_active"
    await consume(stream)
    with pytest.raises(RunError) as info:
        await stream.steer("late", key="k")
    assert info.value.code == "run_not_active"


# ---------------------------------------------------------------------------------------------- H-98, H-99


async def test_export_state_before_enter_raises() -> None:
    """H-98: export_state() on a stream not yet entered → StateError(run_not_active)."""
    stream = Harness(simple_agent()).stream("go")
    with pytest.raises(StateError) as info:
        await stream.export_state()
    assert info.value.code == "run_not_active"


async def test_export_state_during_run_is_the_latest_boundary() -> None:
    """H-98: between boundaries export_state() returns the most recent boundary's state, unchanged."""
    previous = HarnessState.new("thr_export")
    agent = two_step_agent([])
    async with Harness(agent).stream("go", previous_state=previous) as stream:
        assert await stream.export_state() == previous
        boundary_state: HarnessState | None = None
        async for event in stream:
            if isinstance(event, BoundaryEvent):
                boundary_state = await stream.export_state()
                assert await stream.export_state() == boundary_state
            elif isinstance(event, (FunctionToolCallEvent, FunctionToolResultEvent)):
                # tools are running or done, but no boundary was reached since
                assert boundary_state is not None
                assert canonical((await stream.export_state()).message_history) == canonical(
                    boundary_state.message_history
                )


@dataclass
class NanProvider:
    async def restore(self, data: JsonValue | None) -> None:
        return None

    async def export(self) -> JsonValue:
        return {"x": float("nan")}


async def test_export_state_after_failed_capture_raises_unavailable() -> None:
    """H-98: when no state could be captured at shutdown → StateError(run_state_unavailable)."""
    stream = Harness(simple_agent()).stream("go", bindings=RunBindings(environments={"m": NanProvider()}))
    await consume(stream)
    assert stream.outcome is not None
    assert stream.outcome.state is None
    with pytest.raises(StateError) as info:
        await stream.export_state()
    assert info.value.code == "run_state_unavailable"


def _suspending_agent() -> Any:
    def delete(path: str) -> str:
        return path

    return make_agent(script(calls(tool_call("delete", {"path": "/x"}))), Tool(delete, requires_approval=True))


def _failing_agent() -> Any:
    async def broken() -> str:
        raise RuntimeError("x")

    return make_agent(script(calls(tool_call("broken"))), broken)


@pytest.mark.parametrize(
    ("make", "status", "stop_at"),
    [
        (lambda: two_step_agent([]), "completed", None),
        (_suspending_agent, "suspended", None),
        (_failing_agent, "failed", None),
        (lambda: two_step_agent([]), "cancelled", "cancel"),
        (lambda: two_step_agent([]), "cancelled", "break"),
    ],
    ids=["completed", "suspended", "failed", "cancel", "break"],
)
async def test_export_state_after_close_equals_outcome_state(make: Any, status: str, stop_at: str | None) -> None:
    """H-98, H-99: after close, export_state() == stream.outcome.state, whatever the status."""
    async with Harness(make()).stream("go") as stream:
        async for event in stream:
            if isinstance(event, BoundaryEvent) and event.index == 3:
                if stop_at == "cancel":
                    stream.cancel()
                elif stop_at == "break":
                    break
    outcome = stream.outcome
    assert outcome is not None
    assert outcome.status == status
    assert outcome.state is not None
    exported = await stream.export_state()
    assert exported == outcome.state
    assert exported.model_dump_json() == outcome.state.model_dump_json()


# ---------------------------------------------------------------------------------------------- H-100


async def test_result_and_outcome_timing() -> None:
    """H-100: result stays None until RunResultEvent is delivered; outcome stays None until shutdown."""
    stream = Harness(two_step_agent([])).stream("go")
    assert (stream.result, stream.outcome) == (None, None)
    async with stream:
        async for event in stream:
            if isinstance(event, RunResultEvent):
                assert stream.result is event.result
                assert stream.outcome is None
            else:
                assert stream.result is None
                assert stream.outcome is None
        assert stream.outcome is not None
    assert stream.result is not None
    assert stream.outcome.status == stream.result.status == "completed"
    assert stream.outcome.state == stream.result.state


async def test_outcome_without_result_when_consumer_leaves_early() -> None:
    """H-100: a consumer that leaves before the end gets an outcome at shutdown but never a result."""
    async with Harness(two_step_agent([])).stream("go") as stream:
        async for event in stream:
            if isinstance(event, BoundaryEvent) and event.kind == "tool":
                break
        assert stream.result is None
    assert stream.result is None
    assert stream.outcome is not None
    assert stream.outcome.status == "cancelled"


# ---------------------------------------------------------------------------------------------- H-104


def _steering(state: HarnessState) -> Any:
    namespace = state.capabilities.get("candor.steering")
    return None if namespace is None else namespace.data


async def test_steer_enters_history_before_next_request() -> None:
    """H-104: steered input is added as user-prompt content before the next model request; its key is reported."""
    model = script(calls(tool_call("add", {"a": 1, "b": 2})), text("done"))
    agent = make_agent(model)
    seen_boundaries: list[BoundaryEvent] = []
    exported: dict[int, HarnessState] = {}
    async with Harness(agent).stream("go") as stream:
        async for event in stream:
            if isinstance(event, BoundaryEvent):
                seen_boundaries.append(event)
                exported[event.index] = await stream.export_state()
                if event.index == 1:
                    await stream.steer("please also check", key="k1")
    assert [b.incorporated_keys for b in seen_boundaries] == [(), (), ("k1",)]
    # between steer() and incorporation the steering namespace carries the input with its key
    pending = _steering(exported[2])
    assert pending is not None
    assert "k1" in json.dumps(pending) and "please also check" in json.dumps(pending)
    # once incorporated it leaves the namespace
    assert _steering(exported[3]) is None
    assert stream.outcome is not None and stream.outcome.state is not None
    assert _steering(stream.outcome.state) is None
    # the second request sent to the model holds the tool return and then the steered input
    second = model.seen[1]
    last_request = second[-1]
    assert isinstance(last_request, ModelRequest)
    assert isinstance(last_request.parts[0], ToolReturnPart)
    assert [p.content for p in last_request.parts if isinstance(p, UserPromptPart)] == ["please also check"]
    stored = exported[3].message_history[-1]
    assert [p.content for p in stored.parts if isinstance(p, UserPromptPart)] == ["please also check"]


async def test_steer_before_first_request() -> None:
    """H-104: input steered before the first boundary joins the first request; keyless input reports no key."""
    model = script(text("done"))
    stream = Harness(make_agent(model)).stream("go")
    async with stream:
        await stream.steer("first extra", key="a")
        await stream.steer("second extra")
        events = [e async for e in stream]
    assert boundaries(events)[0].incorporated_keys == ("a",)
    prompts = [p.content for m in model.seen[0] for p in m.parts if isinstance(p, UserPromptPart)]
    assert prompts == ["go", "first extra", "second extra"]


async def test_steer_during_the_last_request_stays_pending() -> None:
    """H-104: input steered while the final model request is in flight is never sent; it stays in "candor.steering"."""
    holder: list[RunStream[Any]] = []

    async def respond(messages: Any, info: Any) -> ModelResponse:
        await holder[0].steer("too late", key="late")
        return text("done")

    model = script(respond)
    stream = Harness(make_agent(model)).stream("go")
    holder.append(stream)
    events = await consume(stream)
    assert [b.incorporated_keys for b in boundaries(events)] == [()]
    assert stream.outcome is not None
    state = stream.outcome.state
    assert state is not None
    assert _steering(state) is not None
    assert "too late" in json.dumps(_steering(state)) and "late" in json.dumps(_steering(state))
    assert all("too late" not in json.dumps(canonical([m])) for m in state.message_history)


async def test_restored_pending_steering_is_not_lost() -> None:
    """H-104, H-85: an input recorded in "candor.steering" and never incorporated is kept until it enters history."""
    holder: list[RunStream[Any]] = []

    async def respond(messages: Any, info: Any) -> ModelResponse:
        await holder[0].steer("too late", key="late")
        return text("done")

    stream = Harness(make_agent(script(respond))).stream("go")
    holder.append(stream)
    await consume(stream)
    assert stream.outcome is not None
    state = stream.outcome.state
    assert state is not None
    assert "too late" in json.dumps(_steering(state))
    model = script(calls(tool_call("add", {"a": 1, "b": 2})), text("done"))
    second = Harness(make_agent(model)).stream("next", previous_state=state)
    async with second:
        async for event in second:
            if isinstance(event, BoundaryEvent) and event.index == 1:
                await second.steer("new input", key="new")
    assert second.outcome is not None
    final = second.outcome.state
    assert final is not None
    in_history = any("too late" in json.dumps(canonical([m])) for m in final.message_history)
    assert final is not None
    assert in_history or "too late" in json.dumps(_steering(final))


async def test_state_exported_right_after_steer_carries_it() -> None:
    """H-104: until incorporated, a state exported in between carries the steered input in "candor.steering"."""
    async with Harness(two_step_agent([])).stream("go") as stream:
        async for event in stream:
            if isinstance(event, BoundaryEvent) and event.index == 2:
                await stream.steer("between", key="k")
                exported = await stream.export_state()
                assert "between" in json.dumps(_steering(exported))


# ---------------------------------------------------------------------------------------------- H-105


async def test_cancel_during_an_async_tool() -> None:
    """H-105, H-103: cancel() while an async tool runs cancels the tool and ends the run cancelled."""
    started = asyncio.Event()
    observed: list[str] = []

    async def forever() -> str:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            observed.append("cancelled")
            raise
        return "never"

    model = script(calls(tool_call("forever"), tool_call("add", {"a": 1, "b": 2}, "c2")), text("never"))
    stream = Harness(make_agent(model, forever)).stream("go")

    async def cancel_when_started() -> None:
        await started.wait()
        stream.cancel()

    helper = asyncio.ensure_future(cancel_when_started())
    events = await asyncio.wait_for(consume(stream), timeout=5)
    await asyncio.wait_for(helper, timeout=1)
    outcome = stream.outcome
    assert outcome is not None
    assert outcome.status == "cancelled"
    assert isinstance(events[-1], RunResultEvent)
    assert observed == ["cancelled"]
    assert len(model.seen) == 1
    state = outcome.state
    assert state is not None
    assert open_calls(state.message_history) == []
    returns = {p.tool_call_id: p for p in state.message_history[-1].parts if isinstance(p, ToolReturnPart)}
    assert returns["c1"].content == UNKNOWN_OUTCOME_CONTENT
    assert returns["c1"].outcome == "interrupted"


async def test_cancel_at_a_tool_boundary_runs_no_tool() -> None:
    """H-105: cancel() at a boundary ends the run before the next step; open calls get unknown outcomes."""
    ran: list[str] = []

    async def effect() -> str:
        ran.append("effect")
        return "done"

    model = script(calls(tool_call("effect")), text("never"))
    async with Harness(make_agent(model, effect)).stream("go") as stream:
        async for event in stream:
            if isinstance(event, BoundaryEvent) and event.kind == "tool":
                stream.cancel()
    assert ran == []
    assert stream.outcome is not None
    assert stream.outcome.status == "cancelled"
    state = stream.outcome.state
    assert state is not None
    assert open_calls(state.message_history) == []
    unknown = state.message_history[-1].parts[0]
    assert isinstance(unknown, ToolReturnPart) and unknown.outcome == "interrupted"
    # the cancelled state can be continued with "always" without executing anything
    again = await Harness(make_agent(script(text("ok")), effect)).run(
        None, previous_state=state, tool_recovery="always"
    )
    assert again.status == "completed"
    assert ran == []


@STREAMING
async def test_cancel_during_model_request(stream_model: bool) -> None:
    """H-105: cancel() while the model request is in flight ends the run cancelled with the request stored."""
    started = asyncio.Event()

    async def hang(messages: Any, info: Any) -> ModelResponse:
        started.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    stream = Harness(make_agent(script(hang, stream=stream_model))).stream("go")

    async def cancel_when_started() -> None:
        await started.wait()
        stream.cancel()

    helper = asyncio.ensure_future(cancel_when_started())
    await asyncio.wait_for(consume(stream), timeout=5)
    await asyncio.wait_for(helper, timeout=1)
    assert stream.outcome is not None
    assert stream.outcome.status == "cancelled"
    assert stream.outcome.state is not None
    history = stream.outcome.state.message_history
    assert [type(m) for m in history] == [ModelRequest]


async def test_cancel_before_first_step() -> None:
    """H-105: cancel() right after entering ends the run cancelled without any model request."""
    model = script(text("never"))
    stream: RunStream[Any] = Harness(make_agent(model)).stream("go")
    async with stream:
        stream.cancel()
        events = [e async for e in stream]
    assert stream.outcome is not None
    assert stream.outcome.status == "cancelled"
    assert model.seen == []
    assert isinstance(events[-1], RunResultEvent)


async def test_cancelling_the_consumer_task_propagates_cancellation() -> None:
    """H-105, H-101: cancelling the task that consumes a stream cancels the run; it is not a teardown failure."""
    started = asyncio.Event()

    async def slow() -> str:
        started.set()
        await asyncio.sleep(30)
        return "never"

    agent = make_agent(script(calls(tool_call("slow")), text("done")), slow)

    async def consumer() -> None:
        async with Harness(agent).stream("go") as stream:
            async for _ in stream:
                pass

    task = asyncio.create_task(consumer())
    await asyncio.wait_for(started.wait(), timeout=5)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, timeout=5)
    assert task.cancelled()
