"""Service protocol decisions: pure functions that decide, so the store and worker shells only act.

Nothing in this package does I/O, reads a clock or holds global state; time and randomness are parameters.
It imports neither sqlalchemy, fastapi nor httpx (STYLE §1, habit 9).
"""
