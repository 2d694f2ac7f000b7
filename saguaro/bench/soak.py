"""A bounded soak of an OpenAI-compatible server: mixed streamed and whole requests, clients that leave mid-stream,
bad requests, and a fault injected partway (e.g. a killed SSD draft worker), for a fixed time on loopback.

First each prompt is sent alone (greedy, `ignore_eos`, a fixed max_tokens): its *solo* output. Then `concurrency`
users send requests until the duration is up, each choosing what to send from a seeded numpy Generator:
- a streamed or a whole completion of prompt i, whose tokens must equal prompt i's solo output;
- a stream the client leaves after a few chunks, whose tokens so far must be a prefix of the solo output;
- a bad request, which must get its own 4xx status in OpenAI's error shape.
A request that gets no complete answer (connection error, a stream without its end) is *lost*; one still open
after `timeout_s` is *hung*. At the end the server must be healthy with no request left running. The server's
resident memory is read (a callable: the server may be another process) after the solo pass, every second of
the load and at the end. What is recorded and reported is in saguaro.bench.soak_result. No torch is imported:
the server is the caller's.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from dataclasses import dataclass

import httpx
import numpy as np

from saguaro.bench.soak_result import Kind, Outcome, Sent, SoakConfig, SoakResult, markdown, write

__all__ = ["BadRequest", "Kind", "Outcome", "Soak", "SoakConfig", "SoakResult", "bad_requests", "markdown", "write"]

HEALTH_WAIT_S = 30.0
RSS_EVERY_S = 1.0


@dataclass(frozen=True)
class BadRequest:
    name: str
    status: int
    body: bytes
    path: str = "/v1/completions"


def bad_requests(model: str) -> list[BadRequest]:
    """Requests the server must refuse, each with the status it must answer."""

    def body(**fields) -> bytes:
        return json.dumps({"model": model, "prompt": "Hello", "max_tokens": 4, **fields}).encode()

    return [
        BadRequest("not JSON", 400, b"{not json"),
        BadRequest("n = 2", 400, body(n=2)),
        BadRequest("unknown model", 404, body(model="no-such-model")),
        BadRequest("structured output", 400, body(response_format={"type": "json_object"})),
        BadRequest("temperature a string", 400, body(temperature="hot")),
        BadRequest("over the context", 400, body(max_tokens=10**7)),
        BadRequest(
            "tools",
            400,
            json.dumps(
                {"model": model, "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}
            ).encode(),
            "/v1/chat/completions",
        ),
    ]


def _tokens(event: dict) -> list[int]:
    choices = event.get("choices") or []
    return list(choices[0].get("token_ids") or []) if choices else []


class Soak:
    """Runs a SoakConfig. `fault` is called once at `fault_at_s`; `rss` returns the server's resident bytes."""

    def __init__(
        self,
        config: SoakConfig,
        *,
        fault: Callable[[], None] | None = None,
        rss: Callable[[], int | None] | None = None,
    ):
        self.config = config
        self.fault = fault
        self.rss = rss or (lambda: None)
        self.bad = bad_requests(config.model)

    def _body(self, prompt: int, stream: bool) -> dict:
        p = self.config.prompts[prompt]
        return {
            "model": self.config.model,
            "prompt": p if isinstance(p, str) else list(p),
            "max_tokens": self.config.max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "stream": stream,
        }

    async def _solo(self, client: httpx.AsyncClient) -> list[list[int]]:
        solo = []
        for i in range(len(self.config.prompts)):
            response = await client.post("/v1/completions", json=self._body(i, False))
            response.raise_for_status()
            solo.append(response.json()["choices"][0]["token_ids"])
        return solo

    async def _stream(
        self, client: httpx.AsyncClient, sent: Sent, solo: list[int], leave_after: int | None, t0: float
    ) -> None:
        tokens, done = [], False
        async with client.stream("POST", "/v1/completions", json=self._body(sent.prompt, True)) as response:
            sent.status = response.status_code
            if response.status_code != 200:
                await response.aread()
                sent.outcome = Outcome.BUSY if response.status_code == 503 else Outcome.UNEXPECTED
                return
            chunks = 0
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line.removeprefix("data: ")
                if data == "[DONE]":
                    done = True
                    break
                event = json.loads(data)
                if "error" in event:
                    sent.outcome, sent.detail = Outcome.UNEXPECTED, str(event["error"].get("message"))
                    return
                new = _tokens(event)
                if new and sent.ttft_s is None:
                    sent.ttft_s = time.perf_counter() - t0
                tokens += new
                chunks += bool(new)
                if leave_after is not None and chunks >= leave_after:
                    break  # leaving the block closes the connection: the server must abort the request
        if leave_after is not None and not done:
            sent.outcome = Outcome.OK if tokens == solo[: len(tokens)] else Outcome.MISMATCH
        elif not done:
            sent.outcome = Outcome.LOST
        else:
            sent.outcome = Outcome.OK if tokens == solo else Outcome.MISMATCH

    async def _whole(self, client: httpx.AsyncClient, sent: Sent, solo: list[int]) -> None:
        response = await client.post("/v1/completions", json=self._body(sent.prompt, False))
        sent.status = response.status_code
        if response.status_code == 503:
            sent.outcome = Outcome.BUSY
        elif response.status_code != 200:
            sent.outcome, sent.detail = Outcome.UNEXPECTED, response.text[:200]
        else:
            sent.outcome = Outcome.OK if response.json()["choices"][0]["token_ids"] == solo else Outcome.MISMATCH

    async def _bad(self, client: httpx.AsyncClient, sent: Sent, bad: BadRequest) -> None:
        response = await client.post(bad.path, content=bad.body, headers={"content-type": "application/json"})
        sent.status, sent.detail = response.status_code, bad.name
        shaped = set(response.json().get("error", {})) >= {"message", "type", "param", "code"}
        sent.outcome = Outcome.REFUSED if response.status_code == bad.status and shaped else Outcome.UNEXPECTED

    async def _one(
        self, client: httpx.AsyncClient, rng: np.random.Generator, solo: list[list[int]], start: float
    ) -> Sent:
        kind = list(Kind)[int(rng.choice(len(Kind), p=self.config.shares))]
        prompt = int(rng.integers(len(self.config.prompts))) if kind is not Kind.BAD else None
        leave_after = int(rng.integers(1, 4)) if kind is Kind.LEAVE else None
        bad = self.bad[int(rng.integers(len(self.bad)))] if kind is Kind.BAD else None
        t0 = time.perf_counter()
        sent = Sent(kind, prompt, Outcome.LOST, t0 - start)
        try:
            async with asyncio.timeout(self.config.timeout_s):
                if kind is Kind.BAD:
                    await self._bad(client, sent, bad)
                elif kind is Kind.WHOLE:
                    await self._whole(client, sent, solo[prompt])
                else:
                    await self._stream(client, sent, solo[prompt], leave_after, t0)
        except TimeoutError:
            sent.outcome = Outcome.HUNG
        except (httpx.HTTPError, json.JSONDecodeError) as err:
            sent.outcome, sent.detail = Outcome.LOST, f"{type(err).__name__}: {err}"
        return sent

    async def _user(
        self, client: httpx.AsyncClient, user: int, solo: list[list[int]], start: float, end: float, out: list[Sent]
    ) -> None:
        rng = np.random.default_rng([self.config.seed, user])
        while time.perf_counter() < end:
            out.append(await self._one(client, rng, solo, start))

    async def _inject(self, start: float, result: SoakResult) -> None:
        await asyncio.sleep(self.config.fault_at_s)
        await asyncio.to_thread(self.fault)
        result.fault_s = time.perf_counter() - start

    async def _sample_rss(self, start: float, end: float, result: SoakResult) -> None:
        while time.perf_counter() < end:
            rss = await asyncio.to_thread(self.rss)
            if rss is not None:
                result.rss_samples.append((time.perf_counter() - start, rss))
            await asyncio.sleep(RSS_EVERY_S)

    async def _end_state(self, client: httpx.AsyncClient, result: SoakResult) -> None:
        """Healthy, with no request left running (aborted rows take a step or two to leave)."""
        deadline = time.perf_counter() + HEALTH_WAIT_S
        while time.perf_counter() < deadline:
            result.healthy_at_end = (await client.get("/health")).status_code == 200
            result.running_at_end = _gauge((await client.get("/metrics")).text, "saguaro:num_requests_running")
            if result.healthy_at_end and not result.running_at_end:
                return
            await asyncio.sleep(0.2)

    async def _run(self) -> SoakResult:
        c = self.config
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
        async with httpx.AsyncClient(base_url=c.url, timeout=httpx.Timeout(c.timeout_s), limits=limits) as client:
            result = SoakResult(c, await self._solo(client))
            result.rss_at_start = self.rss()
            start = time.perf_counter()
            tasks = [
                asyncio.create_task(self._user(client, u, result.solo, start, start + c.duration_s, result.requests))
                for u in range(c.concurrency)
            ]
            if self.fault is not None and c.fault_at_s is not None and c.fault_at_s < c.duration_s:
                tasks.append(asyncio.create_task(self._inject(start, result)))
            tasks.append(asyncio.create_task(self._sample_rss(start, start + c.duration_s, result)))
            await asyncio.gather(*tasks)
            await self._end_state(client, result)
            result.rss_end = self.rss()
        return result

    def run(self) -> SoakResult:
        return asyncio.run(self._run())


def _gauge(exposition: str, name: str) -> float | None:
    """The sum of a gauge's samples in Prometheus text (None if absent)."""
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in exposition.splitlines()
        if line.startswith(name + "{") or line.startswith(name + " ")
    ]
    return sum(values) if values else None
