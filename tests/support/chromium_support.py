"""Debian's Chromium for the console's browser tests: where it is, the flags it runs with, and the skip (naming
what failed) when it is missing. `playwright install` is never used; `.ci/run` installs `/usr/bin/chromium`."""

from __future__ import annotations

import os
import shutil

import pytest

__all__ = ("CHROMIUM_FLAGS", "find_chromium")

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def find_chromium() -> str:
    """The Chromium executable, or a skip saying why there is none (`CANDOR_CHROMIUM_SETUP` says what setup ran)."""
    found = shutil.which("chromium") or ("/usr/bin/chromium" if os.path.exists("/usr/bin/chromium") else None)
    if found is None:
        setup = os.environ.get("CANDOR_CHROMIUM_SETUP", "no setup step ran (run .ci/run, which installs it)")
        pytest.skip(f"Chromium is not installed (/usr/bin/chromium missing): {setup}")
    return found
