"""The OIDC issuer's documents (``identity.documents``), public: the cloud's security token service fetches
them without credentials to check the runners' workload identity tokens."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from orchestrator.identity import documents
from orchestrator.web import openapi
from orchestrator.web.services import Services, services

_CACHE_HEADER: dict[str, Any] = {"schema": {"type": "string"}, "description": "How long to cache it."}
_CACHED: dict[int | str, dict[str, Any]] = {200: {"headers": {"Cache-Control": _CACHE_HEADER}}}


class OpenIDConfiguration(BaseModel):
    """The issuer's OIDC discovery document."""

    issuer: str
    jwks_uri: str
    response_types_supported: list[str]
    subject_types_supported: list[str]
    id_token_signing_alg_values_supported: list[str]
    claims_supported: list[str]


class JsonWebKey(BaseModel):
    """An RSA public key (RFC 7517, 7518)."""

    kty: str
    n: str
    e: str
    kid: str
    use: str
    alg: str


class JsonWebKeySet(BaseModel):
    """Every key a valid token may name: the current one, the next (published before it signs), and
    retired ones until their tokens have expired."""

    keys: list[JsonWebKey]


def router(issuer: str) -> APIRouter:
    """The documents at the root and, when the issuer URL has a path (``https://host/po``), under it too:
    relying parties fetch ``{issuer}/.well-known/openid-configuration`` exactly."""
    routes = APIRouter(tags=["Workload identity"])

    async def openid_configuration(svc: Annotated[Services, Depends(services)]) -> JSONResponse:
        """The OIDC discovery document of the issuer (``PO_PUBLIC_URL``). No credentials needed."""
        return JSONResponse(
            documents.discovery(svc.issuer.issuer), headers={"Cache-Control": documents.CACHE_CONTROL}
        )

    @openapi.may_answer(503)
    async def jwks(svc: Annotated[Services, Depends(services)]) -> JSONResponse:
        """The issuer's public signing keys (JWKS). No credentials needed."""
        published = await svc.issuer.published_keys()
        return JSONResponse(documents.jwks(published), headers={"Cache-Control": documents.CACHE_CONTROL})

    served = (
        (documents.DISCOVERY_PATH, openid_configuration, OpenIDConfiguration, "get_openid_configuration"),
        (documents.JWKS_PATH, jwks, JsonWebKeySet, "get_jwks"),
    )
    prefix = documents.path_prefix(issuer)
    for base in ["", prefix] if prefix else [""]:
        shown = not base
        for path, endpoint, model, operation_id in served:
            routes.add_api_route(
                base + path,
                endpoint,
                methods=["GET"],
                response_model=model,
                responses=_CACHED,
                operation_id=operation_id if shown else None,
                include_in_schema=shown,
            )
    return routes
