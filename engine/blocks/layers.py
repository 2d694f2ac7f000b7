"""The transformers Cache of a block pool: its layers write each forward's new keys and values into their slots and
return the keys and values the forward's rows attend over (engine.blocks)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from torch import Tensor
from transformers.cache_utils import Cache, CacheLayerMixin

if TYPE_CHECKING:
    from engine.blocks.pool import BlockPool


@dataclass
class Binding:
    """Where the next forward's tokens go and what they read: write [B·T] slots, row-major over (row, token);
    read [B, W] slots of each row's columns, or `view` = (first, end) slots of one row whose slots lie in order."""

    write: Tensor
    read: Tensor | None
    view: tuple[int, int] | None


class BlockLayer(CacheLayerMixin):
    """One layer's keys and values over every slot; `update` writes the forward's new tokens and returns the keys
    and values its rows attend over."""

    is_compileable = False
    is_sliding = False

    def __init__(self, pool: BlockPool):
        super().__init__()
        self.pool = pool

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor, *args) -> None:
        slots = self.pool.capacity * self.pool.block_size
        H, d = key_states.shape[1], key_states.shape[-1]
        self.keys = key_states.new_zeros(H, slots, d)  # [H, S, d]
        self.values = value_states.new_zeros(H, slots, value_states.shape[-1])
        self.is_initialized = True

    def grow(self, slots: int) -> None:
        if not self.is_initialized:
            return
        keys = self.keys.new_zeros(self.keys.shape[0], slots, self.keys.shape[-1])
        values = self.values.new_zeros(self.values.shape[0], slots, self.values.shape[-1])
        keys[:, : self.keys.shape[1]] = self.keys
        values[:, : self.values.shape[1]] = self.values
        self.keys, self.values = keys, values

    def update(self, key_states: Tensor, value_states: Tensor, *args, **kwargs) -> tuple[Tensor, Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        b = self.pool.binding
        B, H, T, d = key_states.shape
        if B == 1:
            k, v = key_states[0], value_states[0]  # [H, T, d]
        else:
            k = key_states.transpose(0, 1).reshape(H, B * T, d)  # [H, B·T, d], row-major over (row, token)
            v = value_states.transpose(0, 1).reshape(H, B * T, value_states.shape[-1])
        self.keys.index_copy_(1, b.write, k)
        self.values.index_copy_(1, b.write, v)
        if b.view is not None:
            first, end = b.view
            return self.keys[None, :, first:end], self.values[None, :, first:end]  # [1, H, W, d] views
        flat = b.read.reshape(-1)  # [B·W]
        keys = self.keys.index_select(1, flat).view(H, B, -1, d).transpose(0, 1)  # [B, H, W, d]
        values = self.values.index_select(1, flat).view(H, B, -1, self.values.shape[-1]).transpose(0, 1)
        return keys, values

    def get_mask_sizes(self, *args, **kwargs) -> tuple[int, int]:
        return self.pool.width, 0

    def get_seq_length(self, *args) -> int:
        return 0  # positions are always given (per row)

    def get_max_length(self) -> int:
        return -1


class BlockKVCache(Cache):
    """The transformers Cache of a block pool (its layers read the pool's binding of the next forward)."""

    def __init__(self, pool: BlockPool, num_layers: int):
        super().__init__(layers=[BlockLayer(pool) for _ in range(num_layers)])
