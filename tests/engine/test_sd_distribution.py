"""The full SD engine samples from exactly the target's distribution (statistical, real code path).

A tiny model with an 8-token vocabulary makes the exact distribution of the first three generated
tokens computable by enumeration (512 sequences). Each regime generates N independent sequences as
one batch and compares their empirical distribution with the exact one by a chi-square test.
False-alarm rate: each test rejects at p < 1e-3, and the seeds are fixed, so a correct engine
fails a given test with probability 1e-3 over seeds and the suite is deterministic. The negative
control runs the same test on an engine with a deliberately biased verifier and must reject.
"""

import itertools

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from engine import LLM, SamplingParams, SpeculativeConfig
from engine.sampling import sample, warp
from engine.verifier import Verification
from tests.engine.tiny import noisy_copy, tiny_lm

V, STEPS, N = 8, 3, 20_000
PROMPT = [1, 5, 2]
FALSE_ALARM = 1e-3


@pytest.fixture(scope="module")
def target():
    return tiny_lm(0, vocab_size=V, hidden=16, scale=6.0)


@pytest.fixture(scope="module")
def draft(target):
    return noisy_copy(target, noise=1.5, seed=1)


def exact_distribution(model, params: SamplingParams) -> np.ndarray:
    """P(first STEPS tokens = s) for every s in V^STEPS, from the target alone, by enumeration."""
    probs = np.ones((V,) * 0)
    prefixes = [()]
    table = {(): 1.0}
    for _ in range(STEPS):
        batch = torch.tensor([PROMPT + list(s) for s in prefixes])
        with torch.inference_mode():
            p = warp(model(batch).logits[:, -1].double(), params).numpy()  # [n, V]
        table = {s + (x,): table[s] * p[i, x] for i, s in enumerate(prefixes) for x in range(V)}
        prefixes = list(table)
    probs = np.array([table[s] for s in itertools.product(range(V), repeat=STEPS)])
    return probs


def engine_counts(target, draft, spec: SpeculativeConfig, params: SamplingParams) -> np.ndarray:
    out = LLM(target, draft, strategy="sd", speculative=spec).generate([PROMPT] * N, params)
    index = [np.ravel_multi_index(o.token_ids, (V,) * STEPS) for o in out]
    return np.bincount(index, minlength=V**STEPS)


def chi_square_p(counts: np.ndarray, probs: np.ndarray) -> float:
    """Chi-square goodness of fit, pooling cells whose expected count is below 5."""
    expected = probs * counts.sum()
    small = expected < 5
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    if exp[-1] == 0:
        obs, exp = obs[:-1], exp[:-1]
    return chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


REGIMES = {
    "plain q, T=1": (SpeculativeConfig(K=2), dict(temperature=1.0)),
    "K=3, T=0.7": (SpeculativeConfig(K=3), dict(temperature=0.7)),
    "top-k and top-p": (SpeculativeConfig(K=2), dict(temperature=1.0, top_k=5, top_p=0.9)),
    "Saguaro C=0.3": (SpeculativeConfig(K=2, C=0.3, fanout=(1, 2, 1)), dict(temperature=1.0)),
}


@pytest.mark.parametrize("regime", list(REGIMES))
def test_sd_engine_matches_the_target_distribution(target, draft, regime):
    spec, kwargs = REGIMES[regime]
    params = SamplingParams(max_new_tokens=STEPS, stop_on_eos=False, seed=11, **kwargs)
    counts = engine_counts(target, draft, spec, params)
    assert chi_square_p(counts, exact_distribution(target, params)) > FALSE_ALARM


def argmax_verifier(draft_tokens, q, p, generator):
    """The reference engine's bug: accept while the draft token equals the target's argmax, then
    sample the bonus from p, at temperature > 0."""
    matches = draft_tokens == p[:, :-1].argmax(-1)  # [B, K]
    accepted = matches.long().cumprod(dim=1).sum(dim=1)  # [B]
    rows = torch.arange(len(accepted))
    bonus = sample(p[rows, accepted], generator)
    return Verification(accepted=accepted, bonus=bonus)


def test_negative_control_biased_verifier_is_detected(target, draft, monkeypatch):
    monkeypatch.setattr("engine.decode_loop.verify", argmax_verifier)
    params = SamplingParams(temperature=1.0, max_new_tokens=STEPS, stop_on_eos=False, seed=11)
    counts = engine_counts(target, draft, SpeculativeConfig(K=2), params)
    assert chi_square_p(counts, exact_distribution(target, params)) < 1e-12


def test_exact_distribution_is_not_degenerate(target):
    # The test above is only meaningful if the target spreads its mass over many sequences.
    probs = exact_distribution(target, SamplingParams(temperature=1.0))
    assert probs.sum() == pytest.approx(1.0)
    assert (probs > 1e-3).sum() > 50
