"""The schema check behind `/readyz` (§10.1, §10.3): compares the database with this build, changing nothing."""

from __future__ import annotations

from ..core import Service
from ..store.migrate import SchemaStatus, check_schema

__all__ = ("SchemaStatus", "check_database_schema")


async def check_database_schema(service: Service, *, timeout: float) -> SchemaStatus:
    """The schema status of the service's database (S-122, S-123)."""
    return await check_schema(service.settings.database.url, timeout=timeout)
