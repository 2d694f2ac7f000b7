"""One request in flight: its prompt, its output so far, and its metrics."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.metrics import RequestMetrics
from engine.sampling_params import SamplingParams


@dataclass
class Sequence:
    index: int  # position in the caller's list of prompts
    prompt_ids: list[int]
    params: SamplingParams
    eos_ids: frozenset[int]
    output_ids: list[int] = field(default_factory=list)
    finish_reason: str | None = None  # "eos" or "length"
    metrics: RequestMetrics = field(init=False)

    def __post_init__(self) -> None:
        self.metrics = RequestMetrics(prompt_tokens=len(self.prompt_ids))

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    def append(self, tokens: list[int], now_s: float) -> int:
        """Append emitted tokens, stopping at EOS or the token limit; returns how many were kept.

        Truncating a round's output keeps exactness: every kept token was distributed as the target
        would have sampled it, and AR would have stopped at the same place.
        """
        kept = 0
        for token in tokens:
            if self.finished:
                break
            self.output_ids.append(token)
            kept += 1
            if self.params.stop_on_eos and token in self.eos_ids:
                self.finish_reason = "eos"
            elif len(self.output_ids) >= self.params.max_new_tokens:
                self.finish_reason = "length"
        if kept:
            m = self.metrics
            if m.new_tokens == 0:
                m.ttft_s = now_s
            m.new_tokens += kept
            m.e2e_s = now_s
            m.token_times_s.extend([now_s] * kept)
        return kept
