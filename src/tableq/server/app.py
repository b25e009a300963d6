"""Builds the ASGI app: the /v1 API, the SQS endpoint, the dashboard, /metrics, /healthz and
/readyz on one Queue; the request-size cap, the security headers and the error boundary that
turns every failure into a JSON body with a stable code (no tracebacks in responses)."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import resources
from typing import Any

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from tableq.errors import TableqError
from tableq.queue import Queue
from tableq.server import errors
from tableq.server.errors import ApiError
from tableq.server.history import Sampler
from tableq.server.metrics import Metrics
from tableq.server.settings import ServerConfig
from tableq.server.store import Store
from tableq.server.waiting import Waiter

log = logging.getLogger("tableq.server")
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
       "object-src 'none'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
SECURITY_HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
]


class ServerState:
    """What the routes share: the queue, limits, metrics, the long-poll waiter, history."""

    def __init__(self, queue: Queue, config: ServerConfig) -> None:
        self.queue, self.config = queue, config
        self.store = Store(queue)
        self.metrics = Metrics(lambda: queue.stats())
        self.history = Sampler(queue, config)
        self.waiter: Waiter | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.doctor_cache: tuple[float, list[Any]] | None = None  # (monotonic, findings)

    def wake(self, topic: str) -> None:
        if self.waiter is not None:
            self.waiter.wake([topic])

    def wake_threadsafe(self, topic: str) -> None:
        if self.waiter is not None and self.loop is not None and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.waiter.wake, [topic])


class BodyTooLarge(HTTPException):
    """Raised from inside the body stream; an HTTPException so that the framework's body
    parsing passes it on instead of turning it into a generic 400."""

    def __init__(self, limit: int) -> None:
        self.message = (f"the request body is over the limit of {limit} bytes; send fewer or "
                        "smaller messages (or raise --max-body-bytes)")
        super().__init__(413, self.message)


UNEXPECTED = errors.body("InternalError", "the server failed unexpectedly; its log has the "
                         "details")


class Guard:
    """Outermost layer: caps request bodies before they are read (Content-Length, then a
    running count for chunked bodies), adds the security headers to every response, and
    times requests by route for /metrics."""

    def __init__(self, app: ASGIApp, state: ServerState) -> None:
        self.app, self.state = app, state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.state.config.max_body_bytes
        started = time.perf_counter()
        status = {"code": 500, "sent": False}

        async def send_secured(message: Message) -> None:
            if message["type"] == "http.response.start":
                status["code"], status["sent"] = message["status"], True
                names = {k.lower() for k, _ in message.get("headers", [])}
                message["headers"] = [*message.get("headers", []),
                                      *[h for h in SECURITY_HEADERS if h[0] not in names]]
            await send(message)

        length = _header(scope, b"content-length")
        if length is not None and length.isdigit() and int(length) > limit and \
                scope["path"].rstrip("/") == "/sqs":
            from tableq.server.sqs import too_large  # the SQS endpoint's own error shape

            await too_large(BodyTooLarge(limit).message)(scope, receive, send_secured)
        elif length is not None and (not length.isdigit() or int(length) > limit):
            await _send_json(send_secured, 413 if length.isdigit() else 400,
                             errors.body("RequestTooLarge", BodyTooLarge(limit).message)
                             if length.isdigit() else
                             errors.body("BadRequest", "Content-Length is not a number"))
        else:
            seen = 0

            async def limited() -> Message:
                nonlocal seen
                message = await receive()
                if message["type"] == "http.request":
                    seen += len(message.get("body", b""))
                    if seen > limit:
                        raise BodyTooLarge(limit)
                return message

            try:
                await self.app(scope, limited, send_secured)
            except Exception:
                # Answered here, not by Starlette's outer error middleware, so that a bug's
                # 500 carries the security headers and is counted in /metrics too.
                if status["sent"]:
                    raise
                log.exception("tableq.server.unexpected_error path=%s", scope["path"])
                await _send_json(send_secured, 500, UNEXPECTED)
        route = scope.get("route")
        path = getattr(route, "path", None) or ("/static" if scope["path"].startswith(
            "/static/") else "unmatched")
        # Label values come from a fixed set: a client inventing methods must not grow /metrics.
        method = scope["method"] if scope["method"] in HTTP_METHODS else "other"
        self.state.metrics.requests.labels(method, path, str(status["code"])).observe(
            time.perf_counter() - started)


HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            text: str = value.decode("latin-1")
            return text.strip()
    return None


async def _send_json(send: Send, status: int, content: Any) -> None:
    data = json.dumps(content).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(data)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": data})


def _is_json(content_type: str | None) -> bool:
    """What FastAPI reads as JSON: application/json or a +json type, parameters aside."""
    kind = (content_type or "").split(";", 1)[0].strip().lower()
    return kind == "application/json" or (kind.startswith("application/")
                                           and kind.endswith("+json"))


def _error_response(status: int, content: dict[str, Any]) -> JSONResponse:
    headers = {"Retry-After": "1"} if status in errors.RETRYABLE else {}
    if status == 401:  # RFC 9110: a 401 names the scheme that would be accepted
        headers["WWW-Authenticate"] = 'Bearer realm="tableq"'
    return JSONResponse(content, status_code=status, headers=headers or None)


def create_app(queue: Queue, *, config: ServerConfig | None = None,
               **settings: Any) -> FastAPI:
    """The ASGI app serving `queue`. Settings are ServerConfig's fields (max_body_bytes,
    max_batch, max_receive, max_wait_s, metrics_public, ...). The queue should be opened with
    strict_kinds=False: the server relays kinds it has no codec for."""
    cfg = config or ServerConfig(**settings)
    state = ServerState(queue, cfg)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        state.loop = asyncio.get_running_loop()
        state.waiter = Waiter(queue.listener if queue.dialect == "postgres" else None)
        state.history.start()
        log.info("tableq.server.started database=%s notify=%s", queue.where,
                 queue.dialect == "postgres")
        try:
            yield
        finally:
            state.history.stop()
            state.waiter.close()
            log.info("tableq.server.stopped")

    from tableq.version import __version__

    app = FastAPI(title="tableq", version=__version__, lifespan=lifespan, docs_url=None,
                  redoc_url=None, openapi_url="/openapi.json",
                  description="The native JSON API of a tableq queue. Every call but the "
                  "health checks takes `Authorization: Bearer <token>` (from `tableq token "
                  "create`); tokens in the URL are refused.")
    app.state.tableq = state

    @app.exception_handler(TableqError)
    async def on_library_error(request: Request, exc: TableqError) -> Response:
        status, content = errors.of_library(exc)
        if status >= 500:
            log.warning("tableq.server.database_error path=%s error=%s", request.url.path,
                        str(exc).splitlines()[0])
        return _error_response(status, content)

    @app.exception_handler(ApiError)
    async def on_api_error(request: Request, exc: ApiError) -> Response:
        return _error_response(exc.status, errors.body(exc.code, exc.message, **exc.fields))

    @app.exception_handler(RequestValidationError)
    async def on_invalid(request: Request, exc: RequestValidationError) -> Response:
        if any(e.get("loc", ())[:1] == ("body",) for e in exc.errors()) and \
                not _is_json(request.headers.get("content-type")) and await request.body():
            return _error_response(415, errors.body(
                "UnsupportedMediaType", "the body must be JSON sent with Content-Type: "
                "application/json (curl: --json '{...}'), not "
                f"{request.headers.get('content-type') or 'no Content-Type'}"))
        problems = [{"loc": [str(x) for x in e.get("loc", ())], "msg": str(e.get("msg", ""))}
                    for e in exc.errors()[:20]]
        if any(e.get("type") == "json_invalid" for e in exc.errors()):
            return _error_response(400, errors.body(
                "BadRequest", "the body is not valid JSON; send a JSON object with "
                "Content-Type: application/json"))
        first = problems[0] if problems else {"loc": [], "msg": "invalid"}
        text = f"invalid request: {'.'.join(first['loc'])}: {first['msg']}"
        return _error_response(422, errors.body("ValidationError", text, problems=problems))

    @app.exception_handler(StarletteHTTPException)
    async def on_http(request: Request, exc: StarletteHTTPException) -> Response:
        code = {400: "BadRequest", 404: "NotFound", 405: "MethodNotAllowed",
                413: "RequestTooLarge"}.get(exc.status_code, "HTTPError")
        response = _error_response(exc.status_code, errors.body(code, str(exc.detail)))
        for name, value in (exc.headers or {}).items():
            response.headers[name] = value
        if exc.status_code == 405:
            # Every method the path takes, not only the first route's (one path may have a
            # GET and a POST route).
            methods: set[str] = set()
            for route in served:
                if getattr(route, "methods", None) and route.matches(request.scope)[0] != \
                        Match.NONE:
                    methods |= getattr(route, "methods", set())
            response.headers["Allow"] = ", ".join(sorted(methods))
        return response

    @app.exception_handler(RecursionError)
    async def on_deep(request: Request, exc: RecursionError) -> Response:
        return _error_response(400, errors.body("BadRequest", "the JSON body is nested too "
                                                "deeply"))

    @app.exception_handler(Exception)
    async def on_bug(request: Request, exc: Exception) -> Response:
        log.exception("tableq.server.unexpected_error path=%s", request.url.path)
        return _error_response(500, UNEXPECTED)

    from tableq.server import api, dashboard, ops, sqs

    routers = (api.router, ops.router, sqs.router, dashboard.router)
    for router in routers:
        app.include_router(router)
    # The routes themselves: FastAPI's app.router.routes holds the included routers, which
    # have no methods of their own.
    served = [*app.router.routes, *(r for router in routers for r in router.routes)]
    app.mount("/static/look", StaticFiles(directory=str(resources.files("tableq.look")
                                                       .joinpath("static"))), name="look")
    app.mount("/static", StaticFiles(directory=str(resources.files("tableq.server")
                                                   .joinpath("static"))), name="static")
    app.add_middleware(Guard, state=state)

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            from fastapi.openapi.utils import get_openapi

            schema = get_openapi(title=app.title, version=app.version,
                                 description=app.description, routes=app.routes)
            app.openapi_schema = with_limits(schema, cfg)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


def with_limits(schema: dict[str, Any], cfg: ServerConfig) -> dict[str, Any]:
    """The OpenAPI document with this server's configured limits written in, so that what it
    says is accepted is what the server accepts."""
    parts = schema.get("components", {}).get("schemas", {})

    def put(model: str, prop: str, key: str, value: Any) -> None:
        field = parts.get(model, {}).get("properties", {}).get(prop)
        if field is not None:
            for target in field.get("anyOf", [field]):
                if target.get("type") in ("integer", "number", "array"):
                    target[key] = value

    put("ReceiveIn", "max", "maximum", cfg.max_receive)
    put("ReceiveIn", "wait_s", "maximum", cfg.max_wait_s)
    for model in ("SendBatch", "RefsIn", "HeartbeatManyIn"):
        put(model, "messages", "maxItems", cfg.max_batch)
    return schema
