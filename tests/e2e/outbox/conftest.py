"""The outbox tests' fixtures (tests/support/outbox/fixtures.py): fresh failpoints, a tenant, a clock, a receiver."""

from outbox.fixtures import _fresh, clock, receiver, tenant

__all__ = ["_fresh", "clock", "receiver", "tenant"]
