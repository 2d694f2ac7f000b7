"""One request in flight: its prompt, settings, random stream, output so far, text and metrics."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.metrics import RequestMetrics
from engine.outputs import Chunk, RequestOutput, TokenLogprob
from engine.sampling_params import SamplingParams

REPLACEMENT = "\ufffd"  # what a tokenizer decodes an incomplete UTF-8 character to


@dataclass
class Sequence:
    seq_id: int  # unique within the engine (the draft worker's key)
    request_id: str
    index: int  # position in the caller's list of prompts
    prompt_ids: list[int]
    params: SamplingParams
    eos_ids: frozenset[int]
    seed: int  # the request's random stream (the target's; the draft's is derived from it)
    arrival_s: float  # time.perf_counter() when the request was submitted
    tokenizer: object | None = None
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None  # "stop", "length" or "abort"
    text: str = ""
    sent_chars: int = 0  # text already streamed
    cut_at_stop: bool = False  # the text was cut before a stop string
    metrics: RequestMetrics = field(init=False)
    generator: torch.Generator | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.metrics = RequestMetrics(prompt_tokens=len(self.prompt_ids), arrival_s=self.arrival_s)

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def append(self, tokens: list[int], logprobs: list[TokenLogprob] | None, now_s: float) -> Chunk | None:
        """Append a round's tokens, stopping at EOS, a stop token or string, or the token limit; return the
        chunk to stream (None if nothing was kept).

        Truncating a round's output keeps exactness: every kept token was distributed as the target
        would have sampled it, and AR would have stopped at the same place.
        """
        p, kept = self.params, 0
        for i, token in enumerate(tokens):
            if self.finished:
                break
            self.output_ids.append(token)
            if logprobs is not None and p.logprobs is not None:
                self.logprobs.append(logprobs[i])
            kept += 1
            if (p.stop_on_eos and token in self.eos_ids) or token in p.stop_token_ids:
                self.finish_reason = "stop"
            elif p.stop and len(self.output_ids) > p.min_tokens and self._cut_at_stop_string():
                self.finish_reason = "stop"
            elif len(self.output_ids) >= p.max_new_tokens:
                self.finish_reason = "length"
        if not kept:
            return None
        self.metrics.add_chunk(now_s, kept)
        return self._chunk(tokens[:kept], logprobs[:kept] if logprobs is not None and p.logprobs is not None else None,
                           now_s)

    def abort(self, now_s: float) -> Chunk:
        """End the request where it is (the client left or the engine stops); the final, empty chunk."""
        self.finish_reason = "abort"
        return self._chunk([], None, now_s)

    def _decode(self) -> str:
        return self.tokenizer.decode(self.output_ids, skip_special_tokens=True)

    def _cut_at_stop_string(self) -> bool:
        """True (and the text cut before it) once the output text contains a stop string."""
        text = self._decode()
        longest = max(len(s) for s in self.params.stop)
        start = max(0, len(self.text) - longest)  # a new match must end in the newest characters
        found = [i for i in (text.find(s, start) for s in self.params.stop) if i >= 0]
        self.text = text[: min(found)] if found else text
        self.cut_at_stop = bool(found)
        return self.cut_at_stop

    def _chunk(self, tokens: list[int], logprobs: list[TokenLogprob] | None, now_s: float) -> Chunk:
        delta = ""
        if self.tokenizer is not None:
            if not self.cut_at_stop and self.finish_reason != "abort":
                self.text = self._decode()
            end = len(self.text)
            if not self.finished:
                # Hold back an incomplete character, and a possible start of a stop string.
                if self.text.endswith(REPLACEMENT):
                    end = len(self.text.rstrip(REPLACEMENT))
                if self.params.stop:
                    end = min(end, len(self.text) - (max(len(s) for s in self.params.stop) - 1))
            end = max(end, self.sent_chars)
            delta, self.sent_chars = self.text[self.sent_chars : end], end
        return Chunk(self.request_id, self.index, list(tokens), delta, logprobs, now_s, self.finished,
                     self.finish_reason, len(self.prompt_ids), len(self.output_ids), self.metrics.scheduled_s)

    def output(self) -> RequestOutput:
        return RequestOutput(
            index=self.index, request_id=self.request_id, prompt_ids=self.prompt_ids, token_ids=list(self.output_ids),
            text=self.text if self.tokenizer is not None else None, finish_reason=self.finish_reason or "length",
            logprobs=list(self.logprobs) if self.params.logprobs is not None else None, metrics=self.metrics,
        )
