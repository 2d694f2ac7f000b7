"""warp, saguaro, sample and the backups' proposals: exact expectations on small hand-checkable rows."""

from itertools import pairwise

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.proposals import point_mass, random_tokens, uniform
from engine.ranking import top_mask
from engine.sampling import saguaro, sample, warp
from engine.sampling_params import SamplingParams

F64 = torch.float64


def random_logits(*shape: int, seed: int = 0) -> torch.Tensor:
    return 2 * torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64)


# --- warp ---------------------------------------------------------------------------------------------


def test_warp_at_temperature_zero_is_one_hot_on_argmax_with_ties_to_lowest_id():
    logits = torch.tensor([[0.5, 2.0, 2.0, -1.0], [3.0, 1.0, 3.0, 3.0]])
    probs = warp(logits, SamplingParams(temperature=0, top_k=1, top_p=0.1))
    assert torch.equal(probs, torch.tensor([[0.0, 1, 0, 0], [1, 0, 0, 0]]))


def test_warp_approaches_argmax_as_temperature_falls_and_uniform_as_it_grows():
    logits = random_logits(3, 7)
    cold = warp(logits, SamplingParams(temperature=1e-3))
    hot = warp(logits, SamplingParams(temperature=1e6))
    assert torch.allclose(cold, warp(logits, SamplingParams(temperature=0)), atol=1e-12)
    assert torch.allclose(hot, torch.full_like(hot, 1 / 7), atol=1e-5)


def test_warp_is_softmax_of_logits_over_temperature_without_filters():
    logits = random_logits(2, 5)
    assert torch.allclose(warp(logits, SamplingParams(temperature=0.7)), torch.softmax(logits / 0.7, -1))


def test_warp_top_k_keeps_exactly_the_k_largest():
    logits = random_logits(4, 9)
    probs = warp(logits, SamplingParams(top_k=3))
    kept = probs > 0
    assert kept.sum(-1).tolist() == [3] * 4
    assert torch.equal(kept, torch.zeros_like(kept).scatter(-1, logits.topk(3).indices, True))
    renormalised = torch.softmax(logits.masked_fill(~kept, -torch.inf), -1)
    assert torch.allclose(probs, renormalised)


def test_warp_top_k_breaks_ties_at_the_boundary_by_lowest_id():
    # transformers' TopKLogitsWarper would keep all three tied tokens; we keep exactly k.
    probs = warp(torch.tensor([0.0, 1.0, 1.0, 1.0]), SamplingParams(top_k=2))
    assert torch.equal(probs, torch.tensor([0.0, 0.5, 0.5, 0.0]))


def test_warp_top_p_keeps_the_smallest_most_probable_set_reaching_top_p():
    logits = torch.log(torch.tensor([0.1, 0.4, 0.05, 0.3, 0.15], dtype=F64))
    # Sorted: 0.4, 0.3, 0.15, 0.1, 0.05. Mass 0.7 < 0.8 after two, 0.85 >= 0.8 after three.
    probs = warp(logits, SamplingParams(top_p=0.8))
    assert torch.allclose(probs, torch.tensor([0, 0.4, 0, 0.3, 0.15], dtype=F64) / 0.85)
    # A set that reaches top_p exactly stops there.
    assert (warp(logits, SamplingParams(top_p=0.7)) > 0).tolist() == [False, True, False, True, False]


def test_warp_top_p_always_keeps_at_least_one_token():
    probs = warp(torch.tensor([0.0, 5.0, 1.0]), SamplingParams(top_p=1e-9))
    assert torch.equal(probs, torch.tensor([0.0, 1.0, 0.0]))


@settings(deadline=None, max_examples=60)
@given(
    seed=st.integers(0, 2**31),
    vocab_size=st.integers(1, 12),
    temperature=st.sampled_from([0.0, 0.3, 1.0, 2.5]),
    top_k=st.none() | st.integers(1, 12),
    top_p=st.none() | st.floats(0.05, 1.0),
)
def test_warp_is_a_distribution_whose_support_is_the_minimal_top_p_set(seed, vocab_size, temperature, top_k, top_p):
    logits = random_logits(3, vocab_size, seed=seed).round()  # rounding makes ties common
    params = SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p)
    probs = warp(logits, params)
    assert torch.allclose(probs.sum(-1), torch.ones(3, dtype=F64))
    assert (probs >= 0).all()
    if temperature > 0 and top_p is not None:
        # Minimal: dropping the least probable kept token leaves mass < top_p (before renormalising).
        before_p = warp(logits, SamplingParams(temperature=temperature, top_k=top_k))
        kept = probs > 0
        mass = (before_p * kept).sum(-1)
        smallest = before_p.masked_fill(~kept, torch.inf).min(-1).values
        assert (mass >= top_p - 1e-12).all()
        assert ((mass - smallest < top_p) | (kept.sum(-1) == 1)).all()


def test_warp_computes_in_float32_or_float64():
    logits = torch.randn(2, 5)
    assert warp(logits.half(), SamplingParams()).dtype == torch.float32
    assert warp(logits.bfloat16(), SamplingParams(temperature=0)).dtype == torch.float32
    assert warp(logits.double(), SamplingParams(top_k=2, top_p=0.5)).dtype == F64


def test_warp_is_one_function_for_p_and_q_so_equal_logits_give_equal_distributions():
    logits = random_logits(2, 3, 11)
    params = SamplingParams(temperature=0.8, top_k=6, top_p=0.9)
    p = warp(logits, params)  # the target's
    q = warp(logits.clone(), params)  # the draft's, same logits
    assert torch.equal(p, q)


def test_warp_matches_transformers_warpers_on_tie_free_logits():
    """Same distribution as transformers' Temperature -> TopK -> TopP warpers, then softmax.

    They differ only at boundaries: transformers keeps every token tied with the k-th logit (ours keeps
    exactly k, lowest ids first), and its top-p sums ascending in its own precision, so a cumulative mass
    within rounding of top_p may fall either side. Continuous random logits in float64 avoid both.
    """
    from transformers.generation.logits_process import (
        LogitsProcessorList,
        TemperatureLogitsWarper,
        TopKLogitsWarper,
        TopPLogitsWarper,
    )

    for seed, (temperature, top_k, top_p) in enumerate([(0.7, 5, 0.9), (1.3, 12, 0.5), (1.0, 3, 0.99), (0.5, 20, 0.3)]):
        logits = random_logits(64, 20, seed=seed)
        chain = LogitsProcessorList(
            [TemperatureLogitsWarper(temperature), TopKLogitsWarper(top_k), TopPLogitsWarper(top_p)]
        )
        expected = torch.softmax(chain(None, logits.clone()), -1)
        ours = warp(logits, SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p))
        assert torch.allclose(ours, expected, atol=1e-12)


@pytest.mark.parametrize("bad", [torch.zeros(()), torch.zeros(3, 0), torch.zeros(3, dtype=torch.long)])
def test_warp_rejects_inputs_without_a_float_vocabulary_dim(bad):
    with pytest.raises(ValueError):
        warp(bad, SamplingParams())


# --- saguaro ------------------------------------------------------------------------------------------

Q = torch.tensor([[0.05, 0.4, 0.0, 0.25, 0.2, 0.1]], dtype=F64)  # top 2 = {1, 3}; token 2 has q = 0


def test_saguaro_is_a_distribution_and_keeps_zeros():
    sigma = saguaro(Q, 2, 0.3)
    assert torch.allclose(sigma.sum(-1), torch.ones(1, dtype=F64))
    assert sigma[0, 2] == 0 and (sigma >= 0).all()


def test_saguaro_shrinks_every_top_to_other_ratio_by_exactly_C():
    C = 0.3
    sigma, q = saguaro(Q, 2, C)[0].tolist(), Q[0].tolist()
    for a in (1, 3):
        for b in (0, 4, 5):
            assert sigma[a] / sigma[b] == pytest.approx(C * q[a] / q[b], rel=1e-12)
    # Inside each set ratios are untouched.
    assert sigma[1] / sigma[3] == pytest.approx(0.4 / 0.25, rel=1e-12)
    assert sigma[0] / sigma[4] == pytest.approx(0.05 / 0.2, rel=1e-12)


def test_saguaro_is_not_handing_the_freed_mass_to_the_other_tokens():
    # The wrong variant keeps the top set at exactly C·q and spreads (1 − C)·q(top) over the rest.
    C, top_mass = 0.3, 0.65
    sigma_top = float(saguaro(Q, 2, C)[0, [1, 3]].sum())
    assert sigma_top == pytest.approx(C * top_mass / (C * top_mass + 1 - top_mass), rel=1e-12)
    assert sigma_top != pytest.approx(C * top_mass)


def test_saguaro_with_C_one_returns_q_unchanged():
    assert torch.equal(saguaro(Q, 3, 1.0), Q)


def test_saguaro_top_set_mass_does_not_increase_as_C_decreases():
    q = warp(random_logits(5, 8, seed=3), SamplingParams())
    top = torch.zeros_like(q, dtype=torch.bool).scatter(-1, q.topk(3).indices, True)  # [5, 8]
    masses = [(saguaro(q, 3, C) * top).sum(-1) for C in (1.0, 0.8, 0.5, 0.2, 0.05)]
    for higher_C, lower_C in pairwise(masses):
        assert (lower_C <= higher_C + 1e-15).all()


def test_saguaro_top_set_breaks_ties_by_lowest_id():
    q = torch.tensor([0.1, 0.3, 0.3, 0.3], dtype=F64)
    sigma = saguaro(q, 2, 0.5)
    assert torch.allclose(sigma, torch.tensor([0.1, 0.15, 0.15, 0.3], dtype=F64) / 0.7)


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_saguaro_top_set_is_the_head_of_a_stable_descending_sort(data):
    # The top set is found without sorting the vocabulary; it must be exactly the first n of a stable
    # sort (ties -> lowest id), including ties across the boundary, zeros, and n beyond the vocabulary.
    rows, V = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 9))
    weights = torch.tensor(
        data.draw(st.lists(st.lists(st.integers(0, 3), min_size=V, max_size=V), min_size=rows, max_size=rows)),
        dtype=torch.float32,
    )
    weights[:, 0] += 1  # no all-zero row
    q = weights / weights.sum(-1, keepdim=True)
    n = torch.tensor(data.draw(st.lists(st.integers(0, V + 1), min_size=rows, max_size=rows)))
    order = torch.sort(q, dim=-1, descending=True, stable=True).indices
    expected = torch.zeros_like(q, dtype=torch.bool)
    for r in range(rows):
        expected[r, order[r, : n[r]]] = True
    assert torch.equal(top_mask(q, n[:, None]), expected)
    top_mass = (q * expected).sum(-1, keepdim=True)
    sigma = torch.where(expected, 0.5 * q, q) / (1 - 0.5 * top_mass)
    assert torch.allclose(saguaro(q, n, 0.5), sigma, atol=1e-6)


def test_saguaro_takes_a_per_row_n_top():
    q = Q.expand(3, 6)
    sigma = saguaro(q, torch.tensor([0, 1, 2]), 0.5)
    assert torch.equal(sigma[0], Q[0])  # n_top = 0: nothing down-weighted, renormalised to itself
    assert torch.allclose(sigma[1], saguaro(Q, 1, 0.5)[0])
    assert torch.allclose(sigma[2], saguaro(Q, 2, 0.5)[0])


def test_saguaro_with_everything_in_the_top_set_is_q():
    assert torch.allclose(saguaro(Q, 6, 0.2), Q)


@pytest.mark.parametrize("n_top, C", [(2, 0.0), (2, 1.5), (2, -0.1), (2, float("nan")), (-1, 0.5)])
def test_saguaro_rejects_bad_constants(n_top, C):
    with pytest.raises(ValueError):
        saguaro(Q, n_top, C)


def test_saguaro_rejects_a_negative_per_row_n_top():
    with pytest.raises(ValueError):
        saguaro(Q.expand(2, 6), torch.tensor([1, -1]), 0.5)


# --- sample -------------------------------------------------------------------------------------------


def test_sample_one_hot_rows_are_deterministic():
    probs = torch.nn.functional.one_hot(torch.tensor([[3, 0], [1, 2]]), 4).float()  # [2, 2, 4]
    for seed in range(5):
        assert sample(probs, torch.Generator().manual_seed(seed)).tolist() == [[3, 0], [1, 2]]


def test_sample_uses_only_the_given_generator():
    probs = warp(random_logits(50, 6), SamplingParams())
    torch.manual_seed(1)
    first = sample(probs, torch.Generator().manual_seed(7))
    torch.manual_seed(2)
    second = sample(probs, torch.Generator().manual_seed(7))
    assert torch.equal(first, second)
    assert first.shape == (50,) and first.dtype == torch.long


def test_sample_never_draws_a_zero_probability_token():
    probs = torch.tensor([0.5, 0.0, 0.5, 0.0]).expand(2000, 4)
    draws = sample(probs, torch.Generator().manual_seed(0))
    assert set(draws.tolist()) == {0, 2}


def test_sample_handles_an_empty_batch():
    assert sample(torch.ones(0, 3), torch.Generator()).shape == (0,)


# --- proposals ----------------------------------------------------------------------------------------


def test_uniform_is_the_uniform_distribution():
    q = uniform((2, 3), 4, dtype=F64)
    assert q.shape == (2, 3, 4) and torch.all(q == 0.25)


def test_random_tokens_are_in_range_and_reproducible():
    first = random_tokens((3, 4), 5, torch.Generator().manual_seed(3))
    again = random_tokens((3, 4), 5, torch.Generator().manual_seed(3))
    assert torch.equal(first, again) and first.shape == (3, 4)
    assert first.min() >= 0 and first.max() < 5


def test_point_mass_is_one_hot_on_the_proposed_token():
    assert torch.equal(point_mass(torch.tensor([[2, 0]]), 3), torch.tensor([[[0.0, 0, 1], [1, 0, 0]]]))


@pytest.mark.parametrize("tokens", [torch.tensor([3]), torch.tensor([-1]), torch.tensor([1.0])])
def test_point_mass_rejects_tokens_outside_the_vocabulary(tokens):
    with pytest.raises(ValueError):
        point_mass(tokens, 3)


def test_proposals_reject_an_empty_vocabulary():
    with pytest.raises(ValueError):
        uniform((2,), 0)
    with pytest.raises(ValueError):
        random_tokens((2,), 0, torch.Generator())
