"""SD and SSD on the device sample from exactly the target's distribution (statistical, real code path).

The design and functions of tests/engine/test_sd_distribution.py, with the engine on the device (cuda:0 on a
GPU): a tiny 8-token model, N sequences generated as one batch, the first three tokens compared by chi-square
with the exact distribution, enumerated on the CPU in float64. False-alarm rate 1e-3 per test with fixed seeds
(the per-row random streams live on the host on every device, but GPU kernels may still round p and q
differently from the CPU's, never change their distribution). The negative control plugs the reference engine's
argmax verifier into the engine and must be rejected at p < 1e-12."""

import copy

import numpy as np
import pytest

from engine import LLM, SamplingParams, SpeculativeConfig
from engine.config import DraftPlacement
from tests.engine.tiny import (
    FALSE_ALARM,
    PROMPT,
    STEPS,
    V,
    argmax_verifier,
    chi_square_p,
    exact_distribution,
    noisy_copy,
    tiny_lm,
)
from tests.gpu.devices import target_device

N = 20_000  # SD rows
N_SSD = 3_000  # SSD rows (as the CPU SSD test: the worker keeps a cache per row and branch)
PARAMS = SamplingParams(temperature=1.0, max_new_tokens=STEPS, stop_on_eos=False, seed=11)


def models():
    """A fresh target and draft per engine (LLM moves a given model to its device in place)."""
    target = tiny_lm(0, vocab_size=V, hidden=16, scale=6.0)
    return target, noisy_copy(target, noise=1.5, seed=1)


@pytest.fixture(scope="module")
def exact():
    target, _ = models()
    return exact_distribution(copy.deepcopy(target), PARAMS)  # on the CPU, float64


def counts(device: str, strategy: str, spec: SpeculativeConfig, rows: int) -> tuple[np.ndarray, dict]:
    target, draft = models()
    with LLM(target, draft, strategy=strategy, speculative=spec, device=target_device(device), dtype="float32") as llm:
        out = llm.generate([PROMPT] * rows, PARAMS)
    index = [np.ravel_multi_index(o.token_ids, (V,) * STEPS) for o in out]
    return np.bincount(index, minlength=V**STEPS), out.metrics.summary()


def test_sd_matches_the_target_distribution(device, exact):
    observed, _ = counts(device, "sd", SpeculativeConfig(K=2), N)
    assert chi_square_p(observed, exact) > FALSE_ALARM


def test_ssd_with_cache_hits_matches_the_target_distribution(device, exact):
    spec = SpeculativeConfig(K=2, schedule="given", fanout=(3, 3, 3), placement=DraftPlacement(in_process=True))
    observed, summary = counts(device, "ssd", spec, N_SSD)
    assert summary["hit_rate"] > 0.15  # the rows really take the cache-hit path
    assert chi_square_p(observed, exact) > FALSE_ALARM


def test_negative_control_biased_verifier_is_detected(device, exact, monkeypatch):
    monkeypatch.setattr("engine.verifier.verify", argmax_verifier)
    observed, _ = counts(device, "sd", SpeculativeConfig(K=2), N)
    assert chi_square_p(observed, exact) < 1e-12
