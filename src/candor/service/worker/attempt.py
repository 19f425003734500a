"""One attempt (§7.7): authority, state, harness stream → a checkpoint commit per boundary → seal or recovery.

`run_attempt()` never raises for anything the attempt itself ran into: what happened is classified with
`protocol.outcomes.classify_outcome` (§7.9) and settled with one write (final commit + seal, seal, recovery).
`LeaseLost` and the supervisor's deadline cancellation end the attempt without a seal; the usage it incurred is
still recorded (S-22, S-51). No transaction is ever open while the model or a tool works: each boundary is one
short fenced transaction, committed before the stream is asked for the next event (S-35, S-36).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import assert_never

from pydantic import JsonValue
from pydantic_ai.messages import ModelMessage
from pydantic_ai.usage import RunUsage
from pydantic_core import to_jsonable_python

from candor import BoundaryEvent, DeferredToolResume, HarnessState, RunBindings, RunResult, RunResultEvent
from candor.errors import HarnessError

from .. import failpoints
from ..agents import AgentUnavailable
from ..core import Service
from ..errors import CheckpointCorrupt, LeaseLost, StoreUnavailable
from ..metrics import ATTEMPT_DURATION, CHECKPOINT_COMMIT_BYTES, attempt_status_label
from ..protocol.db_faults import describe_database_error
from ..protocol.outcomes import (
    AttemptOutcome,
    HarnessStatus,
    NoSeal,
    OutcomeKind,
    Recover,
    Requeue,
    Seal,
    classify_outcome,
)
from ..protocol.pending import PendingInvalid, build_pending, wait_reason
from ..protocol.transitions import SealedRunStatus
from ..store.attempts import AttemptStart, CommitResult, SealRequest, advance_thread_after_seal, failure, record_usage
from ..store.checkpoints import (
    EncodedEnvelope,
    EncodedMessage,
    canonical_json,
    encode_envelope,
    encode_history_reusing,
    envelope_for_state,
)
from ..store.threads import NewStreamEntry, append_stream_entries
from .attempt_store import AttemptStore
from .children import child_toolsets
from .client_tools import CLIENT_TOOL_CONFLICT, agent_tool_names, client_tools_of, client_toolsets
from .deltas import DeltaBuffer
from .handle import AgentRunStream, AttemptHandle
from .inputs import deferred_json, input_content, resume_batch, resume_input, start_state, usage_delta, usage_json
from .lease_check import LeaseCheck, holding

__all__ = ("run_attempt",)

log = logging.getLogger("candor.worker")


@dataclass(frozen=True, kw_only=True, slots=True)
class _Finished:
    """How the attempt ended, before classification."""

    outcome: AttemptOutcome
    result: RunResult[object] | None = None
    """The harness result when the stream produced one."""
    message: str | None = None
    """A people-facing failure message from the harness (SafeFailure or HarnessError), if any."""
    cause: str | None = None
    """For the operator's log line only (never stored): why a transient failure happened, in words."""


def _ended(
    kind: OutcomeKind,
    *,
    harness_status: HarnessStatus | None = None,
    failure_code: str | None = None,
    output_bytes: int | None = None,
    result: RunResult[object] | None = None,
    message: str | None = None,
    cause: str | None = None,
) -> _Finished:
    outcome = AttemptOutcome(
        kind=kind, harness_status=harness_status, failure_code=failure_code, output_bytes=output_bytes
    )
    return _Finished(outcome=outcome, result=result, message=message, cause=cause)


async def run_attempt(service: Service, handle: AttemptHandle) -> None:
    """Execute the claimed attempt of `handle` to its end (§7.7–§7.11)."""
    attempt = _Attempt(service, handle)
    with holding(handle), attempt.trace.active():  # `lease_held()` for tools; the attempt span (telemetry)
        await attempt.run()


class _Attempt:
    def __init__(self, service: Service, handle: AttemptHandle) -> None:
        self.service = service
        self.handle = handle
        self.claimed = handle.claimed
        self.lease = handle.claimed.lease
        self.settings = service.settings
        self.store = AttemptStore(service, handle)
        """Every database call of the attempt, retried through a blip within the lease."""
        self.cause: str | None = None
        """Why the attempt failed or was abandoned, in words, for its "Attempt ended" line."""
        self.trace = service.telemetry.attempt(handle.claimed)
        self.expected_seq = self.claimed.checkpoint_seq
        self.base_id: str | None = self.claimed.checkpoint_id or self.claimed.start_checkpoint_id
        self.base_encoded: list[EncodedMessage] = []
        self.base_messages: tuple[ModelMessage, ...] = ()
        """The message objects `base_encoded` encodes (identity lets a boundary re-encode only new messages)."""
        self.recorded = RunUsage()
        """The usage already written to `usage_records` by this attempt."""
        self.stream: AgentRunStream | None = None
        self.has_resume_input = resume_input(self.claimed.resume, consumed=False) is not None
        """Whether the run carries a resume `input`; every envelope it commits records it as in history (S-88)."""
        self.stream_sequence = 0
        self.deltas = DeltaBuffer(self._write_deltas, flush_seconds=self.settings.worker.stream_coalesce_seconds)
        """§8.7: deltas ride in the next boundary commit, or go in their own write once the oldest waited
        `worker.stream_coalesce_seconds` (a slowly streaming model still shows them live)."""

    # -- top level ------------------------------------------------------------------------------------------------

    async def run(self) -> None:
        status, reason = "crashed", "exception"
        try:
            finished = await self._execute()
            self.cause = finished.cause
            status, reason = await self._settle(finished)
        except LeaseLost as exc:
            self.handle.lease_lost = True
            status, reason = "abandoned", f"lease_lost:{exc.reason}"
            await self._record_usage_unfenced()
        except StoreUnavailable as exc:  # the settling write's retries ran out of lease: expiry recovers the run
            status, reason, self.cause = "abandoned", "store_unavailable", describe_database_error(exc)
            await self._record_usage_unfenced()
        except asyncio.CancelledError:
            status, reason = "abandoned", "cancelled"
            if not self.handle.deadline_cancelled:
                raise
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            reason = "deadline_cancelled"
            await self._record_usage_unfenced()
        finally:
            self.trace.ended(status, reason, self.stream)
            duration = self.service.clock.monotonic() - self.handle.started_at
            ATTEMPT_DURATION.labels(status=attempt_status_label(status)).observe(duration)
            duration_ms = int(duration * 1000)
            log.info(
                "Attempt ended",
                extra={
                    "run_id": self.lease.run_id,
                    "attempt": self.lease.attempt_number,
                    "status": status,
                    "reason": reason,
                    "duration_ms": duration_ms,
                    **({"cause": self.cause} if self.cause else {}),
                },
            )

    def _guard(self) -> None:
        """S-24, S-25: no fenced write too close to the local lease deadline."""
        self.store.guard()

    # -- execution -----------------------------------------------------------------------------------------------

    def _before_harness(self) -> _Finished | None:
        """Stops honoured while the harness has not started: handoff at once (S-54), cancellation, revocation."""
        if self.handle.handoff_requested:
            return _ended("handoff")
        if self.handle.stop_reason is not None:
            return self._stopped()
        if self.claimed.cancel_requested:
            return _ended("cancelled_by_request")
        return None

    async def _execute(self) -> _Finished:
        handle, claimed = self.handle, self.claimed
        if (stop := self._before_harness()) is not None:
            return stop
        verdict = await self.store.authority(claimed.principal_id)
        if verdict == "refused":
            return _ended("authority_refused")  # S-63: the agent is never called
        if verdict == "unavailable":
            return _ended("authority_unavailable", cause="authority check unavailable")
        try:
            start = await self.store.load_start()
            state = self._start_state(start)
        except CheckpointCorrupt:
            return _ended("checkpoint_corrupt")
        except StoreUnavailable as exc:
            return _ended("database_unavailable", cause=describe_database_error(exc))
        try:
            harness = self.service.agents.build(claimed.agent, claimed.options)
            model = self.service.agents.model(claimed.agent)  # docs/providers.md: bound per run, key never stored
            mcp_toolsets = self.service.agents.mcp_toolsets(claimed.agent)  # docs/mcp.md: fresh per attempt
        except AgentUnavailable:
            return _ended("agent_factory_failed")
        tools = client_tools_of(claimed.options)  # §8.8: validated at post time; re-checked, never trusted
        if not isinstance(tools, list):
            return _ended(
                "harness_error", failure_code="client_tools_invalid", message=f"{tools.field}: {tools.reason}"
            )
        if clash := sorted({tool.name for tool in tools} & agent_tool_names(harness)):
            message = "client tools named like the agent's own tools: " + ", ".join(clash)
            return _ended("harness_error", failure_code=CLIENT_TOOL_CONFLICT, message=message)
        if claimed.resume_problem is not None:  # corrupt stored answers: parsed at the claim, reported here
            return _ended("harness_error", failure_code="deferred_results_invalid", message=claimed.resume_problem)
        try:
            stream: AgentRunStream = harness.stream(
                self._input(start),
                previous_state=state,
                tool_recovery=claimed.tool_recovery,  # the run's mode, fixed at acceptance
                bindings=RunBindings(
                    deferred_tools_supported=True,
                    model=model,
                    toolsets=[*client_toolsets(tools), *child_toolsets(self.service, claimed), *mcp_toolsets],
                    # no tool starts once the lease is not held; step spans (docs/telemetry.md)
                    capabilities=[LeaseCheck(handle), *self.trace.capabilities],
                ),
                deferred_resume=self._resume_batch(start),
            )
        except HarnessError as exc:
            return _ended("harness_error", failure_code=exc.code, message=str(exc))
        except ValueError:
            return _ended("harness_error", failure_code="deferred_results_invalid")
        if (stop := self._before_harness()) is not None:
            return stop
        try:
            await self.store.start(stream.run_id)
        except StoreUnavailable as exc:
            return _ended("database_unavailable", cause=describe_database_error(exc))
        self.stream = handle.stream = stream
        try:
            finished = await self._consume(stream, start)
        except HarnessError as exc:
            _raise_if_cancelling()  # a cancelled attempt never settles, whatever the stream reported
            return _ended("harness_error", failure_code=exc.code, message=str(exc))
        except StoreUnavailable as exc:
            _raise_if_cancelling()
            return _ended("database_unavailable", cause=describe_database_error(exc))
        except (LeaseLost, asyncio.CancelledError):
            raise
        except Exception as exc:
            _raise_if_cancelling()
            log.exception("Attempt failed unexpectedly", extra={"run_id": self.lease.run_id})
            return _ended("unexpected_exception", cause=f"unexpected {type(exc).__name__}")
        _raise_if_cancelling()
        return finished

    def _start_state(self, start: AttemptStart) -> HarnessState:
        loaded = start.checkpoint
        if loaded is not None:
            self.base_encoded = list(loaded.encoded)
        state = start_state(
            loaded.state if loaded is not None else None,
            thread_id=self.lease.thread_id,
            from_own_checkpoint=start.from_own_checkpoint,
        )
        if loaded is not None and state is loaded.state:
            self.base_messages = state.history_view()
        return state

    def _input(self, start: AttemptStart) -> str | list[str] | None:
        resume = self.claimed.resume
        if resume is not None:
            loaded = start.checkpoint
            consumed = start.from_own_checkpoint and loaded is not None and loaded.resume_input_consumed
            return resume_input(resume, consumed=consumed)
        return input_content(start.source_payload)

    def _resume_batch(self, start: AttemptStart) -> DeferredToolResume | None:
        if self.claimed.trigger != "resume" or self.claimed.resume is None:
            return None
        return resume_batch(start.resume_requests, self.claimed.resume, attempt_number=self.lease.attempt_number)

    async def _consume(self, stream: AgentRunStream, start: AttemptStart) -> _Finished:
        try:
            async with stream:
                for entry in start.assigned:  # §7.7 step 6, S-34
                    await self._steer(stream, entry.id, entry.payload)
                async for event in stream:
                    if isinstance(event, BoundaryEvent):
                        stop = await self._boundary(stream, event)
                        if stop is not None:
                            return stop  # leaving the block closes the stream: nothing more runs
                    elif not isinstance(event, RunResultEvent):
                        self._delta(event)  # §7.7 step 7: deltas → stream_entries (§8.7)
            return self._classify_end(stream)
        finally:
            await self.deltas.stop_timer()  # what is still buffered goes with the settling write, if any

    # -- stream entries (§8.7): provisional, fenced, best effort ------------------------------------------------

    def _next_sequence(self) -> int:
        self.stream_sequence += 1
        return self.stream_sequence

    def _delta(self, event: object) -> None:
        """Any other stream event (pydantic-ai's part and tool events), stored as JSON as it is."""
        event_json = to_jsonable_python(event, fallback=str)
        entry = NewStreamEntry(type="delta", sequence=self._next_sequence(), event=event_json)
        self.deltas.add(entry)

    async def _write_deltas(self, entries: list[NewStreamEntry]) -> None:
        """The timer's own fenced write (best effort: a lost lease or a store failure only loses live output; the
        next boundary commit's fence ends the attempt if the lease is really gone)."""
        try:
            self._guard()
            await append_stream_entries(self.service.engine, self.lease, entries)
        except (LeaseLost, StoreUnavailable) as exc:  # expected: one line, no traceback
            _log_dropped(self.lease.run_id, exc)

    async def _flush_deltas(self) -> None:
        """Before a settling write that carries no stream entries (a seal, a recovery): the buffered deltas alone."""
        async with self.deltas.taken() as entries:
            if entries:
                self._guard()
                try:
                    await append_stream_entries(self.service.engine, self.lease, entries)
                except StoreUnavailable as exc:
                    _log_dropped(self.lease.run_id, exc)

    async def _steer(self, stream: AgentRunStream, entry_id: str, payload: Mapping[str, JsonValue]) -> None:
        self.store.offered.add(entry_id)
        content = input_content(payload)
        if content is not None:
            await stream.steer(content, key=entry_id)

    async def _boundary(self, stream: AgentRunStream, event: BoundaryEvent) -> _Finished | None:
        """§7.8: commit the boundary before asking for the next event (S-35, S-36); then the stop checks."""
        if event.kind == "tool":
            failpoints.hit(failpoints.AFTER_MODEL_RESPONSE)
        state = await stream.export_state()
        envelope = encode_envelope(envelope_for_state(state, resume_input_consumed=self.has_resume_input))
        if len(envelope.text) > self.settings.worker.envelope_bytes:
            return _ended("envelope_too_large")
        history = state.history_view()
        encoded = encode_history_reusing(history, self.base_messages, self.base_encoded)
        usage = stream.usage
        result = await self._commit(envelope, encoded, usage, incorporated_keys=event.incorporated_keys)
        CHECKPOINT_COMMIT_BYTES.labels(boundary=event.kind).observe(result.bytes_written)
        self._committed(result.checkpoint_id, result.seq, encoded, usage)
        self.base_messages = history
        failpoints.hit(failpoints.CHECKPOINT_AFTER_COMMIT)
        for entry in result.assigned:
            await self._steer(stream, entry.id, entry.payload)
        if event.kind == "tool":
            failpoints.hit(failpoints.BEFORE_TOOL)
        if self.handle.stop_reason is not None:
            return self._stopped()
        if event.kind == "model" and self.handle.handoff_requested:
            return _ended("handoff")  # S-53: only at a model boundary, after committing it (S-54)
        return None

    async def _commit(
        self,
        envelope: EncodedEnvelope,
        encoded: list[EncodedMessage],
        usage: RunUsage,
        *,
        incorporated_keys: Sequence[str] = (),
        seal: SealRequest | None = None,
    ) -> CommitResult:
        """The fenced commit of a boundary or of the seal (§7.8). Its usage record is what ran since the last commit
        (step 5); the buffered deltas ride in its transaction (§8.7) and its `boundary` entry takes the next stream
        sequence there (step 7; the seal's is the lease's last fenced append)."""
        async with self.deltas.taken() as deltas:
            return await self.store.commit(
                expected_seq=self.expected_seq,
                base_id=self.base_id,
                base_encoded=self.base_encoded,
                new_encoded=encoded,
                envelope=envelope,
                source_entry_consumed=self.expected_seq == 0,
                usage=usage_json(usage - self.recorded),
                stream_entries=deltas,
                boundary_sequence=self._next_sequence(),
                incorporated_keys=incorporated_keys,
                # how many steer entries a boundary commit may assign to the run; a sealing commit assigns none
                delivery_count=self.settings.worker.delivery_count,
                delivery_bytes=self.settings.worker.delivery_bytes,
                seal=seal,
            )

    def _committed(self, checkpoint_id: str, seq: int, encoded: list[EncodedMessage], usage: RunUsage) -> None:
        self.base_id, self.expected_seq, self.base_encoded, self.recorded = checkpoint_id, seq, encoded, usage

    def _stopped(self) -> _Finished:
        match self.handle.stop_reason:
            case "cancelled":
                return _ended("cancelled_by_request")
            case "authority_revoked":
                return _ended("authority_refused")
            case None:
                raise AssertionError("no stop was requested")
            case other:
                assert_never(other)

    def _classify_end(self, stream: AgentRunStream) -> _Finished:
        result = stream.outcome
        if result is None:
            return _ended("unexpected_exception")
        if result.status == "cancelled" and self.handle.stop_reason is not None:
            return self._stopped()
        if result.status == "completed":
            output_bytes = len(canonical_json(_output_json(result.output)))
            return _ended("harness_result", harness_status="completed", output_bytes=output_bytes, result=result)
        if result.status == "failed":
            code = result.failure.code if result.failure is not None else "agent_run_failed"
            message = result.failure.message if result.failure is not None else None
            return _ended("harness_result", harness_status="failed", failure_code=code, message=message, result=result)
        return _ended("harness_result", harness_status=result.status, result=result)

    # -- settling ------------------------------------------------------------------------------------------------

    async def _settle(self, finished: _Finished) -> tuple[str, str]:
        decision = classify_outcome(finished.outcome, output_limit=self.settings.worker.output_bytes)
        self.trace.decided(decision)
        if (not isinstance(decision, Seal) or not decision.final_commit) and not isinstance(decision, NoSeal):
            await self._flush_deltas()  # the final commit carries them; other settling writes do not
        failpoints.hit(failpoints.BEFORE_SEAL)
        match decision:
            case Seal(final_commit=True):
                return await self._final_commit(decision, finished.result)
            case Seal():
                assert decision.failure_code is not None
                await self._seal(decision.status, decision.failure_code, finished.message)
                return decision.status, decision.failure_code
            case Recover():
                current = self._current_usage()
                result = await self.store.recover(
                    outcome=decision.attempt_outcome,
                    failure_code=decision.failure_code,
                    failure_message=finished.message,
                    usage=usage_delta(current, self.recorded),
                )
                self.trace.decided(result)  # a seal after recovery (§7.6) ends the run span too
                self.recorded = current
                if isinstance(result, Requeue) and result.wake_workers:
                    self.service.wake_workers()
                return decision.attempt_outcome, decision.failure_code or "handoff"
            case NoSeal():
                await self._record_usage_unfenced()
                return "abandoned", decision.reason
            case _:
                assert_never(decision)

    async def _seal(self, status: SealedRunStatus, code: str, message: str | None) -> None:
        request = SealRequest(status=status, failure=failure(code, message))
        current = self._current_usage()
        await self.store.seal(request, usage=usage_delta(current, self.recorded))
        self.recorded = current

    async def _final_commit(self, decision: Seal, result: RunResult[object] | None) -> tuple[str, str]:
        """§7.9: the final checkpoint and the `completed`/`waiting` seal in one transaction (S-5, S-89)."""
        if result is None or result.state is None:  # classify_outcome seals this way only after a harness result
            raise AssertionError("a final commit without the harness result's state")
        state = result.state
        deferred: JsonValue = None
        if decision.status == "waiting":
            requests = result.deferred
            if requests is None:  # a suspended result always carries them (RunResult checks it)
                raise AssertionError("a waiting seal without deferred requests")
            try:
                pending = build_pending(requests)
            except PendingInvalid as exc:
                await self._seal("failed", exc.code, None)
                return "failed", exc.code
            deferred = deferred_json(requests)
            request = SealRequest(
                status="waiting", pending=pending.model_dump(mode="json"), wait_reason=wait_reason(pending)
            )
        else:
            request = SealRequest(status="completed", output=_output_json(result.output))
        envelope = encode_envelope(
            envelope_for_state(state, deferred=deferred, resume_input_consumed=self.has_resume_input)
        )
        if len(envelope.text) > self.settings.worker.envelope_bytes:
            await self._seal("failed", "checkpoint_envelope_too_large", None)
            return "failed", "checkpoint_envelope_too_large"
        encoded = encode_history_reusing(state.history_view(), self.base_messages, self.base_encoded)
        committed = await self._commit(envelope, encoded, result.usage, seal=request)
        # §10.4 knows only model and tool boundaries; the final commit ends a model turn (its last response).
        CHECKPOINT_COMMIT_BYTES.labels(boundary="model").observe(committed.bytes_written)
        self.recorded = result.usage
        if committed.queued:  # otherwise nothing to start: no thread lock, no transaction
            await self._advance_thread()
        return decision.status, "sealed"

    async def _advance_thread(self) -> None:
        """§7.8: after a completed/waiting seal, try to start the thread's next run; the sweep retries failures."""
        try:
            started = await advance_thread_after_seal(
                self.service.engine,
                thread_id=self.lease.thread_id,
                settings=self.settings,
                agent_names=self.service.agents.names(),
                entropy=self.service.entropy,
            )
        except StoreUnavailable as exc:  # expected in an outage: one line (the advance sweep retries)
            cause = describe_database_error(exc)
            log.warning("Thread advance failed", extra={"thread_id": self.lease.thread_id, "cause": cause})
            return
        except Exception:
            log.warning("Thread advance failed", extra={"thread_id": self.lease.thread_id}, exc_info=True)
            return
        if started is not None:
            self.service.wake_workers()

    # -- usage ---------------------------------------------------------------------------------------------------

    def _current_usage(self) -> RunUsage:
        return self.stream.usage if self.stream is not None else RunUsage()

    async def _record_usage_unfenced(self) -> None:
        """S-51: no seal, but the usage already incurred is written, bounded by `database.timeout`."""
        current = self._current_usage()
        delta = usage_delta(current, self.recorded)
        if delta is None:
            return
        self.recorded = current
        try:
            async with asyncio.timeout(self.settings.database.timeout):  # not wait_for (see the supervisor)
                await record_usage(
                    self.service.engine,
                    run_id=self.lease.run_id,
                    attempt_id=self.lease.attempt_id,
                    usage=delta,
                    checkpoint_seq=self.expected_seq or None,
                )
        except (StoreUnavailable, TimeoutError) as exc:  # expected in an outage: one line naming why
            log.warning(
                "Usage record failed", extra={"run_id": self.lease.run_id, "cause": describe_database_error(exc)}
            )
        except Exception:
            log.warning("Usage record failed", extra={"run_id": self.lease.run_id}, exc_info=True)


def _log_dropped(run_id: str, error: Exception) -> None:
    """Live output lost to a lost lease or a database fault: one line naming why (the next fenced write decides)."""
    cause = f"lease lost: {error.reason}" if isinstance(error, LeaseLost) else describe_database_error(error)
    log.warning("Stream entries dropped", extra={"run_id": run_id, "cause": cause})


def _raise_if_cancelling() -> None:
    """A cancelled attempt task (deadline, abandonment, shutdown) ends without settling, whatever the stream said."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


def _output_json(output: object) -> JsonValue:
    value: JsonValue = to_jsonable_python(output, fallback=str)
    return value
