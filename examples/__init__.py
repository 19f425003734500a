"""Runnable examples for candor: scripted agents (no API key needed) and the `python -m examples.demo` story."""
