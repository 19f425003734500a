"""Read models: rows of threads, runs, attempts and entries, keyset pages, and a run's added messages.

This is the face code outside `store/` imports; modules inside `store/` import each other directly.
"""

from __future__ import annotations

from .messages import iter_added_messages, read_added_messages
from .run_lists import list_workspace_runs
from .thread_lists import ThreadFilters, list_workspace_threads
from .views import (
    AttemptRow,
    EntryRow,
    RunRow,
    ThreadRow,
    get_entry,
    get_run,
    get_thread,
    list_attempts,
    list_runs,
    load_run,
)

__all__ = (
    "AttemptRow",
    "EntryRow",
    "RunRow",
    "ThreadFilters",
    "ThreadRow",
    "get_entry",
    "get_run",
    "get_thread",
    "iter_added_messages",
    "list_attempts",
    "list_runs",
    "list_workspace_runs",
    "list_workspace_threads",
    "load_run",
    "read_added_messages",
)
