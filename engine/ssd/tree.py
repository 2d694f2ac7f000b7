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
from transformers import DynamicCache

from engine.kv_cache import KVState
from engine.sampling import sample, saguaro, warp
from engine.sampling_params import SamplingParams


def fork_rows(state: KVState, rows: Tensor) -> KVState:
    """A new KV state whose row i is a copy of `state`'s row rows[i] (rows may repeat)."""
    new = KVState.__new__(KVState)
    new.model = state.model
    new.cache = DynamicCache(config=state.model.config)
    for src, dst in zip(state.cache.layers, new.cache.layers):
        if src.is_initialized:
            dst.lazy_initialization(src.keys, src.values)
            dst.keys = src.keys.index_select(0, rows)  # [N, heads, L, d]
            dst.values = src.values.index_select(0, rows)
    new.mask = state.mask.index_select(0, rows)
    new.lengths = state.lengths.index_select(0, rows)
    return new


def stack_rows(parts: list[tuple[KVState, Tensor]]) -> KVState:
    """One KV state made of the given rows of several states, in order (shorter ones padded with holes)."""
    parts = [(s, r) for s, r in parts if r.numel()]
    width = max(s.mask.shape[1] for s, _ in parts)
    first = parts[0][0]
    new = KVState.__new__(KVState)
    new.model = first.model
    new.cache = DynamicCache(config=first.model.config)

    def padded(x: Tensor, rows: Tensor, dim: int) -> Tensor:
        x = x.index_select(0, rows)
        extra = width - x.shape[dim]
        if extra == 0:
            return x
        shape = list(x.shape)
        shape[dim] = extra
        return torch.cat([x, x.new_zeros(shape)], dim=dim)  # holes: masked, never attended

    for i, dst in enumerate(new.cache.layers):
        srcs = [(s.cache.layers[i], r) for s, r in parts]
        if not all(src.is_initialized for src, _ in srcs):
            continue
        dst.lazy_initialization(srcs[0][0].keys, srcs[0][0].values)
        dst.keys = torch.cat([padded(src.keys, r, 2) for src, r in srcs])
        dst.values = torch.cat([padded(src.values, r, 2) for src, r in srcs])
    new.mask = torch.cat([padded(s.mask, r, 1) for s, r in parts])
    new.lengths = torch.cat([s.lengths.index_select(0, r) for s, r in parts])
    return new


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
    params: SamplingParams,
    generator: torch.Generator,
    active: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Feed `first` [N, T] (holes where not valid) then draft K tokens with K forwards in total.

    Rows where `active` [N] is False only get holes after `first` (their results are to be ignored).
    Returns tokens [N, K], q [N, K, V] (σ_{F,C} when C < 1, n_top = saguaro_top[i] at position i+1)
    and the raw logits [N, K, V] (float32). The last token is sampled, not fed.
    """
    logits = state.extend(first, first_valid)[:, -1].float()  # [N, V]
    ys, qs, zs = [], [], []
    for i in range(K):
        q = warp(logits, params)  # [N, V]
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
    params: SamplingParams,
    generator: torch.Generator,
) -> Branches:
    """Pre-draft every branch (row[i], k[i], t[i]); `state` must hold x_1..x_K of each row as its newest tokens."""
    branch_state = fork_rows(state, row)
    branch_state.rollback(K - k)  # holes over x_{k+1}..x_K: exactly the state after x_1..x_k
    tokens, q, logits = draft_tokens(branch_state, t[:, None], None, K, saguaro_top, C, params, generator)
    return Branches(branch_state, row, k, t, tokens, q, logits)
