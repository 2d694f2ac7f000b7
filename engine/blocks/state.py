"""A batch's rows in a model's block pool: block tables and lengths on the host (engine.blocks)."""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from engine import host
from engine.blocks.layers import Binding
from engine.blocks.pool import SCRATCH, BlockPool, host_ints

if TYPE_CHECKING:
    from engine.blocks.model import BlockModel
    from engine.blocks.tree import BlockTree


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
    def extend(
        self,
        tokens: Tensor,
        valid: Tensor | None = None,
        logits_to_keep: int = 0,
        fed: list[int] | np.ndarray | None = None,
    ) -> Tensor:
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
            packed = np.concatenate(
                [write.reshape(-1), positions.reshape(-1), real.reshape(-1).astype(np.int64), read.reshape(-1)]
            )
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
        if blocks[:n].tolist() == list(range(first, first + n)):
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
        if B == 1 and self._make_room_one_row(int(end[0])):
            return
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
                src = np.concatenate([np.arange(u) + blk * bs for u, blk in zip(used, blocks, strict=True)])
                dst = np.concatenate([np.arange(u) + blk * bs for u, blk in zip(used, fresh, strict=True)])
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

    def _make_room_one_row(self, end: int) -> bool:
        """`_make_room` of one row in plain integers, unless the new tokens go into a block another holds (then
        False: the general path copies it)."""
        rows, pool, bs = self._rows, self.pool, self.pool.block_size
        length = int(rows.lengths[0])
        if length % bs and end > length:
            block = int(rows.table[0, length // bs])
            if pool.refs[block] > 1 or block in pool.hash_of:
                return False
        need, have = -(-end // bs), -(-length // bs)
        if max(need, 1) > rows.table.shape[1]:
            rows.table = np.pad(rows.table, ((0, 0), (0, max(need, 1) - rows.table.shape[1])))
        if need > have:  # after the row's last block where those are free: its blocks in order
            rows.table[0, have:need] = pool.allocate(need - have, after=int(rows.table[0, have - 1]) if have else None)
        return True

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

    def tree(self, parent: list[int], keep: list[int], steps: int) -> BlockTree:
        """Branches over this state's rows, decoded as a tree (BlockTree): branch i continues row parent[i] after
        its first keep[i] tokens, for up to `steps` tokens."""
        from engine.blocks.tree import BlockTree

        return BlockTree(self, parent, keep, steps)

    # -- bookkeeping --------------------------------------------------------------------------------
    def rollback(self, drop: Tensor | list[int] | np.ndarray) -> None:
        """Forget the newest drop[b] tokens of each row (0 <= drop[b] <= its length; ValueError otherwise): its
        length goes down and blocks past it go back. Nothing on the device changes."""
        drop = host_ints(drop)
        rows = self._rows
        if drop.shape != rows.lengths.shape:
            raise ValueError(f"roll-back needs one count per row ({len(rows.lengths)}), got {drop.tolist()}")
        if ((drop < 0) | (drop > rows.lengths)).any():
            raise ValueError(
                f"roll-back of {drop.tolist()} tokens from rows of {rows.lengths.tolist()}: each row "
                f"can forget 0 up to its own length (to extend a row, feed it tokens)"
            )
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
        keep = host_ints(keep)
        rows = self._rows
        if len(set(keep.tolist())) != len(keep):
            raise ValueError(f"select keeps each row at most once, got rows {keep.tolist()}: copy rows with fork")
        dropped = np.ones(len(rows.lengths), dtype=bool)
        dropped[keep] = False
        gone = rows.table[dropped]
        self.pool.release(gone[gone > 0])
        rows.table, rows.lengths = rows.table[keep], rows.lengths[keep]
        self._changed()

    def fork(self, index: Tensor | list[int] | np.ndarray) -> BlockState:
        """A new state whose row i shares row index[i]'s blocks (rows may repeat): nothing is copied until a row
        writes into a shared block."""
        index = host_ints(index)
        table = self._rows.table[index].copy()
        held = table[table > 0]
        self.pool.retain(held)
        return BlockState(self.model, table, self._rows.lengths[index].copy())

    @staticmethod
    def concat(states: list[BlockState]) -> BlockState:
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
