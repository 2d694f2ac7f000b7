"""A row with nothing to sample (all −inf, NaN logits, zero mass) raises instead of yielding the last id."""

import pytest
import torch

from engine.sampling import sample, warp
from engine.sampling_params import SamplingParams


@pytest.mark.parametrize("temperature", [0.0, 0.7])
@pytest.mark.parametrize("bad", [-torch.inf, torch.nan])
def test_warp_refuses_a_row_without_a_finite_maximum(temperature, bad):
    logits = torch.zeros(3, 5)
    logits[1] = bad
    with pytest.raises(RuntimeError, match=r"row \(1,\)"):
        warp(logits, SamplingParams(temperature=temperature))


def test_warp_refuses_a_row_banned_entirely_by_a_processor_mask():
    logits = torch.randn(2, 4, 6)
    logits[0, 2] = logits[0, 2].masked_fill(torch.ones(6, dtype=torch.bool), -torch.inf)
    with pytest.raises(RuntimeError, match=r"row \(0, 2\)"):
        warp(logits, SamplingParams(temperature=1.0, top_k=2))


def test_warp_still_accepts_rows_with_some_banned_tokens():
    logits = torch.tensor([[0.0, -torch.inf, 1.0]])
    probs = warp(logits, SamplingParams(temperature=1.0))
    assert probs[0, 1] == 0 and torch.isclose(probs.sum(), torch.tensor(1.0))


@pytest.mark.parametrize("row", [[0.0, 0.0, 0.0], [float("nan"), 1.0, 0.0], [0.5, -0.5, 1.0]])
def test_sample_refuses_a_row_without_positive_mass(row):
    probs = torch.tensor([[0.0, 1.0, 0.0], row])
    with pytest.raises(RuntimeError, match="probs row 1"):
        sample(probs, torch.Generator().manual_seed(0))


def test_sample_of_a_one_hot_row_is_its_token():
    probs = torch.tensor([[0.0, 1.0, 0.0]])
    assert sample(probs, torch.Generator().manual_seed(0)).tolist() == [1]
