"""/docs and /redoc with their scripts served from an installed package, not a CDN.

FastAPI's default pages load Swagger UI and ReDoc from a CDN, and render blank on a
machine without internet. The `fastapi-offline` package ships those files (Swagger UI 5
and ReDoc 2, MIT); only its static folder is used here, with FastAPI's own page builders.
"""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path

from fastapi import FastAPI
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS_URL = "/docs-assets"


def assets_folder() -> Path:
    spec = find_spec("fastapi_offline")
    if spec is None or spec.origin is None:
        raise RuntimeError("the fastapi-offline package (the docs' assets) is not installed")
    return Path(spec.origin).parent / "static"


def install_docs(app: FastAPI) -> None:
    """Serve /docs, /docs/oauth2-redirect and /redoc from local assets. The app must be
    built with docs_url=None and redoc_url=None."""
    app.mount(ASSETS_URL, StaticFiles(directory=assets_folder()), name="docs-assets")
    openapi_url = app.openapi_url or "/openapi.json"
    oauth2 = app.swagger_ui_oauth2_redirect_url or "/docs/oauth2-redirect"

    @app.get("/docs", include_in_schema=False)
    async def swagger_ui() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=openapi_url,
            title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=oauth2,
            swagger_js_url=f"{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS_URL}/favicon.png",
            swagger_ui_parameters=app.swagger_ui_parameters,
        )

    @app.get(oauth2, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get("/redoc", include_in_schema=False)
    async def redoc() -> HTMLResponse:
        return get_redoc_html(
            openapi_url=openapi_url,
            title=f"{app.title} - ReDoc",
            redoc_js_url=f"{ASSETS_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{ASSETS_URL}/favicon.png",
            with_google_fonts=False,
        )
