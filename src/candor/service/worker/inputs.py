"""(pure) What an attempt hands to `Harness.stream` (§7.7 steps 2 and 4) and the usage it reports.

Turns stored values into harness values: input content into user content, the stored checkpoint into the state to
continue (a fork's first run re-homes it, §6), a resume body into a `DeferredToolResume`, and the run's usage
counters into the JSON deltas `usage_records` hold.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from pydantic import JsonValue, TypeAdapter
from pydantic_ai import DeferredToolRequests
from pydantic_ai.usage import RunUsage

from candor import DeferredToolResume, HarnessState

from ..errors import CheckpointCorrupt
from ..protocol.json_types import JsonObject
from ..protocol.resume import ResumeAnswers

__all__ = (
    "input_content",
    "resume_input",
    "start_state",
    "resume_batch",
    "deferred_json",
    "usage_json",
    "usage_delta",
)

_requests_adapter: Final = TypeAdapter(DeferredToolRequests)
_usage_adapter: Final = TypeAdapter(RunUsage)


def input_content(payload: Mapping[str, JsonValue] | None) -> str | list[str] | None:
    """§8.1 input content `{"content": [{"type": "text", "text": str}, ...]}` as harness input.

    One text item becomes a plain string, several a list of strings; items of other types are skipped. A payload
    that wraps the content in `"input"` is accepted too. Returns None when there is no text at all.
    """
    if not payload:
        return None
    content = payload.get("content")
    wrapped = payload.get("input")
    if content is None and isinstance(wrapped, Mapping):
        content = wrapped.get("content")
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return None
    texts = [text for item in content if isinstance(item, Mapping) and isinstance(text := item.get("text"), str)]
    if not texts:
        return None
    return texts[0] if len(texts) == 1 else texts


def resume_input(resume: ResumeAnswers | None, *, consumed: bool) -> str | list[str] | None:
    """S-88: the resume answers' `input` while the successor's envelope says it is not in history yet."""
    if consumed or resume is None or resume.input is None:
        return None
    return input_content(resume.input)


def start_state(state: HarnessState | None, *, thread_id: str, from_own_checkpoint: bool) -> HarnessState:
    """§7.7 step 2: the loaded state, a new one, or (a fork's first run) the origin's state re-homed (§6).

    A start checkpoint of another thread is a fork's origin: `fork(thread_id=...)` gives it the new thread id and
    clears `environment`. A run's own checkpoint always carries the run's thread id; anything else is corrupt.
    """
    if state is None:
        return HarnessState.new(thread_id)
    if state.thread_id == thread_id:
        return state
    if from_own_checkpoint:
        raise CheckpointCorrupt(f"a checkpoint of thread {thread_id} names another thread")
    return state.fork(thread_id=thread_id)


def resume_batch(requests: JsonValue, resume: ResumeAnswers, *, attempt_number: int) -> DeferredToolResume:
    """§7.7 step 4, S-87: the waiting run's requests with the converted answers; `recovery` from the 2nd attempt.

    The harness reduces a recovery batch with `remaining()` itself. Raises `ValueError` for requests that are
    missing or do not convert (the waiting run committed them, so this means corrupt data).
    """
    if requests is None:
        raise ValueError("the waiting run's final envelope has no deferred requests")
    return DeferredToolResume(
        requests=_requests_adapter.validate_python(requests),
        results=resume.to_results(),
        recovery=attempt_number > 1,
    )


def deferred_json(requests: DeferredToolRequests) -> JsonValue:
    """The envelope form of a waiting run's deferred requests (§6)."""
    value: JsonValue = _requests_adapter.dump_python(requests, mode="json")
    return value


def usage_json(usage: RunUsage) -> JsonObject:
    dumped: JsonObject = _usage_adapter.dump_python(usage, mode="json")
    return dumped


def usage_delta(current: RunUsage, recorded: RunUsage) -> JsonObject | None:
    """The usage incurred since the last record, as JSON; None when nothing was incurred."""
    delta = current - recorded
    if delta == RunUsage():
        return None
    return usage_json(delta)
