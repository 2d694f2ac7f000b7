"""OpenAI response bodies: streamed chunks and whole responses, for completions and chat completions.

Each choice also carries `token_ids` (vLLM's extension): in a streamed chunk the tokens of that
chunk, so a client can count tokens per chunk without a tokenizer; in a whole response all of them.
Every body carries OpenAI's `system_fingerprint`; the final one (the whole response, or a stream's finishing
chunk and its usage chunk) also says whether the seed gives this text again: `reproducible` and
`unreproducible_reason` (server.reproducibility).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from server.engine_api import Chunk, TokenLogprob
from server.reproducibility import Reproducibility
from server.token_bytes import TokenStrings

NEG_INF_LOGPROB = -9999.0  # JSON has no -inf; OpenAI and vLLM send this for an impossible token


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def json_logprob(value: float) -> float:
    return value if math.isfinite(value) else NEG_INF_LOGPROB


@dataclass(frozen=True)
class Head:
    """What the bodies of one response repeat: every body the id, time, model and fingerprint; the final body
    also `reproducibility.fields()`."""

    id: str
    created: int  # unix seconds
    model: str
    reproducibility: Reproducibility

    def body(self, kind: str, choices: list[dict], final: bool) -> dict:
        body = {
            "id": self.id,
            "object": kind,
            "created": self.created,
            "model": self.model,
            "system_fingerprint": self.reproducibility.system_fingerprint,
            "choices": choices,
        }
        return {**body, **self.reproducibility.fields()} if final else body


class ResponseFormat(Protocol):
    """How one endpoint shapes its streamed chunks and its whole response.

    text_offset: characters of the completion sent before this chunk (completions' logprobs need it).
    """

    def chunk(self, chunk: Chunk, first: bool, text_offset: int) -> dict: ...

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> dict: ...

    def response(
        self,
        text: str,
        token_ids: list[int],
        logprobs: Sequence[TokenLogprob] | None,
        finish_reason: str | None,
        prompt_tokens: int,
        completion_tokens: int,
    ) -> dict: ...


@dataclass(frozen=True)
class CompletionFormat:
    """/v1/completions: `text_completion` objects, logprobs as parallel lists."""

    head: Head
    tokens: TokenStrings
    include_usage: bool = False

    def _logprobs(self, logprobs: Sequence[TokenLogprob] | None, text_offset: int = 0) -> dict | None:
        if logprobs is None:
            return None
        tokens = [self.tokens.text(lp.token_id) for lp in logprobs]
        offsets = []
        for token in tokens:
            offsets.append(text_offset)
            text_offset += len(token)
        return {
            "tokens": tokens,
            "token_logprobs": [json_logprob(lp.logprob) for lp in logprobs],
            "top_logprobs": [{self.tokens.text(t): json_logprob(v) for t, v in lp.top} for lp in logprobs],
            "text_offset": offsets,
        }

    def chunk(self, chunk: Chunk, first: bool, text_offset: int) -> dict:
        body = self.head.body(
            "text_completion",
            [
                {
                    "index": 0,
                    "text": chunk.text,
                    "logprobs": self._logprobs(chunk.logprobs, text_offset),
                    "finish_reason": chunk.finish_reason if chunk.finished else None,
                    "token_ids": list(chunk.token_ids),
                }
            ],
            final=chunk.finished,
        )
        if self.include_usage:
            body["usage"] = None  # OpenAI's shape: only the last, choice-less chunk carries usage
        return body

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> dict:
        return {**self.head.body("text_completion", [], final=True), "usage": usage(prompt_tokens, completion_tokens)}

    def response(self, text, token_ids, logprobs, finish_reason, prompt_tokens, completion_tokens) -> dict:
        choice = {
            "index": 0,
            "text": text,
            "logprobs": self._logprobs(logprobs),
            "finish_reason": finish_reason,
            "token_ids": token_ids,
        }
        return {
            **self.head.body("text_completion", [choice], final=True),
            "usage": usage(prompt_tokens, completion_tokens),
        }


@dataclass(frozen=True)
class ChatFormat:
    """/v1/chat/completions: `chat.completion(.chunk)` objects, logprobs as a list of entries."""

    head: Head
    tokens: TokenStrings
    include_usage: bool = False

    def _entry(self, token_id: int, logprob: float) -> dict:
        # `bytes` are the token's own: a token holding part of a character gives that part, not U+FFFD
        return {
            "token": self.tokens.text(token_id),
            "logprob": json_logprob(logprob),
            "bytes": list(self.tokens.raw(token_id)),
        }

    def _logprobs(self, logprobs: Sequence[TokenLogprob] | None) -> dict | None:
        if logprobs is None:
            return None
        return {
            "content": [
                {**self._entry(lp.token_id, lp.logprob), "top_logprobs": [self._entry(t, v) for t, v in lp.top]}
                for lp in logprobs
            ]
        }

    def chunk(self, chunk: Chunk, first: bool, text_offset: int) -> dict:
        # The role rides on the first chunk with content, so that every chunk carries tokens.
        delta = {"role": "assistant", "content": chunk.text} if first else {"content": chunk.text}
        body = self.head.body(
            "chat.completion.chunk",
            [
                {
                    "index": 0,
                    "delta": delta,
                    "logprobs": self._logprobs(chunk.logprobs),
                    "finish_reason": chunk.finish_reason if chunk.finished else None,
                    "token_ids": list(chunk.token_ids),
                }
            ],
            final=chunk.finished,
        )
        if self.include_usage:
            body["usage"] = None
        return body

    def usage_chunk(self, prompt_tokens: int, completion_tokens: int) -> dict:
        return {
            **self.head.body("chat.completion.chunk", [], final=True),
            "usage": usage(prompt_tokens, completion_tokens),
        }

    def response(self, text, token_ids, logprobs, finish_reason, prompt_tokens, completion_tokens) -> dict:
        choice = {
            "index": 0,
            "message": {"role": "assistant", "content": text},
            "logprobs": self._logprobs(logprobs),
            "finish_reason": finish_reason,
            "token_ids": token_ids,
        }
        return {
            **self.head.body("chat.completion", [choice], final=True),
            "usage": usage(prompt_tokens, completion_tokens),
        }
