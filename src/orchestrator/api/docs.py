"""``/docs``: Swagger UI on ``/openapi.json``, its JavaScript, CSS and icon served from the installed package
(``fastapi-offline`` ships them), so the page works on a network that reaches no CDN."""

from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, Final

from fastapi import FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

DOCS_PATH: Final = "/docs"
ASSETS_PATH: Final = "/docs/assets"
#: The files the page loads, all under ASSETS_PATH.
ASSETS: Final = ("swagger-ui-bundle.js", "swagger-ui.css", "favicon.png")


def assets_dir() -> Path:
    return Path(str(resources.files("fastapi_offline") / "static"))


def install(app: FastAPI) -> None:
    """Serve the page and its assets; the app must be created with ``docs_url=None``."""
    openapi_url = app.openapi_url or "/openapi.json"
    app.mount(ASSETS_PATH, StaticFiles(directory=assets_dir()), name="docs-assets")

    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title} - Swagger UI",
            swagger_js_url=f"{ASSETS_PATH}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS_PATH}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS_PATH}/favicon.png",
            oauth2_redirect_url=None,
        )

    app.add_api_route(DOCS_PATH, swagger_ui, methods=["GET"], include_in_schema=False)


#: The page's entry in the OpenAPI document (FastAPI leaves it out): no credentials needed.
PATH_ITEM: Final[dict[str, Any]] = {
    "get": {
        "tags": ["Meta"],
        "summary": "This API's documentation (Swagger UI)",
        "operationId": "get_docs",
        "security": [],
        "responses": {
            "200": {"description": "An HTML page.", "content": {"text/html": {"schema": {"type": "string"}}}}
        },
    }
}
