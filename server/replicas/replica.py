"""One engine replica as Ray Serve runs it: an `engine.LLM` behind its `AsyncLLM`, streaming chunks to the ingress.

The replica is built from a picklable `build()` that returns the LLM, so the same class serves a model named on
the command line and a tiny model made in memory. Every STATS_PERIOD_S it sends its engine counters to the ingress
(`Ingress.note_replica`), which exports them with a `replica` label: Ray Serve gives no public way to address one
replica of a deployment, so the replicas report rather than being polled.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from engine import LLM, AsyncLLM, Chunk, SamplingParams, ServingStats
from engine.config import EngineConfig
from server.replicas.loopback import keep_serve_on_loopback

log = logging.getLogger("server")

STATS_PERIOD_S = 1.0  # how often a replica sends its counters to the ingress


@dataclass(frozen=True)
class ModelFacts:
    """What the ingress needs of the served model to check and tokenize requests without loading its weights."""

    model_name: str
    tokenizer: Any  # a transformers tokenizer, or None for a bare model (token-id prompts only)
    vocab_size: int
    max_context: int | None
    lookahead: int  # context positions a request needs beyond prompt + max_tokens (SD/SSD: K + 1)
    strategy: str
    config: EngineConfig  # the settings that decide a seeded text (server.reproducibility)


@dataclass(frozen=True)
class EngineRequest:
    """One request for a replica; `prompt_ids` is also what the prefix-affinity router reads."""

    request_id: str
    prompt_ids: list[int]
    params: SamplingParams


@dataclass(frozen=True)
class ReplicaReport:
    """A replica's counters at one moment, sent to the ingress."""

    replica: str  # Ray Serve's replica id: a new one when Ray replaces a replica
    stats: ServingStats
    fault: str | None  # why SSD's draft worker was replaced, once it was


class EngineReplica:
    """The deployment class of the engine replicas (server.replicas.application makes it a Ray Serve deployment)."""

    async def __init__(self, build: Callable[[], LLM], max_waiting: int, ingress_name: str, app_name: str):
        from ray import serve

        keep_serve_on_loopback()
        self.llm = build()
        self.engine = AsyncLLM(self.llm, max_waiting=max_waiting)
        self.replica = serve.get_replica_context().replica_id.unique_id
        self._ingress_name, self._app_name = ingress_name, app_name
        self._reporter = asyncio.get_running_loop().create_task(self._report_forever())
        log.info(
            "replica %s (pid %d) serves %s with %s",
            self.replica,
            os.getpid(),
            self.llm.model_name,
            self.llm.strategy_in_use,
        )

    def facts(self) -> ModelFacts:
        llm = self.llm
        return ModelFacts(
            model_name=llm.model_name,
            tokenizer=llm.tokenizer,
            vocab_size=llm.vocab_size,
            max_context=llm.max_context,
            lookahead=llm.lookahead,
            strategy=llm.strategy_in_use,
            config=llm.config,
        )

    async def generate(self, request: EngineRequest) -> AsyncIterator[Chunk]:
        """The request's chunks as the engine emits them. Ray cancels this generator when the caller goes away:
        closing the engine's stream aborts the request and frees its row."""
        stream = self.engine.generate(request.prompt_ids, request.params, request.request_id)
        try:
            async for chunk in stream:
                yield chunk
        finally:
            await stream.aclose()

    def report(self) -> ReplicaReport:
        return ReplicaReport(self.replica, self.engine.stats(), self.llm.fault)

    async def _report_forever(self) -> None:
        from ray import serve

        ingress = serve.get_deployment_handle(self._ingress_name, app_name=self._app_name)
        while True:
            try:
                await ingress.note_replica.remote(self.report())
            except Exception as err:  # noqa: BLE001  the ingress is restarting or shutting down: try next period
                log.debug("replica %s could not report: %s", self.replica, err)
            await asyncio.sleep(STATS_PERIOD_S)

    def __del__(self) -> None:
        """Ray Serve's graceful shutdown: requests in flight have had their time (the ingress drained them)."""
        self._reporter.cancel()
        self.engine.shutdown(deadline_s=0.0)
