"""What the HTTP layer needs from the engine, as Protocols.

The server is written against these names only, so that its tests can drive it with a small fake
and `engine.AsyncLLM` / `engine.LLM` satisfy them as they are.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol


class TokenLogprob(Protocol):
    """One emitted token's log-probability under the target, and the target's top N."""

    token_id: int
    logprob: float  # -inf possible at temperature 0 (a token outside the argmax)
    top: Sequence[tuple[int, float]]


class Chunk(Protocol):
    """What one engine round emitted for one request."""

    token_ids: list[int]
    text: str  # text delta; stop strings already cut out
    logprobs: list[TokenLogprob] | None
    time_s: float  # time.perf_counter() when the round emitted it
    finished: bool
    finish_reason: str | None  # "stop" | "length" | "abort" | None
    prompt_tokens: int
    output_tokens: int  # cumulative
    scheduled_s: float | None  # time.perf_counter() when the request left the engine's waiting queue


class ServingStats(Protocol):
    """A snapshot of the engine's counters (cumulative since start) and gauges (engine.metrics.ServingStats)."""

    running: int
    waiting: int
    prompt_tokens: int
    generation_tokens: int
    rounds: int
    accepted: int
    drafts: int
    draft_tokens: int
    accepted_per_position: Sequence[int]
    ssd_lookups_by_k: Sequence[int]
    ssd_hits_by_k: Sequence[int]
    backup_s: float
    fallbacks: int
    cached_tokens: int
    cache_capacity_tokens: int | None
    strategy: str


class ServedModel(Protocol):
    """The synchronous engine (`engine.LLM`): tokenizer and model facts."""

    tokenizer: Any  # a transformers tokenizer, or None for a bare model (token-id prompts only)
    model_name: str
    max_context: int | None
    strategy_in_use: str
    fault: str | None  # why the SSD worker was replaced, once it was
    config: Any  # engine.EngineConfig: the settings that decide a seeded text (server.reproducibility)

    def encode(self, prompt: str | list[int], chat: bool = False) -> list[int]:
        """Token ids of a text prompt; token ids as given, once checked against the vocabulary (ValueError)."""

    def encode_chat(self, messages: Sequence[dict[str, str]]) -> list[int]: ...

    def room(self, prompt_ids: list[int]) -> int | None:
        """The most new tokens a request with this prompt may ask for (None: no known limit); for an empty
        prompt, the most tokens prompt + max_tokens may hold (the served max_model_len)."""


class ChunkStream(Protocol):
    """One request's chunks; closing it (or cancelling a pending step) before the end aborts the request."""

    def __aiter__(self) -> AsyncIterator[Chunk]: ...

    async def __anext__(self) -> Chunk: ...

    async def aclose(self) -> None: ...


class AsyncEngine(Protocol):
    """The engine's asynchronous front (`engine.AsyncLLM`).

    `generate` raises ValueError (bad request), QueueFull or EngineStopped when called or at the
    latest before the first chunk; EngineStopped raised *from* another exception is a failure.
    """

    def generate(self, prompt_ids: list[int], params: Any, request_id: str) -> ChunkStream: ...

    def abort(self, request_id: str) -> None: ...

    def stats(self) -> ServingStats: ...

    def shutdown(self, deadline_s: float = 30.0) -> None: ...
