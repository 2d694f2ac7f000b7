"""Bucketed forwards on the static slot cache, compiled once per bucket (torch.compile; CUDA graphs on CUDA).

`SlotModel` wraps a model for the engine: the states it makes (`new_kv_state`, engine.kv_cache.new_state)
live in its slot cache (engine.static_cache), and their forwards go through `run`, which pads each block to
a bucket: its rows to the smallest batch bucket that holds them (padding rows sit in the reserved padding slot
and are holes throughout), its new tokens to 1 or the round's K + 1 (holes on the left, so each row's newest
token stays last), and the columns it attends over to the smallest context bucket that holds its longest row.
So the target's verify (K + 1 wide), the draft's steps (1 wide), SSD's glue, backup and branch steps all take
a handful of shapes. A bucket is compiled the first time it runs, with a log line and its time; inductor's
on-disk caches (TORCHINDUCTOR_CACHE_DIR) make later compiles of the same shapes fast. A block that fits no
bucket (a prefill, a batch above the largest bucket) runs eagerly on the same cache over exactly the columns
it needs.

A bucket computes what the eager forward computes: padding rows and holes never write a real row's columns
(engine.static_cache), and every real token sees exactly its own row's past. Compiled kernels may round
differently (fused reductions), as two block shapes of the eager forward already do.
"""

from __future__ import annotations

import functools
import logging
import time
import types
from collections.abc import Callable

import torch
from torch import Tensor

from engine.blocks import BlockModel
from engine.compile_config import CompileConfig, SlotPlan
from engine.kv_cache import cache_keyword
from engine.static_cache import SlotCache, SlotState, block_inputs

log = logging.getLogger(__name__)
MASKED_ATTENTION = ("sdpa", "eager")  # attention implementations that take a 4-D mask as it is given


def _forward(
    model: torch.nn.Module, cache: SlotCache, keyword: str, tokens: Tensor, positions: Tensor, mask: Tensor
) -> Tensor:
    """One forward of a bucket: logits [B, T, V] (the cache's binding says where the tokens go)."""
    return model(
        input_ids=tokens, attention_mask=mask, position_ids=positions, use_cache=True, **{keyword: cache}
    ).logits


def _own_code(fn: Callable, name: str) -> Callable:
    """`fn` with a code object of its own: dynamo keeps its compiled graphs per code object, so each bucket
    gets one entry (no recompile limit shared by every bucket and model, no guards of the others to check)."""
    code = fn.__code__.replace(co_name=name)
    return types.FunctionType(code, fn.__globals__, name, fn.__defaults__, fn.__closure__)


class SlotModel:
    """A model on a static slot cache, run in buckets; compiled per bucket when `settings.compiled`.

    name        what the log lines call it ("target", "draft").
    max_tokens  the widest block that has a bucket (the round's K + 1; 1 for AR).
    rows        slots to allocate at first (the cache grows when more rows are alive at once).
    """

    def __init__(
        self,
        model: torch.nn.Module,
        settings: CompileConfig,
        device: torch.device,
        *,
        name: str,
        max_tokens: int,
        rows: int,
    ):
        attention = getattr(model.config, "_attn_implementation", "sdpa")
        if attention not in MASKED_ATTENTION:
            raise ValueError(
                f"the static KV cache needs sdpa or eager attention (a 4-D mask per row), not "
                f"{attention!r}: load the {name} with attn_implementation='sdpa', or drop compile"
            )
        self.model = model
        self.settings = settings
        self.device = device
        self.name = name
        self.max_tokens = max(1, max_tokens)
        self.sdpa = attention == "sdpa"
        self.cudagraphs = (
            settings.compiled
            and device.type == "cuda"  # the modes that capture CUDA graphs
            and settings.mode_for(device.type) in ("reduce-overhead", "max-autotune")
        )
        self.cache = SlotCache(model.config.get_text_config().num_hidden_layers, rows, settings.max_len)
        self.keyword = cache_keyword(model)
        self.vocab_size = model.get_output_embeddings().out_features
        self._forwards: dict[tuple[int, int, int], Callable] = {}
        self.first_call_s: dict[tuple[int, int, int], float] = {}  # per bucket: its first call, compile included

    def new_kv_state(self, batch_size: int, device: torch.device) -> SlotState:
        return SlotState.empty(self, batch_size, self.device)

    def bucket(self, batch: int, tokens: int, need: int) -> tuple[int, int, int] | None:
        """(rows, new tokens, attended columns) of the bucket a block runs in, or None: eagerly."""
        rows = next((b for b in self.settings.batch_buckets if b >= batch), None)
        width = next((w for w in self.settings.widths if w >= need), None)
        if tokens == 1:
            block = 1
        elif tokens <= self.max_tokens:
            block = self.max_tokens
        else:
            return None
        return None if rows is None or width is None else (rows, block, width)

    def run(
        self, rows: Tensor, tokens: Tensor, valid: Tensor, lengths: Tensor, logits_to_keep: int, need: int | None = None
    ) -> Tensor:
        """Logits [B, T or logits_to_keep, V] of tokens [B, T] (valid [B, T]) fed to the rows in slots `rows`
        [B] after their `lengths` [B] tokens; `need`: the longest row after them + the scratch column, when the
        caller knows it on the host (else it is read from the device)."""
        B, T = tokens.shape
        keep = logits_to_keep if 0 < logits_to_keep < T else T
        if B == 0:
            return torch.zeros(0, keep, self.vocab_size, device=self.device)
        if need is None:
            need = 1 + int((lengths + valid.to(torch.long).sum(-1)).max())  # the longest row, + the scratch column
        if need > 1 + self.settings.max_len:
            raise ValueError(
                f"a row of {need - 1} tokens does not fit the static KV cache's max_len "
                f"{self.settings.max_len}: raise CompileConfig.max_len (--max-len)"
            )
        bucket = self.bucket(B, T, need)
        if bucket is None:
            return self._eager(rows, tokens, valid, lengths, need, logits_to_keep)
        Bb, Tb, W = bucket
        tokens_b = tokens.new_zeros(Bb, Tb)  # [Bb, Tb]: padding rows, holes on the left
        valid_b = torch.zeros(Bb, Tb, dtype=torch.bool, device=tokens.device)
        tokens_b[:B, Tb - T :] = tokens
        valid_b[:B, Tb - T :] = valid
        rows_b = torch.full((Bb,), SlotCache.PAD_SLOT, dtype=torch.long, device=rows.device)
        rows_b[:B] = rows
        lengths_b = torch.zeros(Bb, dtype=torch.long, device=lengths.device)
        lengths_b[:B] = lengths
        positions, write, sees = block_inputs(lengths_b, valid_b, W)
        self.cache.bind(rows_b, write, W)
        logits = self._call(bucket, tokens_b, positions, self._mask(sees))  # [Bb, Tb, V]
        return logits[:B, Tb - keep :]

    def _call(self, bucket: tuple[int, int, int], tokens: Tensor, positions: Tensor, mask: Tensor) -> Tensor:
        if not self.cache.layers[0].is_initialized:
            # The cache allocates itself at its first forward, from the key states' shape: eagerly, not in a graph.
            return _forward(self.model, self.cache, self.keyword, tokens, positions, mask)
        forward = self._forwards.get(bucket)
        if forward is None:
            forward = self._forwards[bucket] = self._build(bucket)
        first = bucket not in self.first_call_s
        if first and self.settings.compiled:
            log.info("compiling the %s's forward for %d rows x %d tokens over %d columns ...", self.name, *bucket)
        t0 = time.perf_counter()
        if self.cudagraphs:
            torch.compiler.cudagraph_mark_step_begin()
        logits = forward(tokens, positions, mask)
        if self.cudagraphs and self.name != "target":
            # The graph's output buffer is overwritten by its next replay. The target's logits are used up within
            # the round, before its next forward (p, the outcome and the log-probabilities are made from them), so
            # they are not copied; a draft's steps replay one graph K times and keep each step's logits.
            logits = logits.clone()
        if first:
            self.first_call_s[bucket] = time.perf_counter() - t0
            if self.settings.compiled:
                log.info("... compiled in %.1f s", self.first_call_s[bucket])
        return logits

    def _build(self, bucket: tuple[int, int, int]) -> Callable:
        forward = _forward
        if self.settings.compiled:
            rows, block, width = bucket
            own = _own_code(_forward, f"{self.name}_forward_b{rows}_t{block}_w{width}")
            # compiled as a plain function (a partial would be traced through torch's one shared wrapper code)
            forward = torch.compile(own, mode=self.settings.mode_for(self.device.type), dynamic=False)
        return functools.partial(forward, self.model, self.cache, self.keyword)

    def _eager(
        self, rows: Tensor, tokens: Tensor, valid: Tensor, lengths: Tensor, need: int, logits_to_keep: int
    ) -> Tensor:
        """A block outside the buckets, at its own shape, attending over the `need` columns it reaches."""
        positions, write, sees = block_inputs(lengths, valid, need)
        self.cache.bind(rows, write, need)
        T = tokens.shape[1]
        if 0 < logits_to_keep < T:
            # positions as a tensor: transformers then gathers a contiguous block for the head (engine.kv_cache)
            logits_to_keep = torch.arange(T - logits_to_keep, T, device=tokens.device)
        return self.model(
            input_ids=tokens,
            attention_mask=self._mask(sees),
            position_ids=positions,
            use_cache=True,
            logits_to_keep=logits_to_keep,
            **{self.keyword: self.cache},
        ).logits

    def _mask(self, sees: Tensor) -> Tensor:
        """The 4-D mask as the attention implementation takes it: boolean for SDPA, additive for eager."""
        if self.sdpa:
            return sees
        dtype = self.model.dtype
        return torch.zeros(sees.shape, dtype=dtype, device=sees.device).masked_fill(~sees, torch.finfo(dtype).min)


def slot_model(
    model: torch.nn.Module,
    plan: SlotPlan | None,
    device: torch.device,
    name: str,
    *,
    prefix_caching: bool = True,
    max_bytes: int | None = None,
) -> torch.nn.Module | SlotModel | BlockModel:
    """What the engine feeds: without a plan the model on a block KV cache (engine.blocks; the model itself
    when its attention takes no 4-D mask), with its prefix cache and its budget of `max_bytes`, else the model on a
    static slot cache."""
    if plan is None:
        if getattr(model.config, "_attn_implementation", "sdpa") not in MASKED_ATTENTION:
            return model
        return BlockModel(model, device, max_bytes=max_bytes, prefix_caching=prefix_caching)
    return SlotModel(model, plan.settings, device, name=name, max_tokens=plan.max_tokens, rows=plan.rows)
