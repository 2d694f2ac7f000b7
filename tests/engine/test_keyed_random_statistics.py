"""Statistical tests of keyed random numbers (engine/keyed_random.py): uniform, independent across positions,
purposes and seeds, and Gumbel noise whose argmax samples p.

Each test computes one p-value from fixed keys and rejects at p < FALSE_ALARM = 1e-4: for a fresh choice of keys a
correct generator fails a test with probability 1e-4 (below 1e-3 for the file's tests together); with the keys
fixed the outcome is reproducible. Each test has a negative control: a flawed construction (a biased transform, a
key that ignores the position, noise reused across positions, a seed or purpose that only shifts a shared stream, a
biased p) that must fail the same test at the same threshold.
"""

import numpy as np
import pytest
import torch
from scipy import stats

from engine.keyed_random import (
    GAMMA,
    MASK64,
    Purpose,
    _signed,
    keyed_bits,
    keyed_gumbel,
    keyed_uniforms,
    uniforms_from_bits,
)

FALSE_ALARM = 1e-4
ROWS, COLUMNS = 20, 1000  # 20 seeds x 1000 positions: 20,000 draws or pairs per test
SEEDS = torch.arange(ROWS, dtype=torch.int64)  # the small adjacent seeds users pick
POSITIONS = torch.arange(COLUMNS, dtype=torch.int64)[None, :]  # [1, n]
P = np.array([0.4, 0.25, 0.15, 0.1, 0.07, 0.03])  # the Gumbel-max tests' distribution


def uniformity_p(u: torch.Tensor) -> float:
    """Kolmogorov-Smirnov against U(0, 1)."""
    return stats.kstest(u.flatten().double().numpy(), "uniform").pvalue


def pair_independence_p(u: torch.Tensor, v: torch.Tensor, bins: int = 10) -> float:
    """Chi-square of the pairs (u, v) over a bins x bins grid against the uniform square (independent uniforms)."""
    cells = (u.flatten().double() * bins).long() * bins + (v.flatten().double() * bins).long()
    return stats.chisquare(torch.bincount(cells, minlength=bins * bins).numpy()).pvalue


def weyl_uniforms(seeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """A flawed construction: the seed's word plus position * GAMMA, with no mix after it (a Weyl sequence)."""
    base = keyed_bits(seeds, torch.zeros(1, 1, dtype=torch.int64), Purpose.ACCEPT)  # [B, 1]
    return uniforms_from_bits(base + positions * _signed(GAMMA), torch.float64)


def test_float64_uniforms_are_uniform():
    assert uniformity_p(keyed_uniforms(SEEDS, POSITIONS, Purpose.ACCEPT, torch.float64)) > FALSE_ALARM


def test_float32_uniforms_are_uniform():
    assert uniformity_p(keyed_uniforms(SEEDS, POSITIONS, Purpose.ACCEPT, torch.float32)) > FALSE_ALARM


def test_the_uniformity_test_rejects_a_biased_transform():
    u = keyed_uniforms(SEEDS, POSITIONS, Purpose.ACCEPT, torch.float64)
    assert uniformity_p(u**1.1) < FALSE_ALARM


def adjacent_positions_p(uniforms) -> float:
    """Pairs at positions (2i, 2i + 1) of one seed."""
    u = uniforms(SEEDS, POSITIONS)  # [B, n]
    return pair_independence_p(u[:, 0::2], u[:, 1::2])


def test_draws_at_adjacent_positions_are_independent():
    assert adjacent_positions_p(lambda s, p: keyed_uniforms(s, p, Purpose.DRAFT, torch.float64)) > FALSE_ALARM


@pytest.mark.parametrize("flaw", ["position ignored", "noise reused across positions", "no mix after the position"])
def test_the_position_test_rejects_a_key_that_mishandles_the_position(flaw):
    uniforms = {
        "position ignored": lambda s, p: keyed_uniforms(s, torch.zeros_like(p), Purpose.DRAFT, torch.float64),
        "noise reused across positions": lambda s, p: keyed_uniforms(s, p // 2, Purpose.DRAFT, torch.float64),
        "no mix after the position": weyl_uniforms,
    }[flaw]
    assert adjacent_positions_p(uniforms) < FALSE_ALARM


def adjacent_seeds_p(uniforms) -> float:
    """Pairs at seeds (2j, 2j + 1), same position and purpose: 2,000 seed pairs x 10 positions."""
    seeds = torch.arange(4000, dtype=torch.int64)
    u = uniforms(seeds, POSITIONS[:, :10])  # [4000, 10]
    return pair_independence_p(u[0::2], u[1::2])


def test_draws_of_adjacent_seeds_are_independent():
    assert adjacent_seeds_p(lambda s, p: keyed_uniforms(s, p, Purpose.TARGET, torch.float64)) > FALSE_ALARM


@pytest.mark.parametrize("flaw", ["low bit of the seed ignored", "seed shifts a shared stream"])
def test_the_seed_test_rejects_a_key_that_mishandles_the_seed(flaw):
    def shifted_stream(s, p):
        shared = keyed_bits(torch.zeros_like(s), p, Purpose.TARGET)  # [B, n], one stream for every seed
        return uniforms_from_bits(shared + s[:, None] * _signed(GAMMA), torch.float64)

    uniforms = {
        "low bit of the seed ignored": lambda s, p: keyed_uniforms(s // 2, p, Purpose.TARGET, torch.float64),
        "seed shifts a shared stream": shifted_stream,
    }[flaw]
    assert adjacent_seeds_p(uniforms) < FALSE_ALARM


PURPOSE_PAIRS = [(Purpose.DRAFT, Purpose.ACCEPT), (Purpose.ACCEPT, Purpose.TARGET), (Purpose.DRAFT, Purpose.TARGET)]


def purposes_p(uniforms, first: Purpose, second: Purpose) -> float:
    """Pairs at one (seed, position) for two purposes."""
    return pair_independence_p(uniforms(first), uniforms(second))


@pytest.mark.parametrize("first, second", PURPOSE_PAIRS, ids=lambda p: p.name)
def test_draws_for_different_purposes_at_a_position_are_independent(first, second):
    p = purposes_p(lambda purpose: keyed_uniforms(SEEDS, POSITIONS, purpose, torch.float64), first, second)
    assert p > FALSE_ALARM / len(PURPOSE_PAIRS)  # Bonferroni over the three pairs


@pytest.mark.parametrize("flaw", ["purpose ignored", "purpose shifts a shared stream"])
def test_the_purpose_test_rejects_a_key_that_mishandles_the_purpose(flaw):
    def shifted_stream(purpose):
        shared = keyed_bits(SEEDS, POSITIONS, Purpose.DRAFT)  # [B, n], one stream for every purpose
        return uniforms_from_bits(shared + _signed(int(purpose) * GAMMA & MASK64), torch.float64)

    uniforms = {
        "purpose ignored": lambda purpose: keyed_uniforms(SEEDS, POSITIONS, Purpose.DRAFT, torch.float64),
        "purpose shifts a shared stream": shifted_stream,
    }[flaw]
    assert purposes_p(uniforms, Purpose.DRAFT, Purpose.ACCEPT) < FALSE_ALARM / len(PURPOSE_PAIRS)


def test_gumbel_noise_has_the_standard_gumbel_distribution():
    noise = keyed_gumbel(SEEDS[:4], POSITIONS[:, :50], 100)  # [4, 50, 100]: 20,000 values
    assert stats.kstest(noise.flatten().double().numpy(), "gumbel_r").pvalue > FALSE_ALARM


def test_the_gumbel_distribution_test_rejects_exponential_noise():
    # A transform that forgets the outer log: -log(u) is exponential, not Gumbel.
    exponential = torch.exp(-keyed_gumbel(SEEDS[:4], POSITIONS[:, :50], 100, torch.float64))  # -log(u)
    assert stats.kstest(exponential.flatten().numpy(), "gumbel_r").pvalue < FALSE_ALARM


def gumbel_argmax(noise: torch.Tensor, p: np.ndarray) -> torch.Tensor:
    return (torch.tensor(np.log(p)) + noise.double()).argmax(dim=-1)  # [B, n]


def argmax_fit_p(noise: torch.Tensor, p: np.ndarray) -> float:
    """Chi-square of the argmax of log p + G over all positions against P (p is P but in a negative control)."""
    counts = torch.bincount(gumbel_argmax(noise, p).flatten(), minlength=len(p)).numpy()
    return stats.chisquare(counts, P * counts.sum()).pvalue


@pytest.fixture(scope="module")
def noise() -> torch.Tensor:
    return keyed_gumbel(SEEDS, POSITIONS, len(P))  # [B, n, V]


def test_the_gumbel_argmax_samples_p(noise):
    assert argmax_fit_p(noise, P) > FALSE_ALARM


@pytest.mark.parametrize("flaw", ["noise reused across positions", "biased p"])
def test_the_gumbel_argmax_test_rejects_reused_noise_and_a_biased_p(noise, flaw):
    if flaw == "noise reused across positions":
        noise, p = noise[:, :1].expand_as(noise), P
    else:
        p = P**1.1 / (P**1.1).sum()
    assert argmax_fit_p(noise, p) < FALSE_ALARM


def adjacent_argmax_p(noise: torch.Tensor) -> float:
    """Chi-square of the argmax pairs at positions (2i, 2i + 1) against p x p (independent draws from p)."""
    tokens = gumbel_argmax(noise, P)  # [B, n]
    cells = tokens[:, 0::2] * len(P) + tokens[:, 1::2]
    counts = torch.bincount(cells.flatten(), minlength=len(P) ** 2).numpy()
    return stats.chisquare(counts, np.outer(P, P).flatten() * counts.sum()).pvalue


def test_gumbel_argmaxes_at_adjacent_positions_are_independent(noise):
    assert adjacent_argmax_p(noise) > FALSE_ALARM


def test_the_adjacent_argmax_test_rejects_noise_shared_by_pairs_of_positions():
    # Each marginal still samples p: only the pairs show the reuse.
    assert adjacent_argmax_p(keyed_gumbel(SEEDS, POSITIONS // 2, len(P))) < FALSE_ALARM
