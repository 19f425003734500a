"""The public face of the `/v1` OpenAPI schema and its docs page.

* Operation ids are the route functions' names in camelCase (`createThread`, `resumeRun`): generated clients name
  their methods after them, so they are part of the API and stay stable.
* Every `/v1` operation lists 500 `internal`; every operation with a body lists 413 `payload_too_large` and 415
  `unsupported_media_type`. FastAPI's 422 is dropped: this API answers validation problems with 400 (S-96).
* Descriptions and summaries carry no internal spec references (`§8.6`, `S-81`).
* `/v1/docs` is Swagger UI served from the `swagger-ui-bundle-v2` package's files under `/v1/docs/assets`: it works
  without internet access (no CDN).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.routing import APIRoute
from fastapi.staticfiles import StaticFiles

from ..protocol.public_text import public_text
from .schemas import ErrorBody

__all__ = ("operation_id", "shape_openapi", "mount_docs", "DOCS_URL", "OPENAPI_URL")

OPENAPI_URL = "/v1/openapi.json"
DOCS_URL = "/v1/docs"
_ASSETS = "/v1/docs/assets"
_ERROR = {"$ref": "#/components/schemas/ErrorBody"}
_BODY_ERRORS = {
    "413": "payload_too_large: the body exceeds `server.max_request_bytes`, or one message exceeds "
    "`control.inbox_bytes`",
    "415": "unsupported_media_type: the body is not `application/json`",
}


def operation_id(route: APIRoute) -> str:
    """`create_thread` → `createThread`."""
    head, *rest = route.name.split("_")
    return head + "".join(word.capitalize() for word in rest)


def _public(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            key: public_text(item) if key in ("description", "summary") and isinstance(item, str) else _public(item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_public(item) for item in value]
    return value


def shape_openapi(app: FastAPI) -> None:
    """Wrap `app.openapi` so the schema it serves has the shape described above."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = generate()
        error_content = {"application/json": {"schema": _ERROR}}
        for path, item in schema.get("paths", {}).items():
            for operation in item.values():
                responses = operation.setdefault("responses", {})
                if responses.get("422", {}).get("description") == "Validation Error":
                    del responses["422"]
                if not path.startswith("/v1/"):
                    continue
                responses.setdefault("500", {"description": "internal", "content": error_content})
                if "requestBody" in operation:
                    for status, description in _BODY_ERRORS.items():
                        responses.setdefault(status, {"description": description, "content": error_content})
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        for name in ("HTTPValidationError", "ValidationError"):
            components.pop(name, None)
        components.setdefault("ErrorBody", ErrorBody.model_json_schema(ref_template="#/components/schemas/{model}"))
        app.openapi_schema = _public(schema)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def mount_docs(app: FastAPI) -> None:
    """`/v1/docs`: Swagger UI from the packaged assets (importing the package is deferred to here: only the API
    roles serve the page)."""
    from swagger_ui_bundle import swagger_ui_path  # type: ignore[import-untyped]

    app.mount(_ASSETS, StaticFiles(directory=swagger_ui_path), name="swagger-ui-assets")

    @app.get(DOCS_URL, include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=OPENAPI_URL,
            title="candor API",
            swagger_js_url=f"{_ASSETS}/swagger-ui-bundle.js",
            swagger_css_url=f"{_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{_ASSETS}/favicon-32x32.png",
        )
