"""The provider tests' fixtures (tests/support/model_provider/fixtures.py): the API key variable and a tenant."""

from model_provider.fixtures import api_key, tenant

__all__ = ["api_key", "tenant"]
