"""`/console`: the approvals console and run inspector, a static page shipped in the package (no build step, no CDN).

The page itself needs no key: it holds no data. It asks for a key once, keeps it in the tab's `sessionStorage` and
calls the `/v1` API with it as a bearer token, like any client (docs/console.md). The assets are read from the
package once per process; the Content-Security-Policy allows nothing but this origin, so the page runs no inline
script and loads nothing from elsewhere.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from fastapi import APIRouter
from fastapi.responses import Response

__all__ = ("router", "ASSETS")

router = APIRouter(include_in_schema=False)

ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "console.js": "text/javascript; charset=utf-8",
    "inspector.js": "text/javascript; charset=utf-8",
    "run_page.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
}
_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


@cache
def _asset(name: str) -> bytes:
    return (resources.files("candor.service.http") / "console_assets" / name).read_bytes()


def _serve(name: str) -> Response:
    return Response(_asset(name), media_type=ASSETS[name], headers=_HEADERS)


@router.api_route("/console", methods=["GET", "HEAD"])
async def console_page() -> Response:
    """The page; HEAD answers like GET (without the body), as link checkers and `curl -I` expect."""
    return _serve("index.html")


@router.api_route("/favicon.ico", methods=["GET", "HEAD"])
async def favicon() -> Response:
    """204: the console ships no icon, and a browser's automatic request for one is not an error to log as 404."""
    return Response(status_code=204, headers={"Cache-Control": "max-age=86400"})


# The inspector's pages are deep links (`/console/threads/{id}`, `/console/runs/{id}`): the same page, which reads
# its path and renders the view, so a reload or a shared link opens the same view.
@router.api_route("/console/threads", methods=["GET", "HEAD"])
@router.api_route("/console/threads/{thread_id}", methods=["GET", "HEAD"])
@router.api_route("/console/runs/{run_id}", methods=["GET", "HEAD"])
async def console_deep_link() -> Response:
    return _serve("index.html")


def _asset_route(name: str) -> None:
    """One route per asset, so no pattern of the console overlaps another (tests/unit/http/test_http_routing.py);
    any other path under `/console` answers 404 `not_found`, kind `route` (S-99)."""

    async def console_asset() -> Response:
        return _serve(name)

    router.add_api_route(f"/console/{name}", console_asset, methods=["GET", "HEAD"], name=f"console_asset_{name}")


for _name in ASSETS:
    if _name != "index.html":
        _asset_route(_name)
