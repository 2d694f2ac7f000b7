"""Per-request sampling settings, validated on construction."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

MAX_LOGPROBS = 5  # top-N log-probabilities a request may ask for (OpenAI's limit)
MAX_SEED = (1 << 63) - 1  # seeds travel as int64 (torch generators, the SSD worker's messages)


class LogprobsMode(str, Enum):
    """Which distribution `logprobs` reports (vLLM's names)."""

    RAW = "raw_logprobs"  # the model's own: log-softmax of its logits, before min_tokens, temperature, top-k/p
    PROCESSED = "processed_logprobs"  # the distribution actually sampled: after all of them


class SamplingMode(str, Enum):
    """How a token is drawn from the target's distribution p (both are exact: every token is distributed as p).

    STANDARD: speculative rounds verify by rejection sampling (accept x with probability min(1, p(x)/q(x)), else
    draw from the residual); AR draws by inverse CDF. A seed reproduces each strategy's text, but SD's and SSD's
    text is not AR's, and it depends on the draft (engine.sampling.Keys; docs/api.md "Reproducible sampling").
    INVARIANT: drafter-invariant sampling. Each token is the winner of an exponential race keyed by (seed,
    position, token): argmax_i log(U_i)/p(i), which is distributed as p and is the Gumbel-max trick in another
    form. The draft runs the same race on its q and a draft token is accepted exactly when it is the target's
    winner, so AR, SD and SSD give the same text for a seed at any temperature: the draft changes the speed,
    never the text (Daliri, Musco & Suresh, arXiv 2408.07978).
    """

    STANDARD = "standard"
    INVARIANT = "invariant"


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are sampled for one request. temperature 0 means greedy (argmax).

    top_k / top_p restrict the distribution before sampling (None = off). The same warp is applied
    to the target's p and the draft's q, so what is verified is exactly what would be sampled.
    Requests in one batch may differ in every field.

    seed          the request's own random stream (None: a fresh random seed per request). The same
                  seed and prompt give the same tokens whatever else shares the batch.
    stop          strings that end the output (the text is cut before the first one; it is not returned).
    stop_token_ids token ids that end the output (the token is kept, like EOS).
    logprobs      None: no log-probabilities; N in 0..5: each emitted token's log-probability and the top N
                  of the target's distribution at that position.
    logprobs_mode which distribution: RAW (default, as vLLM and OpenAI) the model's own log-softmax, before
                  min_tokens, temperature and top-k/top-p; PROCESSED the one actually sampled from (at
                  temperature 0 a point mass: 0 for the chosen token, -inf for the others).
    min_tokens    the fewest tokens generated before EOS, a stop token or a stop string may end the output:
                  until then those tokens get probability 0 (the target's p is renormalised without them).
    sampling_mode STANDARD (rejection sampling) or INVARIANT (drafter-invariant: the same text whatever the
                  strategy, K or draft), SamplingMode; the same at temperature 0.
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    max_new_tokens: int = 128
    stop_on_eos: bool = True
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    logprobs: int | None = None
    logprobs_mode: LogprobsMode = LogprobsMode.RAW
    min_tokens: int = 0
    sampling_mode: SamplingMode = SamplingMode.STANDARD

    def __post_init__(self) -> None:
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)):
            raise ValueError(f"temperature must be a number >= 0 (0 = greedy), got {self.temperature!r}")
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):  # also rejects NaN
            raise ValueError(f"temperature must be a finite number >= 0 (0 = greedy), got {self.temperature}")
        if self.top_k is not None and (not _is_int(self.top_k) or self.top_k < 1):
            raise ValueError(f"top_k must be an integer >= 1 (or None to disable), got {self.top_k!r}")
        if self.top_p is not None and (isinstance(self.top_p, bool) or not 0 < self.top_p <= 1):
            raise ValueError(f"top_p must be in (0, 1] (or None to disable), got {self.top_p!r}")
        if not _is_int(self.max_new_tokens) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if self.seed is not None and (not _is_int(self.seed) or not 0 <= self.seed <= MAX_SEED):
            raise ValueError(
                f"seed must be a non-negative integer up to 2**63 - 1 (or None for a random one), "
                f"got {self.seed!r}: take it modulo 2**63"
            )
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)
        if not all(isinstance(s, str) and s for s in stop):
            raise ValueError(f"stop must be non-empty strings, got {self.stop!r}")
        object.__setattr__(self, "stop", stop)
        ids = tuple(self.stop_token_ids)
        if not all(_is_int(t) and t >= 0 for t in ids):
            raise ValueError(f"stop_token_ids must be non-negative integers, got {self.stop_token_ids!r}")
        object.__setattr__(self, "stop_token_ids", ids)
        if self.logprobs is not None and (not _is_int(self.logprobs) or not 0 <= self.logprobs <= MAX_LOGPROBS):
            raise ValueError(f"logprobs must be an integer in 0..{MAX_LOGPROBS} (or None), got {self.logprobs!r}")
        try:
            object.__setattr__(self, "logprobs_mode", LogprobsMode(self.logprobs_mode))
        except ValueError:
            raise ValueError(
                f"logprobs_mode must be one of {', '.join(m.value for m in LogprobsMode)}, got {self.logprobs_mode!r}"
            ) from None
        try:
            object.__setattr__(self, "sampling_mode", SamplingMode(self.sampling_mode))
        except ValueError:
            raise ValueError(
                f"sampling_mode must be one of {', '.join(m.value for m in SamplingMode)}, got {self.sampling_mode!r}"
            ) from None
        if not _is_int(self.min_tokens) or not 0 <= self.min_tokens <= self.max_new_tokens:
            raise ValueError(
                f"min_tokens must be an integer in 0..max_new_tokens = 0..{self.max_new_tokens}, "
                f"got {self.min_tokens!r}"
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def invariant(self) -> bool:
        """Drafter-invariant sampling at temperature > 0 (at 0 both modes are the argmax)."""
        return self.sampling_mode is SamplingMode.INVARIANT and not self.greedy

    def stops_before(self, eos_ids: frozenset[int]) -> tuple[int, ...]:
        """The ids min_tokens holds back: those that would end the output (EOS unless ignored, stop tokens)."""
        return tuple(sorted((set(eos_ids) if self.stop_on_eos else set()) | set(self.stop_token_ids)))

    @property
    def warp_key(self) -> tuple:
        """What decides the warped distribution; requests with equal keys are warped together."""
        return (0.0, None, None) if self.greedy else (float(self.temperature), self.top_k, self.top_p)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
