"""The one ranking rule of the engine: higher value first, equal values by lower token id.

Every place that picks or orders a distribution's best tokens goes through here, so they agree on ties: top-k in
the warp (engine.sampling), Saguaro's down-weighted set, the draft's ranking that SSD's guesses come from
(engine.sparse.TopLogits, engine.ssd.speculation_cache), the rank of a verified bonus among those guesses, and
top-p's full order. `ranked_ids` gives the first n tokens in order, `top_mask` the same set as a mask (n per row
or one n), `descending_order` the full order, `rank_of` where one token stands, and `best` the first token alone
with its value (greedy drafting and verification).
"""

from __future__ import annotations

import torch
from torch import Tensor

from engine import host

BLOCK = 256  # `best` on the CPU: the vocabulary in blocks of this many, the best block first
BLOCKED_FROM = 32768  # `best` on the CPU takes blocks from this many logits on (rows × vocabulary) up


def best(logits: Tensor) -> tuple[Tensor, Tensor]:
    """The best value of each row of logits [..., V] and its token, the lowest id among equal values: ([...], [...]).
    NaN propagates to the value (a caller's finite check then refuses the row), as torch.max does.

    On the CPU torch.max over the last dim with its indices runs several times slower than a plain reduction over a
    large vocabulary (2.1 against 0.3 ms for 15 rows of 151,936 on one core of the AVX-512 Xeon of
    reports/2026-12-cpu-engine-overhead): there the rows' maxima per block of BLOCK tokens are taken by the fast
    reduction, and the token is sought only in the first block holding the row's maximum. Below BLOCKED_FROM
    logits the blocks' own ten small operations cost more than they save (0.05 against 0.007 ms for one row of
    2,048), and on a device there is nothing to save: there torch.max, which gives the same answer."""
    V = logits.shape[-1]
    if logits.device.type != "cpu" or V < 4 * BLOCK or logits.numel() < BLOCKED_FROM:
        return logits.max(dim=-1)
    flat = logits.reshape(-1, V)  # [R, V]
    R, whole = flat.shape[0], V // BLOCK * BLOCK
    blocks = flat[:, :whole].reshape(R, whole // BLOCK, BLOCK)  # [R, B, BLOCK], a view
    tail = flat[:, whole:]  # [R, V - whole]
    maxima = blocks.amax(-1)  # [R, B]
    if tail.shape[-1]:
        maxima = torch.cat([maxima, tail.amax(-1, keepdim=True)], 1)  # [R, B + 1]
        tail = torch.nn.functional.pad(tail, (0, BLOCK - tail.shape[-1]), value=-torch.inf)  # [R, BLOCK]
    top, at = maxima.max(-1)  # [R]: the first block holding the row's maximum (NaN: the first NaN's block)
    rows = torch.arange(R, device=flat.device)
    inside = blocks[rows, at.clamp(max=blocks.shape[1] - 1)]  # [R, BLOCK]
    if tail.shape[-1]:
        inside = torch.where((at == blocks.shape[1])[:, None], tail, inside)
    ids = at * BLOCK + inside.max(-1).indices  # the first token of the block equal to its maximum
    return top.reshape(logits.shape[:-1]), ids.reshape(logits.shape[:-1])


def ranked_ids(logits: Tensor, n: int) -> Tensor:
    """The n best tokens of each row of logits [..., V], best first, equal logits in increasing id: [..., n].

    torch.topk leaves the order of equal values (and which of them make the cut) unspecified. On the CPU
    (engine.host.reads_are_free) topk's answer stands for every row whose n + 1 best values are all distinct, its
    order being the only one, and the rows with a tie (rare with float logits) are settled one by one; on a device
    every row is settled without reading anything back (`_ranked_on_device`, the same answer).
    """
    V = logits.shape[-1]
    n = min(n, V)
    flat = logits.reshape(-1, V)  # [R, V]
    if n == 0:
        return torch.zeros(*logits.shape[:-1], 0, dtype=torch.long, device=logits.device)
    if host.reads_are_free(logits.device):
        ids = _ranked_on_host(flat, n)
    else:
        ids = _ranked_on_device(flat, n)
    return ids.reshape(*logits.shape[:-1], n)


def _ranked_on_host(flat: Tensor, n: int) -> Tensor:
    V = flat.shape[-1]
    top = torch.topk(flat, min(n + 1, V), dim=-1)  # one more, to see a tie at the cut
    ids = top.indices[:, :n].clone()  # [R, n]
    cut = top.values[:, n - 1]  # [R] the n-th best value
    unique = (top.values[:, 1:] != top.values[:, :-1]).all(-1)  # [R]
    for r in (~unique).nonzero()[:, 0].tolist():
        z = flat[r]
        above = (z > cut[r]).nonzero()[:, 0]  # increasing id
        above = above[torch.sort(z[above], descending=True, stable=True).indices]  # by value; ties keep id order
        tied = (z == cut[r]).nonzero()[: n - above.numel(), 0]
        ids[r] = torch.cat([above, tied])
    return ids


def _ranked_on_device(flat: Tensor, n: int) -> Tensor:
    """`ranked_ids` for every row at once: the tokens above the n-th best value (all among topk's n), in value
    then id order, then the lowest ids of the tokens equal to it, as many as fit."""
    R, V = flat.shape
    top = torch.topk(flat, n, dim=-1)
    values, ids = top.values, top.indices  # [R, n]
    cut = values[:, n - 1 :]  # [R, 1] the n-th best value
    above = values > cut  # [R, n]
    n_above = above.sum(-1, keepdim=True)  # [R, 1]
    # the tokens above the cut, by increasing id, then (stably) by decreasing value
    by_id = torch.sort(torch.where(above, ids, V), dim=-1, stable=True).indices  # [R, n]
    ids, values = ids.gather(1, by_id), torch.where(above, values, -torch.inf).gather(1, by_id)
    ids = ids.gather(1, torch.sort(values, dim=-1, descending=True, stable=True).indices)  # [R, n]
    # the tied tokens, lowest ids first, into the places after them (the rest into a spare column)
    tied = flat == cut  # [R, V]
    place = tied.long().cumsum(-1) - 1 + n_above  # [R, V]
    place = torch.where(tied & (place < n), place, n)
    filled = torch.zeros(R, n + 1, dtype=torch.long, device=flat.device)
    filled.scatter_(1, place, torch.arange(V, device=flat.device).expand(R, V))
    return torch.where(torch.arange(n, device=flat.device) < n_above, ids, filled[:, :n])


def descending_order(x: Tensor) -> Tensor:
    """Indices that sort the last dim by decreasing value, equal values by lower id (a stable sort): [..., V]."""
    return torch.sort(x, dim=-1, descending=True, stable=True).indices


def top_mask(x: Tensor, n: int | Tensor) -> Tensor:
    """Mask [..., V] of the n best entries of each row (`ranked_ids`' set): `n` an int, or an integer tensor that
    broadcasts to [..., 1] when it varies by row (read on the host for its largest)."""
    V = x.shape[-1]
    if isinstance(n, Tensor):
        n = torch.broadcast_to(n.to(x.device), (*x.shape[:-1], 1)).clamp(max=V)  # [..., 1]
        most = int(n.max()) if n.numel() else 0
    else:
        most = min(n, V)
    mask = torch.zeros_like(x, dtype=torch.bool)
    if most <= 0 or x.numel() == 0:
        return mask
    ids = ranked_ids(x, most)  # [..., most]
    keep = True if not isinstance(n, Tensor) else torch.arange(most, device=x.device) < n  # [..., most]
    return mask.scatter_(-1, ids, torch.ones_like(ids, dtype=torch.bool) & keep)


def rank_of(logits: Tensor, token: Tensor, excluded: Tensor) -> Tensor:
    """Where each row's `token` [N] stands in the ranking of logits [N, V]: the tokens other than `excluded` [N]
    (−1: none) ranked above it (a higher logit, or an equal one and a lower id), as a LongTensor [N] on the logits'
    device; an excluded token gets V (it is never among the guesses)."""
    logits = logits.float()
    ids = torch.arange(logits.shape[-1], device=logits.device)  # [V]
    mine = logits.gather(-1, token[:, None])  # [N, 1]
    above = (logits > mine) | ((logits == mine) & (ids < token[:, None]))  # [N, V]
    rank = above.sum(-1)  # [N]
    excluded_above = above.gather(-1, excluded.clamp(min=0)[:, None])[:, 0] & (excluded >= 0)  # [N]
    rank = rank - excluded_above.long()
    return torch.where(token == excluded, logits.shape[-1], rank)
