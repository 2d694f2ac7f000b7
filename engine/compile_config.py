"""Settings of the fixed-shape forward path (engine.static_cache, engine.compiled): a frozen dataclass that
validates itself, importable without torch (the CLI reads it)."""

from __future__ import annotations

from dataclasses import dataclass

COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


@dataclass(frozen=True)
class CompileConfig:
    """Forwards on a preallocated KV cache in fixed shapes (buckets), compiled once per bucket.

    max_len          tokens one row can hold: its prompt, its output and a round's speculation. A request
                     that could pass it is refused when it is made (engine.llm.LLM.make_sequence).
    batch_buckets    batch sizes with a compiled forward: a batch runs padded to the smallest bucket that holds
                     it (padding rows are masked and write only scratch); a larger batch runs eagerly on the
                     same cache. New tokens per row are bucketed as 1 or the round's K + 1 (a block in between
                     is padded with holes); a longer block (a prefill) runs eagerly.
    context_buckets  widths a compiled forward attends over (each row's keys up to it); None: one, max_len + 1.
                     More buckets attend over less at short contexts, at one compile more per bucket.
    mode             torch.compile's mode; None: "reduce-overhead" (CUDA graphs) on CUDA, inductor's default
                     on the CPU.
    compiled         False: the same cache and buckets run eagerly (no torch.compile): tests of the cache
                     alone, and the baseline that isolates what compiling adds.
    """

    max_len: int = 2048
    batch_buckets: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    context_buckets: tuple[int, ...] | None = None
    mode: str | None = None
    compiled: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.max_len, int) or self.max_len < 2:
            raise ValueError(
                f"max_len (tokens per row of the static cache) must be an integer >= 2, got {self.max_len!r}"
            )
        buckets = tuple(sorted({int(b) for b in self.batch_buckets}))
        if not buckets or buckets[0] < 1:
            raise ValueError(f"batch_buckets must list batch sizes >= 1, got {self.batch_buckets!r}")
        object.__setattr__(self, "batch_buckets", buckets)
        if self.context_buckets is not None:
            widths = tuple(sorted({int(w) for w in self.context_buckets}))
            if not widths or widths[0] < 2 or widths[-1] > self.max_len + 1:
                raise ValueError(
                    f"context_buckets must be widths in 2..max_len + 1 = {self.max_len + 1}, got "
                    f"{self.context_buckets!r}"
                )
            object.__setattr__(self, "context_buckets", widths)
        if self.mode is not None and self.mode not in COMPILE_MODES:
            raise ValueError(f"mode must be one of {', '.join(COMPILE_MODES)} or None (by device), got {self.mode!r}")

    @property
    def widths(self) -> tuple[int, ...]:
        """The attended widths of compiled forwards, ascending; the last is the whole row (scratch + max_len)."""
        widths = self.context_buckets or ()
        return widths if widths and widths[-1] == self.max_len + 1 else widths + (self.max_len + 1,)

    def mode_for(self, device_type: str) -> str:
        return self.mode or ("reduce-overhead" if device_type == "cuda" else "default")

    @classmethod
    def of(cls, value: CompileConfig | bool | None) -> CompileConfig | None:
        """`value` as a CompileConfig: True takes the defaults, False or None turns the path off."""
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if isinstance(value, cls):
            return value
        raise ValueError(f"compile must be True, False, None or a CompileConfig, got {value!r}")


@dataclass(frozen=True)
class SlotPlan:
    """How one model runs on the static cache: the settings, the widest block with a bucket (the round's K + 1;
    1 for AR's target) and the slots to allocate at first (the cache grows past them when it must)."""

    settings: CompileConfig
    max_tokens: int
    rows: int


DEFAULT_ROWS = 8  # slots per model to start with when the batch is not bounded (max_num_seqs None)


def slot_plans(
    settings: CompileConfig | None, K: int | None, fanout_total: int, max_num_seqs: int | None
) -> tuple[SlotPlan | None, SlotPlan | None]:
    """The target's and the draft's plans (None, None without `settings`). K: the round's largest K (None: AR);
    fanout_total: SSD's branches per row (0 for SD), each of which holds a slot of the draft's cache."""
    if settings is None:
        return None, None
    rows = max_num_seqs or DEFAULT_ROWS
    width = 1 if K is None else K + 1
    draft_rows = rows * (2 + fanout_total)  # the rows, their branches, and the copies a hit makes of them
    return SlotPlan(settings, width, rows), SlotPlan(settings, width, draft_rows)
