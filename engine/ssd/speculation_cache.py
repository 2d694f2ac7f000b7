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

from engine import host
from engine.sparse import TopLogits
from engine.ssd.tree import Branches


def guess_plan(ranking: TopLogits, x: Tensor, fanouts: list[tuple[int, ...]]) -> tuple[list[int], list[int], Tensor]:
    """Branches to pre-draft, worked out where the ranking lives: their rows and k on the host (known from the
    fan-outs alone) and their guessed tokens t [N] on the ranking's device (nothing is read back).

    ranking: TopLogits [B, K+1, M], the draft's best tokens at positions 1..K+1 of each row's speculation
    x [B, K] (on the same device); fanouts[b] = (F_0..F_K) for row b. Position k+1 < K+1 guesses the first F_k
    tokens other than x_{k+1} (at most M − 1 of them: the ranking may hold x_{k+1}), position K+1 the first
    F_K (at most M). The worker keeps M >= the largest fan-out + 1, or M = V, so each (b, k) gets exactly
    min(F_k, M − 1) or min(F_K, M) guesses whatever the tokens are.
    """
    B, K = x.shape
    ids = ranking.ids  # [B, K+1, M]
    M = ids.shape[-1]
    rows, ks, places = [], [], []
    for b in range(B):
        for k in range(K + 1):
            n = min(fanouts[b][k], M - 1 if k < K else M)
            rows += [b] * n
            ks += [k] * n
            places += range(n)
    if not rows:
        return [], [], torch.empty(0, dtype=torch.long, device=ids.device)
    excluded = torch.cat([x.to(ids.device), x.new_full((B, 1), -1, device=ids.device)], dim=1)  # [B, K+1]
    kept = ids != excluded[..., None]  # [B, K+1, M]
    order = torch.sort((~kept).to(torch.int8), dim=-1, stable=True).indices  # the kept first, in ranking order
    ranked = ids.gather(-1, order)  # [B, K+1, M]
    at = [host.tensor(v, torch.long, ids.device) for v in (rows, ks, places)]
    return rows, ks, ranked[at[0], at[1], at[2]]


def guesses(logits: Tensor | TopLogits, x: Tensor, fanouts: list[tuple[int, ...]]) -> tuple[Tensor, Tensor, Tensor]:
    """Branches to pre-draft: row [N], k [N], t [N] (`guess_plan` as tensors on the logits' device).

    logits [B, K+1, V] (or their ranking, TopLogits [B, K+1, M]): the draft's logits at positions 1..K+1 of
    each row's current speculation x [B, K]; fanouts[b] = (F_0..F_K) for row b.
    """
    most = max((max(f) for f in fanouts), default=0)
    if isinstance(logits, Tensor):
        logits = TopLogits.of(logits, most + 1)
    rows, ks, t = guess_plan(logits, x, fanouts)
    return host.tensor(rows, torch.long, t.device), host.tensor(ks, torch.long, t.device), t


class SpeculationCache:
    """(sequence id, k, t*) -> index of the pre-drafted branch. The branches stay on the draft's device; the
    index is built on the host from their rows, outcomes and guessed tokens."""

    def __init__(self, seq_ids: list[int], branches: Branches | None, keys: list[tuple[int, int, int]] = ()):
        self.branches = branches
        self.index: dict[tuple[int, int, int], int] = {}
        for i, (row, k, t) in enumerate(keys):
            self.index[(seq_ids[row], k, t)] = i

    def __len__(self) -> int:
        return len(self.index)

    def lookup(self, seq_id: int, k: int, bonus: int) -> int | None:
        return self.index.get((seq_id, k, bonus))
