"""Failpoints: named crash points that a test arms through `CANDOR_FAILPOINTS` to kill the process for real.

For example `CANDOR_FAILPOINTS="checkpoint_before_commit@3,before_tool:sigkill"` (the syntax is `parse`'s). The
variable is parsed once per process, at the first `hit()` (or `reset()`); an entry that does not parse raises
`ValueError` naming it. With nothing armed, `hit()` is one global read and a falsy check. The state is per process
and `reset(environ)` rebuilds it for tests.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal, NoReturn, cast

__all__ = (
    "AFTER_MODEL_RESPONSE",
    "BEFORE_TOOL",
    "CHECKPOINT_BEFORE_COMMIT",
    "CHECKPOINT_AFTER_COMMIT",
    "BEFORE_SEAL",
    "OUTBOX_BEFORE_SETTLE",
    "POINTS",
    "ENV_VAR",
    "EXIT_CODE",
    "Action",
    "Failpoint",
    "parse",
    "hit",
    "reset",
    "armed",
)

AFTER_MODEL_RESPONSE: Final = "after_model_response"
"""The model's response is received, before its boundary is committed."""
BEFORE_TOOL: Final = "before_tool"
"""The tool boundary is committed and a tool is about to run (H-36)."""
CHECKPOINT_BEFORE_COMMIT: Final = "checkpoint_before_commit"
"""The checkpoint rows are written inside the transaction, before it commits (§7.8)."""
CHECKPOINT_AFTER_COMMIT: Final = "checkpoint_after_commit"
"""The checkpoint transaction has committed, before the stream is asked for the next event."""
BEFORE_SEAL: Final = "before_seal"
"""The attempt's outcome is classified, before the seal transaction (§7.10)."""
OUTBOX_BEFORE_SETTLE: Final = "outbox_before_settle"
"""An outbox handler has finished, before its row is settled (§9.2)."""

POINTS: Final = frozenset(
    {
        AFTER_MODEL_RESPONSE,
        BEFORE_TOOL,
        CHECKPOINT_BEFORE_COMMIT,
        CHECKPOINT_AFTER_COMMIT,
        BEFORE_SEAL,
        OUTBOX_BEFORE_SETTLE,
    }
)

ENV_VAR: Final = "CANDOR_FAILPOINTS"
EXIT_CODE: Final = 137
"""Exit status of the `exit` action: what a shell reports for a process killed by SIGKILL (128 + 9)."""

Action = Literal["exit", "sigkill"]
_ACTIONS: Final[frozenset[str]] = frozenset({"exit", "sigkill"})
_ENTRY = re.compile(r"(?P<name>[A-Za-z0-9_]+)(?::(?P<action>[A-Za-z0-9_]+))?(?:@(?P<count>[0-9]+))?")


@dataclass(frozen=True, slots=True, kw_only=True)
class Failpoint:
    """One armed entry of `CANDOR_FAILPOINTS`."""

    name: str
    """One of `POINTS`."""
    action: Action = "exit"
    """How the process dies."""
    count: int = 1
    """The hit of this point (1-based, per process) that kills the process."""


def parse(value: str) -> dict[str, Failpoint]:
    """Parse a `CANDOR_FAILPOINTS` value into name → `Failpoint`; blank entries are ignored.

    The value holds comma-separated entries `name[:action][@count]`:

    * `name` is one of `POINTS`;
    * `action` is `exit` (default: flush stdio, then `os._exit(137)`) or `sigkill` (`SIGKILL` to this process, no
      flushing at all);
    * `@count` fires on the count-th hit of that point in this process (default 1).

    Raises `ValueError` naming the entry for a malformed entry, an unknown point or action, a count below 1, or a
    point armed twice.
    """
    parsed: dict[str, Failpoint] = {}
    for raw in value.split(","):
        entry = raw.strip()
        if not entry:
            continue
        match = _ENTRY.fullmatch(entry)
        if match is None:
            raise ValueError(f"{ENV_VAR}: malformed entry {entry!r}, expected name[:action][@count]")
        name, action, count = match["name"], match["action"] or "exit", int(match["count"] or "1")
        if name not in POINTS:
            raise ValueError(f"{ENV_VAR}: unknown failpoint in entry {entry!r}, expected one of {sorted(POINTS)}")
        if action not in _ACTIONS:
            raise ValueError(f"{ENV_VAR}: unknown action in entry {entry!r}, expected one of {sorted(_ACTIONS)}")
        if count < 1:
            raise ValueError(f"{ENV_VAR}: count must be ≥ 1 in entry {entry!r}")
        if name in parsed:
            raise ValueError(f"{ENV_VAR}: failpoint {name!r} armed twice in entry {entry!r}")
        parsed[name] = Failpoint(name=name, action=cast(Action, action), count=count)
    return parsed


_armed: dict[str, Failpoint] | None = None
"""None until the variable is parsed; then the armed points (an empty dict when nothing is armed)."""
_hits: dict[str, int] = {}
_lock = threading.Lock()


def reset(environ: Mapping[str, str] | None = None) -> dict[str, Failpoint]:
    """Forget the hit counts and parse `environ` (default `os.environ`) now; returns the armed points.

    Tests call it to arm points in process (`reset({ENV_VAR: "before_tool@2"})`) and `reset({})` to disarm.
    """
    global _armed
    armed_now = parse((os.environ if environ is None else environ).get(ENV_VAR, ""))
    with _lock:
        _hits.clear()
        _armed = armed_now
    return dict(armed_now)


def armed() -> dict[str, Failpoint]:
    """The armed points, parsing `os.environ` first if this process has not parsed it yet."""
    current = _armed
    return dict(reset() if current is None else current)


def hit(name: str) -> None:
    """Pass the failpoint `name`: kills the process if this hit is the one its entry arms, else returns."""
    current = _armed
    if current is None:
        current = reset()
    if not current:
        return
    # Checked only while something is armed, so the unarmed path stays a no-op; a misspelt call site fails here.
    if name not in POINTS:
        raise ValueError(f"unknown failpoint {name!r}")
    point = current.get(name)
    if point is None:
        return
    with _lock:
        count = _hits[name] = _hits.get(name, 0) + 1
    if count == point.count:
        _fire(point)


def _fire(point: Failpoint) -> NoReturn:
    if point.action == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
        os._exit(EXIT_CODE)  # pragma: no cover - only if the signal did not end the process at once
    with contextlib.suppress(Exception):  # a closed stream must not stop the crash
        sys.stderr.write(f"candor: failpoint {point.name} fired (hit {point.count})\n")
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(EXIT_CODE)
