"""One streamed request to an OpenAI-compatible server, timed chunk by chunk (httpx, server-sent events).

The request asks for `stream: true` with `stream_options.include_usage`, so the last event carries the token
totals. Each event whose choice carries text (or token ids) is one *chunk*: its arrival time is recorded, and
its token count is the length of the choice's `token_ids` when the server sends them (vLLM's extension, which
`saguaro serve` follows), else 1. The output length is usage.completion_tokens when reported, else the sum of
the chunk counts. Latency then follows theory.latency from the time the request was sent.

A failed request (HTTP status, a broken stream, a timeout, a refused connection) is returned with its error,
never raised: one failure does not stop a load test.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import dataclass, field, replace

import httpx

from theory.latency import RequestLatency, request_latency, time_per_output_token

ENDPOINTS = {"completions": "/completions", "chat": "/chat/completions"}
ERROR_TEXT_CHARS = 300  # of an error response's body kept in the record


@dataclass(frozen=True)
class Call:
    """What to send: one prompt (text or token ids) and its sampling settings."""

    prompt: str | list[int]
    max_tokens: int
    temperature: float
    seed: int | None = None
    ignore_eos: bool = False
    system: str | None = None  # a system prompt: the chat's system message, or text put before a completions prompt


@dataclass
class Streamed:
    """One request as the client saw it. Times are time.perf_counter() readings (seconds)."""

    sent_s: float
    chunk_times_s: list[float] = field(default_factory=list)
    chunk_tokens: list[int] = field(default_factory=list)
    token_counts: str = "chunks"  # where chunk_tokens came from: "server" (token_ids) or "chunks" (1 per chunk)
    text: str = ""
    finish_reason: str | None = None
    prompt_tokens: int | None = None  # from usage
    completion_tokens: int | None = None  # from usage
    status: int | None = None  # HTTP status
    error: str | None = None
    done_s: float | None = None

    @property
    def output_tokens(self) -> int:
        return self.completion_tokens if self.completion_tokens is not None else sum(self.chunk_tokens)

    def latency(self) -> RequestLatency | None:
        """TTFT, TPOT, ITL and E2EL from the send time; None for a failed request or one with no token."""
        if self.error is not None or not self.chunk_times_s:
            return None
        measured = request_latency(self.sent_s, self.chunk_times_s, self.chunk_tokens)
        tokens = max(self.output_tokens, 1)
        if tokens == measured.output_tokens:
            return measured
        # the server's total disagrees with the chunk counts (no token_ids): TPOT over the reported tokens
        return replace(
            measured, tpot_s=time_per_output_token(measured.ttft_s, measured.e2el_s, tokens), output_tokens=tokens
        )


def payload(endpoint: str, model: str, call: Call) -> dict:
    """The JSON body of a streamed completions or chat completions request."""
    body: dict = {
        "model": model,
        "max_tokens": call.max_tokens,
        "temperature": call.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if call.system is not None and not isinstance(call.prompt, str):
        raise ValueError("a system prompt goes with text prompts: put it in the token ids instead")
    if endpoint == "chat":
        if not isinstance(call.prompt, str):
            raise ValueError("the chat endpoint takes text prompts: use --endpoint completions for token-id prompts")
        system = [] if call.system is None else [{"role": "system", "content": call.system}]
        body["messages"] = system + [{"role": "user", "content": call.prompt}]
    else:
        body["prompt"] = call.prompt if call.system is None else f"{call.system}\n\n{call.prompt}"
    if call.seed is not None:
        body["seed"] = call.seed
    if call.ignore_eos:
        body["ignore_eos"] = True
    return body


def _choice_content(choice: dict) -> tuple[str, list | None]:
    """(text, token ids or None) of one streamed choice, completions or chat."""
    text = choice.get("text")
    if text is None:
        text = (choice.get("delta") or {}).get("content")
    ids = choice.get("token_ids")
    return text or "", ids if isinstance(ids, list) else None


def note_event(record: Streamed, event: dict, now_s: float) -> None:
    """Record one SSE data event: a chunk if a choice carries output, usage and finish reason if present."""
    if event.get("error"):
        err = event["error"]
        record.error = f"stream error: {err.get('message', err) if isinstance(err, dict) else err}"
        return
    for choice in event.get("choices") or []:
        text, ids = _choice_content(choice)
        if text or ids:
            record.chunk_times_s.append(now_s)
            if ids is not None:
                record.token_counts = "server"
            record.chunk_tokens.append(len(ids) if ids else 1)
            record.text += text
        if choice.get("finish_reason"):
            record.finish_reason = choice["finish_reason"]
    usage = event.get("usage")
    if usage:
        record.prompt_tokens = usage.get("prompt_tokens")
        record.completion_tokens = usage.get("completion_tokens")


async def _read_stream(response: httpx.Response, record: Streamed) -> None:
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue  # blank separators, comments (':'), event names
        data = line[len("data:") :].strip()
        if data == "[DONE]":
            break
        now = time.perf_counter()
        try:
            event = json.loads(data)
        except json.JSONDecodeError:
            record.error = f"stream error: not JSON: {data[:ERROR_TEXT_CHARS]!r}"
            return
        note_event(record, event, now)
        if record.error is not None:
            return


async def stream(
    client: httpx.AsyncClient,
    url: str,
    body: dict,
    timeout_s: float,
    deadline_s: float = math.inf,
    headers: dict[str, str] | None = None,
) -> Streamed:
    """POST `body` to `url` and read its event stream to the end, within `timeout_s` in all and before the
    run's `deadline_s` (a time.perf_counter() reading)."""
    record = Streamed(sent_s=time.perf_counter())
    by_deadline = deadline_s - record.sent_s < timeout_s
    try:
        async with asyncio.timeout(min(timeout_s, max(0.0, deadline_s - record.sent_s))):
            async with client.stream("POST", url, json=body, headers=headers) as response:
                record.status = response.status_code
                if response.status_code != 200:
                    text = (await response.aread()).decode("utf-8", errors="replace")
                    record.error = f"HTTP {response.status_code}: {_error_message(text)}"
                else:
                    await _read_stream(response, record)
    except TimeoutError:
        record.error = (
            "deadline: the run's time was up before the answer was complete"
            if by_deadline
            else f"timeout: no complete answer within {timeout_s:g} s"
        )
    except httpx.HTTPError as err:
        record.error = f"{type(err).__name__}: {err}" if str(err) else type(err).__name__
    record.done_s = time.perf_counter()
    if record.error is None and not record.chunk_times_s:
        record.error = "the stream ended without a token"
    return record


def _error_message(text: str) -> str:
    """OpenAI's {"error": {"message": ...}} (or FastAPI's {"detail": ...}) if it is one, else the text."""
    try:
        body = json.loads(text)
    except json.JSONDecodeError:
        return text[:ERROR_TEXT_CHARS]
    if isinstance(body, dict):
        err = body.get("error", body.get("detail"))
        if isinstance(err, dict) and "message" in err:
            return str(err["message"])[:ERROR_TEXT_CHARS]
        if err is not None:
            return str(err)[:ERROR_TEXT_CHARS]
    return text[:ERROR_TEXT_CHARS]


async def served_model(client: httpx.AsyncClient, base_url: str, headers: dict[str, str] | None = None) -> str:
    """The first model the server lists at GET /models (for a run without --model)."""
    try:
        response = await client.get(f"{base_url}/models", headers=headers)
        response.raise_for_status()
        return response.json()["data"][0]["id"]
    except (httpx.HTTPError, KeyError, IndexError, TypeError, ValueError) as err:
        raise ValueError(
            f"cannot list the models at {base_url}/models ({type(err).__name__}: {err}): give --model NAME"
        ) from None
