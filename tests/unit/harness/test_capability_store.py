"""Tests for `candor.harness.capability_store` and environment providers (spec §3.4, §3.6, rules H-14 to H-23).

Capability code reaches the store with `candor.capability_state()` from inside a run: a tool or a pydantic-ai
capability hook. Environment providers are bound with `RunBindings(environments=...)`.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, JsonValue
from pydantic_ai import CallDeferred, Tool
from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.tools import RunContext

import candor
from candor import BoundaryEvent, CapabilityState, Harness, HarnessState, RunBindings
from candor.errors import StateError
from candor.harness.capability_store import CapabilityStore

from scripted import calls, consume, make_agent, script, text, tool_call


class Counter(BaseModel):
    n: int = 0
    tags: list[str] = []


class Small(BaseModel):
    model_config = ConfigDict(extra="forbid")
    n: int


class Floaty(BaseModel):
    x: float


def prior(**namespaces: CapabilityState) -> HarnessState:
    return HarnessState(schema_version="1", thread_id="thr_caps", capabilities=dict(namespaces))


async def run_with_tool(
    tool: Any, *, previous_state: HarnessState | None = None, **options: Any
) -> candor.RunResult[Any]:
    """One run in which the model calls `tool` once (no arguments) and then answers "done"."""
    name = tool.name if isinstance(tool, Tool) else tool.__name__
    agent = make_agent(script(calls(tool_call(name)), text("done")), tool)
    return await Harness(agent).run("go", previous_state=previous_state, **options)


# ---------------------------------------------------------------------------------------------- H-14, H-18


async def test_unwritten_namespace_reads_none() -> None:
    """H-14: reading a namespace that has never been written yields None."""
    seen: list[Any] = []

    async def probe() -> str:
        store = candor.capability_state()
        seen.append(await store.read("never.written", Counter, version="1"))
        return "ok"

    result = await run_with_tool(probe, previous_state=prior(other=CapabilityState(version="1", data={"n": 1})))
    assert result.status == "completed"
    assert seen == [None]
    assert result.state is not None
    assert "never.written" not in result.state.capabilities


async def test_write_replaces_whole_namespace_and_read_returns_it() -> None:
    """H-18: write() swaps in the whole namespace; the following read() returns an equal model."""
    seen: list[Any] = []

    async def writer() -> str:
        store = candor.capability_state()
        await store.write("ns", Counter(n=1, tags=["a", "b"]), version="1")
        seen.append(await store.read("ns", Counter, version="1"))
        await store.write("ns", Small(n=2), version="1")
        seen.append(await store.read("ns", Small, version="1"))
        seen.append(await store.read("ns", Counter, version="1"))
        return "ok"

    result = await run_with_tool(
        writer, previous_state=prior(ns=CapabilityState(version="1", data={"n": 0, "tags": ["old"], "extra": 1}))
    )
    assert seen == [Counter(n=1, tags=["a", "b"]), Small(n=2), Counter(n=2, tags=[])]
    assert result.state is not None
    assert result.state.capabilities["ns"] == CapabilityState(version="1", data={"n": 2})


async def test_write_can_change_the_version() -> None:
    """H-18: a write replaces version and data of the namespace together."""

    async def writer() -> str:
        await candor.capability_state().write("ns", Small(n=5), version="2")
        return "ok"

    result = await run_with_tool(writer, previous_state=prior(ns=CapabilityState(version="1", data={"n": 1})))
    assert result.state is not None
    assert result.state.capabilities["ns"] == CapabilityState(version="2", data={"n": 5})


async def test_state_written_in_one_run_is_read_by_the_next() -> None:
    """H-14, H-18: namespaces travel in the state from one run to the next."""

    async def bump() -> int:
        store = candor.capability_state()
        counter = await store.read("counter", Counter, version="1") or Counter()
        counter.n += 1
        await store.write("counter", counter, version="1")
        return counter.n

    first = await run_with_tool(bump)
    second = await run_with_tool(bump, previous_state=first.state)
    assert second.state is not None
    restored = HarnessState.model_validate_json(second.state.model_dump_json())
    third = await run_with_tool(bump, previous_state=restored)
    assert third.state is not None
    assert third.state.capabilities["counter"].data == {"n": 3, "tags": []}


async def test_capability_hook_uses_the_store() -> None:
    """H-18, H-21: a pydantic-ai capability's hooks reach the run's store, too."""

    @dataclass
    class CountRequests(AbstractCapability[Any]):
        async def before_model_request(self, ctx: RunContext[Any], request_context: Any) -> Any:
            store = candor.capability_state()
            counter = await store.read("hook.count", Counter, version="1") or Counter()
            await store.write("hook.count", Counter(n=counter.n + 1), version="1")
            return request_context

    agent = make_agent(script(calls(tool_call("add", {"a": 1, "b": 2})), text("done")))
    result = await Harness(agent).run("go", bindings=RunBindings(capabilities=[CountRequests()]))
    assert result.status == "completed"
    assert result.state is not None
    assert result.state.capabilities["hook.count"].data == {"n": 2, "tags": []}


# ---------------------------------------------------------------------------------------------- H-15, H-16, H-17


async def test_version_mismatch_raises_version_unsupported() -> None:
    """H-15: read(version="2") of a namespace stored as "1" → capability_state_version_unsupported with details."""
    errors: list[StateError] = []

    async def probe() -> str:
        try:
            await candor.capability_state().read("ns", Counter, version="2")
        except StateError as exc:
            errors.append(exc)
        return "ok"

    await run_with_tool(probe, previous_state=prior(ns=CapabilityState(version="1", data={"n": 1})))
    assert [e.code for e in errors] == ["capability_state_version_unsupported"]
    assert errors[0].details["capability_id"] == "ns"
    assert errors[0].details["expected_version"] == "2"
    assert errors[0].details["actual_version"] == "1"


async def test_state_error_escaping_a_tool_is_raised_from_run() -> None:
    """H-15, H-31: a StateError is a HarnessError, so it is not turned into a failed result."""

    async def probe() -> str:
        await candor.capability_state().read("ns", Counter, version="2")
        return "unreachable"

    with pytest.raises(StateError) as info:
        await run_with_tool(probe, previous_state=prior(ns=CapabilityState(version="1", data={"n": 1})))
    assert info.value.code == "capability_state_version_unsupported"


@pytest.mark.parametrize(
    ("stored", "model"),
    [({"n": "not a number"}, Counter), ({"n": 1, "extra": True}, Small), ([1, 2], Counter), (None, Small)],
    ids=["wrong-type", "extra-field", "list", "null"],
)
async def test_stored_data_that_does_not_fit_raises_invalid(stored: Any, model: type[BaseModel]) -> None:
    """H-16: stored data that fails validation against the requested model → capability_state_invalid."""
    store = CapabilityStore({"ns": CapabilityState(version="1", data=stored)})
    with pytest.raises(StateError) as info:
        await store.read("ns", model, version="1")
    assert info.value.code == "capability_state_invalid"


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")], ids=["nan", "inf", "-inf"])
async def test_writing_non_finite_data_raises_invalid(bad: float) -> None:
    """H-16: writing data that is not finite JSON → capability_state_invalid, and nothing is stored."""
    store = CapabilityStore({})
    with pytest.raises(StateError) as info:
        await store.write("ns", Floaty(x=bad), version="1")
    assert info.value.code == "capability_state_invalid"
    assert await store.read("ns", Floaty, version="1") is None
    assert "ns" not in await store.snapshot()


async def test_writing_non_finite_data_inside_a_run() -> None:
    """H-16: the same check applies to the store of a real run; the earlier value stays."""
    codes: list[str] = []

    async def probe() -> str:
        try:
            await candor.capability_state().write("ns", Floaty(x=float("nan")), version="1")
        except StateError as exc:
            codes.append(exc.code)
        return "ok"

    result = await run_with_tool(probe, previous_state=prior(ns=CapabilityState(version="1", data={"x": 1.5})))
    assert codes == ["capability_state_invalid"]
    assert result.state is not None
    assert result.state.capabilities["ns"] == CapabilityState(version="1", data={"x": 1.5})


@pytest.mark.parametrize("blank", ["", " ", "\t\n"], ids=["empty", "space", "whitespace"])
async def test_blank_ids_and_versions_raise(blank: str) -> None:
    """H-17: a blank capability id → capability_state_id_invalid; a blank version → capability_state_version_invalid."""
    store = CapabilityStore({"ns": CapabilityState(version="1", data={"n": 1})})
    operations = [
        (lambda: store.read(blank, Counter, version="1"), "capability_state_id_invalid"),
        (lambda: store.write(blank, Counter(), version="1"), "capability_state_id_invalid"),
        (lambda: store.read("ns", Counter, version=blank), "capability_state_version_invalid"),
        (lambda: store.write("ns", Counter(), version=blank), "capability_state_version_invalid"),
    ]
    for operation, code in operations:
        with pytest.raises(StateError) as info:
            await operation()
        assert info.value.code == code
    assert await store.snapshot() == {"ns": CapabilityState(version="1", data={"n": 1})}


async def test_blank_ids_inside_a_run() -> None:
    """H-17: the run's store applies the same checks."""
    codes: list[str] = []

    async def probe() -> str:
        store = candor.capability_state()
        for operation in (
            lambda: store.read("", Counter, version="1"),
            lambda: store.write("ns", Counter(), version=""),
        ):
            try:
                await operation()
            except StateError as exc:
                codes.append(exc.code)
        return "ok"

    await run_with_tool(probe)
    assert codes == ["capability_state_id_invalid", "capability_state_version_invalid"]


# ---------------------------------------------------------------------------------------------- H-19


async def test_snapshot_is_detached_from_later_writes() -> None:
    """H-19: a snapshot taken before a later write still shows the earlier value."""
    snapshots: list[dict[str, CapabilityState]] = []

    async def probe() -> str:
        store = candor.capability_state()
        await store.write("ns", Counter(n=1), version="1")
        snapshots.append(await store.snapshot())
        await store.write("ns", Counter(n=2), version="1")
        snapshots.append(await store.snapshot())
        return "ok"

    await run_with_tool(probe)
    assert snapshots[0]["ns"].data == {"n": 1, "tags": []}
    assert snapshots[1]["ns"].data == {"n": 2, "tags": []}


async def test_mutating_snapshot_and_read_values_changes_nothing_stored() -> None:
    """H-19: mutating snapshot data, a model returned by read(), or a model after write() changes nothing."""
    store = CapabilityStore({"ns": CapabilityState(version="1", data={"n": 1, "tags": ["a"]})})
    snapshot = await store.snapshot()
    snapshot_data = snapshot["ns"].data
    assert isinstance(snapshot_data, dict) and isinstance(snapshot_data["tags"], list)
    snapshot_tags = snapshot_data["tags"]
    snapshot_tags.append("snap")
    snapshot.pop("ns")
    read = await store.read("ns", Counter, version="1")
    assert read is not None
    read.tags.append("read")
    written = Counter(n=5, tags=["w"])
    await store.write("other", written, version="1")
    written.tags.append("after-write")
    assert (await store.snapshot())["ns"].data == {"n": 1, "tags": ["a"]}
    assert await store.read("ns", Counter, version="1") == Counter(n=1, tags=["a"])
    assert await store.read("other", Counter, version="1") == Counter(n=5, tags=["w"])


async def test_mutating_capability_data_read_from_a_state_changes_nothing() -> None:
    """H-19: CapabilityState.data read from a state is a copy, for the state and for the next run's store."""
    state = prior(ns=CapabilityState(version="1", data={"n": 1, "tags": ["a"]}))
    read_data = state.capabilities["ns"].data
    assert isinstance(read_data, dict) and isinstance(read_data["tags"], list)
    read_data["tags"].append("x")
    cs = state.capabilities["ns"]
    assert isinstance(cs.data, dict) and isinstance(cs.data["tags"], list)
    cs.data["tags"].append("y")
    seen: list[Any] = []

    async def probe() -> str:
        seen.append(await candor.capability_state().read("ns", Counter, version="1"))
        return "ok"

    await run_with_tool(probe, previous_state=state)
    assert seen == [Counter(n=1, tags=["a"])]


# ---------------------------------------------------------------------------------------------- H-20


async def test_unwritten_namespaces_are_carried_unchanged() -> None:
    """H-20: namespaces no code writes during a run appear unchanged in the result state (equal JSON)."""
    untouched = {
        "plain": CapabilityState(version="7", data={"a": [1, 2.5, None, True, "s"], "b": {"c": {}}}),
        "float": CapabilityState(version="1", data=1.0),
        "read.only": CapabilityState(version="1", data={"n": 4, "tags": []}),
    }
    state = prior(**untouched)

    async def reader() -> str:
        await candor.capability_state().read("read.only", Counter, version="1")
        await candor.capability_state().write("written", Counter(), version="1")
        return "ok"

    result = await run_with_tool(reader, previous_state=state)
    assert result.state is not None
    dumped = json.loads(result.state.model_dump_json())["capabilities"]
    source = json.loads(state.model_dump_json())["capabilities"]
    for name in untouched:
        assert dumped[name] == source[name]
    assert dumped["written"] == {"version": "1", "data": {"n": 0, "tags": []}}


async def test_unwritten_namespaces_are_unchanged_at_every_boundary() -> None:
    """H-20: the same holds for every state exported during the run."""
    state = prior(plain=CapabilityState(version="3", data={"k": [1, {"z": None}]}))
    agent = make_agent(script(calls(tool_call("add", {"a": 1, "b": 2})), text("done")))
    exported: list[HarnessState] = []
    async with Harness(agent).stream("go", previous_state=state) as stream:
        async for event in stream:
            if isinstance(event, BoundaryEvent):
                exported.append(await stream.export_state())
    assert len(exported) == 3
    assert stream.outcome is not None
    for s in [*exported, stream.outcome.state]:
        assert s is not None
        assert json.loads(s.model_dump_json())["capabilities"]["plain"] == {
            "version": "3",
            "data": {"k": [1, {"z": None}]},
        }


# ---------------------------------------------------------------------------------------------- H-21


def test_capability_state_outside_a_run_raises() -> None:
    """H-21: outside any run, capability_state() raises StateError(run_not_active)."""
    with pytest.raises(StateError) as info:
        candor.capability_state()
    assert info.value.code == "run_not_active"


async def test_capability_state_before_enter_and_after_close_raises() -> None:
    """H-21: a stream that is created but not entered, or already closed, is not an active run."""
    agent = make_agent(script(text("done")))
    stream = Harness(agent).stream("go")
    with pytest.raises(StateError) as info:
        candor.capability_state()
    assert info.value.code == "run_not_active"
    await consume(stream)
    with pytest.raises(StateError) as info:
        candor.capability_state()
    assert info.value.code == "run_not_active"
    await Harness(make_agent(script(text("done")))).run("again")
    with pytest.raises(StateError):
        candor.capability_state()


async def test_capability_state_after_a_failed_run_raises() -> None:
    """H-21: a run that ends by raising leaves no active store behind."""

    async def fail() -> str:
        await candor.capability_state().read("ns", Counter, version="")
        return "unreachable"

    with pytest.raises(StateError):
        await run_with_tool(fail)
    with pytest.raises(StateError) as info:
        candor.capability_state()
    assert info.value.code == "run_not_active"


async def test_interleaved_streams_keep_their_own_stores() -> None:
    """H-18, H-20, H-21: two streams driven from the same task each see their own run's store."""

    async def mark() -> str:
        await candor.capability_state().write("mark", Small(n=1), version="1")
        return "ok"

    first = Harness(make_agent(script(calls(tool_call("mark")), text("done")), mark)).stream("go")
    second = Harness(make_agent(script(text("done")))).stream("go")
    async with first:
        async with second:
            async for _ in first:
                pass
            async for _ in second:
                pass
    assert first.outcome is not None
    assert first.outcome.state is not None
    assert "mark" in first.outcome.state.capabilities
    assert second.outcome is not None
    assert second.outcome.state is not None
    assert "mark" not in second.outcome.state.capabilities


# ---------------------------------------------------------------------------------------------- H-22, H-23


@dataclass
class Provider:
    """A recording environment provider whose exported value is `{"n": counter}`."""

    counter: int = 0
    restored: list[Any] = field(default_factory=list)
    exports: list[Any] = field(default_factory=list)

    async def restore(self, data: JsonValue | None) -> None:
        self.restored.append(data)
        if isinstance(data, dict):
            self.counter = int(data["n"])  # type: ignore[arg-type]  # JSON this provider exported: a number

    async def export(self) -> JsonValue:
        value: dict[str, JsonValue] = {"n": self.counter}
        self.exports.append(value)
        return value


def test_provider_satisfies_the_protocol() -> None:
    """§3.6: EnvironmentProvider is a runtime-checkable protocol with restore() and export()."""
    assert isinstance(Provider(), candor.EnvironmentProvider)
    assert not isinstance(object(), candor.EnvironmentProvider)


async def test_unbound_environment_entries_are_carried_unchanged() -> None:
    """H-22: entries whose mount has no bound provider are carried into the result state unchanged."""
    state = HarnessState(
        schema_version="1",
        thread_id="thr_env",
        environment={"bound": {"n": 3}, "unbound": {"deep": [1, {"x": None}], "f": 2.5}, "flag": False},
    )
    provider = Provider()
    agent = make_agent(script(calls(tool_call("add", {"a": 1, "b": 2})), text("done")))
    result = await Harness(agent).run(
        "go", previous_state=state, bindings=RunBindings(environments={"bound": provider})
    )
    assert result.state is not None
    env = json.loads(result.state.model_dump_json())["environment"]
    assert env["unbound"] == {"deep": [1, {"x": None}], "f": 2.5}
    assert env["flag"] is False
    assert env["bound"] == {"n": 3}
    again = await Harness(make_agent(script(text("x")))).run("go", previous_state=result.state)
    assert again.state is not None
    assert again.state.environment == result.state.environment


async def test_restore_receives_stored_entry_or_none() -> None:
    """H-23: at run start each bound provider's restore() receives its stored entry, or None when absent."""
    state = HarnessState(schema_version="1", thread_id="thr_env", environment={"a": {"n": 7}})
    a, b = Provider(), Provider()
    agent = make_agent(script(text("done")))
    await Harness(agent).run("go", previous_state=state, bindings=RunBindings(environments={"a": a, "b": b}))
    assert a.restored == [{"n": 7}]
    assert b.restored == [None]


async def test_restore_happens_before_any_model_request() -> None:
    """H-23: restore() runs at run start, before the first model request."""
    order: list[str] = []

    class Recording(Provider):
        async def restore(self, data: JsonValue | None) -> None:
            order.append("restore")
            await super().restore(data)

    def respond(messages: Any, info: Any) -> Any:
        order.append("model")
        return text("done")

    await Harness(make_agent(script(respond))).run("go", bindings=RunBindings(environments={"m": Recording()}))
    assert order[:2] == ["restore", "model"]


async def test_every_boundary_exports_the_provider() -> None:
    """H-23: at every safe boundary the entry is replaced by the provider's export() value."""
    provider = Provider()

    async def bump() -> str:
        provider.counter += 1
        return "bumped"

    agent = make_agent(
        script(calls(tool_call("bump", call_id="c1")), calls(tool_call("bump", call_id="c2")), text("done")), bump
    )
    state = HarnessState(schema_version="1", thread_id="thr_env", environment={"m": {"n": 10}})
    seen: list[tuple[str, Any]] = []
    async with Harness(agent).stream(
        "go", previous_state=state, bindings=RunBindings(environments={"m": provider})
    ) as stream:
        async for event in stream:
            if isinstance(event, BoundaryEvent):
                seen.append((event.kind, (await stream.export_state()).environment["m"]))
    assert seen == [
        ("model", {"n": 10}),
        ("tool", {"n": 10}),
        ("model", {"n": 11}),
        ("tool", {"n": 11}),
        ("model", {"n": 12}),
    ]
    assert stream.outcome is not None
    assert stream.outcome.state is not None
    assert stream.outcome.state.environment == {"m": {"n": 12}}


async def test_exported_value_is_detached_from_the_provider() -> None:
    """H-23: the provider mutating its value after export() does not change the exported state."""
    items: list[JsonValue] = [1]
    shared: dict[str, JsonValue] = {"items": items}

    class Sharing(Provider):
        async def export(self) -> JsonValue:
            return shared

    result = await Harness(make_agent(script(text("done")))).run(
        "go", bindings=RunBindings(environments={"m": Sharing()})
    )
    items.append(2)
    assert result.state is not None
    assert result.state.environment == {"m": {"items": [1]}}


async def test_run_end_exports_the_provider_when_suspending() -> None:
    """H-23: run end is a safe boundary, so a suspended run's state holds the value exported at the end."""
    provider = Provider()

    async def bump() -> str:
        provider.counter += 1
        return "bumped"

    async def ask() -> str:
        raise CallDeferred(kind="external")

    agent = make_agent(script(calls(tool_call("bump", call_id="c1"), tool_call("ask", call_id="c2"))), bump, ask)
    result = await Harness(agent).run("go", bindings=RunBindings(environments={"m": provider}))
    assert result.status == "suspended"
    assert provider.counter == 1
    assert result.state is not None
    assert result.state.environment == {"m": {"n": 1}}


async def test_environment_is_restored_in_the_next_run() -> None:
    """H-22, H-23: the exported entry is what the next run's provider receives."""
    first_provider = Provider(counter=5)
    result = await Harness(make_agent(script(text("a")))).run(
        "go", bindings=RunBindings(environments={"m": first_provider})
    )
    second_provider = Provider()
    await Harness(make_agent(script(text("b")))).run(
        "go", previous_state=result.state, bindings=RunBindings(environments={"m": second_provider})
    )
    assert second_provider.restored == [{"n": 5}]


async def test_restore_receives_a_copy() -> None:
    """H-23: a provider mutating what restore() received does not change the previous state."""

    class Mutating(Provider):
        async def restore(self, data: JsonValue | None) -> None:
            assert isinstance(data, dict)
            data["n"] = 99
            self.counter = 1

    state = HarnessState(schema_version="1", thread_id="thr_env", environment={"m": {"n": 1}, "x": [1]})
    before = state.model_dump_json()
    await Harness(make_agent(script(text("a")))).run(
        "go", previous_state=state, bindings=RunBindings(environments={"m": Mutating()})
    )
    assert state.model_dump_json() == before


async def test_concurrent_runs_have_separate_stores() -> None:
    """H-18, H-21: runs in separate tasks never see each other's namespaces."""

    async def mark() -> str:
        store = candor.capability_state()
        await asyncio.sleep(0.01)
        await store.write("mark", Small(n=1), version="1")
        return "ok"

    marking = run_with_tool(mark)
    plain = Harness(make_agent(script(calls(tool_call("add", {"a": 1, "b": 1})), text("done")))).run("go")
    first, second = await asyncio.gather(marking, plain)
    assert first.state is not None
    assert "mark" in first.state.capabilities
    assert second.state is not None
    assert "mark" not in second.state.capabilities
