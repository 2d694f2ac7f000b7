"""Workloads: who asks for how many tokens, and when. Knows nothing of hardware or strategy.

- `ClosedLoop`: a fixed number of sequences in flight; a finished request is replaced at once.
- `OpenLoop`: Poisson arrivals at `rate_per_s`, served by a batch of at most `max_batch` sequences.
- `Replayed`: given requests at given times (a served run's log, replayed), the same batch limit.
Prompt and output lengths come from `Lengths`; all randomness from one seeded numpy Generator.

`shared_prefix` (each workload's, 0 by default) is the fraction of every prompt that its requests share, such as
a chat's system prompt or an agent's instructions: with the engine's prefix cache, a request after the first
finds that part cached in whole blocks of `PREFIX_BLOCK_TOKENS` and prefills only the rest (`Request.cached`).
The first request of a run fills the cache and finds nothing. Nothing is evicted here: the shared part is
assumed to stay cached, as it does while the KV budget holds it beside the running requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

import numpy as np

PREFIX_BLOCK_TOKENS = 16  # engine/blocks/pool.py DEFAULT_BLOCK_SIZE: the prefix cache matches whole blocks


def check_shared_prefix(fraction: float) -> None:
    if not 0.0 <= fraction < 1.0:
        raise ValueError(f"shared_prefix is the fraction of each prompt its requests share, in [0, 1); got {fraction}")


def cached_tokens(prompt_len: int, shared_prefix: float) -> int:
    """Prompt tokens a request finds in the prefix cache when a `shared_prefix` fraction of its prompt was seen
    before: that part in whole blocks, and never the prompt's last token (its logits give the first new one)."""
    check_shared_prefix(shared_prefix)
    blocks = int(shared_prefix * prompt_len) // PREFIX_BLOCK_TOKENS
    return min(blocks * PREFIX_BLOCK_TOKENS, (prompt_len - 1) // PREFIX_BLOCK_TOKENS * PREFIX_BLOCK_TOKENS)


@dataclass(frozen=True)
class Lengths:
    """Token counts drawn uniformly from the integers low..high (fixed when low == high)."""

    low: int
    high: int | None = None  # None: same as low

    def __post_init__(self) -> None:
        if self.low < 1:
            raise ValueError(f"lengths must be >= 1 token; got low = {self.low}")
        if self.high is not None and self.high < self.low:
            raise ValueError(f"length range {self.low}..{self.high} is empty: give low <= high")

    @property
    def upper(self) -> int:
        return self.low if self.high is None else self.high

    @property
    def mean(self) -> float:
        return (self.low + self.upper) / 2

    def sample(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self.upper == self.low:
            return np.full(n, self.low, dtype=np.int64)
        return rng.integers(self.low, self.upper + 1, size=n)

    @staticmethod
    def parse(text: str) -> Lengths:
        """'256' (fixed) or '128:512' (uniform range)."""
        try:
            parts = [int(p) for p in text.split(":")]
        except ValueError:
            raise ValueError(f"a length is N or LOW:HIGH in tokens (e.g. 256 or 128:512); got {text!r}") from None
        if len(parts) not in (1, 2):
            raise ValueError(f"a length is N or LOW:HIGH in tokens (e.g. 256 or 128:512); got {text!r}")
        return Lengths(parts[0], parts[1] if len(parts) == 2 else None)


@dataclass(frozen=True)
class ClosedLoop:
    """`concurrency` sequences always in flight. `output_len` None: sequences never finish (steady state)."""

    concurrency: int = 1
    prompt_len: Lengths = Lengths(128)
    output_len: Lengths | None = Lengths(256)
    shared_prefix: float = 0.0

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency (batch size) must be >= 1; got {self.concurrency}")
        check_shared_prefix(self.shared_prefix)

    @property
    def max_batch(self) -> int:
        return self.concurrency


@dataclass(frozen=True)
class OpenLoop:
    """Poisson arrivals at `rate_per_s` requests per second, at most `max_batch` decoding at once."""

    rate_per_s: float
    max_batch: int = 8
    prompt_len: Lengths = Lengths(128)
    output_len: Lengths = Lengths(256)
    shared_prefix: float = 0.0

    def __post_init__(self) -> None:
        check_shared_prefix(self.shared_prefix)
        if not self.rate_per_s > 0:
            raise ValueError(f"rate_per_s (arrival rate) must be > 0 requests per second; got {self.rate_per_s}")
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1; got {self.max_batch}")


@dataclass(frozen=True)
class Replayed:
    """Requests as a served run saw them: arrival times (ms from the start, non-decreasing) with each
    request's prompt and output lengths, served by a batch of at most `max_batch` sequences. The
    simulation ends when the last one completes."""

    arrivals_ms: tuple[float, ...]
    prompt_lens: tuple[int, ...]
    output_lens: tuple[int, ...]
    max_batch: int = 8
    shared_prefix: float = 0.0

    def __post_init__(self) -> None:
        check_shared_prefix(self.shared_prefix)
        n = len(self.arrivals_ms)
        if n == 0 or len(self.prompt_lens) != n or len(self.output_lens) != n:
            raise ValueError(
                "a replayed workload needs one arrival time, prompt length and output length per "
                f"request; got {n}, {len(self.prompt_lens)} and {len(self.output_lens)}"
            )
        if any(b < a for a, b in pairwise(self.arrivals_ms)) or self.arrivals_ms[0] < 0:
            raise ValueError("replayed arrival times must be >= 0 and in order (sort the requests by arrival)")
        if min(self.prompt_lens) < 1 or min(self.output_lens) < 1:
            raise ValueError("replayed prompt and output lengths must be >= 1 token")
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1; got {self.max_batch}")

    @property
    def requests(self) -> int:
        return len(self.arrivals_ms)


Workload = ClosedLoop | OpenLoop | Replayed


@dataclass
class Request:
    """One request as it moves through the simulation (mutable: the simulation fills in its times)."""

    rid: int
    prompt_len: int
    output_len: int | None  # None: never finishes
    arrival_ms: float = 0.0
    first_token_ms: float | None = None
    done_ms: float | None = None
    cached: int = 0  # prompt tokens found in the prefix cache (module docstring)


class RequestSource:
    """Draws requests for a workload from one Generator: lengths in blocks, arrival gaps for open loops."""

    def __init__(self, workload: Workload, rng: np.random.Generator) -> None:
        self.workload = workload
        self._rng = rng
        self._next_id = 0

    def next_request(self, now_ms: float) -> Request:
        wl, rng = self.workload, self._rng
        if isinstance(wl, Replayed):
            i = self._next_id
            self._next_id += 1
            return Request(
                i,
                wl.prompt_lens[i],
                wl.output_lens[i],
                arrival_ms=now_ms,
                cached=cached_tokens(wl.prompt_lens[i], wl.shared_prefix) if i else 0,
            )
        prompt = int(wl.prompt_len.sample(rng, 1)[0])
        output = None if wl.output_len is None else int(wl.output_len.sample(rng, 1)[0])
        cached = cached_tokens(prompt, wl.shared_prefix) if self._next_id else 0  # the first one fills the cache
        request = Request(self._next_id, prompt, output, arrival_ms=now_ms, cached=cached)
        self._next_id += 1
        return request

    def gap_ms(self, now_ms: float = 0.0) -> float | None:
        """Time to the next arrival of an open loop (exponential: a Poisson process), or of a replayed
        run (None when all its requests have arrived)."""
        wl = self.workload
        if isinstance(wl, Replayed):
            i = self._next_id
            return None if i >= wl.requests else max(0.0, wl.arrivals_ms[i] - now_ms)
        if isinstance(wl, ClosedLoop):
            raise ValueError("a closed loop has no arrival gaps: a sequence starts when another finishes")
        return float(self._rng.exponential(1e3 / wl.rate_per_s))
