"""A model's KV cache for a batch of sequences of different lengths, with exact per-row roll-back.

Every forward appends the same number of slots to all rows (the cache is one tensor per layer), so
rows that need fewer tokens, or that rejected speculated tokens, get *holes*: slots whose attention
mask is 0. Keys in a hole are never attended to, and each row carries its own position ids, so a
row's logits equal those of the same tokens run alone (up to float rounding of block shapes).

Roll-back is exact because the rejected tokens are always the newest ones: the kept tokens' keys
and values were computed before the rejected ones existed (causal attention), so masking the
rejected slots restores precisely the state before they were fed.

Rows come and go (continuous batching): `select` keeps some rows, `concat` stacks states made apart
(a newly prefilled group joins the running batch), `fork` copies rows (SSD's branches). Columns that
became holes in every row are dropped, so a long-running batch does not keep the width of sequences
that left.
"""

from __future__ import annotations

import functools
import inspect
from typing import Protocol

import torch
from torch import Tensor
from transformers import DynamicCache, PreTrainedModel

from engine import host


def cache_keyword(model: torch.nn.Module) -> str:
    """The keyword argument a model's forward takes its KV cache by: `cache` from transformers 5.24 (which
    deprecates `past_key_values`), `past_key_values` before it (5.17 silently drops an unknown `cache=`, and the
    forward then runs without its context)."""
    return _cache_keyword(type(model))


@functools.cache
def _cache_keyword(model_class: type) -> str:
    return "cache" if "cache" in inspect.signature(model_class.forward).parameters else "past_key_values"


class CacheState(Protocol):
    """What the engine does with a model's KV state: KVState below, engine.static_cache.SlotState and
    engine.tp.target.TPState alike."""

    lengths: Tensor  # [B] real tokens per row

    @property
    def batch_size(self) -> int: ...

    def extend(
        self, tokens: Tensor, valid: Tensor | None = None, logits_to_keep: int = 0, fed: list[int] | None = None
    ) -> Tensor: ...

    def rollback(self, drop: Tensor | list[int]) -> None: ...

    def select(self, rows: Tensor | list[int]) -> None: ...

    def fork(self, rows: Tensor | list[int]) -> CacheState: ...


def new_state(model: torch.nn.Module, batch_size: int, device: torch.device) -> CacheState:
    """An empty state of `batch_size` rows for `model`: a KVState, or the state a runner that wraps a model makes
    for it (`new_kv_state`: the static slot cache of engine.compiled, the tensor-parallel target of engine.tp).
    KVState.concat joins states of either kind."""
    make = getattr(model, "new_kv_state", None)
    return make(batch_size, device) if make is not None else KVState(model, batch_size, device)


def right_aligned(rows: list[list[int]], pad_id: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Pack token lists into a block whose rows end together (holes on the left).

    Returns tokens [B, T] and valid [B, T]; the last slot of every non-empty row is real, so the
    last position's logits are each row's next-token logits.
    """
    width = max((len(r) for r in rows), default=0)
    tokens = host.pinned_empty((len(rows), width), torch.long, device).fill_(pad_id)  # built on the host
    valid = host.pinned_empty((len(rows), width), torch.bool, device).zero_()
    for b, row in enumerate(rows):
        if row:
            tokens[b, width - len(row) :] = torch.tensor(row, dtype=torch.long)
            valid[b, width - len(row) :] = True
    return host.upload(tokens, device), host.upload(valid, device)


def prefill(state: CacheState, prompts: list[list[int]], pad_id: int, device: torch.device) -> CacheState:
    """Feed each empty row of `state` its prompt (logits not kept): on the block cache, only what the prefix cache
    does not hold, and the prompts' full blocks are offered to it after."""
    cached = [0] * len(prompts)
    if hasattr(state, "reuse_prefix"):
        cached = [state.reuse_prefix(i, p, len(p)) for i, p in enumerate(prompts)]
    rest = [p[n:] for p, n in zip(prompts, cached, strict=False)]
    if any(rest):
        tokens, valid = right_aligned(rest, pad_id, device)
        state.extend(tokens, valid, logits_to_keep=1, fed=[len(r) for r in rest])
    if hasattr(state, "register"):
        for i, p in enumerate(prompts):
            state.register(i, p)
    return state


class KVState:
    """KV cache, attention mask and position counters of one model over a batch."""

    def __init__(self, model: PreTrainedModel, batch_size: int, device: torch.device):
        self.model = model
        self.cache = DynamicCache(config=model.config)
        self.mask = torch.zeros(batch_size, 0, dtype=torch.long, device=device)  # [B, L], 1 = real
        self.lengths = torch.zeros(batch_size, dtype=torch.long, device=device)  # [B] real tokens

    @property
    def batch_size(self) -> int:
        return self.mask.shape[0]

    @torch.inference_mode()
    def extend(
        self, tokens: Tensor, valid: Tensor | None = None, logits_to_keep: int = 0, fed: list[int] | None = None
    ) -> Tensor:
        """Feed tokens [B, T] (slots where valid [B, T] is False are holes); return logits.

        logits_to_keep > 0 computes logits for the last that many slots only (prefill wants one).
        Returns [B, T or logits_to_keep, V] in the model's dtype. `fed` (real tokens per row, as the block cache
        takes them) is not needed here: `valid` says it.
        """
        if valid is None:
            valid = torch.ones_like(tokens, dtype=torch.bool)
        valid = valid.to(torch.long)
        # A real token's position is the number of real tokens before it in its row.
        positions = (self.lengths[:, None] + valid.cumsum(-1) - 1).clamp(min=0)  # [B, T]
        mask = torch.cat([self.mask, valid], dim=1)  # [B, L + T]
        T = tokens.shape[1]
        if 0 < logits_to_keep < T:
            # Positions as a tensor, not an int: transformers then gathers a contiguous [B, k, H] for the head.
            # The int form slices a strided view, and for B > 1 torch's matmul then runs the head as a bmm over
            # B expanded copies of its weight: a copy of the whole head per row, on a large vocabulary the dearest
            # part of the forward.
            logits_to_keep = torch.arange(T - logits_to_keep, T, device=tokens.device)
        attention = mask
        sdpa = getattr(self.model.config, "_attn_implementation", None) == "sdpa"
        if T == 1 and sdpa and tokens.device.type == "cpu":
            # transformers drops an all-ones mask for a one-token forward (every batch-1 step, any batch without
            # holes) and runs torch's SDPA with enable_gqa, which on CPU in bf16 is many times slower than the
            # pack_gqa path it takes for a masked batch (tests/engine/test_kv_cache.py keeps the engine on the
            # masked path). A 4-D mask is passed on as it is, so every one-token step takes the same fast path,
            # with or without holes. On CUDA the unmasked call can use the flash kernel, so it is left as it is there.
            attention = mask[:, None, None, :].bool()  # [B, 1, 1, L + 1]: attend to every real slot
        out = self.model(
            input_ids=tokens,
            attention_mask=attention,
            position_ids=positions,
            **{cache_keyword(self.model): self.cache},
            use_cache=True,
            logits_to_keep=logits_to_keep,
        )
        self.mask = mask
        self.lengths = self.lengths + valid.sum(-1)
        return out.logits

    def rollback(self, drop: Tensor) -> None:
        """Forget the newest drop[b] real tokens of each row b (drop: [B], 0 <= drop[b] <= the row's length).
        ValueError otherwise: a negative drop would count tokens the cache does not hold. The check and the
        columns left to trim are read on the host in one transfer."""
        drop = host.index(drop, self.lengths.device)
        if drop.numel() == 0:
            return
        # Rank of each real slot counted from the end of its row: 1 = newest.
        rank_from_end = self.mask.flip(-1).cumsum(-1).flip(-1)  # [B, L]
        forget = (self.mask == 1) & (rank_from_end <= drop[:, None])
        mask = self.mask.masked_fill(forget, 0)  # [B, L]
        live = mask.any(dim=0)  # [L]
        L = live.numel()
        last_live = (L - live.flip(0).long().argmax()) * live.any() if L else live.new_zeros((), dtype=torch.long)
        bad, any_drop, last_live, dead = torch.stack(
            [
                ((drop < 0) | (drop > self.lengths)).any().long(),
                drop.any().long(),
                last_live,
                (~live).sum(),
            ]
        ).tolist()  # one read
        if bad:
            raise ValueError(
                f"roll-back of {drop.tolist()} tokens from rows of {self.lengths.tolist()}: each row "
                f"can forget 0 up to its own length (to extend a row, feed it tokens)"
            )
        if not any_drop:
            return
        self.mask = mask
        self.lengths = self.lengths - drop
        self._trim(live, last_live, dead)

    def select(self, rows: Tensor) -> None:
        """Keep only the given rows, in the given order (finished sequences leave the batch)."""
        rows = host.index(rows, self.mask.device)
        if rows.numel() == 0:
            self.cache = DynamicCache(config=self.model.config)
            self.mask, self.lengths = self.mask[:0, :0], self.lengths[:0]
            return
        self.cache.batch_select_indices(rows)
        self.mask = self.mask[rows]
        self.lengths = self.lengths[rows]
        self._trim()

    def fork(self, rows: Tensor) -> KVState:
        """A new state whose row i is a copy of this state's row rows[i] (rows may repeat)."""
        rows = host.index(rows, self.mask.device)
        new = self._like(self.mask.index_select(0, rows), self.lengths.index_select(0, rows))
        for src, dst in zip(self.cache.layers, new.cache.layers, strict=False):
            if src.is_initialized:
                dst.lazy_initialization(src.keys, src.values)
                dst.keys = src.keys.index_select(0, rows)  # [N, heads, L, d]
                dst.values = src.values.index_select(0, rows)
        return new

    @staticmethod
    def concat(states: list[KVState]) -> KVState:
        """One state holding the rows of `states` in order. Narrower states get holes on the left, so every
        row's newest token stays in the last column (holes are masked: nothing else changes)."""
        kind = type(states[0]) if states else KVState
        if kind.concat is not KVState.concat:
            return kind.concat(states)  # states of a runner's own kind (new_state)
        live = [s for s in states if s.batch_size]
        if len(live) <= 1:
            return live[0] if live else states[0]
        width = max(s.mask.shape[1] for s in live)

        def left_pad(x: Tensor, dim: int) -> Tensor:
            extra = width - x.shape[dim]
            if extra == 0:
                return x
            shape = list(x.shape)
            shape[dim] = extra
            return torch.cat([x.new_zeros(shape), x], dim=dim)

        first = live[0]
        new = first._like(torch.cat([left_pad(s.mask, 1) for s in live]), torch.cat([s.lengths for s in live]))
        for i, dst in enumerate(new.cache.layers):
            srcs = [s.cache.layers[i] for s in live]
            if not all(src.is_initialized for src in srcs):
                continue
            dst.lazy_initialization(srcs[0].keys, srcs[0].values)
            dst.keys = torch.cat([left_pad(src.keys, 2) for src in srcs])  # [B, heads, width, d]
            dst.values = torch.cat([left_pad(src.values, 2) for src in srcs])
        new._trim()
        return new

    def _like(self, mask: Tensor, lengths: Tensor) -> KVState:
        new = KVState.__new__(KVState)
        new.model = self.model
        new.cache = DynamicCache(config=self.model.config)
        new.mask, new.lengths = mask, lengths
        return new

    def _trim(self, live: Tensor | None = None, last_live: int | None = None, dead: int | None = None) -> None:
        """Drop columns that are holes in every row: trailing ones always (cheap), inner ones once they are a
        quarter of the width (a copy of the cache), so the cache does not keep growing. `live` [L] (which
        columns hold a real token somewhere), the end of the last live column and the count of dead ones, when
        the caller has read them already (rollback); else they are read here."""
        if self.mask.shape[1] == 0:
            return
        if live is None:
            live = self.mask.any(dim=0)  # [L]
            last_live, dead = torch.stack(
                [(live.numel() - live.flip(0).long().argmax()) * live.any(), (~live).sum()]
            ).tolist()  # one read
        if dead == 0:
            return
        extra = self.mask.shape[1] - last_live
        if extra > 0:
            self.cache.crop(-extra)
            self.mask = self.mask[:, :last_live]
            live = live[:last_live]
            dead -= extra
        if dead and dead * 4 >= live.numel():
            keep = live.nonzero().squeeze(1)  # [L']
            for layer in self.cache.layers:
                if layer.is_initialized:
                    layer.keys = layer.keys.index_select(2, keep)
                    layer.values = layer.values.index_select(2, keep)
            self.mask = self.mask.index_select(1, keep)
