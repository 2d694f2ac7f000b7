"""Exactness under continuous batching with different sampling settings per row (statistical).

Rows of two settings (T = 1; T = 0.7 with top-p 0.9 and top-k 5) are interleaved in one call whose batch
holds at most 256 sequences, so rows join as others leave (a row emits 1..K+1 tokens a round). Each
setting's sequences are compared with that setting's exact distribution of the first three tokens by a
chi-square test (false-alarm rate 1e-3 per test, fixed seeds: deterministic). The negative control runs
the same mixed batch with the biased "equals the target argmax" verifier and must be rejected.
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

SETTINGS = [dict(temperature=1.0), dict(temperature=0.7, top_p=0.9, top_k=5)]
N = {"sd": 6_000, "ssd": 2_000}  # rows per setting
SPECS = {
    "sd": SpeculativeConfig(K=2),
    "ssd": SpeculativeConfig(K=2, schedule="given", fanout=(3, 3, 3), placement=DraftPlacement(in_process=True)),
}


def mixed_counts(target, draft, strategy: str) -> tuple[list[np.ndarray], list]:
    n = N[strategy]
    params = [
        SamplingParams(max_new_tokens=STEPS, stop_on_eos=False, seed=31 + i, **SETTINGS[i % 2]) for i in range(2 * n)
    ]
    with LLM(target, draft, strategy=strategy, speculative=SPECS[strategy], max_num_seqs=256) as llm:
        out = llm.generate([PROMPT] * (2 * n), params)
    counts = []
    for setting in range(2):
        counts.append(sequence_counts(out.outputs[setting::2]))
    return counts, out.metrics.rounds


@pytest.mark.parametrize("strategy", ["sd", "ssd"])
def test_mixed_settings_under_continuous_batching_match_each_target_distribution(target8, draft8, strategy):
    counts, rounds = mixed_counts(target8, draft8, strategy)
    assert max(r.batch_size for r in rounds) == 256
    assert sum(r.phase == "prefill" for r in rounds) > 10  # rows really joined a running batch
    for setting, c in zip(SETTINGS, counts, strict=True):
        params = SamplingParams(max_new_tokens=STEPS, **setting)
        assert chi_square_p(c, exact_distribution(target8, params)) > FALSE_ALARM


def test_negative_control_biased_verifier_is_detected_in_a_mixed_batch(target8, draft8, monkeypatch):
    monkeypatch.setattr("engine.verifier.verify", argmax_verifier)
    counts, _ = mixed_counts(target8, draft8, "sd")
    params = SamplingParams(max_new_tokens=STEPS, **SETTINGS[0])
    assert chi_square_p(counts[0], exact_distribution(target8, params)) < 1e-12
