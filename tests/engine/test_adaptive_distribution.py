"""SD with adaptive K and a confidence stop samples from exactly the target's distribution (statistical).

Same set-up as test_sd_distribution: an 8-token tiny model whose first three generated tokens have an
exact distribution computable by enumeration, and a chi-square test at p < 1e-3 with fixed seeds. The
batch shares one K per round (chosen from its rows' past acceptance) and the draft stops early when it is
unsure in every row, so the rows are generated 20 at a time: in a batch of thousands the stop would never
fire. The K chosen per round and the early stops are checked to vary, or the test would prove nothing.
The negative control runs the same schedule with a biased verifier and must reject.
"""

import numpy as np

from engine import LLM, SamplingParams, SpeculativeConfig
from tests.engine.tiny import (
    FALSE_ALARM,
    PROMPT,
    STEPS,
    V,
    argmax_verifier,
    chi_square_p,
    exact_distribution,
    sequence_counts,
)

ROWS, CALLS = 20, 300  # 6,000 sequences
SPEC = SpeculativeConfig(K=4, adaptive=True, draft_cost=0.02, confidence_stop=0.5)


def run(target, draft, calls: int, temperature: float = 1.0):
    """Counts of each first-STEPS sequence over `calls` batches of ROWS, and the (K, forwards) of each round."""
    llm = LLM(target, draft, strategy="sd", speculative=SPEC, threads=1)  # tiny batches: threads only contend
    counts, shapes = np.zeros(V**STEPS, dtype=np.int64), set()
    for i in range(calls):
        params = SamplingParams(temperature=temperature, max_new_tokens=STEPS, stop_on_eos=False, seed=11 + 7919 * i)
        out = llm.generate([PROMPT] * ROWS, params)
        counts += sequence_counts(out)
        shapes |= {(r.K, r.draft_forwards) for r in out.metrics.rounds if r.phase == "decode"}
    return counts, shapes


def test_adaptive_K_and_confidence_stop_keep_the_target_distribution(target8, draft8):
    counts, shapes = run(target8, draft8, CALLS)
    assert len({K for K, _ in shapes}) >= 3  # K varied from round to round
    assert any(forwards > K for K, forwards in shapes)  # the draft stopped early (it looked one further)
    params = SamplingParams(temperature=1.0)
    assert chi_square_p(counts, exact_distribution(target8, params)) > FALSE_ALARM


def test_negative_control_biased_verifier_is_detected_under_adaptive_K(target8, draft8, monkeypatch):
    monkeypatch.setattr("engine.verifier.verify", argmax_verifier)
    counts, _ = run(target8, draft8, CALLS // 3)
    assert chi_square_p(counts, exact_distribution(target8, SamplingParams(temperature=1.0))) < 1e-9
