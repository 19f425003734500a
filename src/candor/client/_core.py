"""The request-building core both clients share, written sans-I/O.

Every client method is an *operation*: a generator that yields what to do — `Call` (send one HTTP request) or
`Sleep` — and receives the outcome of each `Call` (a `Reply`, or the transport exception). The sync and async
clients only run operations (`CandorClient._run`, `AsyncCandorClient._run`); the request shapes, idempotency keys,
retries, error mapping and waiting logic live here once.

Retries (`RetryPolicy`): a connection error, a timeout, a 5xx or a 429 is retried up to `attempts` times in all,
after `Retry-After` when the server sent one, else after a doubling backoff. A retried request is the same `Call`
object, so it carries the same `Idempotency-Key`: the service answers the retry of a create that did happen with
200 and the objects it created (spec §8.2), never a second thread or successor.
"""

from __future__ import annotations

import inspect
import random
import secrets
import time
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import quote

from .batch import ResumeBatch
from .errors import TransportFailed, WaitTimeout, error_for
from .models import TERMINAL_STATUSES, Accepted, Page, Run
from .sse import SseParser, StreamCursor, StreamEvent

__all__ = (
    "Call",
    "Sleep",
    "Reply",
    "Operation",
    "RetryPolicy",
    "new_idempotency_key",
    "text_input",
    "request",
    "Operations",
    "StreamPlan",
    "method_signature",
)

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True, slots=True)
class Call:
    method: str
    path: str
    json: Any = None
    params: Mapping[str, str | int] | None = None
    idempotency_key: str | None = None

    def headers(self) -> dict[str, str]:
        return {} if self.idempotency_key is None else {"Idempotency-Key": self.idempotency_key}


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


@dataclass(frozen=True, kw_only=True, slots=True)
class Reply:
    status: int
    headers: Mapping[str, str]
    body: Any
    """Parsed JSON, or None when the body is empty or not JSON."""


Operation = Generator[Call | Sleep, "Reply | Exception | None", T]


@dataclass(frozen=True, kw_only=True, slots=True)
class RetryPolicy:
    """How often and how long to retry a request that got no usable answer (bounded in attempts and delay)."""

    attempts: int = 4
    """Tries in all, the first included; 1 disables retries."""
    initial_delay: float = 0.2
    max_delay: float = 5.0
    max_retry_after: float = 30.0
    """A `Retry-After` beyond this is not waited for: the error is raised instead."""
    jitter: float = 0.2
    """Each backoff is stretched by up to this fraction at random, so clients that failed together do not retry
    together."""

    def delay(self, attempt: int, outcome: Reply | Exception) -> float | None:
        """Seconds to wait before try `attempt + 1` (`attempt` ≥ 1 tries made), or None to stop."""
        if isinstance(outcome, Reply) and not (outcome.status == 429 or outcome.status >= 500):
            return None
        if attempt >= self.attempts:
            return None
        retry_after = _retry_after(outcome.headers) if isinstance(outcome, Reply) else None
        if retry_after is not None:
            return retry_after if retry_after <= self.max_retry_after else None
        backoff = min(self.max_delay, self.initial_delay * 2.0 ** (attempt - 1))
        return backoff * (1 + self.jitter * random.random())


def _retry_after(headers: Mapping[str, str]) -> float | None:
    value = headers.get("retry-after") or headers.get("Retry-After")
    try:
        seconds = float(value) if value is not None else None
    except ValueError:
        return None  # an HTTP date: rare from this API; fall back to the backoff
    return None if seconds is None or seconds < 0 else seconds


def new_idempotency_key() -> str:
    """A fresh key for one logical call (reused by each of its retries)."""
    return f"cli_{secrets.token_hex(16)}"


def text_input(text: str | Iterable[str]) -> dict[str, Any]:
    """§8.1 input content from one text or several."""
    texts = [text] if isinstance(text, str) else list(text)
    return {"content": [{"type": "text", "text": item} for item in texts]}


def request(call: Call, policy: RetryPolicy) -> Operation[Reply]:
    """Send `call` (retrying per `policy`); the 2xx `Reply`, or the typed error of the last answer."""
    attempt = 0
    while True:
        outcome = yield call
        assert outcome is not None
        attempt += 1
        delay = policy.delay(attempt, outcome)
        if delay is None:
            break
        yield Sleep(delay)
    if isinstance(outcome, Exception):
        raise TransportFailed(f"{call.method} {call.path}: no answer after {attempt} tries: {outcome!r}") from outcome
    if outcome.status >= 400:
        raise error_for(outcome.status, outcome.body, retry_after=_retry_after(outcome.headers))
    return outcome


def _path(*parts: str) -> str:
    return "/v1/" + "/".join(quote(part, safe="") for part in parts)


@dataclass(kw_only=True)
class Operations:
    """The API's operations, as generators; the clients wrap each in a method of the same name."""

    retry: RetryPolicy = field(default_factory=RetryPolicy)
    monotonic: Callable[[], float] = time.monotonic

    def create_thread(
        self,
        agent: str,
        text: str | Iterable[str],
        *,
        options: Mapping[str, Any] | None = None,
        message_history: list[Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Operation[Accepted]:
        """Start a thread with `agent` and its first message (`text`: one string or several text parts); the
        thread, its first entry and the run it started. `options` are the run's options (e.g. `tool_recovery`);
        `message_history` seeds the thread with Pydantic AI messages. A retry with the same `idempotency_key`
        (one is generated when omitted) answers the same thread."""
        body: dict[str, Any] = {"agent": agent, "input": text_input(text)}
        if options is not None:
            body["options"] = dict(options)
        if message_history is not None:
            body["message_history"] = message_history
        key = idempotency_key or new_idempotency_key()
        reply = yield from request(Call(method="POST", path="/v1/threads", json=body, idempotency_key=key), self.retry)
        return Accepted.of(reply.body, created=reply.status == 201)

    def post_message(
        self,
        thread_id: str,
        text: str | Iterable[str],
        *,
        steer: bool = False,
        agent: str | None = None,
        options: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Operation[Accepted]:
        """Post a message to a thread: it starts the next run, or waits in the inbox while a run is active.
        `steer=True` delivers it to the active run at its next safe boundary instead. `agent` and `options`
        apply to the run it starts."""
        body: dict[str, Any] = {"input": text_input(text), "delivery": "steer" if steer else "next_run"}
        if agent is not None:
            body["agent"] = agent
        if options is not None:
            body["options"] = dict(options)
        key = idempotency_key or new_idempotency_key()
        call = Call(method="POST", path=_path("threads", thread_id, "inbox"), json=body, idempotency_key=key)
        reply = yield from request(call, self.retry)
        return Accepted.of(reply.body, created=reply.status == 201)

    def get_thread(self, thread_id: str) -> Operation[dict[str, Any]]:
        """The thread as the API answers it (its state, head run and counters)."""
        reply = yield from request(Call(method="GET", path=_path("threads", thread_id)), self.retry)
        return dict(reply.body)

    def get_run(self, run_id: str) -> Operation[Run]:
        """The run now, with `recovery` (the tool calls recovery closed) filled in."""
        reply = yield from request(Call(method="GET", path=_path("runs", run_id)), self.retry)
        return Run.of(reply.body)

    def list_runs(
        self,
        *,
        thread_id: str | None = None,
        status: str | None = None,
        awaiting_resume: bool = False,
        limit: int | None = None,
        cursor: str | None = None,
    ) -> Operation[Page]:
        """One page of a thread's runs, or (without `thread_id`) of the workspace's runs."""
        params: dict[str, str | int] = {}
        if thread_id is None:
            path = "/v1/runs"
            if status is not None:
                params["status"] = status
            if awaiting_resume:
                params["awaiting"] = "resume"
        else:
            if status is not None or awaiting_resume:
                raise ValueError("a thread's run list takes no status filter")
            path = _path("threads", thread_id, "runs")
        if limit is not None:
            params["limit"] = limit
        if cursor is not None:
            params["cursor"] = cursor
        reply = yield from request(Call(method="GET", path=path, params=params), self.retry)
        return Page(items=[Run.of(item) for item in reply.body["items"]], next_cursor=reply.body["next_cursor"])

    def interrupt_run(self, run_id: str) -> Operation[Run]:
        """Cancel the run (it stops at its next safe boundary); the run as it is after the request."""
        # Safe to retry without a key: interrupting a cancelled run answers it unchanged (§7.12).
        reply = yield from request(Call(method="POST", path=_path("runs", run_id, "interrupt")), self.retry)
        return Run.of(reply.body)

    def resume(
        self, run_id: str, batch: ResumeBatch | Mapping[str, Any], *, idempotency_key: str | None = None
    ) -> Operation[Run]:
        """Answer a waiting run; the successor run. A `ResumeBatch` is checked locally first (`IncompleteBatch`)."""
        body = batch.body() if isinstance(batch, ResumeBatch) else dict(batch)
        key = idempotency_key or new_idempotency_key()
        call = Call(method="POST", path=_path("runs", run_id, "resume"), json=body, idempotency_key=key)
        reply = yield from request(call, self.retry)
        return Run.of(reply.body)

    def wait_for_run(
        self, run_id: str, *, timeout: float = 60.0, poll_initial: float = 0.05, poll_max: float = 1.0
    ) -> Operation[Run]:
        """Poll until the run is sealed (completed, failed, cancelled or waiting); `WaitTimeout` after `timeout`.
        The poll interval doubles from `poll_initial` up to `poll_max`."""
        deadline = self.monotonic() + timeout
        interval = poll_initial
        while True:
            run = yield from self.get_run(run_id)
            if run.status in TERMINAL_STATUSES or run.status == "waiting":
                return run
            left = deadline - self.monotonic()
            if left <= 0:
                raise WaitTimeout(run_id, run)
            yield Sleep(min(interval, left))
            interval = min(poll_max, interval * 2)


def method_signature(op: Callable[..., Operation[Any]]) -> inspect.Signature:
    """The signature of the client method that runs operation `op`: the same parameters, and the operation's
    result (`Operation[Run]` → `Run`) as the return annotation, so `help()` and `inspect.signature` show what a
    caller passes and gets instead of `(*args, **kwargs)`."""
    signature = inspect.signature(op)
    result = signature.return_annotation
    if isinstance(result, str) and result.startswith("Operation[") and result.endswith("]"):
        result = result.removeprefix("Operation[").removesuffix("]")
    return signature.replace(return_annotation=result)


class StreamPlan:
    """The reconnect decisions of one thread-stream iteration, shared by both clients.

    After each connection ends (the server closed it, or it failed), `next_delay()` says how long to wait before
    reconnecting with `Last-Event-ID` (None: stop). Consecutive failed connections are bounded by the retry
    policy's `attempts`; an answer the retry policy does not retry (401, 403, 404, …) raises its typed error.
    """

    def __init__(self, thread_id: str, *, last_event_id: str | None, policy: RetryPolicy, reconnect: bool) -> None:
        self.path = _path("threads", thread_id, "stream")
        self.cursor = StreamCursor(
            last_event_id=last_event_id, initial_delay=policy.initial_delay, max_delay=policy.max_delay
        )
        self.policy = policy
        self.reconnect = reconnect
        self._failures = 0
        self._last_failure: Reply | Exception | None = None
        self._parser = SseParser(last_event_id=last_event_id)

    def headers(self) -> dict[str, str]:
        return self.cursor.headers()

    def connected(self) -> None:
        """A 200 answer: the failures so far are forgiven, and parsing starts afresh."""
        self._failures = 0
        self._parser = SseParser(last_event_id=self.cursor.last_event_id)

    def feed(self, line: str) -> StreamEvent | None:
        """One line of the open stream; the event it completes (remembered for `Last-Event-ID`), if any."""
        event = self._parser.feed(line)
        if event is not None:
            self.cursor.saw(event)
        return event

    def refused(self, reply: Reply) -> None:
        """A non-200 answer to the stream request: raise its error unless the retry policy retries it."""
        if self.policy.delay(1, reply) is None:
            raise error_for(reply.status, reply.body, retry_after=_retry_after(reply.headers))
        self._fail(reply)

    def failed(self, exc: Exception) -> None:
        self._fail(exc)

    def _fail(self, outcome: Reply | Exception) -> None:
        self._failures += 1
        self._last_failure = outcome
        if self._failures >= self.policy.attempts:
            if isinstance(outcome, Reply):
                raise error_for(outcome.status, outcome.body, retry_after=_retry_after(outcome.headers))
            raise TransportFailed(f"GET {self.path}: no stream after {self._failures} tries: {outcome!r}") from outcome

    def next_delay(self) -> float | None:
        if not self.reconnect:
            if self._last_failure is not None and self._failures:
                outcome = self._last_failure
                if isinstance(outcome, Reply):
                    raise error_for(outcome.status, outcome.body, retry_after=_retry_after(outcome.headers))
                raise TransportFailed(f"GET {self.path}: the stream failed: {outcome!r}") from outcome
            return None
        if self._failures and isinstance(self._last_failure, Reply):
            retry_after = _retry_after(self._last_failure.headers)
            if retry_after is not None:
                return min(retry_after, self.policy.max_retry_after)
        return self.cursor.next_delay()
