"""A tiny OpenAI-compatible streaming server for the bench client's tests: 127.0.0.1, a free port, a thread.

It streams a fixed script of chunks (tokens per chunk, a delay before each) for every request to
/v1/completions and /v1/chat/completions, then the usage chunk and [DONE]; it notes when each request arrived,
its body and headers, and the peak number of requests in flight. `fail_every` answers every n-th request with
HTTP 503 (OpenAI's error JSON). A plain ASGI app under uvicorn: no FastAPI needed.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field

import uvicorn

MODEL = "fake-model"


@dataclass
class Script:
    tokens: tuple[int, ...] = (1, 3, 2)  # tokens of each streamed chunk
    delays_s: tuple[float, ...] = (0.05, 0.03, 0.03)  # before each chunk (the first: the "prefill")
    token_ids: bool = True  # send vLLM's per-choice token_ids (else the client must count 1 per chunk)
    usage: bool = True
    fail_every: int = 0  # 0: never; n: requests n, 2n, ... get HTTP 503


@dataclass
class Seen:
    arrivals_s: list[float] = field(default_factory=list)  # time.perf_counter() when each request arrived
    bodies: list[dict] = field(default_factory=list)
    headers: list[dict] = field(default_factory=list)
    in_flight: int = 0
    peak_in_flight: int = 0


def _sse(payload: dict | str) -> bytes:
    return f"data: {payload if isinstance(payload, str) else json.dumps(payload)}\n\n".encode()


class FakeOpenAI:
    def __init__(self, script: Script | None = None):
        self.script = script or Script()
        self.seen = Seen()

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while (message := await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if scope["path"] == "/v1/models":
            await self._json(send, 200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        seen = self.seen
        seen.arrivals_s.append(time.perf_counter())
        seen.bodies.append(json.loads(body))
        seen.headers.append({k.decode(): v.decode() for k, v in scope["headers"]})
        n = len(seen.arrivals_s)
        if self.script.fail_every and n % self.script.fail_every == 0:
            await self._json(send, 503, {"error": {"message": "overloaded, try later", "type": "server_error"}})
            return
        seen.in_flight += 1
        seen.peak_in_flight = max(seen.peak_in_flight, seen.in_flight)
        try:
            await self._stream(send, scope["path"].endswith("/chat/completions"))
        finally:
            seen.in_flight -= 1

    async def _stream(self, send, chat: bool) -> None:
        s = self.script
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        for i, (tokens, delay) in enumerate(zip(s.tokens, s.delays_s, strict=True)):
            await asyncio.sleep(delay)
            text = "".join(f" t{i}.{j}" for j in range(tokens))
            choice = {"index": 0, "delta": {"content": text}} if chat else {"index": 0, "text": text}
            choice["finish_reason"] = "length" if i == len(s.tokens) - 1 else None
            if s.token_ids:
                choice["token_ids"] = list(range(tokens))
            await send({"type": "http.response.body", "body": _sse({"choices": [choice]}), "more_body": True})
        if s.usage:
            usage = {"prompt_tokens": 4, "completion_tokens": sum(s.tokens), "total_tokens": 4 + sum(s.tokens)}
            await send({"type": "http.response.body", "body": _sse({"choices": [], "usage": usage}), "more_body": True})
        await send({"type": "http.response.body", "body": _sse("[DONE]"), "more_body": False})

    @staticmethod
    async def _json(send, status: int, payload: dict) -> None:
        await send(
            {"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]}
        )
        await send({"type": "http.response.body", "body": json.dumps(payload).encode()})


class Running:
    """The app served by uvicorn in a daemon thread on 127.0.0.1 at a free port, until stop()."""

    def __init__(self, app: FakeOpenAI):
        config = uvicorn.Config(
            app, host="127.0.0.1", port=0, log_level="warning", lifespan="on", timeout_graceful_shutdown=2
        )
        self.app = app
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> Running:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the fake OpenAI server did not start")
            time.sleep(0.01)
        return self

    @property
    def url(self) -> str:
        port = self.server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/v1"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
