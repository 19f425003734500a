"""The schema checks behind `/readyz` (§10.1, §10.3): the full comparison of the database with this build, and the
applied revisions alone; both change nothing."""

from __future__ import annotations

from ..core import Service
from ..store.schema import SchemaStatus, check_schema, current_revisions

__all__ = ("SchemaStatus", "check_database_schema", "database_revisions")


async def check_database_schema(service: Service, *, timeout: float) -> SchemaStatus:
    """The schema status of the service's database (S-122, S-123)."""
    return await check_schema(service.settings.database.url, timeout=timeout)


async def database_revisions(service: Service) -> tuple[str, ...]:
    """The revisions the service's database records as applied (one read on the service's pool)."""
    return await current_revisions(service.engine)
