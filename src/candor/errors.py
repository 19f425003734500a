"""Public face: the HarnessError family with stable codes (spec §3.11)."""

from .harness.errors import DefinitionError, HarnessError, RunCleanupError, RunError, StateError

__all__ = ("HarnessError", "RunError", "StateError", "DefinitionError", "RunCleanupError")
