"""RunStream: drives one run of the agent, stops at safe boundaries, and owns recovery and cleanup (spec §3.7).

The run is driven node by node with `Agent.iter` (`_stepping.py`: every step runs in its own task so that
`cancel()` can stop it at once); the events it produces are forwarded to the single consumer. The stream keeps
its own append-only copy of the history (the *canonical* history, `_canonical.py`): messages enter it at
boundaries and are never changed after, which is what makes checkpoints append-only (H-39).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import copy
import dataclasses
from collections.abc import AsyncGenerator, Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar

from pydantic_ai import CallToolsNode, DeferredToolRequests, ModelRequestNode
from pydantic_ai.exceptions import UsageLimitExceeded
from pydantic_ai.messages import ModelRequest
from pydantic_ai.usage import RunUsage, UsageLimits
from pydantic_graph import End

from . import _agent_glue as glue
from ._canonical import CanonicalHistory, SnapshotRecipe
from ._detach import detached, detached_all
from ._driver import TaskDrivenGenerator
from ._outcomes import RunOutcomes, deferred_unsupported_failure, usage_limit_failure
from ._reconcile_run import reconcile_open_calls
from ._recovery_start import OpenCallStart, start_open_calls
from ._start_plan import plan_start
from ._steering import STEERING_CAPABILITY_ID, InputValue, SteeringQueue
from ._stepping import NodeStepper
from ._usage_state import USAGE_CAPABILITY_ID
from .bindings import RunBindings
from .capability_store import CapabilityStore
from .deferred import DeferredToolResume, stamp_function_ids
from .errors import HarnessError, RunCleanupError, RunError, StateError
from .events import BoundaryEvent, RunResultEvent
from .ids import new_run_id
from .recovery import ToolRecovery
from .results import RunResult, SafeFailure
from .state import HarnessState

if TYPE_CHECKING:
    from .harness import Harness

OutputT = TypeVar("OutputT")

__all__ = ("RunStream", "USAGE_CAPABILITY_ID", "STEERING_CAPABILITY_ID")


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
        self._bindings = bindings
        self._tool_recovery = tool_recovery
        self._batch = deferred_resume
        self._usage_limits = usage_limits
        self.thread_id = previous_state.thread_id
        self.run_id = new_run_id()
        self._usage = usage
        self._store = CapabilityStore(previous_state._capabilities_ref())
        self._environment: dict[str, Any] = dict(previous_state._environment_ref())
        self._history = CanonicalHistory(previous_state._history_ref())
        self._steering = SteeringQueue(self._store)
        self._stepper = NodeStepper(model_streams=self._model_streams, on_step_end=self._count_usage)
        self._outcomes: RunOutcomes[OutputT] = RunOutcomes(
            thread_id=self.thread_id,
            run_id=self.run_id,
            history=self._history,
            store=self._store,
            environment=self._environment,
        )
        self._snapshot: HarnessState | None = None
        """The latest safe boundary's state, once built from `_snapshot_recipe` (or the final state)."""
        self._snapshot_recipe: SnapshotRecipe | None = None
        self._boundary_index = 0
        self._entered = False
        self._iterating = False
        self._in_next = False
        self._closed = False
        self._closing = False
        self._events: TaskDrivenGenerator | None = None
        self._context: contextvars.Context | None = None
        self._teardown_causes: list[BaseException] = []
        self._candidate: RunResult[OutputT] | None = None
        self._run: Any = None
        """pydantic-ai's `AgentRun` once `agent.iter` has started."""
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
        history = outcome_state._history_ref() if outcome_state is not None else self._history.messages
        remaining = self._batch.remaining(history)
        if remaining is None:
            return None
        return DeferredToolResume(remaining.requests, remaining.results, recovery=True)

    def cancel(self) -> None:
        """H-105: end the run `cancelled` at the earliest point; running async tools are cancelled."""
        self._stepper.cancel()

    async def steer(self, input: InputValue, *, key: str | None = None) -> None:  # noqa: A002 - spec name
        """H-104: queue user input; it enters history before the next model request."""
        if not self._entered or self._closed:
            raise RunError("steer() needs an active stream", code="run_not_active")
        self._steering.push(key, input)
        if self._snapshot_recipe is not None:
            # H-104: a state exported before the input is incorporated still carries it.
            self._snapshot_recipe.carry(STEERING_CAPABILITY_ID, self._steering.recorded())
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
            assert self._snapshot_recipe is not None  # taken when the stream is entered
            self._snapshot = self._snapshot_recipe.build(self.thread_id)
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
            if not self._stepper.cancel_requested:
                raise
            self._candidate = self._terminal_candidate("cancelled")
        except HarnessError:
            raise
        except UsageLimitExceeded as exc:
            self._candidate = self._terminal_candidate("failed", failure=usage_limit_failure(exc))
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
        plan = plan_start(self._history.messages, batch=self._batch, user_input=await self._resolve_input())
        self._batch = plan.batch
        self._history.provider_suspended_start = plan.provider_suspended
        if plan.queued_input is not None:
            self._steering.push_run_input(plan.queued_input)
        history = self._history.messages
        await self._restore_environments()
        async with agent.iter(
            plan.iter_prompt,
            message_history=detached_all(history),
            output_type=glue.deferred_output_type(agent),
            deps=self._bindings.deps,
            model=self._bindings.model,
            toolsets=list(self._bindings.toolsets),
            capabilities=[
                *glue.harness_capabilities(
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
            self._stepper.next_node = run.next_node
            if plan.has_open_start:
                async with contextlib.aclosing(self._start_open_calls(run, plan.user_input)) as events:
                    async for event in events:
                        yield event
                if self._candidate is not None:
                    return  # the start phase suspended the run again
            async with contextlib.aclosing(self._node_loop(run, self._stepper.next_node)) as events:
                async for event in events:
                    yield event

    async def _start_open_calls(self, run: Any, user_input: InputValue) -> AsyncGenerator[Any, None]:
        """H-40…H-62, H-74…H-83: close the restored open calls (recovery) or apply the fresh batch before the first
        model request. Leaves the node to continue with in the stepper's `next_node`, or a suspended candidate."""
        history = self._history.messages
        node = await self._stepper.run_quietly(run, self._stepper.next_node)
        if isinstance(node, ModelRequestNode) and node.is_resuming_without_prompt:
            await glue.restore_resumed_request(run, node)
        reconciled = await self._stepper.cancellable(
            reconcile_open_calls(
                run, history=history, batch=self._batch, mode=self._tool_recovery, thread_id=self.thread_id
            )
        )
        start: OpenCallStart = start_open_calls(
            run,
            history=history,
            batch=self._batch,
            mode=self._tool_recovery,
            user_input=user_input,
            deferred_tools_supported=self._bindings.deferred_tools_supported,
            reconciled=reconciled,
        )
        if not start.calls and self._batch is None and isinstance(node, CallToolsNode):
            # §2: output-tool calls are pydantic-ai's to process; the restored response ends the run.
            self._stepper.next_node = node
            return
        if start.native_node is not None:
            async with contextlib.aclosing(self._stepper.step(run, start.native_node)) as events:
                async for event in events:
                    yield event
            node = self._stepper.next_node
        else:
            node = None
        outcome = start.finish(run, node)
        if outcome.suspend is not None:
            self._history.append_new(outcome.messages)
            await self._export_environments()
            self._finish_suspended(outcome.suspend)
            return
        self._stepper.next_node = outcome.node

    async def _node_loop(self, run: Any, node: Any) -> AsyncGenerator[Any, None]:
        """Step node by node to the end, stopping at a model boundary before every request (H-35, H-36) and at a
        tool boundary after every response with tool calls (H-37, H-38)."""
        while not isinstance(node, End):
            if isinstance(node, ModelRequestNode):
                # A re-sent trailing request is already the canonical history's last message.
                resent = node.is_resuming_without_prompt or glue.is_provider_continuation(node)
                if not resent:
                    node = self._steering.incorporate(node)
                yield await self._boundary("model", run, pending_request=None if resent else node.request)
            elif isinstance(node, CallToolsNode) and node.model_response.tool_calls:
                yield await self._boundary("tool", run)
            async with contextlib.aclosing(self._stepper.step(run, node)) as events:
                async for event in events:
                    yield event
            node = self._stepper.next_node
        self._history.sync(run)
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

    def _model_streams(self) -> bool:
        return glue.model_streams(self._harness.agent, self._bindings.model)

    def _count_usage(self, run: Any) -> None:
        self._usage = run.usage

    # -- boundaries and state -------------------------------------------------------------------------
    async def _boundary(
        self, kind: Literal["model", "tool"], run: Any, *, pending_request: ModelRequest | None = None
    ) -> BoundaryEvent:
        if pending_request is not None and pending_request.timestamp is None:
            # A new object, so pydantic-ai's request is left as it is; `sync` detaches it into the history.
            pending_request = dataclasses.replace(
                pending_request,
                timestamp=datetime.now(UTC),
                run_id=pending_request.run_id or self.run_id,
                conversation_id=pending_request.conversation_id or self.thread_id,
            )
        self._history.sync(run, pending_request)
        await self._export_environments()
        self._take_snapshot()
        self._boundary_index += 1
        return BoundaryEvent(
            kind=kind,
            index=self._boundary_index,
            message_count=len(self._history.messages),
            incorporated_keys=self._steering.take_incorporated(),
        )

    def _take_snapshot(self, *, at_start: bool = False) -> None:
        """Remember the state of this safe boundary; it is built only if someone asks for it (export_state)."""
        self._snapshot = None
        self._snapshot_recipe = SnapshotRecipe(
            history=tuple(self._history.messages),
            namespaces=self._store._freeze(),
            environment=detached(self._environment),
            usage=None if at_start else copy.copy(self._usage),
        )

    async def _restore_environments(self) -> None:
        for name, provider in self._bindings.environments.items():
            await provider.restore(copy.deepcopy(self._environment.get(name)))

    async def _export_environments(self) -> None:
        for name, provider in self._bindings.environments.items():
            self._environment[name] = copy.deepcopy(await provider.export())

    # -- outcomes ----------------------------------------------------------------------------------------
    def _finish_end(self, run: Any, node: End[Any]) -> None:
        output = node.data.output if hasattr(node.data, "output") else run.result.output
        if not isinstance(output, DeferredToolRequests):
            self._finish(self._outcomes.completed(output, usage=self._usage))
        elif self._bindings.deferred_tools_supported:
            self._finish_suspended(output)
        else:
            self._candidate = self._terminal_candidate("failed", failure=deferred_unsupported_failure())

    def _finish_suspended(self, deferred: DeferredToolRequests) -> None:
        # §5: the deferrals of local function tools carry the tool's identity, from the surface they ran in.
        stamped = stamp_function_ids(deferred, glue.prepared_surface(self._run))
        self._finish(self._outcomes.suspended(stamped, usage=self._usage))

    def _finish(self, candidate: RunResult[OutputT]) -> None:
        self._snapshot = candidate.state
        self._candidate = candidate

    def _terminal_candidate(
        self, status: Literal["failed", "cancelled"], *, failure: SafeFailure | None = None
    ) -> RunResult[OutputT]:
        return self._outcomes.terminal(status, usage=self._usage, run=self._run, batch=self._batch, failure=failure)
