"""The per-round messages between the target and the draft worker, and their fixed tensor layout.

Only small things cross (docs/ssd.md §2): a sequence's prompt once, when it joins the batch (or just before: a
PREFILL message while the target prefills it), then per round the outcome (k, t*) of each sequence from the
target, and from the draft the hit flags, the next K tokens per sequence and the q they were drawn from (the
verifier needs that q). No KV cache crosses.

Wire layout: an int64 header `[kind, B, K, V, n_ints, n_floats, round, S]`, then an int64 payload of
`n_ints` values and a float64 payload of `n_floats` values, then (speculations only) q: as its support,
ids int64 `[B, K, S]` and values float32 `[B, K, S]` when S > 0 (one id per position at temperature 0, at
most k with top-k: engine.sparse.SparseQ), else dense float32 `[B, K, V]`. The transport packs these
into one or two transfers (engine.ssd.transport). The strategy rebuilds the dense q bit-exactly for the
verifier, once; `decode` checks q on the form it crossed in, and everything else it can, and raises
`MalformedMessage` otherwise.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum

import torch
from torch import Tensor

from engine.sparse import SparseQ

HEADER_LEN = 8


class MalformedMessage(RuntimeError):
    """A message from the other side does not have the agreed layout or values."""


class Kind(IntEnum):
    ROUND = 1  # target -> draft: outcomes (k, t*) of the last speculation, who leaves, who joins
    SPECULATION = 3  # draft -> target: next K tokens per sequence and their q
    STOP = 4  # target -> draft: shut down
    PREFILL = 5  # target -> draft, no answer: prompts about to join, to prefill while the target prefills them
    KEEP_ALIVE = 6  # target -> draft, no answer: the link is up (an idle receive waits in slices: transport)


class Source(IntEnum):
    """Where a sequence's speculation came from (the draft's answer per row)."""

    HIT = 0
    NEURAL = 1
    RANDOM = 2
    LOOKUP = 3


@dataclass
class Join:
    """A sequence that enters the batch: its prompt, first token and sampling settings."""

    seq_id: int
    prompt: list[int]
    pending: int  # t*: the first token, sampled by the target from the prefill
    temperature: float
    top_k: int  # 0 = off
    top_p: float  # 1 = off
    seed: int  # the request's seed, which keys every random number the draft uses for it
    invariant: bool = False  # drafter-invariant sampling (engine.invariant): the draft runs the target's race


@dataclass
class Round:
    """One exchange: the outcome of every row of the last speculation (in its order), whether the row goes
    on, and the sequences that join after them. The reply speculates for the rows that go on, then the
    joiners, in that order."""

    round: int  # 0 for the first exchange, then the number of the decode round whose outcome this carries
    accepted: list[int]  # k per row of the last speculation
    bonus: list[int]  # t* per row
    alive: list[bool]  # False: the sequence finished (or was aborted) and leaves the batch
    verify_ms: float
    joins: list[Join]
    K: int  # length of the speculation asked for now
    V: int
    # Adaptive K: the length of the speculation before (the one whose outcomes these are) and the length the
    # worker pre-drafts its cache branches at, for the next round (None: K; the target then asks for exactly
    # that K, so a cached branch always has the asked length). Both are fixed from past rounds only.
    K_last: int | None = None
    K_next: int | None = None
    # Adaptive K: the length the worker may answer with instead of K when no row hits and its backup is the
    # neural draft (that round costs K draft forwards on the critical path, as in SD, so SD's best length
    # applies; None: K). Fixed from past rounds too: whether a row hits depends on verified outcomes only.
    K_miss: int | None = None
    kind: Kind = field(default=Kind.ROUND, init=False)

    def __post_init__(self) -> None:
        self.K_last = self.K if self.K_last is None else self.K_last
        self.K_next = self.K if self.K_next is None else self.K_next
        self.K_miss = self.K if self.K_miss is None else self.K_miss


@dataclass
class Speculation:
    round: int
    source: list[Source]  # per sequence: HIT or the backup that produced it
    tokens: Tensor  # [B, K] long
    q: SparseQ  # [B, K, V] float32, the distribution each token was drawn from (as its support where narrow)
    backup_ms: float  # drafting on the critical path (the backup), this answer
    cache_build_ms: float  # time the draft spent building the cache that was just looked up
    branches: int  # branches in that cache
    fanout: list[int]  # F_0..F_K used for that cache (hit schedule)
    ranks: list[int] = field(default_factory=list)  # per row of the last round: its bonus's rank (−1: unknown)
    kind: Kind = field(default=Kind.SPECULATION, init=False)

    @property
    def hits(self) -> list[bool]:
        return [s is Source.HIT for s in self.source]


@dataclass
class Stop:
    kind: Kind = field(default=Kind.STOP, init=False)


@dataclass
class Prefill:
    """Prompts the target is about to prefill; the worker prefills their draft side meanwhile and keeps it for the
    Round that brings them as joins (a prompt that never joins is dropped with the next Round). No answer."""

    seq_ids: list[int]
    prompts: list[list[int]]
    V: int
    kind: Kind = field(default=Kind.PREFILL, init=False)


@dataclass
class KeepAlive:
    """Nothing to do: sent on an idle link so that the peer's receive, which waits no longer than the link's
    timeout at a time, gets a message and waits again (engine.ssd.transport). Never reaches the worker's loop."""

    kind: Kind = field(default=Kind.KEEP_ALIVE, init=False)


Message = Round | Speculation | Stop | Prefill | KeepAlive


def _header(kind: Kind, B: int, K: int, V: int, n_ints: int, n_floats: int, round_: int, S: int = 0) -> Tensor:
    return torch.tensor([int(kind), B, K, V, n_ints, n_floats, round_, S], dtype=torch.long)


def encode(msg: Message) -> list[Tensor]:
    """The tensors to send, in order; the first is always the header [HEADER_LEN] int64."""
    if isinstance(msg, Stop):
        return [_header(Kind.STOP, 0, 0, 0, 0, 0, 0)]
    if isinstance(msg, KeepAlive):
        return [_header(Kind.KEEP_ALIVE, 0, 0, 0, 0, 0, 0)]
    if isinstance(msg, Prefill):
        ints = msg.seq_ids + [len(p) for p in msg.prompts] + [t for p in msg.prompts for t in p]
        return [
            _header(Kind.PREFILL, len(msg.seq_ids), 0, msg.V, len(ints), 0, 0),
            torch.tensor(ints, dtype=torch.long),
        ]
    if isinstance(msg, Round):
        B, J = len(msg.accepted), len(msg.joins)
        j = msg.joins
        ints = (
            msg.accepted
            + msg.bonus
            + [int(a) for a in msg.alive]
            + [msg.K_last, msg.K_next, msg.K_miss, J]
            + [x.seq_id for x in j]
            + [len(x.prompt) for x in j]
            + [x.pending for x in j]
            + [x.top_k for x in j]
            + [x.seed for x in j]
            + [int(x.invariant) for x in j]
            + [t for x in j for t in x.prompt]
        )
        floats = [msg.verify_ms] + [x.temperature for x in j] + [x.top_p for x in j]
        return [
            _header(Kind.ROUND, B, msg.K, msg.V, len(ints), len(floats), msg.round),
            torch.tensor(ints, dtype=torch.long),
            torch.tensor(floats, dtype=torch.float64),
        ]
    if isinstance(msg, Speculation):
        B, K = msg.tokens.shape
        q = msg.q
        ints = (
            [int(s) for s in msg.source]
            + msg.tokens.reshape(-1).tolist()
            + [msg.branches, len(msg.ranks)]
            + msg.ranks
            + msg.fanout
        )
        floats = [msg.backup_ms, msg.cache_build_ms]
        values = q.values.to(torch.float32).contiguous()
        S = 0 if q.ids is None else values.shape[-1]
        if q.ids is not None and S == 0:  # an empty batch: nothing to send either way
            q = SparseQ(q.V, None, torch.zeros(B, K, q.V))
            values = q.values
        head = [
            _header(Kind.SPECULATION, B, K, q.V, len(ints), 2, msg.round, S),
            torch.tensor(ints, dtype=torch.long),
            torch.tensor(floats, dtype=torch.float64),
        ]
        return head + ([values] if S == 0 else [q.ids.to(torch.long).contiguous(), values])
    raise TypeError(f"not a message: {type(msg).__name__}")


def check_header(header: Tensor) -> tuple[Kind, int, int, int, int, int, int]:
    if header.shape != (HEADER_LEN,) or header.dtype != torch.long:
        raise MalformedMessage(f"header must be int64 [{HEADER_LEN}], got {header.dtype} {tuple(header.shape)}")
    kind, B, K, V, n_ints, n_floats, round_, S = header.tolist()
    try:
        kind = Kind(kind)
    except ValueError:
        raise MalformedMessage(f"unknown message kind {kind}") from None
    if (
        min(B, K, V, n_ints, n_floats, round_, S) < 0
        or S > V
        or n_ints > 1 << 28
        or n_floats > 1 << 20
        or B * K * V > 1 << 34
    ):
        raise MalformedMessage(f"implausible header {header.tolist()}")
    return kind, B, K, V, n_ints, n_floats, round_


def payload_shapes(header: Tensor) -> list[tuple[tuple[int, ...], torch.dtype]]:
    """Shapes and dtypes of the tensors that follow a header."""
    kind, B, K, V, n_ints, n_floats, _ = check_header(header)
    if kind in (Kind.STOP, Kind.KEEP_ALIVE):
        return []
    if kind is Kind.PREFILL:
        return [((n_ints,), torch.long)]
    shapes = [((n_ints,), torch.long), ((n_floats,), torch.float64)]
    S = int(header[-1])
    if kind is Kind.SPECULATION and S:
        shapes += [((B, K, S), torch.long), ((B, K, S), torch.float32)]
    elif kind is Kind.SPECULATION:
        shapes.append(((B, K, V), torch.float32))
    return shapes


def _tokens_ok(values: list[int], V: int) -> bool:
    return all(0 <= t < V for t in values)


def _prefill(ints: list[int], J: int, V: int, n_ints: int) -> Prefill:
    if len(ints) != n_ints or n_ints < 2 * J:
        raise MalformedMessage("PREFILL payload has the wrong length")
    seq_ids, lengths, flat = ints[:J], ints[J : 2 * J], ints[2 * J :]
    if min(lengths, default=1) < 1 or sum(lengths) != len(flat) or not _tokens_ok(flat, V):
        raise MalformedMessage("PREFILL prompts are inconsistent")
    prompts, at = [], 0
    for n in lengths:
        prompts.append(flat[at : at + n])
        at += n
    return Prefill(seq_ids, prompts, V)


def _round(ints: list[int], floats: list[float], B: int, K: int, V: int, round_: int) -> Round:
    if len(ints) < 3 * B + 4:
        raise MalformedMessage("ROUND payload too short")
    accepted, bonus, alive = ints[:B], ints[B : 2 * B], ints[2 * B : 3 * B]
    K_last, K_next, K_miss, J = ints[3 * B : 3 * B + 4]
    if J < 0 or len(ints) < 3 * B + 4 + 6 * J or len(floats) != 1 + 2 * J:
        raise MalformedMessage("ROUND joins do not match the payload")
    if K < 1 or K_last < 1 or K_next < 1 or not 1 <= K_miss <= K:
        raise MalformedMessage(
            f"ROUND lengths K={K}, K_last={K_last}, K_next={K_next}, K_miss={K_miss}: each must "
            f"be >= 1, and K_miss <= K"
        )
    if not all(0 <= k <= K_last for k in accepted) or not _tokens_ok(bonus, V) or not set(alive) <= {0, 1}:
        raise MalformedMessage("ROUND outcome values out of range")
    at = 3 * B + 4
    seq_ids, lengths, pending, top_k, seeds, invariant = (ints[at + i * J : at + (i + 1) * J] for i in range(6))
    flat = ints[at + 6 * J :]
    if not set(invariant) <= {0, 1}:
        raise MalformedMessage("ROUND joining sampling modes out of range")
    if min(lengths, default=1) < 1 or sum(lengths) != len(flat) or not _tokens_ok(flat + pending, V):
        raise MalformedMessage("ROUND joining prompts or tokens are inconsistent")
    temps, top_p = floats[1 : 1 + J], floats[1 + J :]
    joins, offset = [], 0
    for i in range(J):
        prompt = flat[offset : offset + lengths[i]]
        offset += lengths[i]
        joins.append(Join(seq_ids[i], prompt, pending[i], temps[i], top_k[i], top_p[i], seeds[i], bool(invariant[i])))
    return Round(round_, accepted, bonus, [bool(a) for a in alive], floats[0], joins, K, V, K_last, K_next, K_miss)


def _check_q(q: SparseQ, tokens: Tensor) -> None:
    """q [B, K, V] is a distribution that gives each drawn token mass, checked on the form it crossed in: a dense
    [B, K, V] mask per check cost ~8 ms a round at B = 4, V = 151936 on one CPU core. The support's values are
    scattered-added into zeros by SparseQ.dense, so its row sums and its mass at a token are those of q."""
    values = q.values  # [B, K, S] or [B, K, V]
    if not values.numel():
        return
    # amin is NaN where any value is (a NaN fails `>= 0`); with every value >= 0, an inf makes its row sum inf
    if not float(values.amin()) >= 0 or not torch.allclose(values.sum(-1), torch.ones(values.shape[:-1]), atol=1e-3):
        raise MalformedMessage("SPECULATION q is not a probability distribution")
    if q.ids is None:
        mass = values.gather(-1, tokens[..., None])[..., 0] > 0  # [B, K]
    else:
        mass = ((q.ids == tokens[..., None]) & (values > 0)).any(-1)  # [B, K]: values >= 0, so any > 0 is mass
    if not bool(mass.all()):
        raise MalformedMessage("SPECULATION has a token its own q gives probability 0")


def decode(
    tensors: list[Tensor], expect_K: int | tuple[int, ...] | None = None, expect_V: int | None = None
) -> Message:
    """Rebuild a message from its tensors, checking layout and values (raises MalformedMessage). `expect_K`:
    the length, or the lengths, the message may have (None: any)."""
    kind, B, K, V, n_ints, n_floats, round_ = check_header(tensors[0])
    if kind is Kind.STOP:
        return Stop()
    if kind is Kind.KEEP_ALIVE:
        return KeepAlive()
    if kind is Kind.PREFILL:
        return _prefill(tensors[1].tolist(), B, V, n_ints)
    allowed = (expect_K,) if isinstance(expect_K, int) else expect_K
    if (allowed is not None and K not in allowed) or (expect_V is not None and V != expect_V):
        raise MalformedMessage(f"message has K={K}, V={V}; expected K={expect_K}, V={expect_V}")
    ints, floats = tensors[1].tolist(), tensors[2].tolist()
    if len(ints) != n_ints or len(floats) != n_floats:
        raise MalformedMessage("payload lengths differ from the header")
    if kind is Kind.ROUND:
        return _round(ints, floats, B, K, V, round_)
    # SPECULATION
    S = int(tensors[0][-1])
    if n_ints < B + B * K + 2 or n_floats != 2 or len(tensors) != (5 if S else 4):
        raise MalformedMessage("SPECULATION payload has the wrong length")
    try:
        source = [Source(s) for s in ints[:B]]
    except ValueError:
        raise MalformedMessage("SPECULATION has an unknown source") from None
    tokens = torch.tensor(ints[B : B + B * K], dtype=torch.long).reshape(B, K)
    if not _tokens_ok(tokens.reshape(-1).tolist(), V):
        raise MalformedMessage("SPECULATION tokens out of range")
    if S:
        ids, values = tensors[3], tensors[4]
        if ids.shape != (B, K, S) or values.shape != (B, K, S) or ids.dtype != torch.long:
            raise MalformedMessage("SPECULATION support has the wrong shape")
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= V):
            raise MalformedMessage("SPECULATION support ids out of range")
        sparse = SparseQ(V, ids, values)
    else:
        sparse = SparseQ(V, None, tensors[3])
    if sparse.values.shape != (B, K, S or V) or sparse.values.dtype != torch.float32:
        raise MalformedMessage("SPECULATION q has the wrong shape or type")
    _check_q(sparse, tokens)
    at = B + B * K
    branches, R = ints[at], ints[at + 1]
    if R < 0 or n_ints < at + 2 + R or min(ints[at + 2 : at + 2 + R], default=0) < -1:
        raise MalformedMessage("SPECULATION ranks do not match the payload")
    ranks, fanout = ints[at + 2 : at + 2 + R], ints[at + 2 + R :]
    return Speculation(round_, source, tokens, sparse, floats[0], floats[1], branches, fanout, ranks)
