"""SSD's branches decoded as a tree over their rows' KV (engine.blocks)."""

from __future__ import annotations

import weakref

import numpy as np
import torch
from torch import Tensor

from engine import host
from engine.blocks.layers import Binding
from engine.blocks.pool import SCRATCH, host_ints
from engine.blocks.state import BlockState


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
        self._layout: tuple[Tensor, ...] | None = None  # made at the first step (`_lay_out`)
        self._in_order = False  # every query of the forward a branch, in the branches' order (`_lay_out`)

    @property
    def batch_size(self) -> int:
        return len(self.keep)

    def slots(self, n: int) -> np.ndarray:
        """Each branch's first n tree slots [N, n]."""
        bs = self.pool.block_size
        s = np.arange(n)
        return self.table[:, s // bs] * bs + s % bs

    def _lay_out(self) -> tuple[Tensor, ...]:
        """The forward's layout for every step, made once on the host and sent in one copy: each row's columns are
        its prefix, then each of its branches' area of `steps` slots (the tokens it will feed), then the scratch
        slot. Step s differs from step 0 only in which area columns its queries see, where the write goes and the
        positions, so a step makes its mask, writes and positions on the device from these, reading nothing.

        Returns write [steps, R·Q] (the slot of each query's token at each step), positions [R, Q] (at step 0),
        read [R, W], flat [N] (each branch's query, flattened) and codes [R, 1, Q, W] (the first step at which a
        query sees a column: 0 for its kept prefix, s for its own token of step s, `steps` for never; a padding
        query sees only the scratch slot)."""
        R, Q, steps = len(self.members), self.width, self.steps
        prefix = self.base._rows.lengths  # [R]
        bs = self.pool.block_size
        own = self.slots(steps)  # [N, steps]
        counts = np.asarray([len(m) for m in self.members], dtype=np.int64)
        W = int((prefix + counts * steps).max()) + 1
        nb = -(-int(prefix.max()) // bs) if R else 0
        table = self.base._rows.table
        if table.shape[1] < nb:
            table = np.pad(table, ((0, 0), (0, nb - table.shape[1])))
        read = np.full((R, W), SCRATCH, dtype=np.int64)
        P = int(prefix.max()) if R else 0
        if P:
            pre = (table[:, :nb, None] * bs + np.arange(bs)).reshape(R, nb * bs)[:, :P]  # [R, P]
            read[:, :P] = np.where(np.arange(P)[None, :] < prefix[:, None], pre, SCRATCH)
        first = prefix[self.row] + self.place * steps  # [N] column of each branch's first tree token
        area = first[:, None] + np.arange(steps)[None, :]  # [N, steps]
        read[self.row[:, None], area] = own
        codes = np.full((R, Q, W), steps, dtype=np.int64)
        codes[:, :, W - 1] = 0  # padding queries see the scratch slot only
        codes[self.row, self.place, W - 1] = steps
        columns = np.arange(W)
        kept = columns[None, :] < self.keep[:, None]  # [N, W] the prefix each branch keeps
        codes[self.row, self.place] = np.where(kept, 0, codes[self.row, self.place])
        codes[self.row[:, None], self.place[:, None], area] = np.arange(steps)[None, :]  # its own tokens
        write = np.full((steps, R, Q), SCRATCH, dtype=np.int64)
        write[:, self.row, self.place] = own.T
        positions = np.zeros((R, Q), dtype=np.int64)
        positions[self.row, self.place] = self.keep
        flat = self.row * Q + self.place  # [N]
        self._in_order = R * Q == len(flat) and bool((flat == np.arange(len(flat))).all())
        parts = [write.reshape(-1), positions.reshape(-1), read.reshape(-1), flat, codes.reshape(-1)]
        on = host.upload(torch.from_numpy(np.concatenate(parts)), self.model.device)
        sizes = [p.size for p in parts]
        write_t, positions_t, read_t, flat_t, codes_t = torch.split(on, sizes)
        return (
            write_t.view(steps, R * Q),
            positions_t.view(R, Q),
            read_t.view(R, W),
            flat_t,
            codes_t.view(R, 1, Q, W),
        )

    @torch.inference_mode()
    def extend(
        self, tokens: Tensor, valid: Tensor | None = None, logits_to_keep: int = 0, fed: list[int] | None = None
    ) -> Tensor:
        """Feed one token per branch, tokens [N, 1] (every branch: `valid` and `fed` must mark them all real);
        logits [N, 1, V]."""
        N = self.batch_size
        if tokens.shape != (N, 1) or (fed is not None and min(fed, default=1) < 1):
            raise ValueError(f"a tree step feeds one token to each of its {N} branches, got {tuple(tokens.shape)}")
        s = self.fed
        if s >= self.steps:
            raise ValueError(f"the tree was made for {self.steps} steps")
        if self._layout is None:
            self._layout = self._lay_out()
        write, positions, read, flat, codes = self._layout
        R, Q = positions.shape
        W = read.shape[1]
        mask = codes <= s  # [R, 1, Q, W]
        grid = tokens.new_zeros(R * Q).index_copy_(0, flat, tokens.reshape(-1)).view(R, Q)
        logits = self.model.forward(grid, positions + s, mask, Binding(write[s], read, None), W, 0)  # [R, Q, V]
        self.fed = s + 1
        if self._in_order:  # every query a branch, in the branches' order: the logits as they are, not copied
            return logits.reshape(N, 1, -1)
        return logits.reshape(R * Q, -1).index_select(0, flat)[:, None]  # [N, 1, V]

    def rollback(self, drop) -> None:
        raise ValueError("a tree's branches are not rolled back: drop the tree, or take its branches as rows")

    def fork(self, index: Tensor | list[int] | np.ndarray) -> BlockState:
        """`take`: rows holding the chosen branches (the name the engine's states share)."""
        return self.take(index)

    def take(self, index: Tensor | list[int] | np.ndarray) -> BlockState:
        """Rows for branches index[i]: the parent's first keep tokens (shared blocks) and the branch's tokens fed so
        far (copied from the tree's slots)."""
        index = host_ints(index)
        rows = self.base.fork(self.row[index])
        rows.rollback(rows._rows.lengths - self.keep[index])
        rows.append_slots(self.slots(self.fed)[index])
        return rows
