"""Timing models: how long each actor's step takes. Separate from workload and policy (vidur's lesson).

Every model answers the same questions, in milliseconds:
- `verify_ms(batch, tokens, context)`: the target's forward over `tokens` new positions of `batch` sequences
  whose caches hold up to `context` tokens (AR's decode step is `tokens = 1`);
- `draft_ms(batch, K, context, first_width=1)`: SD's K sequential draft steps for `batch` sequences. The first
  step feeds `first_width` tokens a row: 2 after a round in which some row accepted all K (the draft had not
  fed x_K yet, so that row feeds x_K and the bonus, and the batch's block is two wide), else 1
  (engine/strategies/sd.py);
- `cache_build_ms(batch, K, branches, context)`: SSD's cache build: one "glue" draft forward over the K+1
  verified positions, then K tree-decode steps over all `branches` at once (docs/ssd.md §2);
- `backup_ms(backup, rows, K, context)`: SSD's backup on a cache miss; the neural one drafts `rows` = the whole
  batch (hit rows masked, as the engine does), a fast one the missed rows;
- `prefill_ms(strategy, batch, tokens, cached=0)`: joining prompts on the target's critical path (the draft's
  prefill runs in series with the target's in SD, colocated; in SSD the target prefills alone). `cached` of
  each prompt's `tokens` come from the prefix cache: only the rest is computed, attending to all of them;
- `draft_prefill_ms(batch, tokens, cached=0)`: the joiners' prompts through the draft. SSD's worker runs it while the
  target prefills them (the engine's Prefill message; after the build it may still be running), or, in
  engines before that message (`SimConfig.prefill_overlap = False`), when the round after their join reaches
  it, before their backup (engine/ssd/draft_worker.py);
- `overhead_ms(strategy, batch)`: per-round time outside the forwards (sampling, bookkeeping) of a real engine
  over `batch` sequences.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Protocol

from simulator.hardware import Deployment
from theory.glossary import Backup, Strategy


class TimingModel(Protocol):
    def verify_ms(self, batch: int, tokens: int, context: int) -> float: ...
    def draft_ms(self, batch: int, K: int, context: int, first_width: int = 1) -> float: ...
    def cache_build_ms(self, batch: int, K: int, branches: int, context: int) -> float: ...
    def backup_ms(self, backup: Backup, rows: int, K: int, context: int) -> float: ...
    def prefill_ms(self, strategy: Strategy, batch: int, tokens: int, cached: int = 0) -> float: ...
    def draft_prefill_ms(self, batch: int, tokens: int, cached: int = 0) -> float: ...
    def overhead_ms(self, strategy: Strategy, batch: int = 1) -> float: ...


def computed_share(tokens: int, cached: int) -> float:
    """The share of a `tokens`-token prompt's prefill that is computed when its first `cached` tokens come from
    the prefix cache (1 without). ValueError unless 0 <= cached < tokens: the engine computes a prompt's last
    token at least, whose logits give the first new token."""
    if not 0 <= cached < tokens:
        raise ValueError(f"cached prompt tokens must be in 0..tokens - 1 = {tokens - 1}; got {cached}")
    return (tokens - cached) / tokens


def _nonnegative(owner: object, *names: str) -> None:
    for name in names:
        value = getattr(owner, name)
        if not value >= 0:
            raise ValueError(f"{type(owner).__name__}.{name} must be >= 0 milliseconds; got {value!r}")


@dataclass(frozen=True)
class ConstantTiming:
    """Every step takes a fixed time, whatever the batch and context: the closed forms' assumption.

    Fields follow the glossary: `t_verify_ms` = T_v, `t_decode_ms` = T_ar (None: same as T_v),
    `t_draft_ms` = T_d (one draft step), `t_build_ms` = T_p (None: (K+1)·T_d, the glue forward and K tree
    steps), `t_backup_ms` = T_b of the neural backup (None: K·T_d, as SD drafts). `t_prefill_ms` is the
    target's prefill, `t_draft_prefill_ms` the draft's (free by default, as in the closed forms).
    """

    t_verify_ms: float = 1.0
    t_decode_ms: float | None = None
    t_draft_ms: float = 0.1
    t_build_ms: float | None = None
    t_backup_ms: float | None = None
    t_random_backup_ms: float = 0.0
    t_lookup_backup_ms: float = 0.0
    t_prefill_ms: float = 0.0
    t_draft_prefill_ms: float = 0.0

    def __post_init__(self) -> None:
        if not self.t_verify_ms > 0:
            raise ValueError(f"t_verify_ms must be > 0 milliseconds; got {self.t_verify_ms!r}")
        _nonnegative(
            self, "t_draft_ms", "t_random_backup_ms", "t_lookup_backup_ms", "t_prefill_ms", "t_draft_prefill_ms"
        )
        for name in ("t_decode_ms", "t_build_ms", "t_backup_ms"):
            if getattr(self, name) is not None:
                _nonnegative(self, name)

    def verify_ms(self, batch: int, tokens: int, context: int) -> float:
        if tokens == 1 and self.t_decode_ms is not None:
            return self.t_decode_ms
        return self.t_verify_ms

    def draft_ms(self, batch: int, K: int, context: int, first_width: int = 1) -> float:
        return K * self.t_draft_ms  # the closed forms' T_SD = K·T_d: a step's time does not depend on its width

    def cache_build_ms(self, batch: int, K: int, branches: int, context: int) -> float:
        return (K + 1) * self.t_draft_ms if self.t_build_ms is None else self.t_build_ms

    def backup_ms(self, backup: Backup, rows: int, K: int, context: int) -> float:
        if backup is Backup.NEURAL:
            return K * self.t_draft_ms if self.t_backup_ms is None else self.t_backup_ms
        return self.t_random_backup_ms if backup is Backup.RANDOM else self.t_lookup_backup_ms

    def prefill_ms(self, strategy: Strategy, batch: int, tokens: int, cached: int = 0) -> float:
        target_ms = self.t_prefill_ms * computed_share(tokens, cached)  # a stated prefill scales with what is computed
        return target_ms + self.draft_prefill_ms(batch, tokens, cached) if strategy is Strategy.SD else target_ms

    def draft_prefill_ms(self, batch: int, tokens: int, cached: int = 0) -> float:
        return self.t_draft_prefill_ms * computed_share(tokens, cached)

    def overhead_ms(self, strategy: Strategy, batch: int = 1) -> float:
        return 0.0


@dataclass(frozen=True)
class EngineCosts:
    """What an engine adds to the roofline's forwards, step by step (simulator.presets.ENGINES names some).

    sd_extra_forward        SD drafts K + 1 forwards a round, the last feeding x_K into the draft's cache
                            (the reference engine), instead of K with the first two tokens wide after an
                            all-accepted round (this engine);
    draft_layer_overhead_us the fixed cost per layer of each of the draft's forwards in place of the
                            hardware's (None: the hardware's);
    tree_step_overhead_ms   per tree-decode step of an SSD cache build, the worker's host work around the
                            forward (laying out the tree's attention, choosing each branch's top F, filling
                            the cache);
    build_row_us            per branch row per tree-decode step (masks, top-F per branch, cache entries);
    round_host_ms           per round, the decode loop's host work outside the forwards (sampling, checks,
                            bookkeeping) that the GPU waits for: zero for an engine whose host keeps ahead;
    round_row_us            per round and per sequence of the batch, more of the same;
    verify_host_ms          per SD or SSD round, the target's host work beyond AR's round (verifying K + 1
                            positions instead of sampling one, emitting up to K + 1 tokens a row, the
                            proposer's own bookkeeping): on SSD's critical path beside its worker's build;
    verify_row_us           per SD or SSD round and per sequence, more of the same;
    draft_host_ms           per draft forward, the host work around it (sampling the drafted token, checks);
    draft_row_us            per draft forward and per sequence of the batch, more of the same;
    eager                   the engine launches its forwards kernel by kernel (no CUDA graph): the
                            deployments pay the hardware's launch overhead per layer.

    The host terms of a preset that measured them (simulator.presets.MEASURED_ENGINES) come from the engine's
    rounds with its forwards taken out (simulator.host_terms derives them; saguaro.calibration.host_terms
    measures them).
    """

    sd_extra_forward: bool = False
    draft_layer_overhead_us: float | None = None
    tree_step_overhead_ms: float = 0.0
    build_row_us: float = 0.0
    round_host_ms: float = 0.0
    draft_host_ms: float = 0.0
    eager: bool = False
    round_row_us: float = 0.0
    verify_host_ms: float = 0.0
    verify_row_us: float = 0.0
    draft_row_us: float = 0.0

    def __post_init__(self) -> None:
        _nonnegative(
            self,
            "tree_step_overhead_ms",
            "build_row_us",
            "round_host_ms",
            "draft_host_ms",
            "round_row_us",
            "verify_host_ms",
            "verify_row_us",
            "draft_row_us",
        )

    def round_host_at(self, strategy: Strategy, batch: int) -> float:
        """The host work of a round over `batch` sequences outside its forwards, in ms."""
        ms = self.round_host_ms + batch * self.round_row_us * 1e-3
        if Strategy(strategy) is not Strategy.AR:
            ms += self.verify_host_ms + batch * self.verify_row_us * 1e-3
        return ms

    def draft_host_at(self, batch: int) -> float:
        """The host work around one draft forward over `batch` sequences, in ms."""
        return self.draft_host_ms + batch * self.draft_row_us * 1e-3
        if self.draft_layer_overhead_us is not None:
            _nonnegative(self, "draft_layer_overhead_us")


@dataclass(frozen=True)
class RooflineTiming:
    """Times from hardware and model specs (simulator.hardware) and the engine's own costs (`EngineCosts`):
    nothing measured here, everything stated.

    Tree decoding reads each sequence's cache once for all its branches, so a branch costs a row of
    weights-times-activations but no extra cache traffic.
    """

    target: Deployment
    draft: Deployment
    random_backup_ms: float = 0.01  # assumed: uniform tokens, one small kernel
    lookup_backup_ms: float = 0.05  # assumed: an n-gram lookup over the prompt on the host
    sampling_overhead_ms: float = 0.0
    engine: EngineCosts = field(default_factory=EngineCosts)

    def __post_init__(self) -> None:
        _nonnegative(self, "random_backup_ms", "lookup_backup_ms", "sampling_overhead_ms")
        if self.engine.eager:  # an engine that launches eagerly does so for both models, whatever was asked
            object.__setattr__(self, "target", replace(self.target, eager=True))
            object.__setattr__(self, "draft", replace(self.draft, eager=True))

    @cached_property
    def _draft(self) -> Deployment:
        """The draft's deployment with the engine's per-layer cost, where it states one."""
        overhead = self.engine.draft_layer_overhead_us
        if overhead is None:
            return self.draft
        hw = self.draft.hardware
        if self.draft.tp == 1:
            return replace(self.draft, hardware=replace(hw, single_device_layer_overhead_us=overhead))
        return replace(self.draft, hardware=replace(hw, layer_overhead_us=overhead))

    def verify_ms(self, batch: int, tokens: int, context: int) -> float:
        rows = batch * tokens
        return self.target.forward_ms(rows, batch * context, rows * (context + tokens))

    def _draft_step_ms(self, batch: int, rows: int, context: int) -> float:
        return self._draft.forward_ms(rows, batch * context, rows * context) + self.engine.draft_host_at(batch)

    def draft_ms(self, batch: int, K: int, context: int, first_width: int = 1) -> float:
        if not K:
            return 0.0
        if self.engine.sd_extra_forward:  # K + 1 forwards one token wide: x_K goes in at the end of the round
            return (K + 1) * self._draft_step_ms(batch, batch, context)
        first = self._draft_step_ms(batch, batch * first_width, context)
        return first + (K - 1) * self._draft_step_ms(batch, batch, context)

    def cache_build_ms(self, batch: int, K: int, branches: int, context: int) -> float:
        glue_ms = self._draft_step_ms(batch, batch * (K + 1), context)
        step_ms = self._draft_step_ms(batch, branches, context + K)
        host_ms = self.engine.tree_step_overhead_ms + branches * self.engine.build_row_us * 1e-3
        return glue_ms + K * (step_ms + host_ms)

    def backup_ms(self, backup: Backup, rows: int, K: int, context: int) -> float:
        if backup is Backup.NEURAL:
            return self.draft_ms(rows, K, context)
        return self.random_backup_ms if backup is Backup.RANDOM else self.lookup_backup_ms

    def prefill_ms(self, strategy: Strategy, batch: int, tokens: int, cached: int = 0) -> float:
        target_ms = self.target.forward_ms(*_prefill_shape(batch, tokens, cached))
        return target_ms + self.draft_prefill_ms(batch, tokens, cached) if strategy is Strategy.SD else target_ms

    def draft_prefill_ms(self, batch: int, tokens: int, cached: int = 0) -> float:
        return self._draft.forward_ms(*_prefill_shape(batch, tokens, cached))

    def overhead_ms(self, strategy: Strategy, batch: int = 1) -> float:
        return self.sampling_overhead_ms + self.engine.round_host_at(strategy, batch)


def _prefill_shape(batch: int, tokens: int, cached: int) -> tuple[int, int, int]:
    """(rows, cached KV read, attention pairs) of a prefill of `tokens`-token prompts whose first `cached` come
    from the prefix cache: the rest are computed, each attending to the cached tokens and the computed ones
    before it."""
    computed_share(tokens, cached)  # the ValueError for a cached count out of range
    new = tokens - cached
    return batch * new, batch * cached, batch * (new * cached + new * (new + 1) // 2)
