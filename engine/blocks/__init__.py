"""KV in fixed-size blocks, shared by reference: the KV cache of the engine's eager forwards.

The parts: `layers` (the transformers Cache whose layers write and gather slots), `pool` (the blocks, their
reference counts, the budget and the prefix cache), `model` (a model fed through a pool), `state` (a batch's rows:
block tables and lengths) and `tree` (SSD's branches decoded as a tree over their rows).

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

from engine.blocks.model import BlockModel
from engine.blocks.pool import BlockPool, KVCacheFull
from engine.blocks.state import BlockState
from engine.blocks.tree import BlockTree

__all__ = ["BlockModel", "BlockPool", "BlockState", "BlockTree", "KVCacheFull"]
