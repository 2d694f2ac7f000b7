"""`saguaro bench --url`: load points against an OpenAI-compatible server, into a run folder.

Each point (a rate or a concurrency, in the order given) sends its requests, then its request lines are
appended to requests.jsonl and its summary written as point-<load>-<value>.json; summary.json/.md list every
point at the end. Everything is bounded: a timeout per request, and a deadline for the whole run after which
nothing is sent and what is in flight is cut (recorded as an error). No torch is imported.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import numpy as np

from saguaro.bench.client import ENDPOINTS, Call, Streamed, payload, served_model, stream
from saguaro.bench.client_config import ClientConfig, Load, Point, rate_json
from saguaro.bench.environment import environment
from saguaro.bench.load import InFlight, Sent, closed_loop, open_loop, poisson_offsets_s
from saguaro.bench.prompts import Prompt, load_prompts
from saguaro.bench.runfolder import RunDir
from saguaro.formatting import format_table
from saguaro.reporting.analysis.serving import point_summary

log = logging.getLogger(__name__)
COLUMNS = [
    "point",
    "completed",
    "failed",
    "not_sent",
    "requests_per_s",
    "output_tokens_per_s",
    "median_ttft_ms",
    "p99_ttft_ms",
    "median_tpot_ms",
    "p99_tpot_ms",
    "median_itl_ms",
    "p99_itl_ms",
]
SECRET_FLAGS = ("--api-key",)


@dataclass
class ClientOutcome:
    run_dir: RunDir
    points: list[dict] = field(default_factory=list)  # one summary per load point
    summary: dict = field(default_factory=dict)


def redacted(argv: list[str]) -> list[str]:
    """argv with the value of every secret flag replaced (run folders are shared; keys are not)."""
    out, hide = [], False
    for arg in argv:
        flag, eq, _ = arg.partition("=")
        if hide:
            out.append("***")
        elif eq and flag in SECRET_FLAGS:
            out.append(f"{flag}=***")
        else:
            out.append(arg)
        hide = arg in SECRET_FLAGS
    return out


def _line(point: Point, sent: Sent, prompt: Prompt, t0: float) -> dict:
    """One request's line in requests.jsonl; times in seconds after the point's start."""
    r = sent.record
    lat = r.latency()
    return {
        "point": point.name,
        "rate": rate_json(point.rate_per_s),
        "concurrency": point.concurrency,
        "index": sent.index,
        "prompt_id": prompt.id,
        "category": prompt.category,
        "task": prompt.task,
        "scheduled_s": sent.scheduled_s,
        "sent_s": r.sent_s - t0,
        "done_s": r.done_s - t0,
        "chunk_times_s": [t - t0 for t in r.chunk_times_s],
        "chunk_tokens": r.chunk_tokens,
        "token_counts": r.token_counts,
        "prompt_tokens": r.prompt_tokens,
        "new_tokens": r.output_tokens,
        "ttft_s": lat.ttft_s if lat else None,
        "tpot_s": lat.tpot_s if lat else None,
        "itl_s": list(lat.itl_s) if lat else [],
        "e2el_s": lat.e2el_s if lat else None,
        "chunks": len(r.chunk_times_s),
        "text": r.text,
        "finish_reason": r.finish_reason,
        "status": r.status,
        "error": r.error,
    }


class ClientBench:
    """Runs a ClientConfig against its server; `api_key` is sent as a bearer token and never saved."""

    def __init__(
        self, config: ClientConfig, run_dir: RunDir, prompts: list[Prompt], model: str, api_key: str | None = None
    ):
        self.config, self.run_dir, self.prompts, self.model = config, run_dir, prompts, model
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else None

    def prompt(self, index: int) -> Prompt:
        """The prompt of a point's request `index`: the ones after the warm-up's, cycled."""
        return self.prompts[(self.config.warmup + index) % len(self.prompts)]

    def _call(self, index: int, prompt: Prompt | None = None) -> Call:
        c = self.config
        prompt = self.prompt(index) if prompt is None else prompt
        return Call(prompt.content, c.max_new_tokens, c.temperature, c.seed + index, c.ignore_eos, c.system_prompt)

    async def _warmup(self, client: httpx.AsyncClient, deadline_s: float) -> None:
        """The warm-up requests, one at a time, with the set's first prompts; nothing of them is recorded."""
        c = self.config
        url = c.url + ENDPOINTS[c.endpoint]
        for i in range(c.warmup):
            call = self._call(i, self.prompts[i % len(self.prompts)])
            record = await stream(
                client, url, payload(c.endpoint, self.model, call), c.timeout_s, deadline_s, self._headers
            )
            if record.error is not None:
                log.warning("warm-up request %d failed: %s", i, record.error)

    async def _point(self, client: httpx.AsyncClient, point: Point, deadline_s: float) -> tuple[list[Sent], float, int]:
        """The requests sent at this point, the point's start (perf_counter) and the peak in flight."""
        c = self.config
        url = c.url + ENDPOINTS[c.endpoint]

        async def send(index: int) -> Streamed:
            return await stream(
                client, url, payload(c.endpoint, self.model, self._call(index)), c.timeout_s, deadline_s, self._headers
            )

        counted = InFlight(send)
        t0 = time.perf_counter()
        if point.load is Load.RATE:
            offsets = poisson_offsets_s(c.num_prompts, point.value, np.random.default_rng(c.seed))
            sent = await open_loop(counted, offsets, deadline_s)
        else:
            sent = await closed_loop(counted, c.num_prompts, int(point.value), deadline_s)
        log.info("%s: %d sent, peak %d in flight", point.name, len(sent), counted.peak)
        return sent, t0, counted.peak

    async def _run(self, on_point: Callable[[dict], None] | None) -> tuple[list[dict], list[str]]:
        """Summaries of the points run, and the names of those the deadline left out."""
        c = self.config
        deadline_s = time.perf_counter() + c.deadline_s
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)  # open loop: never queue here
        summaries, points = [], c.points()
        async with httpx.AsyncClient(timeout=httpx.Timeout(c.timeout_s), limits=limits) as client:
            await self._warmup(client, deadline_s)
            for n, point in enumerate(points):
                if time.perf_counter() >= deadline_s:
                    log.warning("deadline reached: %s and later points not run", point.name)
                    return summaries, [p.name for p in points[n:]]
                sent, t0, peak = await self._point(client, point, deadline_s)
                lines = [_line(point, s, self.prompt(s.index), t0) for s in sent]
                self.run_dir.append_requests(lines)
                summary = {
                    **point_summary({**c.to_dict(), "model": self.model}, point.name, lines, c.num_prompts),
                    "rate": rate_json(point.rate_per_s),
                    "concurrency": point.concurrency,
                    "peak_in_flight": peak,
                }
                self.run_dir.write_point(point.load.value, point.value, summary)
                summaries.append(summary)
                if on_point is not None:
                    on_point(summary)
        return summaries, []

    def run(self, on_point: Callable[[dict], None] | None = None) -> ClientOutcome:
        points, not_run = asyncio.run(self._run(on_point))
        summary = {
            "run": self.run_dir.path.name,
            "kind": self.config.kind,
            "label": self.config.label,
            "url": self.config.url,
            "model": self.model,
            "points": points,
            "not_run": not_run,
        }
        self.run_dir.write_summary(summary, markdown(summary))
        return ClientOutcome(self.run_dir, points, summary)


def markdown(summary: dict) -> str:
    label = f" ({summary['label']})" if summary.get("label") else ""
    lines = [
        f"# Client bench {summary['run']}{label}",
        "",
        f"Model `{summary['model']}` served at {summary['url']}.",
        "",
        format_table(summary["points"], COLUMNS, markdown=True),
        "",
    ]
    if summary["not_run"]:
        lines += [f"Not run (the --deadline passed first): {', '.join(summary['not_run'])}.", ""]
    return "\n".join(lines)


def start_client(
    config: ClientConfig, out: str | Path, name: str | None = None, api_key: str | None = None
) -> ClientBench:
    """A ClientBench writing into a new run folder under `out` (the model asked of the server if not given)."""
    prompts = load_prompts(
        config.prompts, config.warmup + config.num_prompts, list(config.categories) or None, config.prompt_order
    )
    if config.endpoint == "chat" and any(p.text is None for p in prompts):
        raise ValueError("the chat endpoint takes text prompts: use --endpoint completions for token-id prompts")
    model = config.model
    if model is None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        model = asyncio.run(_ask_model(config.url, headers, min(config.timeout_s, 30.0)))
    env = environment(None)
    env["argv"] = redacted(env["argv"])
    stem = name or f"{config.label or 'client'}-{config.prompts.rsplit('/', 1)[-1]}"
    config_dict = {**config.to_dict(), "model": model}
    run_dir = RunDir.create(out, stem, config_dict, env)
    run_dir.write_prompts(prompts)  # the warm-up's first, then the points'; requests.jsonl names each by id
    return ClientBench(config, run_dir, prompts, model, api_key)


async def _ask_model(url: str, headers: dict | None, timeout_s: float) -> str:
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout_s)) as client:
        return await served_model(client, url, headers)
