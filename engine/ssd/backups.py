"""Backup speculators for a cache miss (docs/ssd.md §6), each returning its tokens AND its true q.

The verifier is exact for any proposal only when given the distribution the tokens were really drawn
from: uniform for random tokens, a point mass for the deterministic prompt-lookup draft. (The neural
backup is the draft drafting just in time: engine.ssd.tree.draft_compact.)
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from engine.keyed_random import Purpose
from engine.proposals import point_mass, uniform
from engine.sampling import Keys


def random_backup(keys: Keys, K: int, V: int) -> tuple[Tensor, Tensor]:
    """K uniform random tokens per row: tokens [n, K] (token i of row b is floor(V·U) with U the draft's keyed
    draw at its position), q [n, K, V] uniform."""
    u = keys.uniforms(Purpose.DRAFT, K)  # [n, K] float64 in [0, 1)
    tokens = torch.from_numpy(np.minimum(np.floor(u * V), V - 1).astype(np.int64))
    return tokens, uniform((len(keys), K), V)


def lookup_continuation(context: list[int], K: int, max_ngram: int = 3) -> list[int]:
    """Prompt lookup: find the latest earlier occurrence of the context's last n tokens (n = max_ngram..1)
    and propose the K tokens that followed it; without a match, repeat the last token.

    Deterministic given the context, hence a point-mass proposal.
    """
    for n in range(min(max_ngram, len(context) - 1), 0, -1):
        suffix = context[-n:]
        for start in range(len(context) - n - 1, -1, -1):
            if context[start : start + n] == suffix:
                follow = context[start + n : start + n + K]
                while len(follow) < K:  # ran into the end: keep copying from what was proposed
                    follow.append(follow[-1] if follow else context[-1])
                return follow
    return [context[-1]] * K


def lookup_tokens(contexts: list[list[int]], K: int, max_ngram: int = 3) -> Tensor:
    """The n-gram / prompt-lookup draft's tokens for each context [n, K] (its q: a point mass at each)."""
    return torch.tensor([lookup_continuation(c, K, max_ngram) for c in contexts], dtype=torch.long).reshape(-1, K)


def lookup_backup(contexts: list[list[int]], K: int, V: int, max_ngram: int = 3) -> tuple[Tensor, Tensor]:
    """The n-gram / prompt-lookup draft for each context: tokens [n, K], q [n, K, V] point masses."""
    tokens = lookup_tokens(contexts, K, max_ngram)
    return tokens, point_mass(tokens, V)
