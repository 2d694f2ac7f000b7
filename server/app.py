"""The FastAPI application: OpenAI's /v1 endpoints, /health and /metrics over one engine."""

from __future__ import annotations

import logging
import secrets
import time
import uuid
from http import HTTPStatus

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from server.context import ServerSettings, ServingContext
from server.engine_api import AsyncEngine, ServedModel
from server.errors import APIError, RaisedAPIError, install_error_handlers
from server.generation import ClientDisconnected, Job, respond
from server.metrics import ServerMetrics
from server.protocol import ChatCompletionRequest, CompletionRequest
from server.reproducibility import reproducibility
from server.responses import ChatFormat, CompletionFormat, Head
from server.token_bytes import TokenStrings
from server.translate import chat_request, completion_request, max_model_len

logger = logging.getLogger("server")

ENDPOINTS = ("/v1/models", "/v1/completions", "/v1/chat/completions", "/health", "/metrics")
MODEL_ENDPOINT = "/v1/models/{model}"
CLIENT_CLOSED_REQUEST = 499  # nginx's status for "the client went away first"; only ever a metrics label
DRAIN_FACTOR = 16  # a refused body is read and dropped up to this many times the limit, then the connection closes


def endpoint_label(path: str) -> str:
    if path in ENDPOINTS:
        return path
    return MODEL_ENDPOINT if path.startswith("/v1/models/") else "other"


class BodyLimit:
    """ASGI middleware: a request body over `limit` bytes is answered 413 without being kept or parsed: at once when
    its Content-Length says so (the rest is read and dropped, up to DRAIN_FACTOR x the limit, so that the client
    reads the answer rather than a reset connection), else as soon as the bytes received pass the limit."""

    def __init__(self, app: ASGIApp, limit: int):
        self.app = app
        self.limit = limit

    def too_large(self) -> APIError:
        return APIError(
            HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
            f"the request body is larger than this server takes ({self.limit} bytes, --max-request-bytes)",
            code="request_too_large",
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.limit:
            await self.too_large().response()(scope, receive, send)
            drained, more = 0, True
            while more and drained <= DRAIN_FACTOR * self.limit:
                message = await receive()
                drained += len(message.get("body", b""))
                more = message["type"] == "http.request" and message.get("more_body", False)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.limit:
                raise RaisedAPIError(self.too_large())
            return message

        await self.app(scope, receive if length else counted, send)


class RequestAccounting:
    """ASGI middleware: counts requests in flight, the arrival time, and requests by endpoint and status."""

    def __init__(self, app: ASGIApp, ctx: ServingContext):
        self.app = app
        self.ctx = ctx

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        scope.setdefault("state", {})["arrival_s"] = time.perf_counter()
        status = CLIENT_CLOSED_REQUEST

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        self.ctx.in_flight += 1
        try:
            await self.app(scope, receive, send_and_note)
        except Exception:
            status = HTTPStatus.INTERNAL_SERVER_ERROR.value  # a bug: Starlette answers 500 outside this middleware
            raise
        finally:
            self.ctx.in_flight -= 1
            self.ctx.metrics.count_request(endpoint_label(scope["path"]), status)


def create_app(model: ServedModel, engine: AsyncEngine, settings: ServerSettings | None = None) -> FastAPI:
    """An app serving `engine`; `app.state.ctx` is its ServingContext (set `ctx.draining` to turn requests away)."""
    settings = settings or ServerSettings()
    name = settings.served_model_name or model.model_name
    if not name:
        raise ValueError("the model has no name (built in memory?): give a served model name")
    # several engine replicas behind one ingress (server.replicas) report their stats one by one
    metrics = ServerMetrics(engine.stats, name, by_replica=getattr(engine, "stats_by_replica", None))
    ctx = ServingContext(model, engine, settings, metrics)
    tokens = TokenStrings(model.tokenizer)
    app = FastAPI(title="saguaro serve", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.ctx = ctx
    install_error_handlers(app)
    app.add_middleware(BodyLimit, limit=settings.max_request_bytes)
    app.add_middleware(RequestAccounting, ctx=ctx)

    def admitted(request: Request) -> None:
        """/v1/* only: a valid key when one is set, and a server that is not shutting down."""
        if settings.api_key is not None:
            scheme, _, token = request.headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip(), settings.api_key):
                raise APIError(
                    HTTPStatus.UNAUTHORIZED,
                    "missing or invalid API key: send Authorization: Bearer <key>",
                    code="invalid_api_key",
                )
        if ctx.draining:
            raise APIError(HTTPStatus.SERVICE_UNAVAILABLE, "the server is shutting down", code="shutting_down")

    def check_model(name: str) -> None:
        if name != ctx.model_name:
            raise APIError(
                HTTPStatus.NOT_FOUND,
                f"the model '{name}' does not exist: this server has '{ctx.model_name}'",
                param="model",
                code="model_not_found",
            )

    def model_card() -> dict:
        return {
            "id": ctx.model_name,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "saguaro",
            "max_model_len": max_model_len(model),
        }

    async def run(request: Request, job: Job) -> Response:
        try:
            return await respond(ctx, request, job, request.scope["state"]["arrival_s"])
        except ClientDisconnected:
            logger.info("client disconnected from %s: request aborted", job.request_id)
            return Response(status_code=CLIENT_CLOSED_REQUEST)

    async def translated(translate, body):
        """translate(model, body) -> (prompt ids, params), on the request worker thread: tokenizing is CPU work."""
        try:
            return await ctx.off_loop(translate, model, body)
        except ValueError as err:
            raise APIError(HTTPStatus.BAD_REQUEST, str(err)) from err

    @app.get("/health")
    async def health() -> JSONResponse:
        if ctx.draining:
            return JSONResponse({"status": "shutting down"}, status_code=HTTPStatus.SERVICE_UNAVAILABLE)
        return JSONResponse({"status": "ok", "strategy": model.strategy_in_use})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(ctx.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", dependencies=[Depends(admitted)])
    async def models() -> JSONResponse:
        return JSONResponse({"object": "list", "data": [model_card()]})

    @app.get("/v1/models/{model_id:path}", dependencies=[Depends(admitted)])
    async def one_model(model_id: str) -> JSONResponse:
        check_model(model_id)
        return JSONResponse(model_card())

    @app.post("/v1/completions", dependencies=[Depends(admitted)])
    async def completions(body: CompletionRequest, request: Request) -> Response:
        check_model(body.model)
        prompt_ids, params = await translated(completion_request, body)
        head = Head(f"cmpl-{uuid.uuid4().hex}", int(time.time()), ctx.model_name, reproducibility(model.config, params))
        fmt = CompletionFormat(head, tokens, body.include_usage)
        return await run(request, Job(head.id, prompt_ids, params, fmt, body.stream, body.include_usage))

    @app.post("/v1/chat/completions", dependencies=[Depends(admitted)])
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        check_model(body.model)
        prompt_ids, params = await translated(chat_request, body)
        head = Head(
            f"chatcmpl-{uuid.uuid4().hex}", int(time.time()), ctx.model_name, reproducibility(model.config, params)
        )
        fmt = ChatFormat(head, tokens, body.include_usage)
        return await run(request, Job(head.id, prompt_ids, params, fmt, body.stream, body.include_usage))

    return app
