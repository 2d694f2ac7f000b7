"""A bounded soak of an OpenAI-compatible server: mixed streamed and whole requests, clients that leave mid-stream,
bad requests, and a fault injected partway (e.g. a killed SSD draft worker), for a fixed time on loopback.

First each prompt is sent alone (greedy, `ignore_eos`, a fixed max_tokens): its *solo* output. Then `concurrency`
users send requests until the duration is up, each choosing what to send from a seeded numpy Generator:
- a streamed or a whole completion of prompt i, whose tokens must equal prompt i's solo output;
- a stream the client leaves after a few chunks, whose tokens so far must be a prefix of the solo output;
- a bad request, which must get its own 4xx status in OpenAI's error shape.
A request that gets no complete answer (connection error, a stream without its end) is *lost*; one still open
after `timeout_s` is *hung*. At the end the server must be healthy with no request left running. The server's
resident memory is read (a callable: the server may be another process) after the solo pass and at the end.
No torch is imported: the server is the caller's.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from enum import Enum
from statistics import median

import httpx
import numpy as np

from saguaro.tables import format_table

MAX_DURATION_S = 600.0
HEALTH_WAIT_S = 30.0
RSS_EVERY_S = 1.0
SETTLE_S = 15.0  # after the fault, the fallback loads what it needs (SD: the draft's weights in the server)


class Kind(str, Enum):
    STREAM = "stream"
    WHOLE = "whole"
    LEAVE = "leave mid-stream"
    BAD = "bad request"


class Outcome(str, Enum):
    OK = "ok"  # tokens equal the solo output (a stream left early: a prefix of it)
    REFUSED = "refused as expected"  # a bad request got its 4xx
    BUSY = "503"  # the server was full (counted, not a failure: it answered)
    MISMATCH = "tokens differ from solo"
    UNEXPECTED = "unexpected status"
    LOST = "lost"
    HUNG = "hung"


FAILURES = (Outcome.MISMATCH, Outcome.UNEXPECTED, Outcome.LOST, Outcome.HUNG)


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
        BadRequest("tools", 400, json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}],
                                             "tools": [{"type": "function"}]}).encode(), "/v1/chat/completions"),
    ]


@dataclass(frozen=True)
class SoakConfig:
    url: str  # the server's base URL, http://127.0.0.1:PORT (loopback only)
    model: str
    prompts: tuple[str | tuple[int, ...], ...]  # text or token ids, sent to /v1/completions
    duration_s: float = 60.0
    concurrency: int = 4
    max_tokens: int = 24
    seed: int = 0
    shares: tuple[float, float, float, float] = (0.45, 0.3, 0.15, 0.1)  # stream, whole, leave mid-stream, bad
    fault_at_s: float | None = None  # when to call the fault (seconds into the load)
    timeout_s: float = 120.0  # per request

    def __post_init__(self) -> None:
        host = self.url.removeprefix("http://").split(":")[0].split("/")[0]
        if host not in ("127.0.0.1", "localhost", "[::1]"):
            raise ValueError(f"the soak talks to loopback only: give http://127.0.0.1:PORT, got {self.url!r}")
        if not 0 < self.duration_s <= MAX_DURATION_S:
            raise ValueError(f"duration must be in (0, {MAX_DURATION_S:g}] seconds, got {self.duration_s}")
        if not self.prompts or self.concurrency < 1 or self.max_tokens < 1:
            raise ValueError("give at least one prompt, concurrency >= 1 and max_tokens >= 1")
        if len(self.shares) != len(Kind) or abs(sum(self.shares) - 1) > 1e-9 or min(self.shares) < 0:
            raise ValueError(f"shares must be {len(Kind)} non-negative numbers summing to 1, got {self.shares}")


@dataclass
class Sent:
    """One request of the soak."""

    kind: Kind
    prompt: int | None  # index into the prompts (bad requests: None)
    outcome: Outcome
    started_s: float  # after the load's start
    ttft_s: float | None = None
    status: int | None = None
    detail: str = ""


@dataclass
class SoakResult:
    config: SoakConfig
    solo: list[list[int]]
    requests: list[Sent] = field(default_factory=list)
    rss_after_warmup: int | None = None
    rss_end: int | None = None
    rss_samples: list[tuple[float, int]] = field(default_factory=list)  # (seconds into the load, bytes)
    fault_s: float | None = None  # when the fault was injected (None: no fault)
    healthy_at_end: bool = False
    running_at_end: float | None = None  # saguaro:num_requests_running (None: not read)

    @property
    def failures(self) -> int:
        return sum(r.outcome in FAILURES for r in self.requests)

    @property
    def passed(self) -> bool:
        return self.failures == 0 and self.healthy_at_end and not self.running_at_end

    def rss_around_fault(self) -> tuple[int | None, int | None]:
        """The server's RSS just before the fault, and once SETTLE_S have passed after it (None: no fault or no
        sample): the growth before and after those two is what the load itself adds, the step between them is
        the fallback's."""
        if self.fault_s is None:
            return None, None
        before = [rss for t, rss in self.rss_samples if t < self.fault_s]
        after = [rss for t, rss in self.rss_samples if t >= self.fault_s + SETTLE_S]
        return (before[-1] if before else None), (after[0] if after else None)

    def summary(self) -> dict:
        outcomes = Counter(r.outcome.value for r in self.requests)
        kinds = Counter(r.kind.value for r in self.requests)
        ttfts = sorted(r.ttft_s for r in self.requests if r.ttft_s is not None and r.outcome is Outcome.OK)
        before, after = self.rss_around_fault()
        return {
            "duration_s": self.config.duration_s, "concurrency": self.config.concurrency,
            "requests": len(self.requests), "by_kind": dict(kinds), "outcomes": dict(outcomes),
            "failures": self.failures, "fault_s": self.fault_s, "healthy_at_end": self.healthy_at_end,
            "running_at_end": self.running_at_end,
            "rss_after_warmup_mib": _mib(self.rss_after_warmup), "rss_before_fault_mib": _mib(before),
            "rss_after_fault_mib": _mib(after), "rss_end_mib": _mib(self.rss_end),
            "rss_growth_before_fault": _growth(self.rss_after_warmup, before),
            "rss_growth_after_fault": _growth(after, self.rss_end),
            "rss_growth": _growth(self.rss_after_warmup, self.rss_end),
            "p50_ttft_ms": 1e3 * median(ttfts) if ttfts else None,
            "p99_ttft_ms": 1e3 * float(np.percentile(ttfts, 99)) if ttfts else None,
            "passed": self.passed,
        }


def markdown(summary: dict) -> str:
    """The soak's table: one row per kind of request, then the totals and the server's memory."""
    rows = [{"what": f"requests: {kind}", "value": n} for kind, n in sorted(summary["by_kind"].items())]
    rows += [{"what": f"outcome: {outcome}", "value": n} for outcome, n in sorted(summary["outcomes"].items())]

    def number(value, unit="", digits=1):
        return "n/a" if value is None else f"{value:.{digits}f}{unit}"

    def percent(value):
        return number(None if value is None else 100 * value, " %", 2)

    rows += [
        {"what": "requests in all", "value": summary["requests"]},
        {"what": "failures (lost, hung, mismatched, unexpected status)", "value": summary["failures"]},
        {"what": "draft worker killed at", "value": number(summary["fault_s"], " s")},
        {"what": "healthy, no request running at the end", "value":
            "yes" if summary["healthy_at_end"] and not summary["running_at_end"] else "no"},
        {"what": "server RSS after warm-up", "value": number(summary["rss_after_warmup_mib"], " MiB")},
        {"what": "server RSS just before the fault", "value": number(summary["rss_before_fault_mib"], " MiB")},
        {"what": f"server RSS {SETTLE_S:g} s after the fault", "value": number(summary["rss_after_fault_mib"], " MiB")},
        {"what": "server RSS at the end", "value": number(summary["rss_end_mib"], " MiB")},
        {"what": "RSS growth, warm-up to the fault", "value": percent(summary["rss_growth_before_fault"])},
        {"what": "RSS growth, after the fault to the end", "value": percent(summary["rss_growth_after_fault"])},
        {"what": "RSS growth, warm-up to the end", "value": percent(summary["rss_growth"])},
        {"what": "TTFT p50 (streams)", "value": number(summary["p50_ttft_ms"], " ms", 0)},
        {"what": "TTFT p99 (streams)", "value": number(summary["p99_ttft_ms"], " ms", 0)},
    ]
    return format_table(rows, ["what", "value"], markdown=True) + "\n"


def _mib(rss: int | None) -> float | None:
    return None if rss is None else rss / 2**20


def _growth(first: int | None, last: int | None) -> float | None:
    return last / first - 1 if first and last else None


def _tokens(event: dict) -> list[int]:
    choices = event.get("choices") or []
    return list(choices[0].get("token_ids") or []) if choices else []


class Soak:
    """Runs a SoakConfig. `fault` is called once at `fault_at_s`; `rss` returns the server's resident bytes."""

    def __init__(self, config: SoakConfig, *, fault: Callable[[], None] | None = None,
                 rss: Callable[[], int | None] | None = None):
        self.config = config
        self.fault = fault
        self.rss = rss or (lambda: None)
        self.bad = bad_requests(config.model)

    def _body(self, prompt: int, stream: bool) -> dict:
        p = self.config.prompts[prompt]
        return {"model": self.config.model, "prompt": p if isinstance(p, str) else list(p),
                "max_tokens": self.config.max_tokens, "temperature": 0, "ignore_eos": True, "stream": stream}

    async def _solo(self, client: httpx.AsyncClient) -> list[list[int]]:
        solo = []
        for i in range(len(self.config.prompts)):
            response = await client.post("/v1/completions", json=self._body(i, False))
            response.raise_for_status()
            solo.append(response.json()["choices"][0]["token_ids"])
        return solo

    async def _stream(self, client: httpx.AsyncClient, sent: Sent, solo: list[int], leave_after: int | None,
                      t0: float) -> None:
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

    async def _one(self, client: httpx.AsyncClient, rng: np.random.Generator, solo: list[list[int]],
                   start: float) -> Sent:
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

    async def _user(self, client: httpx.AsyncClient, user: int, solo: list[list[int]], start: float,
                    end: float, out: list[Sent]) -> None:
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
            result.rss_after_warmup = self.rss()
            start = time.perf_counter()
            tasks = [asyncio.create_task(self._user(client, u, result.solo, start, start + c.duration_s,
                                                    result.requests)) for u in range(c.concurrency)]
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
    values = [float(line.rsplit(" ", 1)[1]) for line in exposition.splitlines()
              if line.startswith(name + "{") or line.startswith(name + " ")]
    return sum(values) if values else None


def write(result: SoakResult, out_dir) -> dict:
    """soak.json (summary, config, every request) and soak.md (the table) into out_dir."""
    from pathlib import Path

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    summary = result.summary()
    requests = [{**asdict(r), "kind": r.kind.value, "outcome": r.outcome.value} for r in result.requests]
    (out / "soak.json").write_text(json.dumps({"summary": summary, "config": asdict(result.config),
                                               "requests": requests}, indent=1) + "\n")
    (out / "soak.md").write_text(markdown(summary))
    return summary
