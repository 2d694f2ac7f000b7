"""Drafting: the draft model proposes K tokens, each drawn from its q, with one forward per token after the
first. SD's proposal (engine.strategies.sd), SSD's neural backup and its cache branches (engine.ssd.tree) all
draft with `draft_steps`, in the same order of random draws.

`bonus_ranks` reads the draft's ranking from the other side: where the verified bonus t* stood among the
tokens the draft ranks above it. SSD's cache guesses the top F_k tokens of that ranking (engine.ssd.
speculation_cache), so a run's ranks tell what any fan-out schedule would have hit, SD's runs included.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
from torch import Tensor

from engine import host
from engine.checks import Checks, check
from engine.invariant import draft_winners
from engine.keyed_random import Purpose
from engine.kv_cache import KVState
from engine.ranking import best, rank_of, ranked_ids
from engine.sampling import Generators, Keys, RowSampling, saguaro, sample, warp_rows
from engine.sparse import SparseQ


def draft_steps(
    state: KVState,
    logits: Tensor,
    K: int,
    saguaro_top: tuple[int, ...],
    C: float,
    params: RowSampling,
    generator: Generators,
    active: Tensor | None = None,
    stop_below: float | None = None,
    fed: list[int] | None = None,
    checks: Checks | None = None,
    rank_depth: int | None = None,
) -> Iterator[tuple[Tensor, SparseQ, Tensor, Tensor | None]]:
    """Yield (y [N], q [N, V], logits [N, V], ranking [N, rank_depth] or None) for draft positions 1..K, feeding
    each y but the last. The ranking (with `rank_depth`): the draft's best tokens there, in the cache's order
    (engine.ranking.ranked_ids); when every row is greedy, y is its first token, so one pass over the vocabulary
    gives both.

    `logits` [N, V] are the draft's logits at position 1. q is the warped draft distribution, Saguaro's
    σ_{F,C} when C < 1 (n_top = saguaro_top[i] at position i+1), kept as its support where that is narrow: when
    every row is greedy it is the point mass at the argmax, and nothing over the vocabulary is made but the argmax
    itself (no draw either: a point mass has one outcome). `params` and `generator` are per row; keyed (`Keys`,
    the positions those of y_1), y_i is drawn with U(seed, position of y_i, DRAFT). Rows where
    `active` [N] is False get holes (their results are to be ignored); `fed` is `active` on the host (1 or 0
    per row). `stop_below`: stop before a position i > 1 whose top probability (softmax of the raw logits, so greedy
    rows can stop too) is below it in every row; the last y, fed only to look there, goes back to unfed, so the
    block ends with it. The steps' input checks (finite logits, a positive mass to draw from) are read on the host
    once, after the last step: a bad row raises then, as it would have at its step; or they go to `checks`, to be
    read later with other values (the decode loop reads them with the round's outcome).
    """
    own = checks is None
    checks = Checks() if own else checks
    N, V = logits.shape
    greedy = all(p.greedy for p in params.params)
    drawn = race = None
    if isinstance(generator, Keys) and not greedy:  # the draft's draw at each position, keyed: one copy up
        drawn = host.upload(torch.from_numpy(generator.uniforms(Purpose.DRAFT, K)), logits.device)  # [N, K]
        rows = [b for b, p in enumerate(params.params) if p.invariant]
        if rows:
            on = host.tensor([[b, generator.seeds[b], generator.positions[b]] for b in rows], torch.long, logits.device)
            race = (on[:, 0], on[:, 1], on[:, 2])
    for i in range(K):
        if i > 0 and stop_below is not None and bool((logits.softmax(-1).amax(-1) < stop_below).all()):
            state.rollback([1] * N)
            break
        ranking = None if rank_depth is None else ranked_ids(logits, rank_depth)  # [N, M]
        if greedy:  # σ_{F,C} of a point mass is that point mass
            if ranking is None:
                top, y = best(logits)  # [N]; NaN propagates, so a bad row fails the check
            else:  # the argmax, ties to the lowest id, is the ranking's first token
                y = ranking[:, 0]
                top = logits.gather(-1, y[:, None])[:, 0]  # NaN, ±inf at the top fail the check alike
            check(~torch.isfinite(top), _no_maximum, checks)
            q = SparseQ.point_mass(y, V)
        else:
            dense = warp_rows(logits, params, checks)  # [N, V]
            if C < 1:
                dense = saguaro(dense, saguaro_top[i], C)
            y = sample(dense, generator, checks) if drawn is None else sample(dense, None, checks, u=drawn[:, i])
            if race is not None:  # drafter-invariant rows: the race's likeliest winner (engine.invariant)
                index, seeds, positions = race
                y[index] = draft_winners(dense[index], seeds, positions + i)
            q = SparseQ(V, None, dense.float())
        yield y, q, logits, ranking
        if i < K - 1:
            valid = None if active is None else active[:, None]
            logits = state.extend(y[:, None], valid, fed=fed)[:, -1].float()  # [N, V]
    if own:
        checks.raise_first()


def _no_maximum(bad: Tensor) -> RuntimeError:
    return RuntimeError(
        f"logits row {tuple(int(i) for i in bad.nonzero()[0].tolist())} has no finite maximum (all "
        f"-inf, NaN or +inf): nothing can be sampled from it; a model or logits-processor bug"
    )


def draft_from(
    state: KVState,
    logits: Tensor,
    K: int,
    saguaro_top: tuple[int, ...],
    C: float,
    params: RowSampling,
    generator: Generators,
    active: Tensor | None = None,
    stop_below: float | None = None,
    keep_logits: bool = True,
    checks: Checks | None = None,
) -> tuple[Tensor, SparseQ, list[Tensor]]:
    """`draft_steps` collected: tokens [N, K'], q [N, K', V] (as its support where narrow) and, with
    `keep_logits`, the draft's logits at each position (K' tensors [N, V], as the steps made them; none without),
    with K' = K unless `stop_below` ended the block early (1 <= K' <= K). A stop looks only at the draft's own logits,
    never at the target, so the shorter block is verified exactly like a block of that length chosen in advance. Draft
    forwards made, the one that gave `logits` included: K' + (K' < K)."""
    ys, qs, zs = [], [], []
    for y, q, z, _ in draft_steps(
        state, logits, K, saguaro_top, C, params, generator, active, stop_below, checks=checks
    ):
        ys.append(y)
        qs.append(q)
        if keep_logits:
            zs.append(z)
    return torch.stack(ys, 1), SparseQ.stack(qs), zs


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
) -> tuple[Tensor, SparseQ, list[Tensor]]:
    """Feed `first` [N, T] (holes where not valid) then draft K tokens with K forwards in total: `draft_from`
    on the logits after `first`. The last token is sampled, not fed."""
    logits = state.extend(first, first_valid)[:, -1].float()  # [N, V]
    return draft_from(state, logits, K, saguaro_top, C, params, generator, active)


def bonus_ranks(logits: Tensor, bonus: Tensor, excluded: Tensor) -> list[int]:
    """Rank of each row's bonus token t* in the draft's ranking (engine.ranking.rank_of), read on the host: logits
    [N, V] at the outcome's position (k+1), excluded [N] the rejected draft token x_{k+1} (−1 when all K were
    accepted). SSD's guesses with fan-out F (engine.ssd.speculation_cache.guesses) hold t* iff rank < F."""
    return rank_of(logits, bonus, excluded).tolist()
