"""No tool starts once its attempt's lease is not held, and `lease_held()` for long tools (§13).

`LeaseCheck`, bound to every run, checks right before each tool starts that the lease is not known lost, not
cancelled at the deadline, and its local deadline (S-24) not reached; otherwise the tool does not start, the attempt
is cancelled without a further write, and the run is recovered elsewhere as after a crash (S-29). `lease_held()`
asks the same from inside a tool (True outside an attempt). A process frozen between the check and the effect still
performs it (docs/operations.md, "Leases and effects").
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass

from pydantic_ai.capabilities import AbstractCapability
from pydantic_ai.messages import ToolCallPart
from pydantic_ai.tools import RunContext, ToolDefinition

from .handle import AttemptHandle

__all__ = ("LeaseCheck", "LeaseNotHeld", "holding", "lease_held")

_HELD: ContextVar[AttemptHandle | None] = ContextVar("candor_attempt_lease", default=None)


class LeaseNotHeld(Exception):
    """A tool was about to start under a lease that is no longer held; it did not start."""


@contextlib.contextmanager
def holding(handle: AttemptHandle) -> Iterator[None]:
    """Within the block (the attempt's task and the tasks and threads it starts), `lease_held()` asks `handle`."""
    token = _HELD.set(handle)
    try:
        yield
    finally:
        _HELD.reset(token)


def lease_held() -> bool:
    """Whether the attempt running this code still holds its lease; True outside an attempt.

    Call it from a tool before an effect that must not happen twice (and between the steps of a long tool): False
    means the run is being handed to another worker, so do not start the effect; return or raise instead."""
    handle = _HELD.get()
    if handle is None:
        return True
    return handle.lease_held(handle.monotonic())


@dataclass
class LeaseCheck(AbstractCapability[object]):
    """Checks the lease right before each tool of the run starts."""

    handle: AttemptHandle

    @classmethod
    def get_serialization_name(cls) -> str | None:
        return None

    async def wrap_tool_execute(
        self,
        ctx: RunContext[object],
        *,
        call: ToolCallPart[object],
        tool_def: ToolDefinition,
        args: dict[str, object],
        handler: Callable[[dict[str, object]], Awaitable[object]],
    ) -> object:
        if not self.handle.lease_held(self.handle.monotonic()):
            self.handle.cancel_for_deadline()  # nothing more runs or is written for this lease (S-24)
            raise LeaseNotHeld(f"tool {tool_def.name!r} not started: the attempt's lease is no longer held")
        return await handler(args)
