"""A model's KV blocks and the host's account of them (engine.blocks): reference counts, free blocks, the budget
and the prefix cache."""

from __future__ import annotations

import heapq
import logging
from collections import OrderedDict

import numpy as np
import torch
from torch import Tensor

from engine import host
from engine.blocks.layers import Binding, BlockKVCache

log = logging.getLogger(__name__)

SCRATCH = 0  # the slot every hole writes to and reads (block 0 is never handed out)
DEFAULT_BLOCK_SIZE = 16
FIRST_BLOCKS = 64  # blocks allocated at first; the pool doubles when it runs out (up to its budget)


class KVCacheFull(RuntimeError):
    """The KV cache's memory budget has no room for the blocks a forward needs."""


class BlockPool:
    """One model's KV blocks and the host's account of them: reference counts, the free blocks (lowest id first,
    so a growing row's blocks tend to lie in order), the budget, and the prefix cache.

    Prefix caching: a row's full blocks of committed tokens (its prompt once prefilled, and all of a request's tokens
    when it ends) are registered under the chained hash of their tokens. A new row whose tokens begin with a
    registered chain takes those blocks (`match`, with the tokens compared) and feeds only the rest. A block no row
    holds stays cached until its slots are needed: allocation takes free blocks first, then the least recently
    used cached ones. Cached blocks are never written (a row that would write into one copies it first), so the
    KV a row reads is the KV its own tokens give."""

    def __init__(
        self,
        num_layers: int,
        bytes_per_token: int,
        block_size: int = DEFAULT_BLOCK_SIZE,
        max_bytes: int | None = None,
        device: torch.device | str = "cpu",
        caching: bool = True,
    ):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.bytes_per_block = bytes_per_token * block_size
        self.max_blocks = None if max_bytes is None else max(2, max_bytes // max(self.bytes_per_block, 1))
        self.capacity = FIRST_BLOCKS if self.max_blocks is None else min(FIRST_BLOCKS, self.max_blocks)
        self.refs = np.zeros(self.capacity, dtype=np.int64)  # [blocks] rows (and cache entries) holding each block
        self.refs[SCRATCH] = 1 << 40  # never freed, never written by a row
        self.free = list(range(1, self.capacity))  # a heap of the free blocks (entries not in `_free` are stale)
        self._free = set(self.free)  # the free blocks
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
        return (
            self._true[..., :width]
            if self._true is not None and self._true.shape[-1] >= width
            else self._make_true(width)
        )

    def _make_true(self, width: int) -> Tensor:
        self._true = torch.ones(1, 1, 1, max(2 * width, 1024), dtype=torch.bool, device=self.device)
        return self._true[..., :width]

    # -- blocks ---------------------------------------------------------------------------------
    @property
    def used_blocks(self) -> int:
        """Blocks some row holds (a cached block no row holds is not used: it can be taken back)."""
        return self.capacity - 1 - len(self._free) - len(self.evictable)

    @property
    def available_blocks(self) -> int:
        """Blocks a new row can get now without growing the pool: free ones and cached ones no row holds."""
        return len(self._free) + len(self.evictable)

    def allocate(self, n: int, after: int | None = None) -> list[int]:
        """n blocks, each held once (KVCacheFull when the budget has no room). Free blocks go first, then the
        least recently used cached blocks that no row holds (their prefixes are forgotten).

        `after`: the last block of the row that grows. When the n blocks after it are free, those are taken, so a
        row's blocks lie in order and a one-row forward reads its keys as a view of the pool instead of gathering
        them at every layer (engine.blocks.state). Cached blocks are not taken for that: a prefix hit is worth more
        (taking them cost HumanEval prompts their shared first blocks in reports/2026-12-cpu-engine-overhead).
        """
        if after is not None:
            run = list(range(after + 1, after + 1 + n))
            if run and all(b in self._free for b in run):
                self._free.difference_update(run)  # their heap entries go stale
                self.refs[run] = 1
                return run
        if n > len(self._free):
            self._evict(n - len(self._free))  # the pool grows only when no cached block can be taken back
            if n > len(self._free):
                self._grow(n - len(self._free))
        taken = [self._pop_free() for _ in range(n)]
        self.refs[taken] = 1
        return taken

    def _pop_free(self) -> int:
        """The lowest free block, taken out of the free set."""
        while True:
            b = heapq.heappop(self.free)
            if b in self._free:
                self._free.remove(b)
                return b

    def _push_free(self, b: int) -> None:
        self._free.add(b)
        heapq.heappush(self.free, b)
        if len(self.free) > 2 * len(self._free) + 64:  # stale entries: rebuild the heap
            self.free = sorted(self._free)

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
                self._push_free(b)

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
            self._forget(b)
            self._push_free(b)

    def _forget(self, b: int) -> None:
        """Drop block b from the prefix cache (no row holds it)."""
        h = self.hash_of.pop(b)
        if self.block_of.get(h) == b:
            del self.block_of[h]
        self.tokens_of.pop(b, None)
        self.parent_of.pop(b, None)

    def _grow(self, short: int) -> None:
        want = max(2 * self.capacity, self.capacity + short)
        if self.max_blocks is not None:
            if self.capacity + short > self.max_blocks:
                raise KVCacheFull(
                    f"the KV cache needs {self.capacity + short} blocks of {self.block_size} tokens "
                    f"but its budget holds {self.max_blocks}: raise the KV cache memory or admit "
                    f"fewer tokens at once"
                )
            want = min(want, self.max_blocks)
        log.debug("growing a KV block pool from %d to %d blocks", self.capacity, want)
        self.refs = np.concatenate([self.refs, np.zeros(want - self.capacity, dtype=np.int64)])
        for b in range(self.capacity, want):
            self._push_free(b)
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
        return sum(
            2 * layer.keys.numel() * layer.keys.element_size() for layer in self.cache.layers if layer.is_initialized
        )


def bytes_per_token(model: torch.nn.Module) -> int:
    """Key and value bytes one token takes in every layer of `model` (from its config and dtype)."""
    config = model.config.get_text_config()
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    dtype = getattr(model, "dtype", torch.float32)
    if not dtype.is_floating_point:
        dtype = torch.float32
    return 2 * config.num_hidden_layers * heads * head_dim * torch.empty(0, dtype=dtype).element_size()


def host_ints(values: Tensor | list[int] | np.ndarray) -> np.ndarray:
    if isinstance(values, Tensor):
        return values.detach().to("cpu", torch.long).numpy().reshape(-1)  # a read of the device for a device tensor
    return np.asarray(values, dtype=np.int64).reshape(-1)
