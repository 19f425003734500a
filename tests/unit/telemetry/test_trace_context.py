"""Trace context and what an attempt's spans say, pure (docs/telemetry.md; issue 35 item 2)."""

from __future__ import annotations

from typing import Any

import pytest

from candor.service.protocol.outcomes import Seal, SealAfterRecovery
from candor.service.protocol.recovered import RecoveredCall
from candor.service.protocol.transitions import attempt_end as closing_attempt
from candor.service.telemetry.attempts import attempt_end, recovery_event_attributes
from candor.service.telemetry.context import (
    TraceParent,
    parse_traceparent,
    recorded_traceparent,
    recording_traceparent,
    run_span_ids,
)

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (f"00-{TRACE}-{SPAN}-01", TraceParent(TRACE, SPAN, sampled=True)),
        (f"00-{TRACE}-{SPAN}-00", TraceParent(TRACE, SPAN, sampled=False)),
        (f" 00-{TRACE.upper()}-{SPAN}-03 ", TraceParent(TRACE, SPAN, sampled=True)),  # case and spaces tolerated
        (f"01-{TRACE}-{SPAN}-01-later-fields", TraceParent(TRACE, SPAN, sampled=True)),  # a later version
        (f"00-{TRACE}-{SPAN}-01-extra", None),  # version 00 has nothing after the flags
        (f"ff-{TRACE}-{SPAN}-01", None),  # version ff is invalid
        (f"00-{'0' * 32}-{SPAN}-01", None),  # all-zero trace id
        (f"00-{TRACE}-{'0' * 16}-01", None),  # all-zero span id
        (f"00-{TRACE[:-1]}-{SPAN}-01", None),
        ("garbage", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_traceparent(header: str | None, expected: TraceParent | None) -> None:
    """W3C Trace Context §3.2: a valid `traceparent` is read; anything else is ignored (never an error)."""
    assert parse_traceparent(header) == expected


def test_run_span_ids_are_the_same_in_every_process_and_follow_the_request() -> None:
    """The run span's ids are derived from the run id, so attempts in other processes find it; its trace is the
    request's when there was one."""
    recorded = f"00-{TRACE}-{SPAN}-01"
    first, again = run_span_ids("run_a", recorded), run_span_ids("run_a", recorded)
    assert first == again
    assert f"{first.trace_id:032x}" == TRACE and first.parent == TraceParent(TRACE, SPAN, sampled=True)
    assert first.span_id != int(SPAN, 16)
    alone = run_span_ids("run_a", None)
    assert alone.parent is None and alone.span_id == first.span_id and alone.trace_id != first.trace_id
    assert run_span_ids("run_b", None).trace_id != alone.trace_id
    unsampled = run_span_ids("run_a", f"00-{TRACE}-{SPAN}-00").run_span()
    assert unsampled.sampled is False and alone.run_span().sampled is True


def test_recording_traceparent_scopes_what_new_runs_record() -> None:
    """The context a run records: the innermost block's, nothing outside."""
    assert recorded_traceparent() is None
    with recording_traceparent(TraceParent(TRACE, SPAN, sampled=True)):
        assert recorded_traceparent() == f"00-{TRACE}-{SPAN}-01"
        with recording_traceparent(None):
            assert recorded_traceparent() is None
        assert recorded_traceparent() == f"00-{TRACE}-{SPAN}-01"
    assert recorded_traceparent() is None


_SEAL = Seal(status="completed", final_commit=True)
_FAILED_AFTER_RECOVERY = SealAfterRecovery(
    status="failed", failure_code="model_unavailable", attempt=closing_attempt("failed")
)


@pytest.mark.parametrize(
    ("status", "reason", "decision", "sealed", "code", "run_code", "error"),
    [
        ("completed", "sealed", _SEAL, "completed", None, None, None),
        ("waiting", "sealed", _SEAL, "waiting", None, None, None),
        ("failed", "agent_run_failed", _SEAL, "failed", "agent_run_failed", "agent_run_failed", "agent_run_failed"),
        ("cancelled", "cancelled", _SEAL, "cancelled", "cancelled", "cancelled", None),
        ("failed", "model_unavailable", None, None, "model_unavailable", None, "model_unavailable"),  # retried
        (
            "failed",
            "model_unavailable",
            _FAILED_AFTER_RECOVERY,
            "failed",
            "model_unavailable",
            "model_unavailable",
            "model_unavailable",
        ),  # the last attempt: the recovery sealed the run failed (S-30)
        ("yielded", "handoff", None, None, None, None, None),
        ("abandoned", "lease_lost:expired", _SEAL, None, None, None, "lease_lost:expired"),  # seal never written
        ("crashed", "exception", None, None, None, None, "exception"),
    ],
)
def test_attempt_end(
    status: str,
    reason: str,
    decision: Any,
    sealed: str | None,
    code: str | None,
    run_code: str | None,
    error: str | None,
) -> None:
    """S-22, S-30, §7.6, §7.9: the attempt span carries status, reason and failure code; the run span is exported
    only when this attempt wrote the seal, the final commit's or the recovery's."""
    end = attempt_end(status, reason, decision=decision)
    assert (end.sealed_status, end.failure_code, end.run_failure_code, end.error) == (sealed, code, run_code, error)
    assert end.attributes["candor.attempt.status"] == status and end.attributes["candor.attempt.reason"] == reason
    assert end.attributes.get("candor.failure.code") == code


def test_recovery_events_name_each_call_and_its_outcome() -> None:
    """H-46, H-47, S-29: one event per recovered call, with its recovery outcome."""
    calls = [
        RecoveredCall(tool_call_id="c1", tool_name="notify", outcome="unknown"),
        RecoveredCall(tool_call_id="c2", tool_name="lookup", outcome="replayed"),
    ]
    assert recovery_event_attributes(calls) == [
        {"candor.tool_call.id": "c1", "candor.tool.name": "notify", "candor.recovery.outcome": "unknown"},
        {"candor.tool_call.id": "c2", "candor.tool.name": "lookup", "candor.recovery.outcome": "replayed"},
    ]


def test_telemetry_settings_are_off_by_default_and_refuse_unknown_keys() -> None:
    """S-124: `[telemetry]` is a settings section like the others: off by default, set by `CANDOR_TELEMETRY__*`,
    unknown keys refused."""
    from candor.service.errors import SettingsError
    from candor.service.settings import ServiceSettings
    from candor.service.telemetry import Telemetry

    assert ServiceSettings.load(environ={}).telemetry.enabled is False
    assert not Telemetry.from_settings(ServiceSettings.load(environ={}).telemetry).enabled
    on = ServiceSettings.load(environ={"CANDOR_TELEMETRY__ENABLED": "true", "CANDOR_TELEMETRY__SERVICE_NAME": "api"})
    assert (on.telemetry.enabled, on.telemetry.service_name) == (True, "api")
    with pytest.raises(SettingsError, match="CANDOR_TELEMETRY__ENDPOINT"):
        ServiceSettings.load(environ={"CANDOR_TELEMETRY__ENDPOINT": "http://x"})


def test_telemetry_needs_the_run_span_id_generator() -> None:
    """A provider without candor's id generator could not place run spans where their attempts point: refused."""
    from opentelemetry.sdk.trace import TracerProvider

    from candor.service.telemetry import Telemetry

    with pytest.raises(ValueError, match="RunSpanIdGenerator"):
        Telemetry(TracerProvider())


def test_telemetry_without_the_extra_is_a_settings_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """S-124: `[telemetry] enabled` without the `telemetry` extra refuses to start with one line naming the fix
    (exit 2 through the CLI), not an ImportError traceback."""
    import sys

    from candor.service.errors import SettingsError
    from candor.service.settings import ServiceSettings
    from candor.service.telemetry import Telemetry

    monkeypatch.setitem(sys.modules, "candor.service.telemetry.sdk", None)  # as if the SDK were not installed
    settings = ServiceSettings.load(environ={"CANDOR_TELEMETRY__ENABLED": "true"})
    with pytest.raises(SettingsError, match=r"pip install 'candor\[telemetry\]'"):
        Telemetry.from_settings(settings.telemetry)
