"""Threads and their inbox: creating threads, appending entries, starting and resuming runs, interrupts,
children, streams and the threads due to advance.

This is the face code outside `store/` imports; modules inside `store/` import each other directly.
"""

from __future__ import annotations

from ..workspaces.auth import new_id
from .advance import threads_to_advance
from .children import ChildSpawn, SpawnedChild, deliver_child_result, spawn_child
from .inbox import EntryEdit, edit_pending_entry, list_entries, move_pending_entries, withdraw_pending_entry
from .interrupts import archive_thread, cancel_accepted_run, lock_run, request_cancel
from .resume import read_resume, start_successor
from .streams import NewStreamEntry, StreamEntry, TrimResult, append_stream_entries, read_stream, trim_streams
from .submit import (
    NewEntry,
    advance_thread,
    append_entry,
    find_entry_by_key,
    find_run_by_source_entry,
    frozen_authority,
    inbox_usage,
    insert_thread,
    lock_thread,
    options_digest,
    payload_size,
    pending_entries,
    start_point,
    start_run,
    touch_thread,
)

__all__ = (
    "ChildSpawn",
    "EntryEdit",
    "NewEntry",
    "NewStreamEntry",
    "SpawnedChild",
    "StreamEntry",
    "TrimResult",
    "advance_thread",
    "append_entry",
    "append_stream_entries",
    "archive_thread",
    "cancel_accepted_run",
    "deliver_child_result",
    "edit_pending_entry",
    "find_entry_by_key",
    "find_run_by_source_entry",
    "frozen_authority",
    "inbox_usage",
    "insert_thread",
    "list_entries",
    "lock_run",
    "lock_thread",
    "move_pending_entries",
    "new_id",
    "options_digest",
    "payload_size",
    "pending_entries",
    "read_resume",
    "read_stream",
    "request_cancel",
    "spawn_child",
    "start_point",
    "start_run",
    "start_successor",
    "threads_to_advance",
    "touch_thread",
    "trim_streams",
    "withdraw_pending_entry",
)
