"""The control role's periodic sweeps (§10.2)."""

from .sweeps import Sweep, expire_leases, run_sweeps, sweep_table

__all__ = ("Sweep", "expire_leases", "run_sweeps", "sweep_table")
