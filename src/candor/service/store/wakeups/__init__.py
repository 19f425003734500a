"""Wake-ups between processes: PostgreSQL LISTEN/NOTIFY, and a local datagram socket on SQLite.

This is the face code outside `store/` imports; modules inside `store/` import each other directly.
"""

from __future__ import annotations

from .notify import Notifier, listen_for_wakeups

__all__ = (
    "Notifier",
    "listen_for_wakeups",
)
