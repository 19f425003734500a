"""candor: a durable runtime for LLM agents, built on Pydantic AI.

The public face of the library (spec §3.1). The service layer lives in `candor.service`.
"""

from .harness.bindings import EnvironmentProvider, RunBindings
from .harness.capability_store import capability_state
from .harness.deferred import MAX_DEFERRED_ITEMS, MAX_DEFERRED_METADATA_BYTES, DeferredToolResume
from .harness.events import BoundaryEvent, RunResultEvent
from .harness.harness import Harness
from .harness.results import RunResult, SafeFailure
from .harness.state import CapabilityState, HarnessState
from .harness.stream import RunStream

__all__ = (
    "Harness",
    "HarnessState",
    "CapabilityState",
    "RunBindings",
    "RunResult",
    "SafeFailure",
    "DeferredToolResume",
    "RunStream",
    "BoundaryEvent",
    "RunResultEvent",
    "EnvironmentProvider",
    "capability_state",
    "MAX_DEFERRED_ITEMS",
    "MAX_DEFERRED_METADATA_BYTES",
)
