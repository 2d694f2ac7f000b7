"""Per-request sampling settings, validated on construction."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SamplingParams:
    """How tokens are sampled. temperature 0 means greedy (argmax).

    top_k / top_p restrict the distribution before sampling (None = off). The same warp is applied
    to the target's p and the draft's q, so what is verified is exactly what would be sampled.
    """

    temperature: float = 1.0
    top_k: int | None = None
    top_p: float | None = None
    max_new_tokens: int = 128
    stop_on_eos: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.temperature >= 0:  # also rejects NaN
            raise ValueError(f"temperature must be >= 0 (0 = greedy), got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1 (or None to disable), got {self.top_k}")
        if self.top_p is not None and not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1] (or None to disable), got {self.top_p}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def same_distribution(self, other: "SamplingParams") -> bool:
        """True when two requests sample from the same warped distribution and can share a batch."""
        return (self.temperature, self.top_k, self.top_p) == (other.temperature, other.top_k, other.top_p)
