"""A low-bit target is the target: SD and SSD stay exact relative to the model actually loaded.

Greedy: SD and SSD with an int4 target and an int8 draft emit exactly greedy AR's tokens on that int4 target
(whose tokens differ from the float target's, so the check is not vacuous). The SSD worker process gets the
same low-bit draft from its recipe as SD uses in process.

Statistical: a tiny model with an 8-token vocabulary makes the distribution of the first three tokens
computable by enumeration (512 sequences); N = 20,000 SD samples with the int4 target are compared with the
int4 target's exact distribution by a chi-square test (cells with expected count < 5 pooled). It passes at
p > 1e-3, so with its fixed seeds a correct engine would fail with probability 1e-3 over seeds (the false-alarm
rate); the suite is deterministic. Negative controls, which must reject at p < 1e-9: the same samples against
the float target's distribution (what the engine would be judged against if the low-bit target were not the
target), and samples from an engine with a deliberately biased verifier against the int4 distribution.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

from engine import LLM, SamplingParams, SpeculativeConfig
from engine.config import DraftPlacement, EngineConfig, QuantConfig
from engine.loading.recipe import draft_recipe
from engine.loading.tiny import tiny_pair
from engine.loading.weight_only import WeightOnlyLinear
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

# tiny_pair's layers are [16|32|64, 32] and [32, 64]: int8 needs in_features % 16, int4 g32 also
# out_features % 16; every Linear but the (kept) output head fits both.
PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12, 13, 14, 15, 16]]
GREEDY = SamplingParams(temperature=0, max_new_tokens=24, stop_on_eos=False)
LOW_BIT = dict(target_quant=QuantConfig("int4", group_size=32), draft_quant="int8")


@pytest.fixture(scope="module")
def pair():
    return tiny_pair(vocab_size=48, seed=0, logit_scale=4.0)


@pytest.fixture(scope="module")
def low_bit_ar(pair):
    with LLM(pair[0], target_quant="int4") as llm:
        return [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]


def test_the_low_bit_target_is_a_different_model(pair, low_bit_ar):
    target = pair[0]
    with LLM(target) as llm:
        float_ar = [o.token_ids for o in llm.generate(PROMPTS, GREEDY)]
    assert float_ar != low_bit_ar  # otherwise the equalities below would not tell the two apart
    with LLM(target, target_quant="int4") as llm:
        assert sum(isinstance(m, WeightOnlyLinear) for m in llm.target.modules()) == 14
        assert llm.target is not target  # the caller's float model is quantised as a copy
    assert not any(isinstance(m, WeightOnlyLinear) for m in target.modules())


@pytest.mark.parametrize("K", [1, 3])
def test_greedy_sd_with_int4_target_and_int8_draft_equals_ar(pair, low_bit_ar, K):
    target, draft = pair
    with LLM(target, draft, strategy="sd", speculative=SpeculativeConfig(K=K), **LOW_BIT) as llm:
        assert sum(isinstance(m, WeightOnlyLinear) for m in llm.draft.modules()) == 7  # 1 layer x 7
        out = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in out] == low_bit_ar
    assert len(out.metrics.accepted_hist) >= 2  # accepted and rejected drafts both exercised


@pytest.mark.parametrize("backup", ["neural", "random"])
def test_greedy_ssd_with_int4_target_and_int8_draft_equals_ar(pair, low_bit_ar, backup):
    target, draft = pair
    spec = SpeculativeConfig(K=3, backup=backup, placement=DraftPlacement(in_process=True))
    with LLM(target, draft, strategy="ssd", speculative=spec, **LOW_BIT) as llm:
        out = llm.generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in out] == low_bit_ar
    assert 0 < out.metrics.summary()["hit_rate"] < 1 and len(out.metrics.accepted_hist) >= 2


def test_greedy_ssd_with_the_draft_quantised_in_its_worker_process_equals_ar(pair, low_bit_ar):
    # The worker process receives the float draft's weights and the scheme, and quantises there.
    target, draft = pair
    spec = SpeculativeConfig(K=3, placement=DraftPlacement(deadline_s=30.0))
    with LLM(target, draft, strategy="ssd", speculative=spec, **LOW_BIT) as llm:
        out = llm.generate(PROMPTS, GREEDY)
        assert llm.strategy_in_use == "ssd" and llm.fault is None
        assert llm.proposer.channel.process.pid != os.getpid()
    assert [o.token_ids for o in out] == low_bit_ar
    assert all(r.strategy == "ssd" for r in out.metrics.rounds if r.phase == "decode")
    # Greedy output is the same whatever the draft; the accepted lengths tell which draft drafted.
    accepted = lambda o: [r.accepted for r in o.metrics.rounds if r.phase == "decode"]  # noqa: E731
    in_process = SpeculativeConfig(K=3, placement=DraftPlacement(in_process=True))
    with LLM(target, draft, strategy="ssd", speculative=in_process, **LOW_BIT) as llm:
        assert accepted(llm.generate(PROMPTS, GREEDY)) == accepted(out)
    with LLM(target, draft, strategy="ssd", speculative=in_process, target_quant="int4") as llm:
        assert accepted(llm.generate(PROMPTS, GREEDY)) != accepted(out)  # the float draft drafts otherwise


@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_the_worker_recipe_builds_the_same_low_bit_draft(pair, quant):
    # SSD's worker process builds its draft from this recipe: it must be the draft SD uses in process.
    target, draft = pair
    config = EngineConfig(target="t", draft="d", strategy="ssd", draft_quant=quant)
    with LLM(target, draft, strategy="sd", draft_quant=quant) as llm:
        in_process = llm.draft
        recipe = draft_recipe(llm._draft_given, config)
    rebuilt = recipe.build(torch.device("cpu"))
    assert (recipe.quant, recipe.path) == (QuantConfig(quant), None)
    assert sum(isinstance(m, WeightOnlyLinear) for m in rebuilt.modules()) == 7
    ids = torch.tensor([PROMPTS[2]])
    assert torch.equal(rebuilt(ids).logits, in_process(ids).logits)
    assert not torch.equal(rebuilt(ids).logits, draft(ids).logits)  # quantised, not the float draft


def test_a_low_bit_draft_object_is_refused_by_the_worker_recipe(pair):
    config = EngineConfig(target="t", draft="d", strategy="ssd", draft_quant="int8")
    with LLM(pair[0], pair[1], strategy="sd", draft_quant="int8") as llm:
        with pytest.raises(ValueError, match="int8-quantised draft object"):
            draft_recipe(llm.draft, config)


# -- statistical ----------------------------------------------------------------------------------
N = 20_000  # V, STEPS, PROMPT and the enumeration and chi-square functions: tiny.py
PARAMS = SamplingParams(temperature=1.0, max_new_tokens=STEPS, stop_on_eos=False, seed=11)


@pytest.fixture(scope="module")
def small_pair():
    return tiny_pair(vocab_size=V, seed=3, logit_scale=1.0)


def sd_samples(target, draft) -> tuple[np.ndarray, torch.nn.Module]:
    """Counts over V^STEPS of N SD samples with an int4 target and int8 draft, and the target loaded."""
    with LLM(target, draft, strategy="sd", speculative=SpeculativeConfig(K=2), **LOW_BIT) as llm:
        out = llm.generate([PROMPT] * N, PARAMS)
        loaded = llm.target
    return sequence_counts(out), loaded


@pytest.fixture(scope="module")
def sampled(small_pair):
    return sd_samples(*small_pair)


def test_sd_with_an_int4_target_samples_the_int4_targets_distribution(sampled):
    counts, loaded = sampled
    probs = exact_distribution(loaded, PARAMS)
    assert (probs > 1e-3).sum() > 50  # mass spread over many sequences: a meaningful test
    assert chi_square_p(counts, probs) > FALSE_ALARM


def test_negative_control_the_float_targets_distribution_is_rejected(small_pair, sampled):
    counts, loaded = sampled
    float_probs, low_bit_probs = exact_distribution(small_pair[0], PARAMS), exact_distribution(loaded, PARAMS)
    assert 0.5 * np.abs(float_probs - low_bit_probs).sum() > 0.02  # the two models differ by this much (TV)
    assert chi_square_p(counts, float_probs) < 1e-9


def test_negative_control_a_biased_verifier_is_detected_on_the_low_bit_path(small_pair, monkeypatch):
    monkeypatch.setattr("engine.verifier.verify", argmax_verifier)
    counts, loaded = sd_samples(*small_pair)
    assert chi_square_p(counts, exact_distribution(loaded, PARAMS)) < 1e-9
