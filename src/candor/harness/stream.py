"""RunStream: drives one run of the agent, stops at safe boundaries, and owns recovery and cleanup (spec §3.7).

The run is driven node by node with `Agent.iter`. Every step runs in its own task so that `cancel()` can stop
it at once; the events it produces are forwarded to the single consumer. The stream keeps its own append-only
copy of the history (the *canonical* history): messages enter it at boundaries and are never changed after,
which is what makes checkpoints append-only (H-39).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import copy
import dataclasses
from collections.abc import AsyncGenerator, Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from pydantic import TypeAdapter
from pydantic_ai import CallToolsNode, DeferredToolRequests, ModelRequestNode
from pydantic_ai.exceptions import UsageLimitExceeded
from pydantic_ai.messages import ModelMessage, ModelRequest, ModelResponse, UserContent, UserPromptPart
from pydantic_ai.usage import RunUsage, UsageLimits
from pydantic_graph import End

from . import _agent_glue as glue
from ._detach import detached, detached_all
from ._driver import TaskDrivenGenerator
from ._reconcile_run import reconcile_open_calls
from ._recovery_start import OpenCallStart, start_open_calls
from .bindings import RunBindings
from .candidates import normalize_candidate
from .capability_store import CapabilityStore
from .deferred import DeferredToolResume
from .errors import HarnessError, RunCleanupError, RunError, StateError
from .events import BoundaryEvent, RunResultEvent
from .history import last_response, unanswered_calls
from .ids import new_run_id
from .recovery import ToolRecovery
from .results import RunResult, SafeFailure
from .state import HarnessState, _trusted_state

if TYPE_CHECKING:
    from .harness import Harness

OutputT = TypeVar("OutputT")
InputValue = str | Sequence[UserContent] | None

USAGE_CAPABILITY_ID = "candor.usage"
STEERING_CAPABILITY_ID = "candor.steering"
_usage_adapter: TypeAdapter[RunUsage] = TypeAdapter(RunUsage)

__all__ = ("RunStream", "USAGE_CAPABILITY_ID", "STEERING_CAPABILITY_ID")

_STEP_DONE = object()


@dataclass(frozen=True, slots=True)
class _SnapshotRecipe:
    """What the state of the latest safe boundary is made of; the state is built only when asked (export_state)."""

    history: tuple[ModelMessage, ...]
    """The canonical history at the boundary."""
    namespaces: CapabilityStore
    """A frozen copy of the capability namespaces (steer() still records pending input into it, H-104)."""
    environment: dict[str, Any]
    """A detached copy of the environment entries."""
    usage: RunUsage | None
    """The usage to record in "candor.usage"; None at run start, where the previous state stands as it was (H-98)."""


@dataclass(frozen=True, slots=True)
class _StartPlan:
    """How the run starts (decided before `agent.iter`): what is prompted and whether open calls come first."""

    user_input: InputValue
    """The input still to deliver once open calls are closed (None once it was queued as steering, H-59)."""
    iter_prompt: InputValue
    """The prompt `agent.iter` gets: the input, unless open calls or a fresh batch must be answered first."""
    has_open_start: bool
    """Unanswered calls of the last response, or a fresh deferred batch, are handled before the first request."""


class RunStream(Generic[OutputT]):
    """One run: an async context manager (entered once) and an async iterator of events (one consumer)."""

    def __init__(
        self,
        harness: Harness[OutputT],
        *,
        input: InputValue,  # noqa: A002 - the spec's parameter name (§3.5)
        input_factory: Callable[[], Awaitable[InputValue]] | None,
        previous_state: HarnessState,
        bindings: RunBindings,
        tool_recovery: ToolRecovery,
        deferred_resume: DeferredToolResume | None,
        usage: RunUsage,
        usage_limits: UsageLimits | None,
    ) -> None:
        self._harness = harness
        self._input = input
        self._input_factory = input_factory
        self._previous = previous_state
        self._bindings = bindings
        self._tool_recovery = tool_recovery
        self._batch = deferred_resume
        self._usage_limits = usage_limits
        self.thread_id = previous_state.thread_id
        self.run_id = new_run_id()
        self._usage = usage
        self._store = CapabilityStore(previous_state._capabilities_ref())
        self._environment: dict[str, Any] = dict(previous_state._environment_ref())
        # canonical history: what earlier boundaries exported, never changed afterwards
        self._history: list[ModelMessage] = list(previous_state._history_ref())
        self._base_len = len(self._history)
        self._snapshot: HarnessState | None = None
        self._snapshot_recipe: _SnapshotRecipe | None = None
        self._steer_queue: list[tuple[str | None, InputValue]] = []
        self._steering_touched = False
        # H-85: pending input restored from the state stays recorded until a host delivers it again.
        self._restored_steering = _restored_steering(self._store)
        self._provider_suspended_start = False
        self._incorporated: list[str] = []
        self._boundary_index = 0
        self._entered = False
        self._iterating = False
        self._in_next = False
        self._closed = False
        self._events: TaskDrivenGenerator | None = None
        self._context: contextvars.Context | None = None
        self._closing = False
        self._teardown_causes: list[BaseException] = []
        self._step_task: asyncio.Task[Any] | None = None
        self._cancel_requested = False
        self._candidate: RunResult[OutputT] | None = None
        self._run: Any = None
        """pydantic-ai's `AgentRun` once `agent.iter` has started."""
        self._next_node: Any = None
        """The node the last `_step` returned."""
        self.result: RunResult[OutputT] | None = None
        self.outcome: RunResult[OutputT] | None = None

    # -- public members --------------------------------------------------------------------------------
    @property
    def usage(self) -> RunUsage:
        return detached(self._usage)

    @property
    def pending_deferred_input(self) -> DeferredToolResume | None:
        """H-96: the accepted batch items history has not incorporated yet, as a recovery batch."""
        if self._batch is None:
            return None
        outcome_state = self.outcome.state if self.outcome is not None else None
        history = outcome_state._history_ref() if outcome_state is not None else self._history
        remaining = self._batch.remaining(history)
        if remaining is None:
            return None
        return DeferredToolResume(remaining.requests, remaining.results, recovery=True)

    def cancel(self) -> None:
        """H-105: end the run `cancelled` at the earliest point; running async tools are cancelled."""
        self._cancel_requested = True
        if self._step_task is not None and not self._step_task.done():
            self._step_task.cancel()

    async def steer(self, input: InputValue, *, key: str | None = None) -> None:  # noqa: A002 - spec name
        """H-104: queue user input; it enters history before the next model request."""
        if not self._entered or self._closed:
            raise RunError("steer() needs an active stream", code="run_not_active")
        self._steer_queue.append((key, input))
        self._record_steering()
        if self._snapshot_recipe is not None:
            # H-104: a state exported before the input is incorporated still carries it.
            steering = self._store._raw(STEERING_CAPABILITY_ID)
            if steering is not None:
                self._snapshot_recipe.namespaces._put(STEERING_CAPABILITY_ID, *steering)
            self._snapshot = None

    async def export_state(self) -> HarnessState:
        """The state of the latest safe boundary (H-98); saves nothing."""
        if not self._entered:
            raise StateError("the stream has not been entered yet", code="run_not_active")
        if self._closed:
            if self.outcome is None or self.outcome.state is None:
                raise StateError("no state could be captured at shutdown", code="run_state_unavailable")
            return self.outcome.state
        if self._snapshot is None:
            recipe = self._snapshot_recipe
            assert recipe is not None  # taken when the stream is entered
            if recipe.usage is not None:
                recipe.namespaces._put(USAGE_CAPABILITY_ID, "1", _usage_adapter.dump_python(recipe.usage, mode="json"))
            self._snapshot = _trusted_state(
                thread_id=self.thread_id,
                message_history=recipe.history,
                capabilities=recipe.namespaces.snapshot_now(),
                environment=recipe.environment,
            )
        return self._snapshot

    # -- context manager and iterator -----------------------------------------------------------------
    async def __aenter__(self) -> RunStream[OutputT]:
        if self._entered:
            raise RunError("a RunStream can be entered only once", code="run_stream_reused")
        self._entered = True
        # The run is driven in a task created in this context: capability_state() there is this run's store,
        # even when several streams are driven from one consumer task.
        self._context = contextvars.copy_context()
        self._context.run(self._store._activate)
        self._take_snapshot(at_start=True)
        self._events = TaskDrivenGenerator(self._drive, context=self._context)
        return self

    async def __aexit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        await self._shutdown()

    def __aiter__(self) -> RunStream[OutputT]:
        if self._iterating:
            raise RunError("a RunStream has a single consumer", code="run_stream_reused")
        self._iterating = True
        return self

    async def __anext__(self) -> Any:
        if self._in_next:
            raise RunError("concurrent __anext__ on a RunStream", code="run_stream_concurrent_next")
        if not self._entered:
            await self.__aenter__()
        if self._closed or self._events is None:
            raise StopAsyncIteration
        self._in_next = True
        try:
            event = await self._events.next()
        except StopAsyncIteration:
            await self._shutdown()
            raise
        except BaseException:
            await self._shutdown(raised=True)
            raise
        finally:
            self._in_next = False
        if isinstance(event, RunResultEvent):
            self.result = event.result
        return event

    async def _shutdown(self, *, raised: bool = False) -> None:
        if self._closed:
            return
        causes: list[BaseException] = []
        self._closing = True
        if self._events is not None:
            try:
                await self._events.aclose()
            except BaseException as exc:  # noqa: BLE001 - every teardown failure is collected (H-101)
                causes.append(exc)
        causes[:0] = self._teardown_causes
        self._closed = True
        if self.outcome is None and self._candidate is None and not raised:
            # The consumer left before the end: the run is over, cancelled, with a safe candidate.
            self._candidate = self._terminal_candidate("cancelled")
        self.outcome = self._candidate
        if causes:
            self.result = None
            raise RunCleanupError("the run's teardown failed", outcome=self._candidate, causes=tuple(causes))

    # -- driving the run ------------------------------------------------------------------------------
    async def _drive(self) -> AsyncGenerator[Any, None]:
        """All events of the run, then one RunResultEvent, yielded only after the agent run was torn down."""
        try:
            async with contextlib.aclosing(self._drive_agent()) as events:
                async for event in events:
                    yield event
        except asyncio.CancelledError:
            if not self._cancel_requested:
                raise
            self._candidate = self._terminal_candidate("cancelled")
        except HarnessError:
            raise
        except UsageLimitExceeded as exc:
            failure = SafeFailure(
                code="usage_limit_exceeded", message="A usage limit of the run was exceeded.",
                details={"error_type": type(exc).__name__},
            )
            self._candidate = self._terminal_candidate("failed", failure=failure)
        except Exception as exc:
            if self._closing:
                # The consumer is closing the stream and the agent run's teardown failed (H-101).
                self._teardown_causes.append(exc)
                return
            if self._candidate is not None:
                # H-102: the run had produced a validated result when its teardown failed.
                raise RunCleanupError(
                    "the run's teardown failed after its result was validated",
                    outcome=self._candidate,
                    causes=(exc,),
                ) from exc
            # H-31: foreign exceptions end the run failed, with a state
            self._candidate = self._terminal_candidate("failed", failure=glue.classify_agent_exception(exc))
        assert self._candidate is not None
        yield RunResultEvent(self._candidate)

    async def _drive_agent(self) -> AsyncGenerator[Any, None]:
        """The agent run: the start phase (open calls or a fresh batch), then the node loop with its boundaries."""
        agent = self._harness.agent
        plan = self._plan_start(await self._resolve_input())
        history = self._history
        await self._restore_environments()
        async with agent.iter(
            plan.iter_prompt,
            message_history=detached_all(history),
            output_type=glue.deferred_output_type(agent),
            deps=self._bindings.deps,
            model=self._bindings.model,
            toolsets=list(self._bindings.toolsets),
            capabilities=[
                glue.HarnessCapability(
                    deferred_tools_supported=self._bindings.deferred_tools_supported,
                    refresh_system_prompt=bool(history),
                ),
                *self._bindings.capabilities,
            ],
            usage=self._usage,
            usage_limits=self._usage_limits,
            run_id=self.run_id,
            conversation_id=self.thread_id,
        ) as run:
            self._run = run
            self._next_node = run.next_node
            if plan.has_open_start:
                async with contextlib.aclosing(self._start_open_calls(run, plan.user_input)) as events:
                    async for event in events:
                        yield event
                if self._candidate is not None:
                    return  # the start phase suspended the run again
            async with contextlib.aclosing(self._node_loop(run, self._next_node)) as events:
                async for event in events:
                    yield event

    def _plan_start(self, user_input: InputValue) -> _StartPlan:
        """Decide how the run starts, from the restored history and the batch (H-58, H-59, H-80, H-91)."""
        if self._batch is not None and self._batch.recovery:
            self._batch = self._batch.remaining(self._history)  # H-91: incorporated → no batch
        history = self._history
        last = last_response(history)
        provider_suspended = bool(history) and last is not None and last.state == "suspended" and history[-1] is last
        self._provider_suspended_start = provider_suspended
        open_calls = [] if provider_suspended else unanswered_calls(history)
        has_open_start = bool(open_calls) or (self._batch is not None and not self._batch.recovery)
        if provider_suspended and user_input is not None:
            self._steer_queue.append((None, user_input))  # H-59: pydantic-ai continues the response first
            user_input = None
        return _StartPlan(
            user_input=user_input, iter_prompt=None if has_open_start else user_input, has_open_start=has_open_start
        )

    async def _start_open_calls(self, run: Any, user_input: InputValue) -> AsyncGenerator[Any, None]:
        """H-40…H-62, H-74…H-83: close the restored open calls (recovery) or apply the fresh batch before the first
        model request. Leaves the node to continue with in `_next_node`, or a suspended candidate."""
        node = await self._await_step(run, self._next_node, stream_events=False)
        if isinstance(node, ModelRequestNode) and node.is_resuming_without_prompt:
            await glue.restore_resumed_request(run, node)
        reconciled = await self._cancellable(
            reconcile_open_calls(
                run, history=self._history, batch=self._batch, mode=self._tool_recovery, thread_id=self.thread_id
            )
        )
        start: OpenCallStart = start_open_calls(
            run,
            history=self._history,
            batch=self._batch,
            mode=self._tool_recovery,
            user_input=user_input,
            deferred_tools_supported=self._bindings.deferred_tools_supported,
            reconciled=reconciled,
        )
        if not start.calls and self._batch is None and isinstance(node, CallToolsNode):
            # §2: output-tool calls are pydantic-ai's to process; the restored response ends the run.
            self._next_node = node
            return
        if start.native_node is not None:
            async with contextlib.aclosing(self._step(run, start.native_node)) as events:
                async for event in events:
                    yield event
            node = self._next_node
        else:
            node = None
        outcome = start.finish(run, node)
        if outcome.suspend is not None:
            self._append_new(outcome.messages)
            await self._export_environments()
            self._finish_suspended(outcome.suspend)
            return
        self._next_node = outcome.node

    async def _node_loop(self, run: Any, node: Any) -> AsyncGenerator[Any, None]:
        """Step node by node to the end, stopping at a model boundary before every request (H-35, H-36) and at a
        tool boundary after every response with tool calls (H-37, H-38)."""
        while not isinstance(node, End):
            if isinstance(node, ModelRequestNode):
                # A re-sent trailing request is already the canonical history's last message.
                resent = node.is_resuming_without_prompt or glue.is_provider_continuation(node)
                if not resent:
                    node = self._incorporate_steering(node)
                yield await self._boundary("model", run, pending_request=None if resent else node.request)
            elif isinstance(node, CallToolsNode) and node.model_response.tool_calls:
                yield await self._boundary("tool", run)
            async with contextlib.aclosing(self._step(run, node)) as events:
                async for event in events:
                    yield event
            node = self._next_node
        self._sync(run)
        await self._export_environments()  # H-23: run end is a safe boundary too
        self._finish_end(run, node)

    async def _resolve_input(self) -> InputValue:
        if self._input_factory is None:
            return self._input
        try:
            return await self._input_factory()
        except Exception as exc:
            raise RunError(
                "the input factory raised", code="input_factory_failed", details={"error_type": type(exc).__name__}
            ) from exc

    async def _cancellable(self, work: Coroutine[Any, Any, Any]) -> Any:
        """Await `work` in a task that `cancel()` stops at once (H-105), like a step."""
        if self._cancel_requested:
            work.close()
            raise asyncio.CancelledError
        task = asyncio.ensure_future(work)
        self._step_task = task
        try:
            return await task
        finally:
            self._step_task = None

    async def _await_step(self, run: Any, node: Any, *, stream_events: bool) -> Any:
        async with contextlib.aclosing(self._step(run, node, stream_events=stream_events)) as events:
            async for _ in events:
                pass
        return self._next_node

    async def _step(self, run: Any, node: Any, *, stream_events: bool = True) -> AsyncGenerator[Any, None]:
        """Run one node in a cancellable task and forward its events as they come."""
        if self._cancel_requested:
            raise asyncio.CancelledError
        queue: asyncio.Queue[Any] = asyncio.Queue()
        streams = stream_events and (
            isinstance(node, CallToolsNode)
            or (isinstance(node, ModelRequestNode) and glue.model_streams(self._harness.agent, self._bindings.model))
        )

        async def execute() -> Any:
            if streams:
                async with node.stream(run.ctx) as events:
                    async for event in events:
                        queue.put_nowait(event)
            return await run.next(node)

        task = asyncio.ensure_future(execute())  # inherits the run's context (capability store)
        # One wake-up per event and one when the step ends: no extra task per event.
        task.add_done_callback(lambda _: queue.put_nowait(_STEP_DONE))
        self._step_task = task
        try:
            while True:
                item = await queue.get()
                if item is _STEP_DONE:
                    self._next_node = task.result()
                    return
                yield item
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(BaseException):  # the step's own error is reported elsewhere
                    await task
            self._step_task = None
            self._usage = run.usage

    # -- boundaries and history -----------------------------------------------------------------------
    def _pyd_new(self, run: Any) -> list[ModelMessage]:
        return list(run.new_messages())

    def _append_new(self, messages: Sequence[ModelMessage]) -> None:
        """Extend the canonical history with messages beyond what it already holds (append-only)."""
        new_len = len(self._history) - self._base_len
        for message in list(messages)[new_len:]:
            self._history.append(detached(message))  # pydantic-ai and tools keep the originals (H-6, H-11)

    def _sync(self, run: Any, pending_request: ModelRequest | None = None) -> None:
        # pydantic-ai's new_messages() starts after the history it was given (a re-sent trailing request
        # included), so it lines up with the canonical history's new part.
        target = self._pyd_new(run)
        if self._provider_suspended_start:
            self._adopt_continued_response(run, len(target))
        if pending_request is not None:
            target.append(pending_request)
        self._append_new(target)

    def _take_snapshot(self, *, at_start: bool = False) -> None:
        """Remember the state of this safe boundary; it is built only if someone asks for it (export_state)."""
        self._snapshot = None
        self._snapshot_recipe = _SnapshotRecipe(
            history=tuple(self._history),
            namespaces=self._store._freeze(),
            environment=detached(self._environment),
            usage=None if at_start else copy.copy(self._usage),
        )

    def _adopt_continued_response(self, run: Any, new_count: int) -> None:
        """H-59: pydantic-ai stitches a provider-suspended response's continuation into that same response."""
        everything = run.all_messages()
        index = len(everything) - new_count - 1
        if index >= 0 and self._base_len and isinstance(everything[index], ModelResponse):
            continued = everything[index]
            if continued != self._history[self._base_len - 1]:
                self._history[self._base_len - 1] = detached(continued)

    async def _boundary(
        self, kind: Literal["model", "tool"], run: Any, *, pending_request: ModelRequest | None = None
    ) -> BoundaryEvent:
        if pending_request is not None and pending_request.timestamp is None:
            # A new object, so pydantic-ai's request is left as it is; `_sync` detaches it into the history.
            pending_request = dataclasses.replace(
                pending_request,
                timestamp=datetime.now(UTC),
                run_id=pending_request.run_id or self.run_id,
                conversation_id=pending_request.conversation_id or self.thread_id,
            )
        self._sync(run, pending_request)
        await self._export_environments()
        self._take_snapshot()
        self._boundary_index += 1
        keys, self._incorporated = tuple(self._incorporated), []
        return BoundaryEvent(
            kind=kind, index=self._boundary_index, message_count=len(self._history), incorporated_keys=keys
        )

    def _incorporate_steering(self, node: ModelRequestNode[Any, Any]) -> ModelRequestNode[Any, Any]:
        if not self._steer_queue:
            return node
        parts = list(node.request.parts)
        for key, content in self._steer_queue:
            parts.append(UserPromptPart(content))  # type: ignore[arg-type]
            if key is not None:
                self._incorporated.append(key)
        self._steer_queue = []
        self._record_steering()
        request = dataclasses.replace(node.request, parts=parts)
        replaced: ModelRequestNode[Any, Any] = glue.replace_request(node, request)
        return replaced

    def _record_steering(self) -> None:
        """H-104: queued input lives in "candor.steering" until it is incorporated."""
        entries = self._restored_steering + [
            {"key": key, "content": _jsonable_input(content)} for key, content in self._steer_queue
        ]
        if self._steer_queue:
            self._steering_touched = True
        if entries and self._steering_touched:
            self._store._put(STEERING_CAPABILITY_ID, "1", {"pending": entries})
        elif self._steering_touched:
            # H-85: a namespace restored from the state is kept exactly unless this run steered.
            self._store._remove(STEERING_CAPABILITY_ID)

    def _write_usage(self) -> None:
        self._store._put(USAGE_CAPABILITY_ID, "1", _usage_adapter.dump_python(self._usage, mode="json"))

    async def _restore_environments(self) -> None:
        for name, provider in self._bindings.environments.items():
            await provider.restore(copy.deepcopy(self._environment.get(name)))

    async def _export_environments(self) -> None:
        for name, provider in self._bindings.environments.items():
            self._environment[name] = copy.deepcopy(await provider.export())

    def _build_state(self, history: Sequence[ModelMessage]) -> HarnessState:
        return _trusted_state(
            thread_id=self.thread_id,
            message_history=tuple(history),
            capabilities=self._store.snapshot_now(),
            environment=detached(self._environment),
        )

    # -- outcomes ----------------------------------------------------------------------------------------
    def _finish_end(self, run: Any, node: End[Any]) -> None:
        output = node.data.output if hasattr(node.data, "output") else run.result.output
        self._write_usage()
        if isinstance(output, DeferredToolRequests):
            if not self._bindings.deferred_tools_supported:
                failure = SafeFailure(
                    code="deferred_tools_unsupported",
                    message="The run needed an approval or an outside answer, which this host cannot give.",
                )
                self._candidate = self._terminal_candidate("failed", failure=failure)
                return
            self._finish_suspended(output)
            return
        state = self._build_state(self._history)
        self._snapshot = state
        self._candidate = RunResult(
            thread_id=self.thread_id, run_id=self.run_id, status="completed", output=output, state=state,
            usage=self._usage, messages=state._history_ref(), new_message_index=self._base_len,
        )

    def _finish_suspended(self, deferred: DeferredToolRequests) -> None:
        self._write_usage()
        state = self._build_state(self._history)
        self._snapshot = state
        self._candidate = RunResult(
            thread_id=self.thread_id, run_id=self.run_id, status="suspended", state=state, usage=self._usage,
            suspend_reason="deferred", deferred=deferred, messages=state._history_ref(),
            new_message_index=self._base_len,
        )

    def _terminal_candidate(
        self, status: Literal["failed", "cancelled"], *, failure: SafeFailure | None = None
    ) -> RunResult[OutputT]:
        """A failed/cancelled result with the safe candidate state of H-103, or without state if none can be built."""
        try:
            messages: list[ModelMessage] = list(self._history)
            if self._run is not None:
                pyd = self._pyd_new(self._run)
                new_len = len(self._history) - self._base_len
                messages.extend(detached_all(pyd[new_len:]))
            pending = self._pending_answer_ids_now(messages)
            normalized = normalize_candidate(messages, stable_prefix=len(self._history), pending_answer_ids=pending)
            self._write_usage()
            state: HarnessState | None = self._build_state(normalized)
        except Exception:  # noqa: BLE001 - a candidate is best effort (H-98: run_state_unavailable)
            state = None
            normalized = list(self._history)
        return RunResult(
            thread_id=self.thread_id, run_id=self.run_id, status=status, state=state, usage=self._usage,
            failure=failure, messages=normalized, new_message_index=self._base_len,
        )

    def _pending_answer_ids_now(self, messages: Sequence[ModelMessage]) -> frozenset[str]:
        if self._batch is None:
            return frozenset()
        try:
            remaining = self._batch.remaining(messages)
        except RunError:
            return frozenset()
        if remaining is None:
            return frozenset()
        requests = remaining.requests
        return frozenset(c.tool_call_id for c in (*requests.calls, *requests.approvals))


def _jsonable_input(content: InputValue) -> Any:
    if content is None or isinstance(content, str):
        return content
    try:
        return TypeAdapter(list[UserContent]).dump_python(list(content), mode="json")
    except Exception:  # noqa: BLE001
        return str(content)


def _restored_steering(store: CapabilityStore) -> list[Any]:
    stored = store._raw(STEERING_CAPABILITY_ID)
    if stored is None or not isinstance(stored[1], dict):
        return []
    pending = stored[1].get("pending")
    return list(pending) if isinstance(pending, list) else []
