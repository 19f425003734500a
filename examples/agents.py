"""The demo's scripted agents live in the package (`candor.demo.support`) so the service can host them."""

from candor.demo.support import *  # noqa: F403
from candor.demo.support import __all__  # noqa: F401
