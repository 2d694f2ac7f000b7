"""The speculation cache: pre-drafted next speculations keyed by (sequence, k, t*) (docs/ssd.md §2).

Guesses for outcome k < K are the top F_k tokens of the draft's ranking at position k+1 with the
drafted (and, under outcome k, rejected) token x_{k+1} excluded: the residual max(0, p − q) is zero
there. For k = K they are the top F_K tokens of the draft's next-token distribution after x_K.
Ranking uses the draft's logits (ties to the lower id), so it is defined at temperature 0 too.

`bonus_ranks` measures the same ranking from the other side: where the verified bonus t* stood. With
fan-out F the outcome is in the cache exactly when its rank is below F, so one run's ranks tell what any
fan-out schedule would have hit (the empirical hit model, simulator.calibrate).
"""

from __future__ import annotations

import torch
from torch import Tensor

from engine.ssd.sparse import TopLogits, ranked_ids
from engine.ssd.tree import Branches


def guesses(logits: Tensor | TopLogits, x: Tensor, fanouts: list[tuple[int, ...]]
            ) -> tuple[Tensor, Tensor, Tensor]:
    """Branches to pre-draft: row [N], k [N], t [N].

    logits [B, K+1, V] (or their ranking, TopLogits [B, K+1, M]): the draft's logits at positions 1..K+1 of
    each row's current speculation x [B, K]; fanouts[b] = (F_0..F_K) for row b. A ranking kept to M tokens
    yields at most M guesses per position (M >= the largest fan-out + 1 in the worker).
    """
    B, K = x.shape
    most = max((max(f) for f in fanouts), default=0)
    if most == 0:
        empty = torch.empty(0, dtype=torch.long)
        return empty, empty, empty
    if isinstance(logits, Tensor):
        logits = TopLogits.of(logits, most + 1)
    top = logits.ids[..., : most + 1].tolist()  # [B][K+1] token lists, best first
    rows, ks, ts = [], [], []
    for b in range(B):
        for k in range(K + 1):
            want = fanouts[b][k]
            if want == 0:
                continue
            ranked = top[b][k]
            if k < K:
                rejected = int(x[b, k])
                ranked = [t for t in ranked if t != rejected]
            for t in ranked[:want]:
                rows.append(b)
                ks.append(k)
                ts.append(t)
    as_long = lambda v: torch.tensor(v, dtype=torch.long)  # noqa: E731
    return as_long(rows), as_long(ks), as_long(ts)


def bonus_ranks(logits: Tensor, bonus: Tensor, excluded: Tensor) -> list[int]:
    """Rank of each row's bonus token t* in the draft's ranking that `guesses` uses: logits [N, V] at the
    outcome's position (k+1), excluded [N] the rejected draft token x_{k+1} (−1 when all K were accepted).

    rank = tokens other than the excluded one that rank above t* (higher logit, or equal and a lower id),
    so `guesses` with fan-out F holds t* iff rank < F. An excluded t* (impossible after a rejection) has
    rank V, never guessed.
    """
    logits = logits.float()
    ids = torch.arange(logits.shape[-1], device=logits.device)  # [V]
    mine = logits.gather(-1, bonus[:, None])  # [N, 1]
    above = (logits > mine) | ((logits == mine) & (ids < bonus[:, None]))  # [N, V]
    rank = above.sum(-1)  # [N]
    excluded_above = above.gather(-1, excluded.clamp(min=0)[:, None])[:, 0] & (excluded >= 0)  # [N]
    rank = rank - excluded_above.long()
    return torch.where(bonus == excluded, logits.shape[-1], rank).tolist()


def ranked_top(logits: Tensor, n: int) -> list[list[list[int]]]:
    """The n best tokens of each row of logits [B, R, V], best first, equal logits in increasing id."""
    return ranked_ids(logits, n).tolist()


class SpeculationCache:
    """(sequence id, k, t*) -> index of the pre-drafted branch."""

    def __init__(self, seq_ids: list[int], branches: Branches | None):
        self.branches = branches
        self.index: dict[tuple[int, int, int], int] = {}
        if branches is not None:
            for i, (row, k, t) in enumerate(zip(branches.row.tolist(), branches.k.tolist(), branches.t.tolist())):
                self.index[(seq_ids[row], k, t)] = i

    def __len__(self) -> int:
        return len(self.index)

    def lookup(self, seq_id: int, k: int, bonus: int) -> int | None:
        return self.index.get((seq_id, k, bonus))
