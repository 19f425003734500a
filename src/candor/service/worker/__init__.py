"""Workers (§7): the claim loop, one task per attempt, the supervisor and drain handoff."""

from .drain import drain, install_sigterm
from .loop import WorkerLoop

__all__ = ("WorkerLoop", "drain", "install_sigterm")
