"""Tables, their dialect-specific types, clocks and triggers, and migrations (Alembic) with the schema check.

This is the face code outside `store/` imports; modules inside `store/` import each other directly.
"""

from __future__ import annotations

from .migration import (
    SchemaStatus,
    check_schema,
    current_revisions,
    include_name,
    include_object_for,
    migrate,
    require_current_schema,
)
from .tables import metadata

__all__ = (
    "SchemaStatus",
    "check_schema",
    "current_revisions",
    "include_name",
    "include_object_for",
    "metadata",
    "migrate",
    "require_current_schema",
)
