"""The candor harness: a pure library around pydantic-ai; it never imports candor.service."""
