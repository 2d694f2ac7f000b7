"""One request in flight: its prompt, settings, seed, output so far, text and metrics."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.detokenizer import OutputText
from engine.metrics import RequestMetrics
from engine.outputs import Chunk, RequestOutput, TokenLogprob
from engine.sampling_params import SamplingParams


@dataclass
class Sequence:
    seq_id: int  # unique within the engine (the draft worker's key)
    request_id: str
    index: int  # position in the caller's list of prompts
    prompt_ids: list[int]
    params: SamplingParams
    eos_ids: frozenset[int]
    seed: int  # keys every random number of the request (engine.keyed_random), the draft's too
    arrival_s: float  # time.perf_counter() when the request was submitted
    tokenizer: object | None = None
    unreproducible: str | None = None  # why a seed may not reproduce this text (engine.reproducibility); None: it does
    output_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None  # "stop", "length" or "abort"
    metrics: RequestMetrics = field(init=False)
    _text: OutputText | None = field(init=False, repr=False)  # None without a tokenizer

    def __post_init__(self) -> None:
        self.metrics = RequestMetrics(prompt_tokens=len(self.prompt_ids), arrival_s=self.arrival_s)
        if self.params.stop and self.tokenizer is None:
            raise ValueError(
                "stop strings need a tokenizer: load the model with one (or pass tokenizer=), "
                "or end the output with stop_token_ids"
            )
        self._text = OutputText(self.tokenizer, self.params.stop) if self.tokenizer is not None else None

    @property
    def text(self) -> str:
        """The output text so far, cut before a stop string ("" without a tokenizer)."""
        return self._text.text if self._text is not None else ""

    @property
    def cut_at_stop(self) -> bool:
        """Whether the text was cut before a stop string."""
        return self._text is not None and self._text.cut_at_stop

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def append(self, tokens: list[int], logprobs: list[TokenLogprob] | None, now_s: float) -> Chunk | None:
        """Append a round's tokens, stopping at EOS, a stop token or string, or the token limit; return the
        chunk to stream (None if nothing was kept).

        Truncating a round's output keeps exactness: every kept token was distributed as the target
        would have sampled it, and AR would have stopped at the same place.
        """
        p, kept, text = self.params, 0, self._text
        for i, token in enumerate(tokens):
            if self.finished:
                break
            self.output_ids.append(token)
            if logprobs is not None and p.logprobs is not None:
                self.logprobs.append(logprobs[i])
            kept += 1
            stop_token = (p.stop_on_eos and token in self.eos_ids) or token in p.stop_token_ids
            # With stop strings, a token at a time: a stop string in its text drops the round's later tokens.
            check = not stop_token and len(self.output_ids) > p.min_tokens
            cut = bool(p.stop) and text.add([token], check_stop=check)
            if stop_token or cut:
                self.finish_reason = "stop"
            elif len(self.output_ids) >= p.max_new_tokens:
                self.finish_reason = "length"
        if not kept:
            return None
        if text is not None and not p.stop:
            text.add(tokens[:kept])
        self.metrics.add_chunk(now_s, kept)
        return self._chunk(
            tokens[:kept], logprobs[:kept] if logprobs is not None and p.logprobs is not None else None, now_s
        )

    def abort(self, now_s: float) -> Chunk:
        """End the request where it is (the client left or the engine stops); the final, empty chunk."""
        self.finish_reason = "abort"
        return self._chunk([], None, now_s)

    def _chunk(self, tokens: list[int], logprobs: list[TokenLogprob] | None, now_s: float) -> Chunk:
        # Unfinished, the delta holds back an incomplete character and a possible start of a stop string.
        delta = self._text.delta(self.finished) if self._text is not None else ""
        return Chunk(
            self.request_id,
            self.index,
            list(tokens),
            delta,
            logprobs,
            now_s,
            self.finished,
            self.finish_reason,
            len(self.prompt_ids),
            len(self.output_ids),
            self.metrics.scheduled_s,
        )

    def output(self) -> RequestOutput:
        return RequestOutput(
            index=self.index,
            request_id=self.request_id,
            prompt_ids=self.prompt_ids,
            token_ids=list(self.output_ids),
            text=self.text if self.tokenizer is not None else None,
            finish_reason=self.finish_reason or "length",
            logprobs=list(self.logprobs) if self.params.logprobs is not None else None,
            metrics=self.metrics,
            unreproducible=self.unreproducible,
        )
