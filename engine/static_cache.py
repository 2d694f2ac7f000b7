"""A preallocated KV cache with fixed row slots, for forwards of fixed shapes (engine.compiled).

Layout: per layer, keys and values [slots, kv_heads, 1 + max_len, head_dim]. Column 0 of every slot is
scratch; a row's token at position p lives in column 1 + p. A row (a sequence, or one of SSD's branches)
holds one slot while it lives: rows join into free slots and leave them, so continuous batching moves no
data; a state's rows may sit in any slots, and each forward gathers them.

Each forward writes every new token at its own row's position (a scatter), so a rejected token is simply
overwritten by the next token fed there: roll-back only lowers the row's length; nothing is copied or
cropped. Which keys a query sees is a mask built from the lengths: the token at position p sees columns
1..1 + p; a hole (a slot of the block that holds no token of its row) writes to the scratch column and sees
only that, so it never touches a row's keys and its own output, which is discarded, stays finite.

`SlotState` offers what engine.kv_cache.KVState offers the engine (extend, rollback, select, fork, concat,
lengths, batch_size), so drafting, verification and SSD's tree run on either: `select` and `concat` only
move slot numbers, `fork` copies the rows' used columns into new slots (SSD's branches). The forward itself
belongs to the runner that owns the cache (engine.compiled.SlotModel), which pads it to a bucket.
"""

from __future__ import annotations

import logging
import weakref
from typing import Protocol

import torch
from torch import Tensor
from transformers.cache_utils import Cache, CacheLayerMixin

from engine import host

log = logging.getLogger(__name__)

SCRATCH = 0  # the column every hole writes to and reads


class SlotLayer(CacheLayerMixin):
    """One layer's keys and values over all slots; `update` scatters the new tokens into their columns and
    returns the keys and values of the forward's rows up to its width."""

    is_compileable = True
    is_sliding = False

    def __init__(self, owner: SlotCache):
        super().__init__()
        self.owner = owner

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        self.allocate(self.owner.capacity, key_states, value_states)

    def allocate(self, slots: int, key_like: Tensor, value_like: Tensor) -> None:
        """(Re)allocate for `slots` slots, keeping what the first slots held."""
        columns = self.owner.max_len + 1
        keys = key_like.new_zeros(slots, key_like.shape[1], columns, key_like.shape[-1])  # [S, H, 1 + L, d]
        values = value_like.new_zeros(slots, value_like.shape[1], columns, value_like.shape[-1])
        if self.is_initialized:
            keys[: self.keys.shape[0]] = self.keys
            values[: self.values.shape[0]] = self.values
        self.keys, self.values = keys, values
        # Fixed addresses: CUDA graphs replay on these tensors (the cache is updated in place).
        torch._dynamo.mark_static_address(self.keys)
        torch._dynamo.mark_static_address(self.values)
        self.is_initialized = True

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        rows, write, width = self.owner.rows, self.owner.write, self.owner.width  # [B], [B, T], int
        heads = torch.arange(key_states.shape[1], device=key_states.device)
        at = (rows[:, None, None], heads[None, :, None], write[:, None, :])  # -> [B, H, T]
        self.keys.index_put_(at, key_states)  # key_states [B, H, T, d]
        self.values.index_put_(at, value_states)
        return self.keys[rows, :, :width], self.values[rows, :, :width]  # [B, H, W, d]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.width, 0

    def get_seq_length(self) -> int:
        return 0  # positions are always given (per row)

    def get_max_length(self) -> int:
        return self.owner.max_len


class SlotCache(Cache):
    """The transformers Cache of a slot pool: its layers, which slots are free, and what the next forward
    reads and writes (`bind`). Slot 0 is reserved for padding rows (they write its scratch column only)."""

    PAD_SLOT = 0

    def __init__(self, num_layers: int, slots: int, max_len: int):
        self.capacity = slots + 1  # + the padding slot
        self.max_len = max_len
        super().__init__(layers=[SlotLayer(self) for _ in range(num_layers)])
        self.free = list(range(self.capacity - 1, 0, -1))  # a stack: the lowest free slot is taken first
        self.returned: list[int] = []  # slots given back since the last allocation (by states' finalizers too)
        self.rows: Tensor | None = None  # [B] slots of the next forward's rows
        self.write: Tensor | None = None  # [B, T] the column each new token goes to
        self.width = max_len + 1  # columns the next forward attends over

    def bind(self, rows: Tensor, write: Tensor, width: int) -> None:
        self.rows, self.write, self.width = rows, write, width

    def allocate(self, n: int) -> list[int]:
        """n free slots (the pool grows when it has too few: a copy, and new compiled graphs, so it is sized
        ahead where the engine can tell)."""
        back, self.returned = self.returned, []  # a finalizer that runs from here on adds to the new list
        if back:
            self.free = sorted(self.free + back, reverse=True)
        if n > len(self.free):
            self._grow(max(2 * self.capacity, self.capacity + n - len(self.free)))
        keep = len(self.free) - n
        taken = self.free[keep:][::-1]  # ascending
        del self.free[keep:]
        return taken

    def release(self, slots: list[int]) -> None:
        """Give slots back. Only appends: a state's finalizer may call it from within `allocate` (the garbage
        collector runs where it likes), which then leaves the free list alone."""
        self.returned.extend(slots)

    @property
    def free_slots(self) -> int:
        return len(self.free) + len(self.returned)

    @torch.inference_mode()  # the cache's tensors were made in inference mode (the first forward)
    def copy_rows(self, source: list[int], target: list[int], columns: int) -> None:
        """Slot target[i] gets the first `columns` columns of slot source[i], in every layer."""
        for layer in self.layers:
            if layer.is_initialized:
                src = torch.tensor(source, device=layer.keys.device)
                dst = torch.tensor(target, device=layer.keys.device)
                layer.keys[:, :, :columns].index_copy_(0, dst, layer.keys[src, :, :columns])
                layer.values[:, :, :columns].index_copy_(0, dst, layer.values[src, :, :columns])

    @torch.inference_mode()
    def _grow(self, capacity: int) -> None:
        log.info("growing the static KV cache from %d to %d slots", self.capacity - 1, capacity - 1)
        for layer in self.layers:
            if layer.is_initialized:
                layer.allocate(capacity, layer.keys, layer.values)
        self.free = list(range(capacity - 1, self.capacity - 1, -1)) + self.free  # still descending
        self.capacity = capacity

    def memory_bytes(self) -> int:
        return sum(2 * layer.keys.numel() * layer.keys.element_size() for layer in self.layers if layer.is_initialized)


class Runner(Protocol):
    """What runs a state's forwards (engine.compiled.SlotModel)."""

    cache: SlotCache

    def run(
        self, rows: Tensor, tokens: Tensor, valid: Tensor, lengths: Tensor, logits_to_keep: int, need: int | None = None
    ) -> Tensor:
        """Logits [B, T or logits_to_keep, V] of tokens [B, T] fed to the rows in slots `rows` [B]; `need`: the
        columns the longest row reaches, scratch included, when the caller knows it on the host."""


def block_inputs(lengths: Tensor, valid: Tensor, width: int) -> tuple[Tensor, Tensor, Tensor]:
    """Position ids [B, T], write columns [B, T] and the attention mask [B, 1, T, width] (True = attend) of a
    block of new tokens whose valid slots [B, T] are fed after each row's `lengths` [B] tokens."""
    valid = valid.to(torch.long)
    positions = lengths[:, None] + valid.cumsum(-1) - 1  # [B, T]: a real token's position in its row
    write = torch.where(valid.bool(), positions + 1, SCRATCH)  # [B, T]
    columns = torch.arange(width, device=lengths.device)  # [W]
    sees = (columns >= 1) & (columns <= positions[:, :, None] + 1)  # [B, T, W]: itself and its row's past
    sees = torch.where(valid.bool()[:, :, None], sees, columns == SCRATCH)  # a hole sees the scratch only
    return positions.clamp(min=0), write, sees[:, None]


class SlotState:
    """A batch's rows in the slot cache: the slot of each row [B] and its length [B] (real tokens fed), kept as host
    integers (the device's copy is made when asked for), so no roll-back, selection or fork reads the device."""

    def __init__(self, runner: Runner, slots: list[int], lengths: list[int], device: torch.device):
        self.runner = runner
        self.model = runner  # as KVState.model: what the state feeds
        self.slots = slots  # owned: given back to the cache when the state is dropped (or passed on)
        self.host_lengths = list(lengths)
        self.device = torch.device(device)
        self._lengths: Tensor | None = None
        self._rows: Tensor | None = None
        weakref.finalize(self, runner.cache.release, slots)

    @classmethod
    def empty(cls, runner: Runner, batch_size: int, device: torch.device) -> SlotState:
        return cls(runner, runner.cache.allocate(batch_size), [0] * batch_size, device)

    @property
    def batch_size(self) -> int:
        return len(self.slots)

    @property
    def lengths(self) -> Tensor:
        """[B] real tokens per row on the device (made from the host's count)."""
        if self._lengths is None:
            self._lengths = host.tensor(self.host_lengths, torch.long, self.device)
        return self._lengths

    def _set_lengths(self, lengths: list[int]) -> None:
        self.host_lengths, self._lengths = lengths, None

    def rows(self) -> Tensor:
        if self._rows is None:
            self._rows = host.tensor(self.slots, torch.long, self.device)
        return self._rows

    @torch.inference_mode()
    def extend(
        self, tokens: Tensor, valid: Tensor | None = None, logits_to_keep: int = 0, fed: list[int] | None = None
    ) -> Tensor:
        """As KVState.extend: feed tokens [B, T] (holes where valid is False); logits [B, T or keep, V]. `fed`: the
        real tokens per row on the host (read from `valid` when not given)."""
        if valid is None:
            valid = torch.ones_like(tokens, dtype=torch.bool)
            fed = [tokens.shape[1]] * tokens.shape[0] if fed is None else fed
        elif fed is None:
            fed = valid.to(torch.long).sum(-1).tolist()  # a read of the device unless it is the CPU
        after = [n + f for n, f in zip(self.host_lengths, fed, strict=False)]
        logits = self.runner.run(
            self.rows(), tokens, valid, self.lengths, logits_to_keep, need=1 + max(after, default=0)
        )
        self._set_lengths(after)
        return logits

    def rollback(self, drop: Tensor | list[int]) -> None:
        """Forget the newest drop[b] tokens of each row: its length goes down, and the next tokens fed overwrite
        theirs. ValueError for a drop below 0 or above the row's length."""
        drop = drop.tolist() if isinstance(drop, Tensor) else list(drop)
        if not drop:
            return
        if any(d < 0 or d > n for d, n in zip(drop, self.host_lengths, strict=False)):
            raise ValueError(
                f"roll-back of {drop} tokens from rows of {self.host_lengths}: each row "
                f"can forget 0 up to its own length (to extend a row, feed it tokens)"
            )
        self._set_lengths([n - d for n, d in zip(self.host_lengths, drop, strict=False)])

    def select(self, rows: Tensor | list[int]) -> None:
        """Keep only the given rows, in the given order; the others' slots go back to the cache."""
        keep = rows.tolist() if isinstance(rows, Tensor) else list(rows)
        if len(set(keep)) != len(keep):
            raise ValueError(f"select keeps each row at most once, got rows {keep}: copy rows with fork")
        kept = [self.slots[i] for i in keep]
        gone = set(self.slots) - set(kept)
        self.runner.cache.release(sorted(gone))
        self.slots[:] = kept  # the list the finalizer holds
        self._set_lengths([self.host_lengths[i] for i in keep])
        self._rows = None

    def fork(self, rows: Tensor | list[int]) -> SlotState:
        """A new state whose row i is a copy of this state's row rows[i] (rows may repeat): new slots, with the
        rows' used columns copied."""
        index = rows.tolist() if isinstance(rows, Tensor) else list(rows)
        lengths = [self.host_lengths[i] for i in index]
        new = SlotState(self.runner, self.runner.cache.allocate(len(index)), lengths, self.device)
        if index:
            columns = 1 + max(lengths)
            self.runner.cache.copy_rows([self.slots[i] for i in index], new.slots, columns)
        return new

    @staticmethod
    def concat(states: list[SlotState]) -> SlotState:
        """One state holding the rows of `states` in order; they give their slots to it (and are empty after)."""
        live = [s for s in states if s.batch_size]
        if len(live) <= 1:
            return live[0] if live else states[0]
        if any(s.runner is not live[0].runner for s in live):
            raise ValueError("concat joins states of one model's slot cache only")
        slots = [slot for s in live for slot in s.slots]
        new = SlotState(live[0].runner, slots, [n for s in live for n in s.host_lengths], live[0].device)
        for s in live:
            s.slots.clear()
            s._set_lengths([])
            s._rows = None
        return new
