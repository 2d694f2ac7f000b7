"""What the engine hands back: streamed chunks, finished outputs, and a generate() call's results."""

from __future__ import annotations

from dataclasses import dataclass

from engine.metrics import RequestMetrics, RunMetrics


@dataclass(frozen=True)
class TokenLogprob:
    """One emitted token's log-probability under the target, and the target's top N there (ids with their
    log-probabilities, most probable first; ties to the lowest id). By default the model's own distribution
    (SamplingParams.logprobs_mode RAW); with PROCESSED the one sampled from, which at temperature 0 is a point
    mass: the chosen token has 0 and every other token −inf."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Chunk:
    """What one round emitted for one request (streaming)."""

    request_id: str
    index: int  # position in the caller's list of prompts (0 for a single request)
    token_ids: list[int]
    text: str  # text delta: complete characters only, stop strings cut out ("" without a tokenizer)
    logprobs: list[TokenLogprob] | None
    time_s: float  # time.perf_counter() when the round emitted these tokens
    finished: bool
    finish_reason: str | None  # "stop" (EOS, a stop token or string), "length" or "abort"
    prompt_tokens: int
    output_tokens: int  # so far, this chunk included
    scheduled_s: float | None = None  # time.perf_counter() when the request left the waiting queue (None: not yet)


@dataclass
class RequestOutput:
    index: int
    request_id: str
    prompt_ids: list[int]
    token_ids: list[int]
    text: str | None  # None when the engine has no tokenizer (token-id prompts on bare models)
    finish_reason: str
    logprobs: list[TokenLogprob] | None
    metrics: RequestMetrics
    # None: the same prompt, seed and settings give this text on any run; else why they may not
    # (engine.reproducibility)
    unreproducible: str | None = None

    @property
    def reproducible(self) -> bool:
        return self.unreproducible is None


@dataclass
class Generation:
    """What generate() returns: one output per prompt, in order, and the run's metrics."""

    outputs: list[RequestOutput]
    metrics: RunMetrics

    def __iter__(self):
        return iter(self.outputs)

    def __len__(self) -> int:
        return len(self.outputs)

    def __getitem__(self, i: int) -> RequestOutput:
        return self.outputs[i]
