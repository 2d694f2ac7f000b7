"""Drafter-invariant sampling samples from exactly the target's distribution, for AR, SD and SSD (statistical).

The design of test_sd_distribution.py (tiny.py's enumeration and chi-square): a tiny 8-token model, N rows of
one prompt generated as one batch with a seed per row, the first three tokens against the exact distribution.
False-alarm rate: each test rejects at p < 1e-3 with fixed seeds (a deterministic suite). Two negative controls
must be rejected: a coupling that emits the draft's race winner (biased towards q), and noise reused at every
position (each token then depends on the one before through the shared numbers).
"""

import pytest

from engine import LLM, SamplingParams, SpeculativeConfig
from engine.config import DraftPlacement
from engine.verifier import Verification
from tests.engine.tiny import FALSE_ALARM, PROMPT, STEPS, chi_square_p, exact_distribution, sequence_counts

N = 3_000
IN_PROCESS = DraftPlacement(in_process=True)
HITS = dict(schedule="given", fanout=(3, 3, 3))
MISSES = dict(schedule="given", fanout=(0, 0, 0))
REGIMES = {
    "AR, T=1": ("ar", {}, dict(temperature=1.0)),
    "SD K=2, T=1": ("sd", dict(K=2), dict(temperature=1.0)),
    "SD K=3, top-k, top-p, T=0.7": ("sd", dict(K=3), dict(temperature=0.7, top_k=5, top_p=0.9)),
    "SSD cache hits, T=1": ("ssd", dict(K=2, **HITS), dict(temperature=1.0)),
    "SSD forced misses, random backup": ("ssd", dict(K=2, backup="random", **MISSES), dict(temperature=1.0)),
    "SSD Saguaro C=0.3, geometric": ("ssd", dict(K=2, C=0.3, schedule="geometric", budget=5), dict(temperature=1.0)),
}


def counts(target, draft, strategy: str, spec: dict, sampling: dict):
    params = SamplingParams(max_new_tokens=STEPS, stop_on_eos=False, seed=11, sampling_mode="invariant", **sampling)
    spec = SpeculativeConfig(placement=IN_PROCESS, **spec)
    out = LLM(target, None if strategy == "ar" else draft, strategy=strategy, speculative=spec).generate(
        [PROMPT] * N, params
    )
    return sequence_counts(out), out.metrics.summary(), params


@pytest.mark.parametrize("regime", list(REGIMES))
def test_invariant_sampling_matches_the_target_distribution(target8, draft8, regime):
    strategy, spec, sampling = REGIMES[regime]
    observed, summary, params = counts(target8, draft8, strategy, spec, sampling)
    if "hits" in regime:
        assert summary["hit_rate"] > 0.15  # over a thousand rows really take the cache-hit path
    if "misses" in regime:
        assert summary["hit_rate"] == 0 and summary["backup_rows"]
    assert chi_square_p(observed, exact_distribution(target8, params)) > FALSE_ALARM


def test_negative_control_emitting_the_drafts_winner_is_detected(target8, draft8, monkeypatch):
    """A coupling that keeps every draft token (the draft's race winner, distributed as q) and only then the
    target's winner: biased towards the draft."""

    def accept_all(draft_tokens, p, keys, checks=None):
        B, K = draft_tokens.shape
        real = verify_invariant(draft_tokens, p, keys, checks)
        accepted = real.accepted.new_full((B,), K)
        return Verification(accepted=accepted, bonus=real.bonus, draft_tokens=draft_tokens)  # bonus: a winner

    from engine.verifier import verify_invariant

    monkeypatch.setattr("engine.verifier.verify_invariant", accept_all)
    observed, _, params = counts(target8, draft8, "sd", dict(K=2), dict(temperature=1.0))
    assert chi_square_p(observed, exact_distribution(target8, params)) < 1e-12


def test_negative_control_noise_reused_across_positions_is_detected(target8, draft8, monkeypatch):
    """Every position of a row races with the same numbers (the position left out of the key)."""
    import engine.invariant

    real = engine.invariant.token_uniforms
    monkeypatch.setattr(
        engine.invariant, "token_uniforms", lambda seeds, positions, V, ids=None: real(seeds, positions * 0, V, ids)
    )
    observed, _, params = counts(target8, draft8, "ar", {}, dict(temperature=1.0))
    assert chi_square_p(observed, exact_distribution(target8, params)) < 1e-12
