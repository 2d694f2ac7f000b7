"""The branch decode: pre-draft K tokens for every guessed outcome of every sequence at once.

After the glue decode the draft's cache row b holds [.., t*_prev, x_1..x_K]. Branch (b, k, t) is that row's first
tokens up to x_k followed by the guess t. On the block KV cache (engine.blocks) the branches are decoded as
a tree over their rows: each forward has one row per sequence, whose queries are its branches' tokens, reading the
row's prefix once and, through a 4-D mask, each branch's own earlier tokens; nothing of a row is copied per
branch. (A state without blocks copies the row per branch and rolls it back.) All branches of all sequences advance
together: K batched forwards per round in total (feed t, y_1..y_{K−1}), never one forward per branch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from engine import host
from engine.checks import Checks
from engine.drafting import draft_steps
from engine.invariant import race_ranking
from engine.kv_cache import KVState
from engine.sampling import Generators, Keys, RowSampling
from engine.sparse import SparseQ, TopLogits


@dataclass
class Branches:
    """K pre-drafted tokens per branch, the q they were drawn from and the draft's ranking there.

    Nothing dense over the vocabulary is kept where it can be avoided: q as its support (one id per
    position at temperature 0), the logits only as the ranking's first M tokens (engine.sparse)."""

    state: KVState  # the branches: a BlockTree over their rows, or one row per branch (fork / take gives rows)
    row: Tensor  # [N] batch row of each branch
    k: Tensor  # [N] outcome k the branch assumes
    t: Tensor  # [N] guessed bonus token
    tokens: Tensor  # [N, K] y_1..y_K
    q: SparseQ  # [N, K, V] float32, the (Saguaro) distribution each y_i was drawn from
    ranking: TopLogits | LaterRanking  # [N, K, M] the draft's best tokens at y_1..y_K (the next round's guesses)


LATER_RANKING_BYTES = 64 * 2**20  # the most logits a cache build keeps per sequence to rank the branches that hit


@dataclass
class LaterRanking:
    """The branches' ranking, made only for the branches that are taken: the logits of each step [N, V] kept until
    then. SSD uses the ranking of a branch only when it hits (its tokens become the speculation whose outcomes the
    next cache guesses), so ranking all N branches at every step would do N/hits times the work."""

    logits: list[Tensor]  # K tensors [N, V]
    depth: int

    def rows(self, index: Tensor) -> TopLogits:
        return TopLogits.of(torch.stack([z[index] for z in self.logits], 1), self.depth)  # [n, K, M]


def draft_compact(
    state: KVState,
    first: Tensor,
    first_valid: Tensor | None,
    K: int,
    saguaro_top: tuple[int, ...],
    C: float,
    params: RowSampling,
    generator: Generators,
    depth: int,
    active: Tensor | None = None,
    width: int | None = None,
    fed: list[int] | None = None,
    active_host: list[bool] | None = None,
    checks: Checks | None = None,
    later: bool = False,
    sequences: int | None = None,
) -> tuple[Tensor, SparseQ, TopLogits | LaterRanking]:
    """Feed `first` [N, T] (holes where not valid) then draft K tokens (engine.drafting.draft_tokens, the same
    draws), keeping q as its support and the logits as their best `depth` tokens step by step, so no [N, K, V]
    tensor is built unless q itself is dense (T > 0 without top-k). Rows where `active` [N] is False only get
    holes after `first`. `width`: a bound on q's support known from the rows' settings (engine.sparse.
    support_width; None: read from q at each step). `fed` (real tokens of `first` per row) and `active_host`
    (`active` as a list) are the same facts on the host, so the cache's bookkeeping reads nothing back. Returns
    tokens [N, K], q [N, K, V] and the ranking [N, K, depth], all on the draft's device; with `later`, the ranking is
    a LaterRanking (made when rows of it are taken) unless the logits it keeps would pass LATER_RANKING_BYTES for
    each of `sequences` (default: one per row) or a row samples in the drafter-invariant mode (its ranking follows
    its race, made at each step)."""
    logits = state.extend(first, first_valid, fed=fed)[:, -1].float()  # [N, V]
    N, V = logits.shape
    ys, qs, ranks, zs = [], [], [], []
    active_fed = None if active_host is None else [1 if a else 0 for a in active_host]
    racing = [b for b, p in enumerate(params.params) if p.invariant] if isinstance(generator, Keys) else []
    kept = N * K * V * logits.element_size()
    later = later and not racing and kept <= LATER_RANKING_BYTES * (N if sequences is None else sequences)
    for i, (y, q, z, ids) in enumerate(
        draft_steps(
            state,
            logits,
            K,
            saguaro_top,
            C,
            params,
            generator,
            active,
            fed=active_fed,
            checks=checks,
            rank_depth=None if later else depth,
        )
    ):
        ys.append(y)  # ids [N, M]: the ranking, made with y when greedy
        if later:
            zs.append(z)
        else:
            if racing:  # drafter-invariant rows rank by the race at their position: the likeliest winners first
                ids[racing] = race_ranking(q.dense()[racing], generator.rows(racing).shifted(i), depth)
            ranks.append(ids)
        qs.append(q if q.ids is not None else SparseQ.of(q.values, width))
    ranking = LaterRanking(zs, min(depth, V)) if later else TopLogits(torch.stack(ranks, 1), V)
    return torch.stack(ys, 1), SparseQ.stack(qs), ranking


def decode_branches(
    state: KVState,
    row: Tensor | list[int],
    k: Tensor | list[int],
    t: Tensor,
    K: int,
    saguaro_top: tuple[int, ...],
    C: float,
    params: RowSampling,
    generator: Generators,
    depth: int,
    length: int | None = None,
    width: int | None = None,
    checks: Checks | None = None,
) -> Branches:
    """Pre-draft every branch (row[i], k[i], t[i]); `state` must hold x_1..x_K of each row as its newest tokens.
    `depth`: how many of the draft's best tokens per position to keep for the next round's guesses.
    `length`: tokens each branch drafts (default K; adaptive K may ask for another length next round)."""
    rows = row.tolist() if isinstance(row, Tensor) else list(row)  # host lists from the worker: nothing is read
    ks = k.tolist() if isinstance(k, Tensor) else list(k)
    length = K if length is None else length
    if hasattr(state, "tree"):  # the block cache: one tree over the rows, their prefixes read once (BlockTree)
        lengths = state.host_lengths
        branch_state = state.tree(rows, [lengths[r] - (K - kb) for r, kb in zip(rows, ks, strict=False)], length)
    else:  # a copy of the row per branch, rolled back to x_1..x_k
        branch_state = state.fork(rows)
        branch_state.rollback([K - kb for kb in ks])  # exactly the state after x_1..x_k
    tokens, q, ranking = draft_compact(
        branch_state,
        t[:, None],
        None,
        length,
        saguaro_top,
        C,
        params,
        generator,
        depth,
        width=width,
        checks=checks,
        later=True,
        sequences=len(set(rows)),
    )
    on = t.device
    return Branches(branch_state, host.index(row, on), host.index(k, on), t, tokens, q, ranking)
