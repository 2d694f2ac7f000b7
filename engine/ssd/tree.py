"""The branch decode: pre-draft K tokens for every guessed outcome of every sequence at once.

After the glue decode the draft's cache row b holds [.., t*_prev, x_1..x_K]. Branch (b, k, t) is that row
with x_{k+1}..x_K masked as holes (exact roll-back, engine.kv_cache) followed by the guess t. The rows are
copied once per branch and all branches of all sequences advance together: K batched forwards per round
in total (feed t, y_1..y_{K−1}), never one forward per branch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from engine.kv_cache import KVState
from engine.sampling import Generators, RowSampling, sample, saguaro, warp_rows


@dataclass
class Branches:
    """K pre-drafted tokens per branch, the q they were drawn from and the draft's logits there."""

    state: KVState  # one row per branch: prefix, x_1..x_k, t, y_1..y_{K−1}
    row: Tensor  # [N] batch row of each branch
    k: Tensor  # [N] outcome k the branch assumes
    t: Tensor  # [N] guessed bonus token
    tokens: Tensor  # [N, K] y_1..y_K
    q: Tensor  # [N, K, V] float32, the (Saguaro) distribution each y_i was drawn from
    logits: Tensor  # [N, K, V] float32 draft logits at y_1..y_K (to rank the next guesses)


def draft_tokens(
    state: KVState,
    first: Tensor,
    first_valid: Tensor | None,
    K: int,
    saguaro_top: tuple[int, ...],
    C: float,
    params: RowSampling,
    generator: Generators,
    active: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Feed `first` [N, T] (holes where not valid) then draft K tokens with K forwards in total (SD's
    proposal, SSD's neural backup and its branches all draft this way).

    `params` and `generator` are per row (a branch uses its sequence's settings and random stream).
    Rows where `active` [N] is False only get holes after `first` (their results are to be ignored).
    Returns tokens [N, K], q [N, K, V] (σ_{F,C} when C < 1, n_top = saguaro_top[i] at position i+1)
    and the raw logits [N, K, V] (float32). The last token is sampled, not fed.
    """
    logits = state.extend(first, first_valid)[:, -1].float()  # [N, V]
    return draft_from(state, logits, K, saguaro_top, C, params, generator, active)


def draft_from(
    state: KVState,
    logits: Tensor,
    K: int,
    saguaro_top: tuple[int, ...],
    C: float,
    params: RowSampling,
    generator: Generators,
    active: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """`draft_tokens` once `first` is fed: `logits` [N, V] are the draft's logits after it."""
    ys, qs, zs = [], [], []
    for i in range(K):
        q = warp_rows(logits, params)  # [N, V]
        if C < 1:
            q = saguaro(q, saguaro_top[i], C)
        y = sample(q, generator)  # [N]
        ys.append(y)
        qs.append(q.float())
        zs.append(logits)
        if i < K - 1:
            valid = None if active is None else active[:, None]
            logits = state.extend(y[:, None], valid)[:, -1].float()
    return torch.stack(ys, 1), torch.stack(qs, 1), torch.stack(zs, 1)


def decode_branches(
    state: KVState,
    row: Tensor,
    k: Tensor,
    t: Tensor,
    K: int,
    saguaro_top: tuple[int, ...],
    C: float,
    params: RowSampling,
    generator: Generators,
) -> Branches:
    """Pre-draft every branch (row[i], k[i], t[i]); `state` must hold x_1..x_K of each row as its newest tokens."""
    branch_state = state.fork(row)
    branch_state.rollback(K - k)  # holes over x_{k+1}..x_K: exactly the state after x_1..x_k
    tokens, q, logits = draft_tokens(branch_state, t[:, None], None, K, saguaro_top, C, params, generator)
    return Branches(branch_state, row, k, t, tokens, q, logits)
