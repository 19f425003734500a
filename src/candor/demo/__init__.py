"""Scripted demo agents (no API key): used by `make demo`, the docs, and as the service's default agents."""
