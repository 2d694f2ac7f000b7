"""The per-round messages between the target and the draft worker, and their fixed tensor layout.

Only small things cross (docs/ssd.md §2): the prompts once, then per round the outcome (k, t*) of each
sequence from the target, and from the draft the hit flags, the next K tokens per sequence and the q they
were drawn from (the verifier needs that q). No KV cache crosses.

Wire layout: an int64 header `[kind, B, K, V, n_ints, n_floats, round, 0]`, then an int64 payload of
`n_ints` values and a float64 payload of `n_floats` values, then (speculations only) q as float32
`[B, K, V]`. `decode` checks everything it can and raises `MalformedMessage` otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

import torch
from torch import Tensor

HEADER_LEN = 8


class MalformedMessage(RuntimeError):
    """A message from the other side does not have the agreed layout or values."""


class Kind(IntEnum):
    START = 1  # target -> draft: a new batch (prompts, first tokens, sampling settings)
    OUTCOME = 2  # target -> draft: (k, t*) per sequence and which sequences go on
    SPECULATION = 3  # draft -> target: next K tokens per sequence and their q
    STOP = 4  # target -> draft: shut down


class Source(IntEnum):
    """Where a sequence's speculation came from (the draft's answer per row)."""

    HIT = 0
    NEURAL = 1
    RANDOM = 2
    LOOKUP = 3


@dataclass
class Start:
    seq_ids: list[int]
    prompts: list[list[int]]
    pending: list[int]  # t*: the first token sampled by the target
    temperature: float
    top_k: int  # 0 = off
    top_p: float  # 1 = off
    seed: int
    K: int
    V: int
    kind: Kind = field(default=Kind.START, init=False)


@dataclass
class Outcome:
    round: int
    accepted: list[int]  # k per sequence
    bonus: list[int]  # t* per sequence
    alive: list[bool]  # False: the sequence finished and leaves the batch
    verify_ms: float
    K: int
    V: int
    kind: Kind = field(default=Kind.OUTCOME, init=False)


@dataclass
class Speculation:
    round: int
    source: list[Source]  # per sequence: HIT or the backup that produced it
    tokens: Tensor  # [B, K] long
    q: Tensor  # [B, K, V] float32, the distribution each token was drawn from
    backup_ms: float  # drafting on the critical path (the backup), this answer
    cache_build_ms: float  # time the draft spent building the cache that was just looked up
    branches: int  # branches in that cache
    fanout: list[int]  # F_0..F_K used for that cache (hit schedule)
    kind: Kind = field(default=Kind.SPECULATION, init=False)

    @property
    def hits(self) -> list[bool]:
        return [s is Source.HIT for s in self.source]


@dataclass
class Stop:
    kind: Kind = field(default=Kind.STOP, init=False)


Message = Start | Outcome | Speculation | Stop


def _header(kind: Kind, B: int, K: int, V: int, n_ints: int, n_floats: int, round_: int) -> Tensor:
    return torch.tensor([int(kind), B, K, V, n_ints, n_floats, round_, 0], dtype=torch.long)


def encode(msg: Message) -> list[Tensor]:
    """The tensors to send, in order; the first is always the header [HEADER_LEN] int64."""
    if isinstance(msg, Stop):
        return [_header(Kind.STOP, 0, 0, 0, 0, 0, 0)]
    if isinstance(msg, Start):
        B = len(msg.seq_ids)
        lengths = [len(p) for p in msg.prompts]
        ints = msg.seq_ids + lengths + msg.pending + [msg.top_k, msg.seed] + [t for p in msg.prompts for t in p]
        floats = [msg.temperature, msg.top_p]
        return [_header(Kind.START, B, msg.K, msg.V, len(ints), 2, 0),
                torch.tensor(ints, dtype=torch.long), torch.tensor(floats, dtype=torch.float64)]
    if isinstance(msg, Outcome):
        B = len(msg.accepted)
        ints = msg.accepted + msg.bonus + [int(a) for a in msg.alive]
        return [_header(Kind.OUTCOME, B, msg.K, msg.V, len(ints), 1, msg.round),
                torch.tensor(ints, dtype=torch.long), torch.tensor([msg.verify_ms], dtype=torch.float64)]
    if isinstance(msg, Speculation):
        B, K = msg.tokens.shape
        V = msg.q.shape[-1]
        ints = [int(s) for s in msg.source] + msg.tokens.reshape(-1).tolist() + [msg.branches] + msg.fanout
        floats = [msg.backup_ms, msg.cache_build_ms]
        return [_header(Kind.SPECULATION, B, K, V, len(ints), 2, msg.round),
                torch.tensor(ints, dtype=torch.long), torch.tensor(floats, dtype=torch.float64),
                msg.q.to(torch.float32).contiguous()]
    raise TypeError(f"not a message: {type(msg).__name__}")


def check_header(header: Tensor) -> tuple[Kind, int, int, int, int, int, int]:
    if header.shape != (HEADER_LEN,) or header.dtype != torch.long:
        raise MalformedMessage(f"header must be int64 [{HEADER_LEN}], got {header.dtype} {tuple(header.shape)}")
    kind, B, K, V, n_ints, n_floats, round_, _ = header.tolist()
    try:
        kind = Kind(kind)
    except ValueError:
        raise MalformedMessage(f"unknown message kind {kind}") from None
    if min(B, K, V, n_ints, n_floats, round_) < 0 or n_ints > 1 << 28 or n_floats > 16 or B * K * V > 1 << 34:
        raise MalformedMessage(f"implausible header {header.tolist()}")
    return kind, B, K, V, n_ints, n_floats, round_


def payload_shapes(header: Tensor) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """Shapes and dtypes of the tensors that follow a header."""
    kind, B, K, V, n_ints, n_floats, _ = check_header(header)
    if kind is Kind.STOP:
        return []
    shapes = [((n_ints,), torch.long), ((n_floats,), torch.float64)]
    if kind is Kind.SPECULATION:
        shapes.append(((B, K, V), torch.float32))
    return shapes


def _tokens_ok(values: list[int], V: int) -> bool:
    return all(0 <= t < V for t in values)


def decode(tensors: list[Tensor], expect_K: int | None = None, expect_V: int | None = None) -> Message:
    """Rebuild a message from its tensors, checking layout and values (raises MalformedMessage)."""
    kind, B, K, V, n_ints, n_floats, round_ = check_header(tensors[0])
    if kind is Kind.STOP:
        return Stop()
    if (expect_K is not None and K != expect_K) or (expect_V is not None and V != expect_V):
        raise MalformedMessage(f"message has K={K}, V={V}; expected K={expect_K}, V={expect_V}")
    ints, floats = tensors[1].tolist(), tensors[2].tolist()
    if len(ints) != n_ints or len(floats) != n_floats:
        raise MalformedMessage("payload lengths differ from the header")
    if kind is Kind.START:
        if n_ints < 3 * B + 2:
            raise MalformedMessage("START payload too short")
        seq_ids, lengths, pending = ints[:B], ints[B : 2 * B], ints[2 * B : 3 * B]
        top_k, seed = ints[3 * B], ints[3 * B + 1]
        flat = ints[3 * B + 2 :]
        if min(lengths, default=1) < 1 or sum(lengths) != len(flat) or not _tokens_ok(flat + pending, V):
            raise MalformedMessage("START prompts or tokens are inconsistent")
        prompts, at = [], 0
        for n in lengths:
            prompts.append(flat[at : at + n])
            at += n
        return Start(seq_ids, prompts, pending, floats[0], top_k, floats[1], seed, K, V)
    if kind is Kind.OUTCOME:
        if n_ints != 3 * B or n_floats != 1:
            raise MalformedMessage("OUTCOME payload has the wrong length")
        accepted, bonus, alive = ints[:B], ints[B : 2 * B], ints[2 * B :]
        if not all(0 <= k <= K for k in accepted) or not _tokens_ok(bonus, V) or not set(alive) <= {0, 1}:
            raise MalformedMessage("OUTCOME values out of range")
        return Outcome(round_, accepted, bonus, [bool(a) for a in alive], floats[0], K, V)
    # SPECULATION
    if n_ints < B + B * K + 1 or n_floats != 2 or len(tensors) != 4:
        raise MalformedMessage("SPECULATION payload has the wrong length")
    try:
        source = [Source(s) for s in ints[:B]]
    except ValueError:
        raise MalformedMessage("SPECULATION has an unknown source") from None
    tokens = torch.tensor(ints[B : B + B * K], dtype=torch.long).reshape(B, K)
    q = tensors[3]
    if q.shape != (B, K, V) or not _tokens_ok(tokens.reshape(-1).tolist(), V):
        raise MalformedMessage("SPECULATION tokens or q have the wrong shape or range")
    if B and (not bool(torch.isfinite(q).all()) or bool((q < 0).any())
              or not torch.allclose(q.sum(-1), torch.ones(B, K), atol=1e-3)):
        raise MalformedMessage("SPECULATION q is not a probability distribution")
    if B and not bool((q.gather(-1, tokens[..., None]) > 0).all()):
        raise MalformedMessage("SPECULATION has a token its own q gives probability 0")
    branches, fanout = ints[B + B * K], ints[B + B * K + 1 :]
    return Speculation(round_, source, tokens, q, floats[0], floats[1], branches, fanout)
