"""The read values the user actions hand back (threads, runs, attempts, entries, stream entries).

They are built by the store; callers outside it (HTTP views, the CLI) import them from here, so no caller above the
commands layer imports the store (tests/e2e/project/test_layering.py).
"""

from __future__ import annotations

from ..store.reads import AttemptRow, EntryRow, RunRow, ThreadRow
from ..store.threads import StreamEntry

__all__ = ("AttemptRow", "EntryRow", "RunRow", "StreamEntry", "ThreadRow")
