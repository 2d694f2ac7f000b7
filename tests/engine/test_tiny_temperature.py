"""A tiny positive temperature behaves like its limit T -> 0+: all mass on the argmax set, uniform over ties.

Before the fix, logits / 1e-40 overflowed to ±inf in float32, softmax gave NaN and sampling fell to the
last vocabulary id. The checks: the warped distribution itself (Hypothesis over T from the smallest
float64 subnormal to 1e-3), the draft's path (warp_rows, Saguaro σ), exactness of a verification round
there by enumeration and on the real verify() path (each with a negative control), and the engine end to
end (SD at T = 1e-40 emits AR's greedy tokens on a tie-free tiny model).
"""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import chisquare

from engine import LLM, SamplingParams, SpeculativeConfig
from engine.config import DraftPlacement
from engine.sampling import RowSampling, saguaro, sample, warp, warp_rows
from engine.verifier import Verification, verify
from tests.engine.test_exactness import (
    argmax_accept,
    enumerate_round,
    standard_accept,
    standard_bonus,
    target_bonus,
    toy_round,
    worst_violation,
)
from tests.engine.tiny import noisy_copy, tiny_lm

SUBNORMALS = [5e-324, 1e-320, 1e-310, 1.4e-45, 1e-45, 1e-40, 1e-39]  # float64 and float32 subnormals
tiny_temperatures = st.sampled_from(SUBNORMALS) | st.floats(1e-45, 1e-3)
# Logits on a grid of 1/4: ties happen, and any two distinct values differ by >= 1/4, so at T <= 1e-3
# the mass off the argmax set is at most V·exp(−250): zero in float32, < 1e-100 in float64.
grid_logits = st.lists(st.integers(-12, 12), min_size=1, max_size=12)


def argmax_set(logits: torch.Tensor) -> torch.Tensor:
    return logits == logits.amax(dim=-1, keepdim=True)


@settings(deadline=None, max_examples=300)
@given(
    values=grid_logits,
    offset=st.sampled_from([0.0, 30.0, -50.0]),
    temperature=tiny_temperatures,
    dtype=st.sampled_from([torch.float32, torch.float64, torch.bfloat16]),
    top_k=st.none() | st.integers(1, 12),
    top_p=st.none() | st.floats(0.05, 1.0),
)
def test_tiny_temperature_puts_all_mass_on_the_argmax_set(values, offset, temperature, dtype, top_k, top_p):
    logits = (torch.tensor(values, dtype=torch.float64) / 4 + offset).to(dtype)  # [V]
    probs = warp(logits, SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p))
    assert torch.isfinite(probs).all() and (probs >= 0).all()
    assert abs(float(probs.sum()) - 1) < 1e-6
    top = argmax_set(logits)
    assert float(probs[~top].sum()) < 1e-100
    if top_k is None and top_p is None:  # the limit itself: uniform over the tied maxima
        assert torch.allclose(probs[top], torch.full_like(probs[top], 1 / int(top.sum())), atol=1e-6)


@settings(deadline=None, max_examples=30)
@given(temperature=st.sampled_from(SUBNORMALS) | st.floats(1e-45, 1e-30), seed=st.integers(0, 2**31))
def test_tiny_temperature_on_real_sized_logits_is_the_argmax(temperature, seed):
    # Random float32 logits of a 150k vocabulary: no ties, and at T <= 1e-30 even a gap of one float32 ulp
    # (~4e-6 near 40) is > 1e24 after scaling, so the result is exactly the one-hot on the argmax.
    logits = 10 * torch.randn(2, 150_000, generator=torch.Generator().manual_seed(seed))
    probs = warp(logits, SamplingParams(temperature=temperature))
    assert torch.equal(probs, warp(logits, SamplingParams(temperature=0)))


def test_warp_rows_mixing_tiny_and_ordinary_temperatures_warps_each_row_alone():
    logits = torch.tensor([[2.0, 2.0, 1.0, 0.0], [2.0, 2.0, 1.0, 0.0], [0.0, 3.0, 3.0, 3.0]])  # [3, 4]
    params = [SamplingParams(temperature=1e-40), SamplingParams(temperature=0.7), SamplingParams(temperature=5e-324)]
    probs = warp_rows(logits, RowSampling(params))
    assert probs[0].tolist() == [0.5, 0.5, 0.0, 0.0]
    assert torch.allclose(probs[1], torch.softmax(logits[1] / 0.7, -1))
    assert torch.allclose(probs[2], torch.tensor([0.0, 1 / 3, 1 / 3, 1 / 3]))


def test_the_drafts_saguaro_sigma_at_tiny_temperature_is_a_distribution_on_the_ties():
    q = warp(torch.tensor([[4.0, 4.0, 4.0, 1.0, 0.0]]), SamplingParams(temperature=1e-45))  # [1, 5]
    sigma = saguaro(q, 1, 0.25)  # the top token (lowest id of the tie) down-weighted by C
    assert torch.isfinite(sigma).all() and abs(float(sigma.sum()) - 1) < 1e-6
    assert torch.allclose(sigma[0], torch.tensor([1 / 9, 4 / 9, 4 / 9, 0.0, 0.0]))


def test_the_old_division_was_the_bug():
    """Negative control for the properties above: logits / T itself is not finite at T = 1e-40."""
    logits = torch.tensor([3.0, 3.0, 1.0])
    assert torch.isnan(torch.softmax(logits / 1e-40, -1)).all()


# --- exactness of a verification round at tiny T --------------------------------------------------------

TINY = SamplingParams(temperature=1e-40)


@pytest.mark.parametrize("kind", ["draft", "saguaro", "uniform", "point_mass"])
@settings(deadline=None, max_examples=60)
@given(
    seed=st.integers(0, 2**31),
    vocab_size=st.integers(2, 5),
    K=st.integers(1, 3),
    temperature=tiny_temperatures,
    top_k=st.none() | st.integers(1, 5),
    F=st.integers(0, 4),
    C=st.floats(0.01, 1.0),
)
def test_one_round_at_tiny_temperature_emits_exactly_the_target_distribution(
    kind, seed, vocab_size, K, temperature, top_k, F, C
):
    # ties=True: integer logits, so the target and draft often have several tied maxima.
    params = SamplingParams(temperature=temperature, top_k=top_k)
    target, proposal, _ = toy_round(seed, vocab_size, K, params, kind, F, C, ties=True)
    assert all(abs(sum(p) - 1) < 1e-9 for p in target.values())
    emitted = enumerate_round(K, target, proposal, proposal, standard_accept, standard_bonus)
    assert worst_violation(K, vocab_size, target, emitted) < 1e-9


def tied_case(seed: int) -> tuple:
    """A toy round whose target has tied maxima at the empty prefix (so the limit is not a point mass)."""
    for s in range(seed, seed + 1000):
        target, proposal, _ = toy_round(s, 4, 2, TINY, "draft", 1, 1.0, ties=True)
        if sum(x > 0 for x in target[()]) >= 2:
            return target, proposal
    raise AssertionError("no seed with tied maxima")


def test_the_enumeration_at_tiny_temperature_catches_the_argmax_rule():
    """Negative control: accept-iff-argmax (ties to the lowest id) is greedy, not the limit over ties."""
    target, proposal = tied_case(0)
    emitted = enumerate_round(2, target, proposal, proposal, argmax_accept, target_bonus)
    assert worst_violation(2, 4, target, emitted) > 1e-3


# On the real verify() path: chi-square of the first emitted token against the target's limit distribution
# (uniform over its tied maxima). False-alarm rate 1e-3 per test, fixed seeds; the negative control (the
# proposal verified as if it were greedy, argmax with ties to the lowest id) must give p < 1e-6.
V, B, ALPHA_TEST, DETECTED = 6, 20_000, 1e-3, 1e-6
TARGET_LOGITS = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0, 2.0], [2.0, 2.0, 0.0, 1.0, 0.0, 0.0]])  # [K+1, V]
DRAFT_LOGITS = torch.tensor([[1.0, 3.0, 3.0, 0.0, 0.0, 2.0]])  # [K, V] agrees on two of three tied maxima


def first_token_p_value(verifier) -> float:
    gen = torch.Generator().manual_seed(5)
    p = warp(TARGET_LOGITS, TINY).expand(B, 2, V)  # [B, K+1, V]
    q = warp(DRAFT_LOGITS, TINY).expand(B, 1, V)  # [B, K, V]
    tokens = sample(q, gen)  # [B, K]
    result = verifier(tokens, q, p, gen)
    first = torch.where(result.accepted >= 1, tokens[:, 0], result.bonus)
    counts = torch.bincount(first, minlength=V)
    limit = p[0, 0].double()  # [V]
    expected = B * limit / limit.sum()
    assert counts[expected == 0].sum() == 0, "a token off the target's argmax set was emitted"
    return float(chisquare(counts[expected > 0].numpy(), expected[expected > 0].numpy()).pvalue)


def greedy_verifier(tokens, q, p, gen) -> Verification:
    K = tokens.shape[1]
    accepted = (tokens == p[:, :K].argmax(-1)).long().cumprod(-1).sum(-1)  # [B]
    bonus = p[torch.arange(tokens.shape[0]), accepted].argmax(-1)  # [B] ties -> lowest id
    return Verification(accepted=accepted, bonus=bonus)


def test_verify_at_tiny_temperature_emits_the_target_limit():
    assert first_token_p_value(verify) > ALPHA_TEST


def test_verify_at_tiny_temperature_detects_a_greedy_verifier():
    assert first_token_p_value(greedy_verifier) < DETECTED


# --- end to end: the target's and the draft's warp in the engine ----------------------------------------

PROMPTS = [[1, 2, 3, 4, 5], [7, 8]]


@pytest.fixture(scope="module")
def target():
    return tiny_lm(0, scale=4.0)  # float32 logits of a random model: no ties at the top


@pytest.fixture(scope="module")
def greedy_tokens(target):
    greedy = SamplingParams(temperature=0, max_new_tokens=12, stop_on_eos=False)
    return [o.token_ids for o in LLM(target).generate(PROMPTS, greedy)]


@pytest.mark.parametrize("temperature", [1e-40, 5e-324])
def test_ar_and_sd_at_tiny_temperature_emit_the_greedy_tokens(target, greedy_tokens, temperature):
    tiny = SamplingParams(temperature=temperature, max_new_tokens=12, stop_on_eos=False, seed=3)
    assert [o.token_ids for o in LLM(target).generate(PROMPTS, tiny)] == greedy_tokens
    sd = LLM(target, tiny_lm(1, layers=1, scale=4.0), strategy="sd", speculative=SpeculativeConfig(K=3, C=0.5))
    assert [o.token_ids for o in sd.generate(PROMPTS, tiny)] == greedy_tokens


def test_ssd_at_tiny_temperature_emits_the_greedy_tokens(target, greedy_tokens):
    # The draft worker's own warp (branches, backup) at T = 1e-40, run in-process to stay fast.
    tiny = SamplingParams(temperature=1e-40, max_new_tokens=12, stop_on_eos=False, seed=3)
    spec = SpeculativeConfig(K=3, C=0.5, placement=DraftPlacement(in_process=True))
    with LLM(target, noisy_copy(target, noise=1.0), strategy="ssd", speculative=spec) as ssd:
        out = ssd.generate(PROMPTS, tiny)
    assert [o.token_ids for o in out] == greedy_tokens
    assert 0 < out.metrics.summary()["hit_rate"]  # the worker's branches were used
