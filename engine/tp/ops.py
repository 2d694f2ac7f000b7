"""What every rank of a tensor-parallel target does to its KV states, as messages: rank 0 sends each operation
to the other ranks and applies it itself, so every rank holds the same states (each over its own shard of
the heads) and runs every forward, with its collectives, at the same time.

A state is known on every rank by the id rank 0 gave it. Its roll-backs, selections, forks and joins are
engine.kv_cache.KVState's own, which depend only on their inputs, so the ranks' states stay identical in
everything but the heads they hold. States rank 0 dropped travel as `freed` with the next operation.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from engine.kv_cache import KVState


@dataclass
class NewState:
    sid: int
    batch_size: int


@dataclass
class Extend:
    sid: int
    tokens: Tensor  # [B, T]
    valid: Tensor | None  # [B, T]
    logits_to_keep: int


@dataclass
class Rollback:
    sid: int
    drop: Tensor  # [B]


@dataclass
class Select:
    sid: int
    rows: Tensor  # [B']


@dataclass
class Fork:
    sid: int
    new: int
    rows: Tensor  # [N]


@dataclass
class Concat:
    sids: list[int]
    new: int


@dataclass
class Stop:
    """Rank 0 closes: the other ranks leave their loop."""


Op = NewState | Extend | Rollback | Select | Fork | Concat | Stop


@dataclass
class Envelope:
    """One message from rank 0: an operation, and the states dropped since the last one (tensors on the CPU)."""

    op: Op
    freed: list[int] = field(default_factory=list)


def on_cpu(op: Op) -> Op:
    """`op` with its tensors on the CPU, as it travels (each rank moves them to its own device)."""
    moved = {name: value.cpu() if isinstance(value, Tensor) else value for name, value in vars(op).items()}
    return type(op)(**moved)


def apply(
    envelope: Envelope, states: dict[int, KVState], model: torch.nn.Module, device: torch.device
) -> Tensor | None:
    """Apply one message to this rank's states; an Extend returns the logits (rank 0 uses them)."""
    for sid in envelope.freed:
        states.pop(sid, None)
    op = envelope.op
    here = lambda t: None if t is None else t.to(device)  # noqa: E731
    if isinstance(op, NewState):
        states[op.sid] = KVState(model, op.batch_size, device)
    elif isinstance(op, Extend):
        return states[op.sid].extend(here(op.tokens), here(op.valid), op.logits_to_keep)
    elif isinstance(op, Rollback):
        states[op.sid].rollback(here(op.drop))
    elif isinstance(op, Select):
        states[op.sid].select(here(op.rows))
    elif isinstance(op, Fork):
        states[op.new] = states[op.sid].fork(here(op.rows))
    elif isinstance(op, Concat):
        states[op.new] = KVState.concat([states[s] for s in op.sids])
    return None
