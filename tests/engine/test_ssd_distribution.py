"""The SSD engine samples from exactly the target's distribution in every regime (statistical).

Same design as test_sd_distribution.py (the same enumeration and chi-square functions, in tiny.py): a tiny
8-token model, N independent sequences generated as one batch (so batch ≥ 2 in every regime, each row
with its own outcome, hit or miss), the first three tokens compared with the exact distribution.
False-alarm rate: each test rejects at p < 1e-3 with fixed seeds (deterministic suite). The negative
control plugs the reference engine's biased argmax verifier into SSD and must be rejected.
"""

import numpy as np
import pytest

from engine import LLM, SamplingParams, SpeculativeConfig
from engine.config import DraftPlacement
from tests.engine.tiny import (
    FALSE_ALARM,
    PROMPT,
    STEPS,
    argmax_verifier,
    chi_square_p,
    exact_distribution,
    sequence_counts,
)

N = 3_000
IN_PROCESS = DraftPlacement(in_process=True)


def ssd_counts(target, draft, spec: SpeculativeConfig, params: SamplingParams) -> tuple[np.ndarray, dict]:
    out = LLM(target, draft, strategy="ssd", speculative=spec).generate([PROMPT] * N, params)
    return sequence_counts(out), out.metrics.summary()


HITS = dict(schedule="given", fanout=(3, 3, 3))
MISSES = dict(schedule="given", fanout=(0, 0, 0))
REGIMES = {
    "cache hits, T=1": (dict(K=2, **HITS), dict(temperature=1.0)),
    "cache hits, top-k, top-p, T=0.7": (dict(K=2, **HITS), dict(temperature=0.7, top_k=5, top_p=0.9)),
    "forced misses, neural backup": (dict(K=2, backup="neural", **MISSES), dict(temperature=1.0)),
    "forced misses, random backup": (dict(K=2, backup="random", **MISSES), dict(temperature=1.0)),
    "forced misses, lookup backup": (dict(K=2, backup="lookup", **MISSES), dict(temperature=1.0)),
    "Saguaro C=0.3, geometric": (dict(K=2, C=0.3, schedule="geometric", budget=5), dict(temperature=1.0)),
}


@pytest.mark.parametrize("regime", list(REGIMES))
def test_ssd_engine_matches_the_target_distribution(target8, draft8, regime):
    spec_kwargs, kwargs = REGIMES[regime]
    spec = SpeculativeConfig(placement=IN_PROCESS, **spec_kwargs)
    params = SamplingParams(max_new_tokens=STEPS, stop_on_eos=False, seed=11, **kwargs)
    counts, summary = ssd_counts(target8, draft8, spec, params)
    if "hits" in regime:
        assert summary["hit_rate"] > 0.15  # over a thousand rows really take the cache-hit path
    if "misses" in regime:
        assert summary["hit_rate"] == 0 and summary["backup_rows"]
    assert chi_square_p(counts, exact_distribution(target8, params)) > FALSE_ALARM


def test_negative_control_biased_verifier_is_detected(target8, draft8, monkeypatch):
    monkeypatch.setattr("engine.verifier.verify", argmax_verifier)
    params = SamplingParams(temperature=1.0, max_new_tokens=STEPS, stop_on_eos=False, seed=11)
    counts, _ = ssd_counts(target8, draft8, SpeculativeConfig(K=2, placement=IN_PROCESS, **HITS), params)
    assert chi_square_p(counts, exact_distribution(target8, params)) < 1e-12
