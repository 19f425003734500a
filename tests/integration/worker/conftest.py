"""The worker tests' fixtures (tests/support/worker/fixtures.py): a fresh `CONTROL` per test, a Service, a tenant."""

from worker.fixtures import control, service, tenant

__all__ = ["control", "service", "tenant"]
