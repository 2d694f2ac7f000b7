"""engine.ranking.best: each row's best value and its lowest-id token, what torch.max gives, over any vocabulary."""

import math
from unittest import mock

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.ranking import BLOCK, BLOCKED_FROM, best

# vocabularies below the blocked path, at whole blocks, and with a tail; values from a small set, so ties are common;
# the blocked path taken from its default size up, or from any size (so that the small shapes take it too)
VOCABS = st.sampled_from([7, 4 * BLOCK - 1, 4 * BLOCK, 4 * BLOCK + 1, 5 * BLOCK + 37, 151_936])
VALUES = st.sampled_from([-math.inf, -2.0, -1.0, 0.0, 0.5, 1.0, 3.0, math.inf])


@settings(max_examples=60, deadline=None)
@given(vocab=VOCABS, rows=st.integers(1, 4), data=st.data())
def test_best_is_torch_max_with_ties_to_the_lowest_id(vocab, rows, data):
    seed = data.draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    levels = torch.tensor([-math.inf, -2.0, -1.0, 0.0, 0.5, 1.0, 3.0, math.inf])
    logits = levels[torch.randint(0, len(levels), (rows, vocab), generator=gen)]
    for _ in range(data.draw(st.integers(0, 3))):  # a few chosen entries, to put ties at block edges
        logits[data.draw(st.integers(0, rows - 1)), data.draw(st.integers(0, vocab - 1))] = data.draw(VALUES)
    with mock.patch("engine.ranking.BLOCKED_FROM", data.draw(st.sampled_from([0, BLOCKED_FROM]))):
        value, token = best(logits)
    want_value, want_token = logits.max(dim=-1)
    assert torch.equal(value, want_value)
    first = torch.stack([(row == row.max()).nonzero()[0, 0] for row in logits])  # the lowest id of the maximum
    assert torch.equal(token, first) and torch.equal(token, want_token)


def test_best_keeps_the_leading_dims_and_propagates_nan():
    logits = torch.randn(2, 3, 5 * BLOCK + 3)
    logits[1, 2, 700] = math.nan
    with mock.patch("engine.ranking.BLOCKED_FROM", 0):
        value, token = best(logits)
    assert value.shape == token.shape == (2, 3)
    assert math.isnan(value[1, 2]) and torch.isfinite(value.flatten()[:-1]).all()
    assert torch.equal(token[0], logits[0].max(-1).indices)
