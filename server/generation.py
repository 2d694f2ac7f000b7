"""Running one request through the engine: a server-sent event stream, or one collected response.

The engine raises before its first chunk for a request it will not take (ValueError, QueueFull,
EngineStopped), so the first chunk is awaited before any status is sent: those become 400 / 503.
A client that goes away aborts its request: a stream is cancelled by Starlette when the client
disconnects, a collected response polls `request.is_disconnected()` while it waits. Either way the
engine's iterator is closed, which aborts the request in the engine and frees its row.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import TypeVar

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from engine import EngineFailed, EngineStopped, QueueFull
from server.context import ServingContext
from server.engine_api import Chunk, ChunkStream, TokenLogprob
from server.errors import APIError
from server.metrics import FinishedRequest
from server.responses import ResponseFormat
from theory.latency import request_latency

logger = logging.getLogger("server")
T = TypeVar("T")

ABORTED = "abort"  # the engine's finish_reason for a request it gave up (shutdown deadline)
SHUT_DOWN = "the server shut down before this request finished"
QUEUE_FULL = "the server is busy (its waiting queue is full): retry later"  # the engine's words may say it too


class ClientDisconnected(Exception):
    """The client closed its connection before the answer was ready."""


@dataclass(frozen=True)
class Job:
    """One request, ready for the engine."""

    request_id: str
    prompt_ids: list[int]
    params: object  # engine.SamplingParams
    format: ResponseFormat
    stream: bool
    include_usage: bool


@dataclass
class Timeline:
    """When the server got each chunk that carried tokens, from the request's arrival (perf_counter s), and how
    the request ended."""

    arrival_s: float
    chunk_times_s: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    last: Chunk | None = None  # the newest chunk

    def record(self, chunk: Chunk) -> None:
        self.last = chunk
        if chunk.token_ids:
            self.chunk_times_s.append(time.perf_counter())
            self.chunk_tokens.append(len(chunk.token_ids))

    def finished(self, max_tokens: int) -> FinishedRequest:
        last, times = self.last, self.chunk_times_s
        latency = request_latency(self.arrival_s, times, self.chunk_tokens) if times else None
        return FinishedRequest(
            latency=latency,
            finish_reason=(last.finish_reason if last is not None and last.finished else None) or ABORTED,
            prompt_tokens=last.prompt_tokens if last is not None else None,
            output_tokens=sum(self.chunk_tokens),
            max_tokens=max_tokens,
            arrival_s=self.arrival_s,
            scheduled_s=getattr(last, "scheduled_s", None) if last is not None else None,
            first_s=times[0] if times else None,
            last_s=times[-1] if times else None,
        )


def engine_error(err: Exception) -> APIError:
    """The answer to an exception from the engine: the user's mistake, a full queue, or a failure."""
    if isinstance(err, APIError):
        return err
    if isinstance(err, ValueError):
        return APIError(HTTPStatus.BAD_REQUEST, str(err))
    if isinstance(err, QueueFull):
        return APIError(HTTPStatus.SERVICE_UNAVAILABLE, QUEUE_FULL, code="queue_full")
    if isinstance(err, EngineStopped) and not isinstance(err, EngineFailed) and err.__cause__ is None:  # shutting down
        return APIError(HTTPStatus.SERVICE_UNAVAILABLE, str(err), code="engine_stopped")
    # The engine failed under this request (EngineStopped from the failure, or anything unexpected).
    logger.error("engine failure", exc_info=err)
    return APIError(HTTPStatus.INTERNAL_SERVER_ERROR, f"the engine failed: {type(err).__name__}: {err}")


async def until_disconnected(request: Request, awaitable: Awaitable[T], poll_s: float) -> T:
    """Await `awaitable`, unless the client disconnects first: then cancel it and raise ClientDisconnected."""
    task = asyncio.ensure_future(awaitable)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=poll_s)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise ClientDisconnected
    finally:
        if not task.done():
            task.cancel()  # cancels the engine iterator's pending step: that aborts the request
            await asyncio.wait({task})


async def respond(ctx: ServingContext, request: Request, job: Job, arrival_s: float) -> Response:
    """Answer one request: an SSE stream or one JSON body (raises APIError / ClientDisconnected)."""
    timeline = Timeline(arrival_s)
    poll_s = ctx.settings.disconnect_poll_s
    try:
        chunks = ctx.engine.generate(job.prompt_ids, job.params, request_id=job.request_id)
    except Exception as err:
        raise engine_error(err) from err
    try:
        first = await until_disconnected(request, anext(chunks), poll_s)
    except BaseException as err:
        await chunks.aclose()
        if isinstance(err, Exception) and not isinstance(err, ClientDisconnected):
            raise engine_error(err) from err
        _finished(ctx, job, timeline)  # it reached the engine, and was aborted there
        raise
    if job.stream:
        return StreamingResponse(
            _events(ctx, job, first, chunks, timeline),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-cache"},
        )
    try:
        answer = await until_disconnected(request, _collect(first, chunks, timeline), poll_s)
    except Exception as err:
        if isinstance(err, ClientDisconnected):
            raise
        raise engine_error(err) from err
    finally:
        await chunks.aclose()
        _finished(ctx, job, timeline)
    return JSONResponse(job.format.response(**answer))


async def _collect(first: Chunk, chunks: ChunkStream, timeline: Timeline) -> dict:
    """All of a request's chunks, joined: the arguments of ResponseFormat.response."""
    text: list[str] = []
    token_ids: list[int] = []
    logprobs: list[TokenLogprob] | None = None if first.logprobs is None else []
    chunk = first
    while True:
        timeline.record(chunk)
        text.append(chunk.text)
        token_ids.extend(chunk.token_ids)
        if logprobs is not None and chunk.logprobs:
            logprobs.extend(chunk.logprobs)
        if chunk.finished:
            break
        chunk = await anext(chunks)
    if chunk.finish_reason == ABORTED:
        raise APIError(HTTPStatus.SERVICE_UNAVAILABLE, SHUT_DOWN, code="shutting_down")
    return {
        "text": "".join(text),
        "token_ids": token_ids,
        "logprobs": logprobs,
        "finish_reason": chunk.finish_reason,
        "prompt_tokens": chunk.prompt_tokens,
        "completion_tokens": chunk.output_tokens,
    }


def _sse(body: dict) -> str:
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


async def _events(
    ctx: ServingContext, job: Job, first: Chunk, chunks: ChunkStream, timeline: Timeline
) -> AsyncIterator[str]:
    """The SSE stream: one event per engine chunk, the usage chunk if asked, then `[DONE]`."""
    chunk, sent_text = first, 0
    try:
        while True:
            if chunk.finish_reason == ABORTED:
                yield _sse(APIError(HTTPStatus.SERVICE_UNAVAILABLE, SHUT_DOWN, code="shutting_down").body())
                break
            timeline.record(chunk)
            yield _sse(job.format.chunk(chunk, chunk is first, sent_text))
            sent_text += len(chunk.text)
            if chunk.finished:
                if job.include_usage:
                    yield _sse(job.format.usage_chunk(chunk.prompt_tokens, chunk.output_tokens))
                break
            chunk = await anext(chunks)
    except Exception as err:  # noqa: BLE001  the engine failed mid-stream: the status is sent, so say it in the stream
        yield _sse(engine_error(err).body())
    finally:
        await chunks.aclose()
        _finished(ctx, job, timeline)
    yield "data: [DONE]\n\n"


def _finished(ctx: ServingContext, job: Job, timeline: Timeline) -> None:
    ctx.metrics.observe(timeline.finished(job.params.max_new_tokens))
    ctx.note_fallbacks()
