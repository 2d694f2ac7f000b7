"""Compact forms of what the draft worker keeps per branch and sends per round, so its memory stays bounded.

- `SparseQ`: a draft distribution q [..., V] kept as its support. At temperature 0 (and for the lookup
  backup's point mass) the support is one token; with top-k it is at most k tokens. The dense q is rebuilt
  bit-exactly (the kept float32 values scattered into zeros) on the target, for the rows it verifies.
  Where the support is too wide to save anything (T > 0 without top-k, the random backup's uniform q),
  q stays dense: it cannot be recovered exactly from less.
- `TopLogits`: the draft's logits at a position reduced to the M best tokens in the cache's ranking order
  (higher logit first, equal logits by lower id). The speculation cache only ever needs the first F + 1 of
  that order to guess, and the rank of a verified bonus token is exact below M (reported as M beyond).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from engine import host
from engine.ranking import ranked_ids
from engine.sampling_params import SamplingParams

ENTRY_BYTES = 12  # a kept support entry: int64 id + float32 value, against 4 bytes per dense entry
RANK_DEPTH = 64  # tokens per position the ranking keeps (at least the largest fan-out + 1)


@dataclass
class SparseQ:
    """q [..., V]: `values` [..., S] at token `ids` [..., S] (zero elsewhere), or dense `values` [..., V]
    when `ids` is None."""

    V: int
    ids: Tensor | None
    values: Tensor

    @classmethod
    def of(cls, q: Tensor, width: int | None = None) -> SparseQ:
        """The support of q [..., V] (q >= 0); S = the widest row's support, narrower rows padded with zeros.
        `width`: a bound on every row's support known beforehand (`support_width`), so S is not read from q; without
        one S is read from q where reads are free (the CPU), and elsewhere q stays dense."""
        V = q.shape[-1]
        if width is not None:
            S = min(width, V) if q.numel() else 0
        elif not host.reads_are_free(q.device):
            return cls(V, None, q)  # its support is unknown, and reading it would wait for the device
        else:
            S = int((q != 0).sum(-1).max()) if q.numel() else 0
        if S * ENTRY_BYTES >= V * q.element_size():
            return cls(V, None, q)
        values, ids = torch.topk(q, S, dim=-1)  # [..., S]: every nonzero is among the S largest (q >= 0)
        return cls(V, ids, values)

    @classmethod
    def point_mass(cls, tokens: Tensor, V: int) -> SparseQ:
        """q [..., V] one-hot at `tokens` [...] (a greedy draw, or a lookup draft's proposal)."""
        return cls(V, tokens[..., None], torch.ones(*tokens.shape, 1, device=tokens.device))

    @classmethod
    def stack(cls, parts: list[SparseQ], dim: int = 1) -> SparseQ:
        """Per-position parts [N, V] stacked along `dim` into [N, K, V] (dense if any part is)."""
        V = parts[0].V
        if any(p.ids is None for p in parts):
            return cls(V, None, torch.stack([p.dense() for p in parts], dim))
        S = max(p.values.shape[-1] for p in parts)
        pad = lambda x: torch.nn.functional.pad(x, (0, S - x.shape[-1]))  # noqa: E731  ids 0 with value 0
        return cls(V, torch.stack([pad(p.ids) for p in parts], dim), torch.stack([pad(p.values) for p in parts], dim))

    @classmethod
    def cat(cls, parts: list[SparseQ]) -> SparseQ:
        """Rows of several parts, in order (dense if any part is)."""
        V = parts[0].V
        if any(p.ids is None for p in parts):
            return cls(V, None, torch.cat([p.dense() for p in parts]))
        S = max(p.values.shape[-1] for p in parts)
        pad = lambda x, S: torch.nn.functional.pad(x, (0, S - x.shape[-1]))  # noqa: E731  ids 0 with value 0
        return cls(V, torch.cat([pad(p.ids, S) for p in parts]), torch.cat([pad(p.values, S) for p in parts]))

    @property
    def shape(self) -> tuple[int, ...]:
        return (*self.values.shape[:-1], self.V)

    @property
    def device(self) -> torch.device:
        return self.values.device

    @property
    def nbytes(self) -> int:
        ids = 0 if self.ids is None else self.ids.numel() * self.ids.element_size()
        return ids + self.values.numel() * self.values.element_size()

    def dense(self) -> Tensor:
        """q [..., V]; scatter_add into zeros adds +0.0 for padding, so every kept value comes back bit-exact."""
        if self.ids is None:
            return self.values
        out = torch.zeros(self.shape, dtype=self.values.dtype, device=self.values.device)
        return out.scatter_add_(-1, self.ids, self.values)

    def rows(self, index: Tensor) -> SparseQ:
        return SparseQ(self.V, None if self.ids is None else self.ids[index], self.values[index])

    def at(self, tokens: Tensor) -> Tensor:
        """q(x) for tokens x [...] (q [..., V]): the mass each token has, without making q dense."""
        if self.ids is None:
            return self.values.gather(-1, tokens[..., None])[..., 0]
        return ((self.ids == tokens[..., None]) * self.values).sum(-1)

    def to(self, device: torch.device | str) -> SparseQ:
        """On `device` (from the host through pinned memory, without waiting: engine.host.upload)."""
        return SparseQ(
            self.V, None if self.ids is None else host.upload(self.ids, device), host.upload(self.values, device)
        )

    def __neg__(self) -> SparseQ:  # fault injection in tests: a q that is no distribution
        return SparseQ(self.V, self.ids, -self.values)


def support_width(params: list[SamplingParams]) -> int | None:
    """A bound on the support of any q drawn under these rows' settings, known without reading q: one token when
    every row is greedy, else the largest top-k when every sampled row has one (top-p only narrows it, and
    Saguaro's reweighting keeps it); None when some row samples without top-k (its support must be read)."""
    sampled = [p for p in params if not p.greedy]
    if any(p.top_k is None for p in sampled):
        return None
    return max([1] + [p.top_k for p in sampled])


@dataclass
class TopLogits:
    """The M best tokens of each position in the cache's ranking order: ids [..., M] (their logits are
    not needed: the order is all the cache and the rank use)."""

    ids: Tensor
    V: int

    @classmethod
    def of(cls, logits: Tensor, M: int) -> TopLogits:
        return cls(ranked_ids(logits, M), logits.shape[-1])

    @classmethod
    def cat(cls, parts: list[TopLogits]) -> TopLogits:
        M = min(p.ids.shape[-1] for p in parts)
        return cls(torch.cat([p.ids[..., :M] for p in parts]), parts[0].V)

    @property
    def depth(self) -> int:
        return self.ids.shape[-1]

    def rows(self, index: Tensor) -> TopLogits:
        return TopLogits(self.ids[index], self.V)

    def ranks(self, bonus: Tensor, excluded: Tensor) -> list[int]:
        """Rank of each row's bonus (ids [N, M], bonus [N], excluded [N], −1 = none): tokens other than the
        excluded one ranked above it. Exact below M − 1; a bonus outside the kept M is reported as M (its
        true rank is at least M − 1, so no fan-out the cache can use, F < M, would have held it); an excluded
        bonus gets V, as engine.drafting.bonus_ranks."""
        M = self.depth
        at = self.ids == bonus[:, None]  # [N, M]
        found = at.any(-1)
        pos = at.long().argmax(-1)  # [N] position of the bonus where found
        before = torch.arange(M, device=pos.device)[None, :] < pos[:, None]  # [N, M]
        excluded_before = ((self.ids == excluded[:, None]) & before).any(-1) & (excluded >= 0)
        rank = torch.where(found, pos - excluded_before.long(), torch.full_like(pos, M))
        return torch.where(bonus == excluded, self.V, rank).tolist()


def host_ranks(ids: np.ndarray, bonus: np.ndarray, excluded: np.ndarray, V: int) -> list[int]:
    """`TopLogits.ranks` on the host: ids [N, M] of a ranking (numpy), bonus [N], excluded [N] (−1 = none)."""
    M = ids.shape[-1]
    at = ids == bonus[:, None]  # [N, M]
    found = at.any(-1)
    pos = at.argmax(-1)  # [N] the bonus's place where found
    before = np.arange(M)[None, :] < pos[:, None]
    excluded_before = ((ids == excluded[:, None]) & before).any(-1) & (excluded >= 0)
    rank = np.where(found, pos - excluded_before, M)
    return np.where(bonus == excluded, V, rank).tolist()
