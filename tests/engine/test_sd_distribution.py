"""The full SD engine samples from exactly the target's distribution (statistical, real code path).

A tiny model with an 8-token vocabulary makes the exact distribution of the first three generated
tokens computable by enumeration (512 sequences). Each regime generates N independent sequences as
one batch and compares their empirical distribution with the exact one by a chi-square test.
False-alarm rate: each test rejects at p < 1e-3, and the seeds are fixed, so a correct engine
fails a given test with probability 1e-3 over seeds and the suite is deterministic. The negative
control runs the same test on an engine with a deliberately biased verifier and must reject.
"""

import numpy as np
import pytest

from engine import LLM, SamplingParams, SpeculativeConfig
from tests.engine.tiny import (
    FALSE_ALARM,
    PROMPT,
    STEPS,
    argmax_verifier,
    chi_square_p,
    exact_distribution,
    sequence_counts,
)

# The 8-token target8 and its draft8: fixtures in conftest.py; V, STEPS, PROMPT and the enumeration and chi-square
# functions: tiny.py.
N = 20_000


def engine_counts(target, draft, spec: SpeculativeConfig, params: SamplingParams) -> np.ndarray:
    out = LLM(target, draft, strategy="sd", speculative=spec).generate([PROMPT] * N, params)
    return sequence_counts(out)


REGIMES = {
    "plain q, T=1": (SpeculativeConfig(K=2), dict(temperature=1.0)),
    "K=3, T=0.7": (SpeculativeConfig(K=3), dict(temperature=0.7)),
    "top-k and top-p": (SpeculativeConfig(K=2), dict(temperature=1.0, top_k=5, top_p=0.9)),
    "Saguaro C=0.3": (SpeculativeConfig(K=2, C=0.3, fanout=(1, 2, 1)), dict(temperature=1.0)),
}


@pytest.mark.parametrize("regime", list(REGIMES))
def test_sd_engine_matches_the_target_distribution(target8, draft8, regime):
    spec, kwargs = REGIMES[regime]
    params = SamplingParams(max_new_tokens=STEPS, stop_on_eos=False, seed=11, **kwargs)
    counts = engine_counts(target8, draft8, spec, params)
    assert chi_square_p(counts, exact_distribution(target8, params)) > FALSE_ALARM


def test_negative_control_biased_verifier_is_detected(target8, draft8, monkeypatch):
    monkeypatch.setattr("engine.verifier.verify", argmax_verifier)
    params = SamplingParams(temperature=1.0, max_new_tokens=STEPS, stop_on_eos=False, seed=11)
    counts = engine_counts(target8, draft8, SpeculativeConfig(K=2), params)
    assert chi_square_p(counts, exact_distribution(target8, params)) < 1e-12


def test_exact_distribution_is_not_degenerate(target8):
    # The test above is only meaningful if the target spreads its mass over many sequences.
    probs = exact_distribution(target8, SamplingParams(temperature=1.0))
    assert probs.sum() == pytest.approx(1.0)
    assert (probs > 1e-3).sum() > 50
