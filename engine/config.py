"""Engine settings: frozen dataclasses that validate themselves and raise ValueError."""

from __future__ import annotations

from dataclasses import dataclass

from theory.glossary import Backup, Strategy

DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class SpeculativeConfig:
    """Speculation settings (notation of docs/ssd.md).

    K       draft tokens per round.
    fanout  F_0..F_K: guesses per verification outcome k (SSD's cache); also fixes Saguaro's
            down-weighted set at draft position k+1: the top F_k + 1 tokens of q. None = uniform 3.
    C       Saguaro down-weighting constant in (0, 1]; 1 = plain sampling (Saguaro off).
    backup  what SSD does on a cache miss.
    """

    K: int = 4
    fanout: tuple[int, ...] | None = None
    C: float = 1.0
    backup: Backup = Backup.NEURAL

    def __post_init__(self) -> None:
        if not isinstance(self.K, int) or self.K < 1:
            raise ValueError(f"K (draft tokens per round) must be an integer >= 1, got {self.K!r}")
        if not 0 < self.C <= 1:
            raise ValueError(f"C (Saguaro constant) must be in (0, 1]; use 1 to turn it off, got {self.C}")
        if self.fanout is not None:
            fanout = tuple(int(f) for f in self.fanout)
            if len(fanout) != self.K + 1 or min(fanout) < 0:
                raise ValueError(
                    f"fanout must list K + 1 = {self.K + 1} non-negative integers F_0..F_K, got {self.fanout}"
                )
            object.__setattr__(self, "fanout", fanout)
        object.__setattr__(self, "backup", Backup(self.backup))

    @property
    def fanouts(self) -> tuple[int, ...]:
        """F_0..F_K, with the uniform default filled in."""
        return self.fanout if self.fanout is not None else (3,) * (self.K + 1)

    def saguaro_top(self) -> tuple[int, ...]:
        """Size of Saguaro's down-weighted set at draft positions 1..K: F_{i-1} + 1."""
        return tuple(f + 1 for f in self.fanouts[: self.K])


@dataclass(frozen=True)
class EngineConfig:
    """Which models run where, and how."""

    target: str
    draft: str | None = None
    strategy: Strategy = Strategy.AR
    speculative: SpeculativeConfig = SpeculativeConfig()
    dtype: str = "float32"
    draft_dtype: str | None = None  # None: same as dtype
    draft_int8: bool = False  # dynamic int8 quantisation of the draft's Linear layers
    device: str = "cpu"
    threads: int | None = None  # torch intra-op threads; None leaves torch's default
    chat_template: bool = True  # wrap text prompts in the tokenizer's chat template

    def __post_init__(self) -> None:
        object.__setattr__(self, "strategy", Strategy(self.strategy))
        for name in ("dtype", "draft_dtype"):
            value = getattr(self, name)
            if value is not None and value not in DTYPES:
                raise ValueError(f"{name} must be one of {', '.join(DTYPES)}, got {value!r}")
        if self.strategy is not Strategy.AR and self.draft is None:
            raise ValueError(f"strategy {self.strategy.value} needs a draft model: pass draft=...")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
