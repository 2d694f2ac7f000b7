"""The speculation cache: pre-drafted next speculations keyed by (sequence, k, t*) (docs/ssd.md §2).

Guesses for outcome k < K are the top F_k tokens of the draft's ranking at position k+1 with the
drafted (and, under outcome k, rejected) token x_{k+1} excluded: the residual max(0, p − q) is zero
there. For k = K they are the top F_K tokens of the draft's next-token distribution after x_K.
Ranking uses the draft's logits (ties to the lower id), so it is defined at temperature 0 too.

engine.drafting.bonus_ranks measures the same ranking from the other side: where the verified bonus t* stood.
With fan-out F the outcome is in the cache exactly when its rank is below F, so one run's ranks tell what any
fan-out schedule would have hit (the empirical hit model, simulator.calibrate).
"""

from __future__ import annotations

import torch
from torch import Tensor

from engine.ssd.sparse import TopLogits
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
