"""The HTTP API (spec §8): the only package that imports fastapi. Routes parse, authenticate, call one command
and render a view; everything else happens in `candor.service.commands`."""

from .app import create_app
from .readiness import Readiness, Role

__all__ = ("create_app", "Readiness", "Role")
