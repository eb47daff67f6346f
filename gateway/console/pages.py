"""The console's page and who-am-I: GET /console (one HTML shell; the pages are ES modules
under /console/static, no build step) and GET /console/api/me."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import FileResponse, RedirectResponse

from tide_fleet.gateway.console.auth import Viewer, current_viewer
from tide_fleet.gateway.deps import StateDep
from tide_fleet.gateway.served import served_catalog

STATIC = Path(__file__).parent / "static"

# Scripts, styles and data only from this origin: no inline script, nothing from a CDN.
CSP = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data: blob:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'"
)

router = APIRouter(include_in_schema=False)


@router.get("/console")
async def console_page() -> FileResponse:
    return FileResponse(
        STATIC / "index.html",
        headers={"Content-Security-Policy": CSP, "Cache-Control": "no-cache"},
    )


@router.get("/favicon.ico")
async def favicon() -> FileResponse:
    return FileResponse(STATIC / "favicon.svg", media_type="image/svg+xml")


@router.get("/console/")
async def console_slash() -> RedirectResponse:
    return RedirectResponse("/console")


@router.get("/console/api/me")
async def me(request: Request, state: StateDep) -> dict[str, Any]:
    """Who the key in the header is; 200 either way ("accepted": false asks the page for a
    key), so that loading the console before signing in logs no failed request."""
    settings = state.settings
    try:
        viewer: Viewer | None = await current_viewer(request, state)
    except HTTPException:
        viewer = None
    return {
        "accepted": viewer is not None,
        "tenant": viewer.tenant if viewer else None,
        "operator": viewer.operator if viewer else False,
        "auth": bool(settings.api_keys or settings.admin_keys),
        "models": served_catalog(state).names(),  # the default first
        "model_loaded": state.model is not None,
        "max_model_len": state.model.config.max_model_len if state.model is not None else None,
    }
