"""Who is looking: the console's one auth rule, on the API's bearer keys.

A tenant key (TIDE_API_KEYS) sees its own jobs and batches; an operator key
(TIDE_ADMIN_KEYS) sees the fleet. A key may be both (listed in both settings). The key
travels in the Authorization header only, never in a URL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request

from tide_fleet.gateway.deps import StateDep, bearer_token, is_operator


@dataclass(frozen=True)
class Viewer:
    tenant: str | None  # None: an operator key that is no tenant's
    operator: bool

    def own_tenant(self) -> str:
        """The tenant whose jobs and batches this viewer may see, or 403."""
        if self.tenant is None:
            raise HTTPException(
                403, detail="this operator key is no tenant's: use a tenant key to see jobs"
            )
        return self.tenant


async def current_viewer(request: Request, state: StateDep) -> Viewer:
    settings = state.settings
    token = bearer_token(request)
    tenant = settings.api_keys.get(token) if settings.api_keys else "default"
    operator = is_operator(settings, token)
    if tenant is None and not operator:
        raise HTTPException(
            status_code=401,
            detail="missing or invalid API key: send 'Authorization: Bearer <key>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    return Viewer(tenant, operator)


async def operator_viewer(viewer: Annotated[Viewer, Depends(current_viewer)]) -> Viewer:
    if not viewer.operator:
        raise HTTPException(403, detail="the fleet view needs an operator key (TIDE_ADMIN_KEYS)")
    return viewer


ViewerDep = Annotated[Viewer, Depends(current_viewer)]
OperatorDep = Annotated[Viewer, Depends(operator_viewer)]
