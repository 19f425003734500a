"""Reconcile before unknown: the pure verdict table, the call key, and recovery runs asking reconcilers.

Rules: H-40, H-43, H-45, H-46, H-47, H-48, H-55, H-58 (spec §4.E) as extended by docs/state-and-resume.md,
"Reconciling against an idempotent API" (issue 13, item 2).
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_ai import Agent, RunContext, Tool
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.tools import ToolDefinition, ToolDefinitionKind

from candor import BoundaryEvent, DeferredToolResume, Harness, HarnessState
from candor.errors import RunError
from candor.harness.reconcile import registered_reconciler, settle_reconciliation, wants_reconcile
from candor.harness.recovery import RecoveryDecision, ToolRecovery
from candor.tools import (
    CALL_KEY_METADATA_KEY,
    RECONCILER_METADATA_KEY,
    RECOVERY_METADATA_KEY,
    RECOVERY_RETRY_SAFE_METADATA_KEY,
    UNKNOWN_OUTCOME_METADATA_KEY,
    NotDone,
    OutcomeUnknown,
    Reconciled,
    Reconciler,
    ReconcileRequest,
    call_key,
    derive_call_key,
    reconciler_for,
    recovery_retryable,
    unknown_outcome_result,
    with_reconciler,
)

CALL = ToolCallPart("charge", {"amount": 40}, tool_call_id="c1")


def _def(*, retry_safe: bool = False, kind: ToolDefinitionKind = "function") -> ToolDefinition:
    metadata = {RECOVERY_RETRY_SAFE_METADATA_KEY: True} if retry_safe else None
    return ToolDefinition(name="charge", metadata=metadata, kind=kind)


UNKNOWN = RecoveryDecision(call=CALL, action="unknown_outcome", reason="not_retry_safe")
REPLAY = RecoveryDecision(call=CALL, action="replay", reason="mode_always")


# --- the pure table ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("decision", "tool_def", "mode", "expected"),
    [
        (UNKNOWN, _def(), "declared", True),  # H-46: unknown today → reconcile first
        (REPLAY, _def(), "always", True),  # H-47: a blind rerun today → reconcile first
        (UNKNOWN, _def(), "never", False),  # H-45: never runs nothing, reconcilers included
        (UNKNOWN, None, "declared", False),  # H-48: the tool is gone
        (RecoveryDecision(call=CALL, action="replay", reason="retry_safe"), _def(retry_safe=True), "declared", False),
        (RecoveryDecision(call=CALL, action="apply_answer", reason="accepted_answer"), _def(), "declared", False),
    ],
)
def test_wants_reconcile_table(decision: RecoveryDecision, tool_def: Any, mode: ToolRecovery, expected: bool) -> None:
    """H-45–H-48: only calls that would end unknown or run again unsafely are put to a reconciler."""
    assert wants_reconcile(decision, tool_def, mode) is expected


@pytest.mark.parametrize(
    ("decision", "verdict", "mode", "kind", "action", "reason"),
    [
        (UNKNOWN, Reconciled("ch_1"), "declared", "function", "apply_answer", "reconciled"),
        (REPLAY, Reconciled("ch_1"), "always", "function", "apply_answer", "reconciled"),
        (UNKNOWN, NotDone(), "declared", "function", "replay", "not_done"),
        (REPLAY, NotDone(), "always", "function", "replay", "not_done"),
        (UNKNOWN, NotDone(), "declared", "unapproved", "suspend", "approval_required"),  # H-55
        (UNKNOWN, NotDone(), "declared", "external", "suspend", "external_tool"),  # H-56
        (UNKNOWN, OutcomeUnknown(), "declared", "function", "unknown_outcome", "reconcile_unknown"),
        (REPLAY, OutcomeUnknown(), "always", "function", "replay", "mode_always"),
        (UNKNOWN, "raised", "declared", "function", "unknown_outcome", "reconcile_failed"),
        (UNKNOWN, "timed_out", "declared", "function", "unknown_outcome", "reconcile_failed"),
        (UNKNOWN, "invalid_verdict", "declared", "function", "unknown_outcome", "reconcile_failed"),
        (UNKNOWN, "args_invalid", "declared", "function", "unknown_outcome", "reconcile_failed"),
        (REPLAY, "timed_out", "always", "function", "replay", "mode_always"),
    ],
)
def test_settle_reconciliation_table(
    decision: RecoveryDecision, verdict: Any, mode: ToolRecovery, kind: ToolDefinitionKind, action: str, reason: str
) -> None:
    """The verdict × mode table of docs/state-and-resume.md ("Reconciling against an idempotent API")."""
    settled = settle_reconciliation(decision, verdict, tool_def=_def(kind=kind), mode=mode, key="ck_x")
    assert (settled.action, settled.reason) == (action, reason)
    assert settled.call is CALL  # H-42: the call itself is never changed
    if action == "apply_answer":
        (part,) = settled.answer
        assert isinstance(part, ToolReturnPart)
        assert (part.tool_call_id, part.tool_name, part.content, part.outcome) == ("c1", "charge", "ch_1", "success")
        assert part.metadata == {RECOVERY_METADATA_KEY: "reconciled", CALL_KEY_METADATA_KEY: "ck_x"}


def test_not_done_with_an_accepted_approval_asks_again() -> None:
    """H-94: an accepted approval never authorises a rerun, even after `NotDone`."""
    settled = settle_reconciliation(UNKNOWN, NotDone(), tool_def=_def(), mode="declared", key="k", approved=True)
    assert (settled.action, settled.reason) == ("suspend", "accepted_approval_not_reused")


def test_derive_call_key_is_stable_and_separates_its_parts() -> None:
    key = derive_call_key("thr_a", "run_b", "c1")
    assert key == derive_call_key("thr_a", "run_b", "c1")
    assert key.startswith("ck_") and len(key) == 67
    others = {
        derive_call_key("thr_b", "run_b", "c1"),
        derive_call_key("thr_a", "run_c", "c1"),
        derive_call_key("thr_a", "run_b", "c2"),
        derive_call_key("thr_a", None, "c1"),
        derive_call_key("thr_a_", "run_b", "c1"),
    }
    assert key not in others and len(others) == 5


def test_reconciler_declarations() -> None:
    """`reconciler_for` keeps the function unchanged; `with_reconciler` copies the tool (as H-52 for the mark)."""

    def charge(amount: int) -> str:
        return "ch"

    def look(request: ReconcileRequest) -> NotDone:
        return NotDone()

    assert reconciler_for(charge, timeout=2)(look) is look
    found = registered_reconciler(None, charge)
    assert found == Reconciler(look, 2)

    plain = Tool(charge, metadata={"team": "payments"})
    marked = with_reconciler(plain, look, timeout=3)
    assert marked is not plain and plain.metadata == {"team": "payments"}
    assert marked.metadata == {"team": "payments", RECONCILER_METADATA_KEY: Reconciler(look, 3)}
    assert registered_reconciler(marked.tool_def, None) == Reconciler(look, 3)
    # A bare callable in metadata gets the default timeout.
    assert registered_reconciler(
        ToolDefinition(name="x", metadata={RECONCILER_METADATA_KEY: look}), None
    ) == Reconciler(look)

    with pytest.raises(ValueError):
        Reconciler(look, 0)
    with pytest.raises(TypeError):
        reconciler_for(42)  # type: ignore[arg-type]


def test_call_key_outside_a_tool_raises() -> None:
    with pytest.raises(RunError) as info:
        call_key(RunContext(deps=None, model=None, usage=None))  # type: ignore[arg-type]
    assert info.value.code == "call_key_unavailable"


# --- recovery runs -----------------------------------------------------------------------------------------------


class Payments:
    """A fake payment API that honours idempotency keys: one charge per key, whatever the retries."""

    def __init__(self) -> None:
        self.charges: dict[str, str] = {}
        self.calls = 0

    def charge(self, amount: int, *, idempotency_key: str) -> str:
        self.calls += 1
        return self.charges.setdefault(idempotency_key, f"ch_{len(self.charges) + 1}_{amount}")

    def find(self, idempotency_key: str) -> str | None:
        return self.charges.get(idempotency_key)


def script(messages: list[Any], info: AgentInfo) -> ModelResponse:
    returns = [p for p in messages[-1].parts if isinstance(p, ToolReturnPart)]
    if not returns:
        return ModelResponse(parts=[ToolCallPart("charge_card", {"amount": 40}, tool_call_id="pay")])
    return ModelResponse(parts=[TextPart(f"{returns[0].outcome}: {returns[0].content}")])


class World:
    def __init__(self, reconcile: Any, *, tool_kwargs: dict[str, Any] | None = None) -> None:
        self.payments = Payments()
        self.keys_seen: list[str] = []
        self.asked: list[ReconcileRequest] = []
        world = self

        def charge_card(ctx: RunContext[Any], amount: int) -> str:
            key = call_key(ctx)
            world.keys_seen.append(key)
            return world.payments.charge(amount, idempotency_key=key)

        async def reconciler(request: ReconcileRequest) -> Any:
            world.asked.append(request)
            return await reconcile(world, request)

        self.tool = with_reconciler(Tool(charge_card, **(tool_kwargs or {})), reconciler, timeout=0.5)
        self.harness = Harness(Agent(FunctionModel(script), tools=[self.tool]))

    async def crash_after_charge(self, *, charged: bool) -> HarnessState:
        """Run to the tool boundary and save; the tool (maybe) charges, then the process "dies"."""
        async with self.harness.stream("Charge $40") as stream:
            async for event in stream:
                if isinstance(event, BoundaryEvent) and event.kind == "tool":
                    saved = (await stream.export_state()).model_dump_json()
                    break
        state = HarnessState.model_validate_json(saved)
        if charged:
            # What the tool did before the crash, under the key it would have computed inside the run.
            response = state.message_history[-1]
            key = derive_call_key(state.thread_id, response.run_id, "pay")
            self.payments.charge(40, idempotency_key=key)
            self.keys_seen.append(key)
        return state


async def _found(world: World, request: ReconcileRequest) -> Any:
    charge = world.payments.find(request.key)
    return NotDone() if charge is None else Reconciled(charge)


def _recovery_return(result: Any) -> ToolReturnPart:
    part = result.new_messages()[0].parts[0]
    assert isinstance(part, ToolReturnPart) and part.tool_call_id == "pay"
    return part


async def test_charged_before_the_crash_is_reconciled_without_running_the_tool() -> None:
    """H-46 + reconcile: the effect happened → its result is the return, `candor.recovery: reconciled`."""
    world = World(_found)
    state = await world.crash_after_charge(charged=True)
    result = await world.harness.run(previous_state=state)
    assert world.payments.calls == 1  # the tool did not run again
    part = _recovery_return(result)
    assert (part.content, part.outcome) == ("ch_1_40", "success")
    assert part.metadata == {RECOVERY_METADATA_KEY: "reconciled", CALL_KEY_METADATA_KEY: world.keys_seen[0]}
    assert result.output == "success: ch_1_40"  # the model sees a normal return
    (asked,) = world.asked
    assert asked.key == world.keys_seen[0]
    assert (asked.tool_name, asked.tool_call_id, asked.args) == ("charge_card", "pay", {"amount": 40})


async def test_not_done_runs_the_call_once_with_the_same_key() -> None:
    """NotDone → one rerun through the normal path; the tool's `call_key(ctx)` equals the reconciler's key."""
    world = World(_found)
    state = await world.crash_after_charge(charged=False)
    result = await world.harness.run(previous_state=state)
    assert world.payments.calls == 1 and len(world.payments.charges) == 1
    (asked,) = world.asked
    assert world.keys_seen == [asked.key]
    assert asked.key == derive_call_key(state.thread_id, state.message_history[-1].run_id, "pay")
    part = _recovery_return(result)
    assert part.outcome == "success"
    assert part.metadata == {RECOVERY_METADATA_KEY: "rerun"}


async def test_the_key_is_the_first_executions_key() -> None:
    """The key a tool sees on its first, uninterrupted execution is the one recovery would use for that call."""
    world = World(_found)
    result = await world.harness.run("Charge $40")
    assert result.state is not None
    response = result.state.message_history[1]
    assert world.keys_seen == [derive_call_key(result.thread_id, result.run_id, "pay")]
    assert response.run_id == result.run_id


@pytest.mark.parametrize(
    ("name", "reconcile"),
    [
        ("unknown", lambda world, request: _value(OutcomeUnknown())),
        ("raises", lambda world, request: _raise()),
        ("times_out", lambda world, request: asyncio.sleep(5)),
        ("nonsense", lambda world, request: _value("ch_1")),
    ],
)
async def test_dont_know_and_failures_fall_back_to_unknown(name: str, reconcile: Any) -> None:
    """H-43, H-46: "don't know", an exception, a timeout or a non-verdict → the exact unknown-outcome result."""
    world = World(reconcile)
    state = await world.crash_after_charge(charged=True)
    result = await world.harness.run(previous_state=state)
    assert world.payments.calls == 1
    charge = state.message_history[-1].parts[0]
    assert isinstance(charge, ToolCallPart)
    assert _same_part(_recovery_return(result), unknown_outcome_result(charge))
    assert len(world.asked) == 1, name


def _same_part(a: ToolReturnPart, b: ToolReturnPart) -> bool:
    """H-43: equal in every field but the timestamp pydantic-ai stamps on a part it builds."""
    return dataclasses.replace(a, timestamp=b.timestamp) == b


async def _value(value: Any) -> Any:
    return value


async def _raise() -> Any:
    raise ConnectionError("payment API down")


async def test_never_asks_no_reconciler() -> None:
    """H-45: `"never"` runs nothing, reconcilers included."""
    world = World(_found)
    state = await world.crash_after_charge(charged=True)
    result = await world.harness.run(previous_state=state, tool_recovery="never")
    assert world.asked == [] and world.payments.calls == 1
    assert _recovery_return(result).metadata == {UNKNOWN_OUTCOME_METADATA_KEY: True}


async def test_always_reconciles_before_running_again() -> None:
    """H-47 + reconcile: `"always"` asks first, so a known charge is not repeated; "don't know" still reruns."""
    world = World(_found)
    state = await world.crash_after_charge(charged=True)
    result = await world.harness.run(previous_state=state, tool_recovery="always")
    assert world.payments.calls == 1 and _recovery_return(result).metadata[RECOVERY_METADATA_KEY] == "reconciled"

    unsure = World(lambda world, request: _value(OutcomeUnknown()))
    state = await unsure.crash_after_charge(charged=False)
    result = await unsure.harness.run(previous_state=state, tool_recovery="always")
    assert unsure.payments.calls == 1
    assert _recovery_return(result).metadata == {RECOVERY_METADATA_KEY: "replayed"}


async def test_retry_safe_tools_are_not_reconciled() -> None:
    """H-46: a retry-safe tool runs again; its reconciler is not asked. The replay's return says "replayed"."""
    world = World(_found)
    world.harness = Harness(Agent(FunctionModel(script), tools=[recovery_retryable(world.tool)]))
    state = await world.crash_after_charge(charged=True)
    result = await world.harness.run(previous_state=state)
    assert world.asked == [] and world.payments.calls == 2 and len(world.payments.charges) == 1
    assert _recovery_return(result).metadata == {RECOVERY_METADATA_KEY: "replayed"}


async def test_not_done_of_an_approval_gated_tool_asks_for_approval_again() -> None:
    """H-55: the rerun after `NotDone` is not an approval: the run suspends with a fresh approval request; once
    approved, the call runs with the same call key."""
    world = World(_found, tool_kwargs={"requires_approval": True})
    result = await world.harness.run("Charge $40")
    assert result.status == "suspended"
    state = result.state  # suspended: the call is open, like a crash before the approval came back
    recovered = await world.harness.run(previous_state=state)
    assert recovered.deferred is not None
    assert recovered.status == "suspended" and [c.tool_call_id for c in recovered.deferred.approvals] == ["pay"]
    assert world.payments.calls == 0 and len(world.asked) == 1
    assert recovered.deferred is not None
    batch = DeferredToolResume(recovered.deferred, recovered.deferred.build_results(approvals={"pay": True}))
    done = await world.harness.run(previous_state=recovered.state, deferred_resume=batch)
    assert done.output is not None
    assert done.output.startswith("success: ch_1_40")
    assert world.keys_seen == [world.asked[0].key]


async def test_a_blocking_reconciler_runs_in_a_thread_and_its_timeout_holds() -> None:
    """A sync reconciler does not block the event loop; past its timeout the call is unknown."""
    release = threading.Event()

    def slow(request: ReconcileRequest) -> NotDone:
        release.wait(5)
        return NotDone()

    world = World(_found)
    world.harness = Harness(Agent(FunctionModel(script), tools=[with_reconciler(world.tool, slow, timeout=0.2)]))
    state = await world.crash_after_charge(charged=False)
    try:
        result = await world.harness.run(previous_state=state)
    finally:
        release.set()
    assert _recovery_return(result).metadata == {UNKNOWN_OUTCOME_METADATA_KEY: True}
    assert world.payments.calls == 0


class Order(BaseModel):
    order_id: str
    amount: int


async def test_reconciler_for_a_plain_function_gets_validated_arguments_and_deps() -> None:
    """`@reconciler_for(fn)` applies where `fn` is offered as a tool; args are validated as the tool gets them."""
    ledger: dict[str, str] = {}

    def pay_order(ctx: RunContext[dict[str, str]], order: Order) -> str:
        return ctx.deps.setdefault(call_key(ctx), f"paid {order.order_id}")

    seen: list[ReconcileRequest] = []

    @reconciler_for(pay_order)
    def find_payment(request: ReconcileRequest) -> Any:
        seen.append(request)
        found = request.deps.get(request.key)
        return NotDone() if found is None else Reconciled(found)

    def order_script(messages: list[Any], info: AgentInfo) -> ModelResponse:
        if not any(isinstance(p, ToolReturnPart) for p in messages[-1].parts):
            args = {"order": {"order_id": "A1", "amount": 40}}
            return ModelResponse(parts=[ToolCallPart("pay_order", args, tool_call_id="p")])
        return ModelResponse(parts=[TextPart("ok")])

    harness = Harness(Agent(FunctionModel(order_script), deps_type=dict, tools=[pay_order]))
    async with harness.stream("pay", bindings=_deps(ledger)) as stream:
        async for event in stream:
            if isinstance(event, BoundaryEvent) and event.kind == "tool":
                state = await stream.export_state()
                break
    key = derive_call_key(state.thread_id, state.message_history[-1].run_id, "p")
    ledger[key] = "paid A1 (before the crash)"
    result = await harness.run(previous_state=state, bindings=_deps(ledger))
    (request,) = seen
    assert request.args == {"order": Order(order_id="A1", amount=40)} and request.deps is ledger
    returned = result.new_messages()[0].parts[0]
    assert isinstance(returned, ToolReturnPart) and returned.content == "paid A1 (before the crash)"


def _deps(deps: Any) -> Any:
    from candor import RunBindings

    return RunBindings(deps=deps)


async def test_cancel_while_a_reconciler_waits_ends_the_run_cancelled() -> None:
    """H-60, H-105: cancelling during reconcile stops it at once; the candidate closes the call as unknown."""
    started = asyncio.Event()

    async def hang(world: World, request: ReconcileRequest) -> Any:
        started.set()
        await asyncio.sleep(30)

    world = World(hang)
    assert world.tool.metadata is not None
    world.tool = with_reconciler(world.tool, world.tool.metadata[RECONCILER_METADATA_KEY].function, timeout=60)
    world.harness = Harness(Agent(FunctionModel(script), tools=[world.tool]))
    state = await world.crash_after_charge(charged=True)
    stream = world.harness.stream(previous_state=state)
    async with stream:
        consumer = asyncio.ensure_future(_drain(stream))
        await asyncio.wait_for(started.wait(), 5)
        stream.cancel()
        await asyncio.wait_for(consumer, 5)
    assert stream.outcome is not None and stream.outcome.status == "cancelled"
    assert stream.outcome.state is not None
    last = stream.outcome.state.message_history[-1]
    (part,) = last.parts
    charge = state.message_history[-1].parts[0]
    assert isinstance(part, ToolReturnPart) and isinstance(charge, ToolCallPart)
    assert _same_part(part, unknown_outcome_result(charge))


async def _drain(stream: Any) -> None:
    try:
        async for _ in stream:
            pass
    except asyncio.CancelledError:
        pass


async def test_an_interrupted_rerun_is_reconciled_by_the_next_recovery() -> None:
    """Docs, "Runs again, once": a rerun interrupted too leaves the same checkpoint; the next recovery asks again
    and, since the rerun sent the same key, finds the one charge instead of charging again."""
    world = World(_found)
    state = await world.crash_after_charge(charged=False)
    async with world.harness.stream(previous_state=state) as stream:
        async for event in stream:
            if getattr(event, "event_kind", None) == "function_tool_result":
                break  # the rerun charged; this process dies before anything is saved
    assert len(world.payments.charges) == 1 and len(world.keys_seen) == 1
    result = await world.harness.run(previous_state=state)
    assert world.payments.calls == 1 and len(world.asked) == 2
    assert world.asked[0].key == world.asked[1].key == world.keys_seen[0]
    assert _recovery_return(result).metadata[RECOVERY_METADATA_KEY] == "reconciled"


async def test_a_replayed_tools_own_metadata_is_kept_with_the_mark_added() -> None:
    """H-42 (nothing existing changes) and the docs: a replay's dict metadata gets `candor.recovery` added; other
    metadata is left as the tool gave it."""
    from pydantic_ai.messages import ToolReturn

    def tool_with(metadata: Any) -> Tool[Any]:
        def charge_card(amount: int) -> Any:
            return ToolReturn(return_value="ok", metadata=metadata)

        return recovery_retryable(Tool(charge_card))

    for given, expected in [
        ({"source": "api"}, {"source": "api", RECOVERY_METADATA_KEY: "replayed"}),
        (["a", "list"], ["a", "list"]),
    ]:
        harness = Harness(Agent(FunctionModel(script), tools=[tool_with(given)]))
        async with harness.stream("Charge $40") as stream:
            async for event in stream:
                if isinstance(event, BoundaryEvent) and event.kind == "tool":
                    state = await stream.export_state()
                    break
        result = await harness.run(previous_state=state)
        assert _recovery_return(result).metadata == expected
