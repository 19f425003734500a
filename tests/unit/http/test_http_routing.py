"""Routing: which route answers a request never depends on the order the routers are included in (`API_ROUTERS`
is ordered busiest first, for the cost of matching only)."""

from __future__ import annotations

import importlib
import itertools
import pkgutil
import re

from fastapi.routing import APIRoute

from candor.service.http.app import API_ROUTERS
from candor.service.http.routes import ops

_PARAMETER = re.compile(r"\{(\w+)(?::\w+)?\}")


def _routes() -> list[APIRoute]:
    routes = [route for router in (*API_ROUTERS, ops.router) for route in router.routes]
    assert all(isinstance(route, APIRoute) for route in routes)
    return [route for route in routes if isinstance(route, APIRoute)]


def _methods(route: APIRoute) -> set[str]:
    assert route.methods is not None  # FastAPI gives every APIRoute its methods
    return route.methods


def _example_path(route: APIRoute) -> str:
    """`route`'s path with every parameter filled in by a value its own pattern accepts."""
    return _PARAMETER.sub(lambda m: f"x_{m[1]}", route.path_format)


def test_every_route_module_is_included_and_its_routes_answer_their_own_paths() -> None:
    """Every route module but `ops` (served by every role) has its router in `API_ROUTERS`, once; each route
    matches the example path built from it, so the overlap check below looks at paths the routes really accept."""
    from candor.service.http import routes

    names = {m.name for m in pkgutil.iter_modules(routes.__path__) if not m.name.startswith("_")} - {"ops"}
    routers = [importlib.import_module(f"{routes.__name__}.{name}").router for name in sorted(names)]
    assert sorted(map(id, routers)) == sorted(map(id, API_ROUTERS))
    for route in _routes():
        assert route.path_regex.match(_example_path(route)), route.path


def test_no_two_routes_accept_the_same_method_and_path() -> None:
    """A request fits at most one route, so reordering `API_ROUTERS` (done for speed) cannot change which route
    answers it: for every pair of routes sharing a method, neither's pattern accepts the other's example path."""
    overlapping = [
        (a.path, b.path, sorted(_methods(a) & _methods(b)))
        for a, b in itertools.combinations(_routes(), 2)
        if _methods(a) & _methods(b) and (a.path_regex.match(_example_path(b)) or b.path_regex.match(_example_path(a)))
    ]
    assert overlapping == []
