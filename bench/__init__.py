"""Benchmarks: `python -m bench.run_all` runs them all and writes docs/benchmarks.md."""
