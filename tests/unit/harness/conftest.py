"""pytest configuration for harness tests; the shared helpers live in `scripted.py`.

Test modules import them with `from scripted import script, make_agent, ...` (see that module's docstring for why
not from this file). They are re-exported here for convenience.
"""

from __future__ import annotations

from scripted import *  # noqa: F403
from scripted import __all__ as __all__
