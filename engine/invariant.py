"""Drafter-invariant sampling (engine.sampling_params.SamplingMode.INVARIANT): every token is the winner of an
exponential race keyed by (seed, position, token).

At a position, token i gets U_i = U(seed, position, i) (purpose GUMBEL, index = i: engine.keyed_random) and the
token drawn from a distribution r is the winner argmax_i log(U_i)/r(i) (tokens with r(i) = 0 never win). With E_i =
−log U_i independent standard exponentials, E_i/r(i) is exponential with rate r(i), so the smallest of them (the
winner) is token i with probability r(i): the winner is distributed as r. It is the Gumbel-max trick in another
form: −log(−log U_i) is standard Gumbel, and argmax_i log r(i) − log(−log U_i) is the same token.

The target's token is the race's winner under p. The draft runs the same race under its own q, so where q is
close to p it very likely names the same winner; the verifier accepts a draft token exactly when it is the
target's winner, and the first token it rejects is replaced by the target's winner there. Every emitted token is
then the target's winner at its position, a function of the context, the seed and p only: AR, SD and SSD emit the
same text for a seed, and it is exact, since each winner is distributed as p and the races of different positions
use independent numbers. What the draft changes is only how many tokens a round keeps. Per token the draft's
winner is the target's with probability at least (1 − TV)/(1 + TV) (Daliri, Musco & Suresh, arXiv 2408.07978),
against rejection sampling's 1 − TV.

The race over the whole vocabulary costs a keyed number per token. The target's must be run in full (its winner
decides the text); the draft's may look at its `DRAFT_TOP` most probable tokens only, since any proposal is
verified exactly: outside them the draft misses a winner it would rarely have named.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from engine import host
from engine.keyed_random import token_uniforms

if TYPE_CHECKING:
    from engine.sampling import Keys

DRAFT_TOP = 64  # tokens of q the draft's race looks at


def race(probs: Tensor, u: Tensor) -> Tensor:
    """The winner argmax_i log(u_i)/probs_i of each row of probs [..., V] (u [..., V] in (0, 1)): a draw from
    probs (rows need not be normalised). Tokens of probability 0 never win; ties (probability 0) to the lowest id."""
    scores = torch.where(probs > 0, u.log() / probs.to(torch.float64), -torch.inf)  # [..., V], all <= 0
    return scores.argmax(-1)


def target_winners(p: Tensor, seeds: Tensor, positions: Tensor) -> Tensor:
    """The target's token at each position: its race over p [B, n, V] at positions [B, n] (seeds [B]): [B, n]."""
    return race(p, token_uniforms(seeds, positions, p.shape[-1]))


def draft_winners(q: Tensor, seeds: Tensor, positions: Tensor, top: int = DRAFT_TOP) -> Tensor:
    """The draft's guess of the target's token: its race over q [N, V] at positions [N] (seeds [N]) among q's `top`
    most probable tokens: [N]."""
    M = min(top, q.shape[-1])
    mass, ids = torch.topk(q, M, dim=-1)  # [N, M]
    u = token_uniforms(seeds, positions[:, None], q.shape[-1], ids[:, None, :])[:, 0]  # [N, M]
    return ids.gather(-1, race(mass, u)[:, None])[:, 0]


def race_ranking(q: Tensor, keys: Keys, depth: int, top: int = DRAFT_TOP) -> Tensor:
    """`draft_race_ranking` at the keys' positions (host Keys of q's rows, engine.sampling): ids [N, depth]."""
    on = host.upload(torch.from_numpy(np.stack([keys.seeds, keys.positions], 1)), q.device)  # [N, 2]
    return draft_race_ranking(q, on[:, 0], on[:, 1], depth, top)


def draft_race_ranking(q: Tensor, seeds: Tensor, positions: Tensor, depth: int, top: int = DRAFT_TOP) -> Tensor:
    """q's most probable tokens ordered by the race (the likeliest winners first): ids [N, depth] (q [N, V],
    positions [N]). SSD guesses the target's winner after a rejection from the head of this order."""
    M = min(max(top, depth), q.shape[-1])
    mass, ids = torch.topk(q, M, dim=-1)  # [N, M]
    u = token_uniforms(seeds, positions[:, None], q.shape[-1], ids[:, None, :])[:, 0]  # [N, M]
    scores = torch.where(mass > 0, u.log() / mass.to(torch.float64), -torch.inf)
    order = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :depth]
    return ids.gather(-1, order)
