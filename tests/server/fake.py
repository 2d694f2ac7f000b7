"""A small stand-in for engine.LLM + engine.AsyncLLM, to test the HTTP layer in milliseconds.

Tokens are predictable: after a prompt ending in id t, the output is t+1, t+2, ... (mod VOCAB), two
tokens per chunk; token t reads as " w<t>". Words of a text prompt become ids by their length.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from engine import EngineStopped, QueueFull, SpeculativeConfig
from engine.config import EngineConfig
from engine.metrics import ServingStats
from engine.outputs import Chunk, TokenLogprob

VOCAB = 50
TOKENS_PER_CHUNK = 2


def word(token_id: int) -> str:
    return f" w{token_id}"


class FakeTokenizer:
    chat_template = "{role}: {content}"

    def decode(self, ids: list[int]) -> str:
        return "".join(word(t) for t in ids)


def fake_config(**speculative) -> EngineConfig:
    """The settings the fake model says it runs with: SSD with K = 4, or `speculative`'s (SpeculativeConfig's)."""
    return EngineConfig(
        target="fake-model",
        draft="fake-draft",
        strategy="ssd",
        dtype="float32",
        speculative=SpeculativeConfig(**{"K": 4, **speculative}),
    )


class FakeModel:
    model_name = "fake-model"
    max_context = 64
    strategy_in_use = "ssd"
    fault = None

    def __init__(
        self, tokenizer: FakeTokenizer | None = None, encode_s: float = 0.0, config: EngineConfig | None = None
    ):
        self.tokenizer = tokenizer if tokenizer is not None else FakeTokenizer()
        self.config = config if config is not None else fake_config()
        self.chats: list[list[dict]] = []
        self.encoded_chars: list[int] = []  # the length of every text encoded
        self.encode_s = encode_s  # how long encoding takes (a stand-in for a slow tokenizer)

    def room(self, prompt_ids: list[int]) -> int:
        return self.max_context - len(prompt_ids)

    def encode(self, text: str | list[int], chat: bool | None = None) -> list[int]:
        if isinstance(text, list):  # token ids: checked as the engine checks them
            if not text:
                raise ValueError("empty prompt: give at least one token id")
            if min(text) < 0 or max(text) >= VOCAB:
                raise ValueError(f"prompt token ids must be in [0, {VOCAB}), got {min(text)}..{max(text)}")
            return list(text)
        self.encoded_chars.append(len(text))
        time.sleep(self.encode_s)
        if not text.strip():
            raise ValueError("empty prompt: give some text (or token ids)")
        return [len(w) % VOCAB for w in text.split()]

    def encode_chat(self, messages: list[dict]) -> list[int]:
        self.chats.append(list(messages))
        return self.encode(" ".join(f"{m['role']}: {m['content']}" for m in messages))


@dataclass
class FakeEngine:
    """Records what it was asked; `refuse` makes the next generate() raise; `fail_after` breaks a stream."""

    delay_s: float = 0.0  # between chunks
    refuse: Exception | None = None
    fail_after: int | None = None  # chunks before the stream raises RuntimeError
    max_context: int = FakeModel.max_context
    requests: list[tuple[str, list[int], object]] = field(default_factory=list)
    aborted: list[str] = field(default_factory=list)
    stats_now: ServingStats = field(default_factory=lambda: ServingStats(strategy="ssd"))
    stopping: bool = False
    abort_all: bool = False
    shutdown_calls: list[float] = field(default_factory=list)

    def generate(self, prompt_ids: list[int], params, request_id: str):
        if self.stopping:
            raise EngineStopped("the engine is shutting down")
        if self.refuse is not None:
            err, self.refuse = self.refuse, None
            raise err
        if len(prompt_ids) + params.max_new_tokens > self.max_context:
            raise ValueError(
                f"prompt 0 has {len(prompt_ids)} tokens; with max_new_tokens={params.max_new_tokens} "
                f"it exceeds the model's context of {self.max_context}"
            )
        self.requests.append((request_id, list(prompt_ids), params))
        return self._chunks(prompt_ids, params, request_id)

    async def _chunks(self, prompt_ids, params, request_id):
        done, scheduled_s = False, time.perf_counter()
        self.stats_now.running += 1
        try:
            tokens, text, sent = [], "", 0
            next_id = prompt_ids[-1]
            while not done:
                await asyncio.sleep(self.delay_s)
                if self.fail_after is not None and sent == self.fail_after:
                    raise RuntimeError("the fake engine broke")
                ids = [
                    (next_id + 1 + i) % VOCAB for i in range(min(TOKENS_PER_CHUNK, params.max_new_tokens - len(tokens)))
                ]
                next_id = ids[-1]
                tokens += ids
                delta = "".join(word(t) for t in ids)
                reason = "length" if len(tokens) == params.max_new_tokens else None
                for stop in params.stop:
                    if stop in text + delta:
                        delta, reason = (text + delta).split(stop)[0][len(text) :], "stop"
                if self.abort_all:
                    ids, delta, reason = [], "", "abort"
                text += delta
                done = reason is not None
                logprobs = (
                    None
                    if params.logprobs is None
                    else [
                        TokenLogprob(
                            t,
                            float("-inf") if t % 2 else -0.5,
                            tuple((t + j, -1.0 - j) for j in range(params.logprobs)),
                        )
                        for t in ids
                    ]
                )
                sent += 1
                yield Chunk(
                    request_id=request_id,
                    index=0,
                    token_ids=ids,
                    text=delta,
                    logprobs=logprobs,
                    time_s=time.perf_counter(),
                    finished=done,
                    finish_reason=reason,
                    prompt_tokens=len(prompt_ids),
                    output_tokens=len(tokens),
                    scheduled_s=scheduled_s,
                )
        finally:
            self.stats_now.running -= 1
            if not done:
                self.aborted.append(request_id)

    def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)

    def stats(self) -> ServingStats:
        return self.stats_now

    def shutdown(self, deadline_s: float = 30.0) -> None:
        """Like AsyncLLM's: stop admitting, wait for running requests up to the deadline, abort the rest."""
        self.shutdown_calls.append(deadline_s)
        self.stopping = True
        end = time.monotonic() + deadline_s
        while self.stats_now.running and time.monotonic() < end:
            time.sleep(0.01)
        self.abort_all = True


def queue_full() -> QueueFull:
    return QueueFull("the engine's waiting queue is full (64 requests): retry later")  # the engine's wording
