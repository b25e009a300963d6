"""Operations routes: /metrics (Prometheus text format) and the health checks /healthz and
/readyz (the database answers and its migrations are current)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import APIRouter, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials

from tableq.errors import PermissionDenied, SchemaNotMigrated, TableqError, public_kind
from tableq.server import models as m
from tableq.server.api import ERRORS, bearer, principal, state

log = logging.getLogger("tableq.server")
router = APIRouter(tags=["operations"])
HEALTH = {503: {"model": m.HealthOut, "description": "Database unreachable or not migrated"}}


def _health(request: Request) -> tuple[int, dict[str, Any]]:
    queue = state(request).queue
    try:
        queue.now()
        pending = queue.pending_migrations()
    except TableqError as exc:
        # Unauthenticated: say what kind of failure, never where the database is.
        log.warning("health check failed: %s", str(exc).splitlines()[0])
        advice = ("its tables are missing or out of date; run `tableq migrate`"
                  if isinstance(exc, SchemaNotMigrated) else "the server's log says why")
        return 503, {"status": "unavailable",
                     "detail": f"{public_kind(exc)}: the queue database failed the check; "
                               f"{advice}"}
    if pending:
        return 503, {"status": "unavailable",
                     "detail": f"migrations {pending} are not applied; run `tableq migrate`"}
    return 200, {"status": "ok", "detail": None}


@router.get("/healthz", response_model=m.HealthOut, responses=HEALTH,  # type: ignore[arg-type]
            openapi_extra={"security": []},
            summary="Liveness: the database answers and its migrations are current")
async def healthz(request: Request) -> Any:
    status, content = await run_in_threadpool(_health, request)
    return JSONResponse(content, status_code=status)


@router.get("/readyz", response_model=m.HealthOut, responses=HEALTH,  # type: ignore[arg-type]
            openapi_extra={"security": []},
            summary="Readiness: the same checks, for load balancers")
async def readyz(request: Request) -> Any:
    status, content = await run_in_threadpool(_health, request)
    return JSONResponse(content, status_code=status)


def _metrics(request: Request, creds: HTTPAuthorizationCredentials | None) -> bytes:
    st = state(request)
    if st.config.metrics_public:
        return st.metrics.exposition(lambda topic: True)
    p = principal(request, creds)
    if not p.may("metrics"):
        raise PermissionDenied(p.role, "read metrics (use a reader or admin token)")
    return st.metrics.exposition(p.sees)


@router.get("/metrics", response_class=Response, responses={
    **{k: v for k, v in ERRORS.items() if k in (401, 403)},
    200: {"content": {"text/plain": {"schema": {"type": "string"}}},
          "description": "Prometheus text format"}},
    openapi_extra={"security": [{"HTTPBearer": []}]},
    summary="Prometheus metrics (a reader or admin token, unless the server runs with "
            "--metrics-public)")
async def metrics(request: Request) -> Response:
    creds = await bearer(request)
    data = await run_in_threadpool(_metrics, request, creds)
    return Response(data, media_type="text/plain; version=0.0.4; charset=utf-8")
