"""User actions (spec §8): one async function per action, each in one write transaction, failing with §12 errors.

The actions live by concept: `threads` (create, post, archive), `runs` (fork, resume, interrupt), `inbox` (edit,
withdraw, reorder entries) and `reads`; `acceptance` holds what the accepting commands share (replay, the new
entry and run, the agent checks) and `protocol.requests` the pure request checks. Callers use this package's
names: `from candor.service import commands; await commands.create_thread(...)`.
"""

from __future__ import annotations

from ..protocol.requests import OPTIONS_LIMIT, RESUME_BODY_LIMIT
from .acceptance import Accepted
from .inbox import EntryChanged, InboxReordered, edit_entry, reorder_inbox, withdraw_entry
from .reads import (
    authenticate,
    get_entry,
    get_run,
    get_run_with_recovery,
    get_thread,
    list_attempts,
    list_entries_page,
    list_run_messages_page,
    list_runs,
    list_runs_page,
)
from .runs import fork_run, interrupt_run, resume_run
from .threads import archive_thread, create_thread, post_input

__all__ = (
    "Accepted",
    "EntryChanged",
    "InboxReordered",
    "create_thread",
    "post_input",
    "archive_thread",
    "resume_run",
    "interrupt_run",
    "fork_run",
    "edit_entry",
    "withdraw_entry",
    "reorder_inbox",
    "get_thread",
    "get_run",
    "get_run_with_recovery",
    "get_entry",
    "list_runs",
    "list_runs_page",
    "list_attempts",
    "list_entries_page",
    "list_run_messages_page",
    "authenticate",
    "OPTIONS_LIMIT",
    "RESUME_BODY_LIMIT",
)
