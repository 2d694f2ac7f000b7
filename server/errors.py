"""Errors in OpenAI's JSON shape, `{"error": {"message", "type", "param", "code"}}`, with their status.

A user's mistake is logged as one line (no traceback); only an engine failure logs its traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from enum import Enum
from http import HTTPStatus

from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

logger = logging.getLogger("server")


class ErrorType(str, Enum):
    """OpenAI's `error.type` values, by what went wrong."""

    INVALID_REQUEST = "invalid_request_error"  # 400, 404, 413
    AUTHENTICATION = "authentication_error"  # 401
    UNAVAILABLE = "service_unavailable_error"  # 503: queue full, shutting down
    SERVER = "server_error"  # 500: the engine failed


_TYPE_OF_STATUS = {
    HTTPStatus.UNAUTHORIZED: ErrorType.AUTHENTICATION,
    HTTPStatus.SERVICE_UNAVAILABLE: ErrorType.UNAVAILABLE,
    HTTPStatus.INTERNAL_SERVER_ERROR: ErrorType.SERVER,
}


RETRY_AFTER_S = 1  # a 503's Retry-After: the waiting queue moves a row at a time, so soon is worth a try


class APIError(Exception):
    """An error answered to the client; `status` decides the HTTP status and `error.type`. A 503 carries
    Retry-After (RETRY_AFTER_S seconds)."""

    def __init__(self, status: HTTPStatus, message: str, *, param: str | None = None, code: str | None = None):
        super().__init__(message)
        self.status = HTTPStatus(status)
        self.message = message
        self.param = param
        self.code = code

    @property
    def type(self) -> ErrorType:
        return _TYPE_OF_STATUS.get(self.status, ErrorType.INVALID_REQUEST)

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type.value, "param": self.param, "code": self.code}}

    def response(self, headers: Mapping[str, str] | None = None) -> JSONResponse:
        """The JSON answer, with `headers` (a 405's Allow) and a 503's Retry-After."""
        headers = dict(headers or {})
        if self.status == HTTPStatus.SERVICE_UNAVAILABLE:
            headers["Retry-After"] = str(RETRY_AFTER_S)
        return JSONResponse(self.body(), status_code=self.status.value, headers=headers or None)


class RaisedAPIError(HTTPException):
    """An APIError raised where FastAPI passes on only an HTTPException (while it reads a request body): answered
    as the APIError it carries, `code` included."""

    def __init__(self, error: APIError):
        super().__init__(error.status.value, error.message)
        self.error = error


def context_length_exceeded(max_model_len: int, prompt_tokens: int, max_tokens: int | None, param: str) -> APIError:
    """OpenAI's (and vLLM's) 400 for a request that does not fit the context: code `context_length_exceeded`.
    max_tokens None: the prompt alone is too long (counted only as far as needed: `prompt_tokens` is a floor)."""
    what = "messages" if param == "messages" else "prompt"
    if max_tokens is None:
        asked = f"your {what} has at least {prompt_tokens} tokens, which leaves no room for a completion"
    else:
        asked = (
            f"you requested {prompt_tokens + max_tokens} tokens ({prompt_tokens} in the {what}, "
            f"{max_tokens} in the completion)"
        )
    return APIError(
        HTTPStatus.BAD_REQUEST,
        f"This model's maximum context length is {max_model_len} tokens. However, "
        f"{asked}. Please reduce the length of the {what} or completion.",
        param=param,
        code="context_length_exceeded",
    )


def validation_message(err: RequestValidationError) -> tuple[str, str | None]:
    """One readable line for pydantic's first complaint, and the parameter it is about."""
    first = err.errors()[0]
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = ".".join(loc) or None
    if first.get("type") == "json_invalid":
        return "the request body is not valid JSON", None
    if loc == [] and first.get("type") in ("model_attributes_type", "dict_type", "missing"):
        return "the request body must be a JSON object (send Content-Type: application/json)", None
    message = first.get("msg", "invalid request")
    if first.get("type") == "finite_number":  # NaN or infinity, which Python's JSON reader lets through
        value = first.get("input")
        message = "must be a number, not NaN" if value != value else f"must be a finite number, not {value}"
    # Pydantic prefixes messages raised by our validators ("Value error, ..."): drop it.
    message = message.removeprefix("Value error, ")
    return (f"{param}: {message}" if param else message), param


def install_error_handlers(app: FastAPI) -> None:
    """Answer every error, including FastAPI's own, in OpenAI's shape."""

    @app.exception_handler(APIError)
    async def api_error(request: Request, err: APIError) -> JSONResponse:
        level = logging.ERROR if err.status >= 500 and err.status != HTTPStatus.SERVICE_UNAVAILABLE else logging.INFO
        logger.log(level, "%d %s %s: %s", err.status, request.method, request.url.path, err.message)
        return err.response()

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, err: RequestValidationError) -> JSONResponse:
        message, param = validation_message(err)
        logger.info("400 %s %s: %s", request.method, request.url.path, message)
        return APIError(HTTPStatus.BAD_REQUEST, message, param=param).response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, err: StarletteHTTPException) -> JSONResponse:
        status = HTTPStatus(err.status_code)
        message = err.detail if isinstance(err.detail, str) else status.phrase
        logger.info("%d %s %s: %s", status, request.method, request.url.path, message)
        error = err.error if isinstance(err, RaisedAPIError) else APIError(status, message)
        return error.response(err.headers)  # Starlette's 405 names the methods allowed in `Allow`

    @app.exception_handler(Exception)
    async def failure(request: Request, err: Exception) -> JSONResponse:
        # A bug in the server: Starlette re-raises it after this answer, so its traceback is logged.
        return APIError(HTTPStatus.INTERNAL_SERVER_ERROR, f"internal error: {type(err).__name__}").response()
