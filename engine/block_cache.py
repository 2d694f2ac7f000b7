"""KV in fixed-size blocks, shared by reference: the KV cache of the engine's eager forwards.

Storage: per layer, keys and values [kv_heads, slots, head_dim], the slots grouped in blocks of `block_size`.
A row (a sequence, or one of SSD's branches) is a block table: logical position p lives in slot
table[p // block_size]·block_size + p % block_size. The host owns the bookkeeping as plain integers (numpy):
tables, lengths, reference counts and the free blocks, so no forward, roll-back, selection or fork reads anything
back from the device.

- A forward writes each new token into its slot and attends over its row's slots, gathered into [B, H, W, d]
  (a view, not a copy, for one row whose blocks lie in order: the common single-request case). Each token sees
  its own row's positions up to its own; a hole (a slot of the block that holds no token of its row) writes to the
  scratch slot and sees only it, so it never touches a row's keys and its discarded output stays finite.
- Roll-back lowers a row's length and gives back the blocks past it: nothing is copied, cropped or read.
- `select` keeps rows and `concat` stacks them: table rows move, no KV does.
- `fork` shares the rows' blocks (reference counts); a block is copied only when a row writes into a block that
  another row (or the prefix cache) also holds: copy-on-write, at most one partly filled block per row.

Every token sees exactly the keys and values it would see in a cache of its own row, so the logits equal those
of the row alone up to the float rounding of block shapes (as engine.kv_cache's do).
"""

from __future__ import annotations

import heapq
import logging
import weakref
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor
from transformers.cache_utils import Cache, CacheLayerMixin

from engine import host

log = logging.getLogger(__name__)

SCRATCH = 0  # the slot every hole writes to and reads (block 0 is never handed out)
DEFAULT_BLOCK_SIZE = 16
FIRST_BLOCKS = 64  # blocks allocated at first; the pool doubles when it runs out (up to its budget)


class KVCacheFull(RuntimeError):
    """The KV cache's memory budget has no room for the blocks a forward needs."""


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

    def __init__(self, pool: "BlockPool"):
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

    def __init__(self, pool: "BlockPool", num_layers: int):
        super().__init__(layers=[BlockLayer(pool) for _ in range(num_layers)])


class BlockPool:
    """One model's KV blocks and the host's account of them: reference counts, the free blocks (lowest id first,
    so a growing row's blocks tend to lie in order), the budget, and the prefix cache.

    Prefix caching: a row's full blocks of committed tokens (its prompt once prefilled, and all of a request's tokens
    when it ends) are registered under the chained hash of their tokens. A new row whose tokens begin with a
    registered chain takes those blocks (`match`, with the tokens compared) and feeds only the rest. A block no row
    holds stays cached until its slots are needed: allocation takes free blocks first, then the least recently
    used cached ones. Cached blocks are never written (a row that would write into one copies it first), so the
    KV a row reads is the KV its own tokens give."""

    def __init__(self, num_layers: int, bytes_per_token: int, block_size: int = DEFAULT_BLOCK_SIZE,
                 max_bytes: int | None = None, device: torch.device | str = "cpu", caching: bool = True):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.bytes_per_block = bytes_per_token * block_size
        self.max_blocks = None if max_bytes is None else max(2, max_bytes // max(self.bytes_per_block, 1))
        self.capacity = FIRST_BLOCKS if self.max_blocks is None else min(FIRST_BLOCKS, self.max_blocks)
        self.refs = np.zeros(self.capacity, dtype=np.int64)  # [blocks] rows (and cache entries) holding each block
        self.refs[SCRATCH] = 1 << 40  # never freed, never written by a row
        self.free = list(range(1, self.capacity))  # a heap
        # the prefix cache: full blocks known by the chained hash of their tokens (and their parent's hash)
        self.caching = caching
        self.block_of: dict[int, int] = {}  # hash -> block
        self.hash_of: dict[int, int] = {}  # block -> hash
        self.tokens_of: dict[int, tuple[int, ...]] = {}  # block -> its tokens (compared on a match)
        self.parent_of: dict[int, int] = {}  # block -> the hash of the block before it (0: the first)
        self.evictable: OrderedDict[int, None] = OrderedDict()  # cached blocks no row holds, least recent first
        self.queried_tokens = 0  # prompt tokens looked up
        self.hit_tokens = 0  # of those, found cached
        self.cache = BlockKVCache(self, num_layers)
        self.binding: Binding | None = None
        self.width = 0
        self.device = torch.device(device)
        self._columns: Tensor | None = None
        self._true: Tensor | None = None

    # -- small tensors the forwards share ----------------------------------------------------------
    def columns(self, width: int, device: torch.device) -> Tensor:
        """arange(width) on `device`, a view of one kept tensor."""
        if self._columns is None or self._columns.numel() < width:
            self._columns = torch.arange(max(2 * width, 1024), device=device)
        return self._columns[:width]

    def all_true(self, width: int) -> Tensor:
        """A [1, 1, 1, width] mask of True: one query that sees every column."""
        return self._true[..., :width] if self._true is not None and self._true.shape[-1] >= width else \
            self._make_true(width)

    def _make_true(self, width: int) -> Tensor:
        self._true = torch.ones(1, 1, 1, max(2 * width, 1024), dtype=torch.bool, device=self.device)
        return self._true[..., :width]

    # -- blocks ---------------------------------------------------------------------------------
    @property
    def used_blocks(self) -> int:
        """Blocks some row holds (a cached block no row holds is not used: it can be taken back)."""
        return self.capacity - 1 - len(self.free) - len(self.evictable)

    @property
    def available_blocks(self) -> int:
        """Blocks a new row can get now without growing the pool: free ones and cached ones no row holds."""
        return len(self.free) + len(self.evictable)

    def allocate(self, n: int) -> list[int]:
        """n blocks, each held once (KVCacheFull when the budget has no room). Free blocks go first, then the
        least recently used cached blocks that no row holds (their prefixes are forgotten)."""
        if n > len(self.free):
            self._evict(n - len(self.free))  # the pool grows only when no cached block can be taken back
            if n > len(self.free):
                self._grow(n - len(self.free))
        taken = [heapq.heappop(self.free) for _ in range(n)]
        self.refs[taken] = 1
        return taken

    def retain(self, blocks: np.ndarray) -> None:
        np.add.at(self.refs, blocks, 1)

    def release(self, blocks: np.ndarray) -> None:
        """Give back one hold on each of `blocks` (a block may repeat); blocks no one holds become free, or, when the
        prefix cache knows them, wait as the most recently used cached blocks."""
        if not len(blocks):
            return
        np.subtract.at(self.refs, blocks, 1)
        for b in np.unique(blocks[self.refs[blocks] == 0]).tolist():
            if b in self.hash_of:
                self.evictable[b] = None
                self.evictable.move_to_end(b)
            else:
                heapq.heappush(self.free, b)

    # -- the prefix cache ----------------------------------------------------------------------------
    def match(self, tokens: list[int], most: int) -> list[int]:
        """The cached blocks that hold the KV of the longest prefix of `tokens` made of full blocks, at most `most`
        tokens, each now held once more (chained hashes of the blocks' tokens; the tokens themselves are compared
        on a match). Counts the query and its hit, in tokens."""
        bs = self.block_size
        self.queried_tokens += len(tokens)
        if not self.caching:
            return []
        found, parent = [], 0
        for i in range(min(most, len(tokens)) // bs):
            part = tuple(tokens[i * bs : (i + 1) * bs])
            h = hash((parent, part))
            b = self.block_of.get(h)
            if b is None or self.tokens_of[b] != part or self.parent_of[b] != parent:
                break
            found.append(b)
            parent = h
        if found:
            for b in found:
                self.evictable.pop(b, None)
            self.retain(np.asarray(found, dtype=np.int64))
        self.hit_tokens += len(found) * bs
        return found

    def register(self, blocks: list[int], tokens: list[int]) -> None:
        """Make full blocks whose KV is that of `tokens` (blocks[i] holding tokens[i·bs:(i+1)·bs], from the first
        token of a row) findable by `match`. A prefix already cached under other blocks keeps them."""
        if not self.caching:
            return
        bs, parent = self.block_size, 0
        for i, b in enumerate(blocks[: len(tokens) // bs]):
            part = tuple(tokens[i * bs : (i + 1) * bs])
            h = hash((parent, part))
            known = self.block_of.get(h)
            if known is None and b not in self.hash_of:
                self.block_of[h], self.hash_of[b], self.tokens_of[b], self.parent_of[b] = b, h, part, parent
            elif known is not None and known != b:
                pass  # the same prefix, cached before in other blocks: those stay the ones found
            parent = h

    def _evict(self, n: int) -> None:
        """Forget the n least recently used cached blocks no row holds; they become free."""
        for _ in range(min(n, len(self.evictable))):
            b, _ = self.evictable.popitem(last=False)
            h = self.hash_of.pop(b)
            if self.block_of.get(h) == b:
                del self.block_of[h]
            self.tokens_of.pop(b, None)
            self.parent_of.pop(b, None)
            heapq.heappush(self.free, b)

    def _grow(self, short: int) -> None:
        want = max(2 * self.capacity, self.capacity + short)
        if self.max_blocks is not None:
            if self.capacity + short > self.max_blocks:
                raise KVCacheFull(f"the KV cache needs {self.capacity + short} blocks of {self.block_size} tokens "
                                  f"but its budget holds {self.max_blocks}: raise the KV cache memory or admit "
                                  f"fewer tokens at once")
            want = min(want, self.max_blocks)
        log.debug("growing a KV block pool from %d to %d blocks", self.capacity, want)
        self.refs = np.concatenate([self.refs, np.zeros(want - self.capacity, dtype=np.int64)])
        for b in range(self.capacity, want):
            heapq.heappush(self.free, b)
        self.capacity = want
        for layer in self.cache.layers:
            layer.grow(want * self.block_size)

    @torch.inference_mode()  # the layers' tensors were made in inference mode (the first forward)
    def copy_slots(self, source: np.ndarray, target: np.ndarray, device: torch.device) -> None:
        """Slot target[i] gets slot source[i]'s key and value, in every layer (copy-on-write)."""
        if not len(source):
            return
        src, dst = host.tensor(source.tolist(), torch.long, device), host.tensor(target.tolist(), torch.long, device)
        for layer in self.cache.layers:
            if layer.is_initialized:
                layer.keys.index_copy_(1, dst, layer.keys.index_select(1, src))
                layer.values.index_copy_(1, dst, layer.values.index_select(1, src))

    def memory_bytes(self) -> int:
        return sum(2 * layer.keys.numel() * layer.keys.element_size() for layer in self.cache.layers
                   if layer.is_initialized)


def bytes_per_token(model: torch.nn.Module) -> int:
    """Key and value bytes one token takes in every layer of `model` (from its config and dtype)."""
    config = model.config.get_text_config()
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    dtype = getattr(model, "dtype", torch.float32)
    if not dtype.is_floating_point:
        dtype = torch.float32
    return 2 * config.num_hidden_layers * heads * head_dim * torch.empty(0, dtype=dtype).element_size()


class BlockModel:
    """A model whose KV lives in a BlockPool: what the engine feeds on the eager path. Attribute reads other than
    its own go to the model (config, embeddings, dtype)."""

    def __init__(self, model: torch.nn.Module, device: torch.device, block_size: int = DEFAULT_BLOCK_SIZE,
                 max_bytes: int | None = None, prefix_caching: bool = True):
        from engine.kv_cache import cache_keyword
        from engine.loading.devices import model_device

        self.model = model
        self.device = model_device(model)  # where its weights are (a low-bit draft stays on the CPU)
        layers = model.config.get_text_config().num_hidden_layers
        self.pool = BlockPool(layers, bytes_per_token(model), block_size, max_bytes, self.device, prefix_caching)
        self.keyword = cache_keyword(model)
        attention = getattr(model.config, "_attn_implementation", "sdpa")
        self.additive_mask = attention == "eager"  # eager attention adds its mask; sdpa takes booleans

    def __getattr__(self, name: str):
        return getattr(self.__dict__["model"], name)

    def __call__(self, *args, **kwargs):
        """The model's own forward (with whatever cache the caller passes)."""
        return self.model(*args, **kwargs)

    def new_kv_state(self, batch_size: int, device: torch.device) -> "BlockState":
        return BlockState(self, np.zeros((batch_size, 0), dtype=np.int64), np.zeros(batch_size, dtype=np.int64))

    def forward(self, tokens: Tensor, positions: Tensor, mask: Tensor, binding: Binding, width: int,
                logits_to_keep: int) -> Tensor:
        self.pool.binding, self.pool.width = binding, width
        T = tokens.shape[1]
        if 0 < logits_to_keep < T:
            # positions as a tensor: transformers then gathers a contiguous block for the head (engine.kv_cache)
            logits_to_keep = torch.arange(T - logits_to_keep, T, device=tokens.device)
        if self.additive_mask:
            dtype = self.model.dtype
            mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)
        try:
            out = self.model(input_ids=tokens, attention_mask=mask, position_ids=positions, use_cache=True,
                             logits_to_keep=logits_to_keep, **{self.keyword: self.pool.cache})
        finally:
            self.pool.binding = None
        return out.logits


class _Rows:
    """A state's rows: its block table [B, n] (0 = no block) and lengths [B], host integers. Owned by one state
    (a finalizer gives the blocks back when the state is dropped)."""

    def __init__(self, table: np.ndarray, lengths: np.ndarray):
        self.table = table
        self.lengths = lengths

    def held(self) -> np.ndarray:
        return self.table[self.table > 0]


def _give_back(pool: BlockPool, rows: _Rows) -> None:
    pool.release(rows.held())
    rows.table = rows.table[:0]
    rows.lengths = rows.lengths[:0]


class BlockState:
    """A batch's rows in a model's block pool (the engine's CacheState on the eager path)."""

    def __init__(self, model: BlockModel, table: np.ndarray, lengths: np.ndarray):
        self.model = model
        self.pool = model.pool
        self._rows = _Rows(table, lengths)
        self._lengths_tensor: Tensor | None = None
        weakref.finalize(self, _give_back, self.pool, self._rows)

    # -- what the engine reads ------------------------------------------------------------------
    @property
    def batch_size(self) -> int:
        return len(self._rows.lengths)

    @property
    def host_lengths(self) -> list[int]:
        """Real tokens per row, on the host."""
        return self._rows.lengths.tolist()

    @property
    def lengths(self) -> Tensor:
        """[B] real tokens per row, on the device (made from the host's count when asked for)."""
        if self._lengths_tensor is None:
            self._lengths_tensor = host.tensor(self._rows.lengths.tolist(), torch.long, self.model.device)
        return self._lengths_tensor

    def _changed(self) -> None:
        self._lengths_tensor = None

    # -- forwards ---------------------------------------------------------------------------------
    @torch.inference_mode()
    def extend(self, tokens: Tensor, valid: Tensor | None = None, logits_to_keep: int = 0,
               fed: list[int] | np.ndarray | None = None) -> Tensor:
        """Feed tokens [B, T]; return logits [B, T or logits_to_keep, V].

        Each row's real tokens are its last fed[b] (holes on the left, as engine.kv_cache.right_aligned packs
        them); `fed` on the host, else read from `valid` [B, T] (a read of the device unless it is on the CPU),
        else every token is real."""
        B, T = tokens.shape
        rows, bs = self._rows, self.pool.block_size
        if B == 1 and (fed is None and valid is None or fed is not None and fed[0] == T):
            return self._extend_one_row(tokens, logits_to_keep)
        if fed is None:
            fed = np.full(B, T, dtype=np.int64) if valid is None else valid.to(torch.long).sum(-1).cpu().numpy()
        fed = np.asarray(fed, dtype=np.int64)
        if fed.shape != (B,) or (fed < 0).any() or (fed > T).any():
            raise ValueError(f"fed must give 0..{T} real tokens for each of {B} rows, got {fed.tolist()}")
        start = rows.lengths
        end = start + fed
        self._make_room(end)
        table = rows.table
        width = int(end.max()) if B else 0
        # positions and slots of the new tokens, right-aligned: token t of row b is real iff t >= T - fed[b]
        t = np.arange(T)
        real = t[None, :] >= (T - fed)[:, None]  # [B, T]
        positions = np.where(real, start[:, None] + t[None, :] - (T - fed)[:, None], 0)  # [B, T]
        write = np.where(real, table[np.arange(B)[:, None], positions // bs] * bs + positions % bs, SCRATCH)
        view = None
        if B == 1 and real.all():
            first = table[0, 0] * bs
            n = -(-width // bs)
            if n and (table[0, :n] == table[0, 0] + np.arange(n)).all():
                view = (int(first), int(first) + width)
        device = self.model.device
        if view is not None:
            packed = np.concatenate([write.reshape(-1), positions.reshape(-1)])
            on = host.upload(torch.from_numpy(packed), device)
            write_t, positions_t = on[: B * T], on[B * T :].view(B, T)
            columns = torch.arange(width, device=device)
            mask = (columns[None, :] <= positions_t[0, :, None])[None, None]  # [1, 1, T, W]
            binding = Binding(write_t, None, view)
            mask_width = width
        else:
            W = width + 1  # the row's columns, then the scratch slot (what holes see)
            n = -(-width // bs) if width else 0
            slots = (table[:, :n, None] * bs + np.arange(bs)).reshape(B, n * bs)[:, :width]  # [B, width]
            slots = np.where(np.arange(width)[None, :] < end[:, None], slots, SCRATCH)
            read = np.concatenate([slots, np.full((B, 1), SCRATCH, dtype=np.int64)], axis=1)  # [B, W]
            packed = np.concatenate([write.reshape(-1), positions.reshape(-1), real.reshape(-1).astype(np.int64),
                                     read.reshape(-1)])
            on = host.upload(torch.from_numpy(packed), device)
            n_bt = B * T
            write_t = on[:n_bt]
            positions_t = on[n_bt : 2 * n_bt].view(B, T)
            real_t = on[2 * n_bt : 3 * n_bt].view(B, T).bool()
            read_t = on[3 * n_bt :].view(B, W)
            columns = torch.arange(W, device=device)
            sees = (columns[None, None, :] <= positions_t[:, :, None]) & real_t[:, :, None]  # [B, T, W]
            sees = sees | (~real_t[:, :, None] & (columns == W - 1))  # a hole sees the scratch slot only
            mask = sees[:, None]  # [B, 1, T, W]
            binding = Binding(write_t, read_t, None)
            mask_width = W
        logits = self.model.forward(tokens, positions_t, mask, binding, mask_width, logits_to_keep)
        rows.lengths = end
        self._changed()
        return logits

    def _extend_one_row(self, tokens: Tensor, logits_to_keep: int) -> Tensor:
        """`extend` of one row without holes (a single request's every step): the same forward, its bookkeeping in
        plain integers. Its keys are a view of the pool when its blocks lie in order (the allocator hands out the
        lowest free block, so a growing row's usually do)."""
        rows, bs = self._rows, self.pool.block_size
        T = tokens.shape[1]
        start = int(rows.lengths[0])
        end = start + T
        self._make_room(np.asarray([end], dtype=np.int64))
        blocks = rows.table[0]
        n = -(-end // bs)
        write = [int(blocks[p // bs]) * bs + p % bs for p in range(start, end)]
        device = self.model.device
        on = host.tensor(write + list(range(start, end)), torch.long, device)
        positions_t = on[T:].view(1, T)
        first = int(blocks[0])
        if n == 1 or (np.diff(blocks[:n]) == 1).all():
            binding, width = Binding(on[:T], None, (first * bs, first * bs + end)), end
            if T == 1:
                mask = self.pool.all_true(end)  # [1, 1, 1, W]: the one query sees every column of its row
            else:
                columns = self.pool.columns(end, device)
                mask = (columns[None, :] <= positions_t[0, :, None])[None, None]  # [1, 1, T, W]
        else:  # the row's slots, gathered (no holes, so no scratch column is needed)
            read = (blocks[:n, None] * bs + np.arange(bs)).reshape(-1)[:end]
            binding, width = Binding(on[:T], host.upload(torch.from_numpy(read)[None], device), None), end
            columns = self.pool.columns(end, device)
            mask = (columns[None, :] <= positions_t[0, :, None])[None, None]
        logits = self.model.forward(tokens, positions_t, mask, binding, width, logits_to_keep)
        rows.lengths = np.asarray([end], dtype=np.int64)
        self._changed()
        return logits

    def _make_room(self, end: np.ndarray) -> None:
        """Blocks for every row up to `end` tokens, with a private copy of any block the new tokens go into that
        another holds (copy-on-write)."""
        rows, pool, bs = self._rows, self.pool, self.pool.block_size
        B = len(end)
        need = -(-end // bs)  # [B] blocks each row needs
        have = -(-rows.lengths // bs)
        most = max(int(need.max()) if B else 0, 1)
        if most > rows.table.shape[1]:
            rows.table = np.pad(rows.table, ((0, 0), (0, most - rows.table.shape[1])))
        # copy-on-write: a partly filled last block that someone else holds too, written into now
        partial = (rows.lengths % bs != 0) & (end > rows.lengths)
        if partial.any():
            b_rows = np.nonzero(partial)[0]
            blocks = rows.table[b_rows, rows.lengths[b_rows] // bs]
            shared = (pool.refs[blocks] > 1) | np.asarray([b in pool.hash_of for b in blocks.tolist()], dtype=bool)
            if shared.any():
                b_rows, blocks = b_rows[shared], blocks[shared]
                fresh = np.asarray(pool.allocate(len(b_rows)), dtype=np.int64)
                used = rows.lengths[b_rows] % bs
                src = np.concatenate([np.arange(u) + blk * bs for u, blk in zip(used, blocks)])
                dst = np.concatenate([np.arange(u) + blk * bs for u, blk in zip(used, fresh)])
                pool.copy_slots(src, dst, self.model.device)
                rows.table[b_rows, rows.lengths[b_rows] // bs] = fresh
                pool.release(blocks)
        short = need - have
        total = int(short.sum())
        if total > 0:
            fresh = iter(pool.allocate(total))
            for b in np.nonzero(short > 0)[0].tolist():
                for j in range(int(have[b]), int(need[b])):
                    rows.table[b, j] = next(fresh)

    def append_slots(self, source: np.ndarray) -> None:
        """Append to each row b the keys and values held in slots source[b] [B, n] (a copy on the device), as if the
        tokens they were computed for had been fed to it: what a tree branch that is kept becomes (BlockTree.take)."""
        rows, bs = self._rows, self.pool.block_size
        B, n = source.shape
        if not n:
            return
        start = rows.lengths
        end = start + n
        self._make_room(end)
        positions = start[:, None] + np.arange(n)[None, :]  # [B, n]
        target = rows.table[np.arange(B)[:, None], positions // bs] * bs + positions % bs
        self.pool.copy_slots(source.reshape(-1), target.reshape(-1), self.model.device)
        rows.lengths = end
        self._changed()

    def reuse_prefix(self, row: int, tokens: list[int], most: int) -> int:
        """Start an empty row with the cached KV of the longest prefix of `tokens` (full blocks, at most `most`
        tokens: keep at least the last token to feed, whose logits are wanted); the tokens it now holds."""
        rows = self._rows
        if rows.lengths[row]:
            raise ValueError("only an empty row takes a cached prefix")
        blocks = self.pool.match(tokens, most)
        if not blocks:
            return 0
        if rows.table.shape[1] < len(blocks):
            rows.table = np.pad(rows.table, ((0, 0), (0, len(blocks) - rows.table.shape[1])))
        rows.table[row, : len(blocks)] = blocks
        rows.lengths = rows.lengths.copy()
        rows.lengths[row] = len(blocks) * self.pool.block_size
        self._changed()
        return int(rows.lengths[row])

    def register(self, row: int, tokens: list[int]) -> None:
        """Offer the row's full blocks to the prefix cache: `tokens` are the tokens its positions hold (its first
        `length` ones are used)."""
        n = int(self._rows.lengths[row])
        if n < len(tokens):
            tokens = tokens[:n]
        full = n // self.pool.block_size
        self.pool.register(self._rows.table[row, :full].tolist(), tokens[: full * self.pool.block_size])

    def tree(self, parent: list[int], keep: list[int], steps: int) -> "BlockTree":
        """Branches over this state's rows, decoded as a tree (BlockTree): branch i continues row parent[i] after
        its first keep[i] tokens, for up to `steps` tokens."""
        return BlockTree(self, parent, keep, steps)

    # -- bookkeeping --------------------------------------------------------------------------------
    def rollback(self, drop: Tensor | list[int] | np.ndarray) -> None:
        """Forget the newest drop[b] tokens of each row (0 <= drop[b] <= its length; ValueError otherwise): its
        length goes down and blocks past it go back. Nothing on the device changes."""
        drop = _host_ints(drop)
        rows = self._rows
        if drop.shape != rows.lengths.shape:
            raise ValueError(f"roll-back needs one count per row ({len(rows.lengths)}), got {drop.tolist()}")
        if ((drop < 0) | (drop > rows.lengths)).any():
            raise ValueError(f"roll-back of {drop.tolist()} tokens from rows of {rows.lengths.tolist()}: each row "
                             f"can forget 0 up to its own length (to extend a row, feed it tokens)")
        if not drop.any():
            return
        rows.lengths = rows.lengths - drop
        keep = -(-rows.lengths // self.pool.block_size)  # [B] blocks still needed
        past = np.arange(rows.table.shape[1])[None, :] >= keep[:, None]
        gone = past & (rows.table > 0)
        if gone.any():
            self.pool.release(rows.table[gone])
            rows.table = np.where(gone, 0, rows.table)
        self._changed()

    def select(self, keep: Tensor | list[int] | np.ndarray) -> None:
        """Keep only the given rows, in the given order (each at most once); the others' blocks go back."""
        keep = _host_ints(keep)
        rows = self._rows
        if len(set(keep.tolist())) != len(keep):
            raise ValueError(f"select keeps each row at most once, got rows {keep.tolist()}: copy rows with fork")
        dropped = np.ones(len(rows.lengths), dtype=bool)
        dropped[keep] = False
        gone = rows.table[dropped]
        self.pool.release(gone[gone > 0])
        rows.table, rows.lengths = rows.table[keep], rows.lengths[keep]
        self._changed()

    def fork(self, index: Tensor | list[int] | np.ndarray) -> "BlockState":
        """A new state whose row i shares row index[i]'s blocks (rows may repeat): nothing is copied until a row
        writes into a shared block."""
        index = _host_ints(index)
        table = self._rows.table[index].copy()
        held = table[table > 0]
        self.pool.retain(held)
        return BlockState(self.model, table, self._rows.lengths[index].copy())

    @staticmethod
    def concat(states: list["BlockState"]) -> "BlockState":
        """One state holding the rows of `states` in order; they hand their blocks to it (and are empty after)."""
        live = [s for s in states if s.batch_size]
        if len(live) <= 1:
            return live[0] if live else states[0]
        if any(s.pool is not live[0].pool for s in live):
            raise ValueError("concat joins states of one model's block pool only")
        width = max(s._rows.table.shape[1] for s in live)
        table = np.concatenate([np.pad(s._rows.table, ((0, 0), (0, width - s._rows.table.shape[1]))) for s in live])
        lengths = np.concatenate([s._rows.lengths for s in live])
        for s in live:
            s._rows.table, s._rows.lengths = s._rows.table[:0], s._rows.lengths[:0]
            s._changed()
        return BlockState(live[0].model, table, lengths)

    def memory_blocks(self) -> int:
        """Blocks this state's rows hold (shared ones counted once)."""
        return len(np.unique(self._rows.held()))


class BlockTree:
    """Branches decoded as a tree over their parent rows' KV: SSD's cache build (engine.ssd.tree) without a copy of
    any row per branch.

    Branch i continues row parent[i] after its first keep[i] tokens (each branch guesses one outcome (k, t*), and
    keeps x_1..x_k of the speculation its row holds). Each `extend` feeds one token per branch. All branches of a
    row are one row of the forward, their tokens its queries: they read the row's prefix once, and a 4-D mask lets
    each see the prefix up to its own keep[i] and its own earlier tokens, nothing of its siblings'. The branches'
    keys and values go to blocks of the tree's own (branch i's token at step s in slot s of its area), so the
    parents are never written, and the prefix is gathered once per row and step, not once per branch. `take` makes
    ordinary rows of chosen branches: the parent's first keep[i] tokens, shared, and the branch's tokens, copied.

    Every query sees exactly the keys its branch would see as a row of its own, so the logits are those of the
    branch run alone, up to the float rounding of block shapes.
    """

    def __init__(self, state: BlockState, parent: list[int], keep: list[int], steps: int):
        if len(parent) != len(keep):
            raise ValueError(f"one keep per branch: {len(parent)} parents, {len(keep)} keeps")
        self.model, self.pool = state.model, state.pool
        bs = self.pool.block_size
        rows = list(dict.fromkeys(parent))  # the parent rows, in order of their first branch
        at = {r: i for i, r in enumerate(rows)}
        self.row = np.asarray([at[p] for p in parent], dtype=np.int64)  # [N] each branch's row of the tree
        self.keep = np.asarray(keep, dtype=np.int64)  # [N]
        lengths = state._rows.lengths
        if ((self.keep < 0) | (self.keep > lengths[np.asarray(parent, dtype=np.int64)])).any():
            raise ValueError("a branch can keep 0 up to its parent row's length")
        self.base = state.fork(rows)  # the parent rows, shared: later changes to `state` do not reach the tree
        longest = np.zeros(len(rows), dtype=np.int64)
        np.maximum.at(longest, self.row, self.keep)
        self.base.rollback(self.base._rows.lengths - longest)  # no row holds more than its branches read
        self.members = [np.nonzero(self.row == r)[0] for r in range(len(rows))]  # branches of each row, in order
        self.place = np.zeros(len(parent), dtype=np.int64)  # each branch's place among its row's
        for m in self.members:
            self.place[m] = np.arange(len(m))
        self.width = max((len(m) for m in self.members), default=0)  # queries per row of the forward
        self.steps = steps
        blocks = -(-steps // bs)
        self.table = np.asarray(self.pool.allocate(len(parent) * blocks), dtype=np.int64).reshape(len(parent), blocks)
        self.fed = 0
        weakref.finalize(self, self.pool.release, self.table.reshape(-1).copy())

    @property
    def batch_size(self) -> int:
        return len(self.keep)

    def slots(self, n: int) -> np.ndarray:
        """Each branch's first n tree slots [N, n]."""
        bs = self.pool.block_size
        s = np.arange(n)
        return self.table[:, s // bs] * bs + s % bs

    @torch.inference_mode()
    def extend(self, tokens: Tensor, valid: Tensor | None = None, logits_to_keep: int = 0,
               fed: list[int] | None = None) -> Tensor:
        """Feed one token per branch, tokens [N, 1] (every branch: `valid` and `fed` must mark them all real);
        logits [N, 1, V]."""
        N = self.batch_size
        if tokens.shape != (N, 1) or (fed is not None and min(fed, default=1) < 1):
            raise ValueError(f"a tree step feeds one token to each of its {N} branches, got {tuple(tokens.shape)}")
        s = self.fed
        if s >= self.steps:
            raise ValueError(f"the tree was made for {self.steps} steps")
        R, Q = len(self.members), self.width
        prefix = self.base._rows.lengths  # [R]
        bs = self.pool.block_size
        own = self.slots(s + 1)  # [N, s + 1]: each branch's tokens so far, this step's last
        # columns of row r: its prefix [0, prefix[r]), then each of its branches' s + 1 tokens, then the scratch slot
        counts = np.asarray([len(m) for m in self.members], dtype=np.int64)
        W = int((prefix + counts * (s + 1)).max()) + 1
        nb = -(-int(prefix.max()) // bs) if R else 0
        table = self.base._rows.table
        if table.shape[1] < nb:
            table = np.pad(table, ((0, 0), (0, nb - table.shape[1])))
        read = np.full((R, W), SCRATCH, dtype=np.int64)
        P = int(prefix.max()) if R else 0
        if P:
            pre = (table[:, :nb, None] * bs + np.arange(bs)).reshape(R, nb * bs)[:, :P]  # [R, P]
            read[:, :P] = np.where(np.arange(P)[None, :] < prefix[:, None], pre, SCRATCH)
        first = prefix[self.row] + self.place * (s + 1)  # [N] column of each branch's first tree token
        read[self.row[:, None], first[:, None] + np.arange(s + 1)[None, :]] = own
        sees = np.zeros((R, Q, W), dtype=bool)
        sees[:, :, W - 1] = True  # padding queries see the scratch slot only
        sees[self.row, self.place, W - 1] = False
        columns = np.arange(W)
        sees[self.row, self.place] |= columns[None, :] < self.keep[:, None]  # the prefix this branch keeps
        tree = (columns[None, :] >= first[:, None]) & (columns[None, :] <= first[:, None] + s)  # its own tokens
        sees[self.row, self.place] |= tree
        write = np.full((R, Q), SCRATCH, dtype=np.int64)
        write[self.row, self.place] = own[:, s]
        positions = np.zeros((R, Q), dtype=np.int64)
        positions[self.row, self.place] = self.keep + s
        flat = self.row * Q + self.place  # [N] each branch's query in the forward, flattened
        packed = np.concatenate([write.reshape(-1), positions.reshape(-1), read.reshape(-1), flat,
                                 sees.reshape(-1).astype(np.int64)])
        device = self.model.device
        on = host.upload(torch.from_numpy(packed), device)
        n_rq = R * Q
        write_t, positions_t = on[:n_rq], on[n_rq : 2 * n_rq].view(R, Q)
        read_t = on[2 * n_rq : 2 * n_rq + R * W].view(R, W)
        flat_t = on[2 * n_rq + R * W : 2 * n_rq + R * W + N]
        mask = on[2 * n_rq + R * W + N :].view(R, 1, Q, W).bool()
        grid = tokens.new_zeros(n_rq).index_copy_(0, flat_t, tokens.reshape(-1)).view(R, Q)
        logits = self.model.forward(grid, positions_t, mask, Binding(write_t, read_t, None), W, 0)  # [R, Q, V]
        self.fed = s + 1
        if R == 1 and Q == N:  # one row, its queries the branches in order: the logits as they are
            return logits[0][:, None]
        return logits.reshape(n_rq, -1).index_select(0, flat_t)[:, None]  # [N, 1, V]

    def rollback(self, drop) -> None:
        raise ValueError("a tree's branches are not rolled back: drop the tree, or take its branches as rows")

    def fork(self, index: Tensor | list[int] | np.ndarray) -> BlockState:
        """`take`: rows holding the chosen branches (the name the engine's states share)."""
        return self.take(index)

    def take(self, index: Tensor | list[int] | np.ndarray) -> BlockState:
        """Rows for branches index[i]: the parent's first keep tokens (shared blocks) and the branch's tokens fed so
        far (copied from the tree's slots)."""
        index = _host_ints(index)
        rows = self.base.fork(self.row[index])
        rows.rollback(rows._rows.lengths - self.keep[index])
        rows.append_slots(self.slots(self.fed)[index])
        return rows


def _host_ints(values: Tensor | list[int] | np.ndarray) -> np.ndarray:
    if isinstance(values, Tensor):
        return values.detach().to("cpu", torch.long).numpy().reshape(-1)  # a read of the device for a device tensor
    return np.asarray(values, dtype=np.int64).reshape(-1)
