"""Greedy speculative decoding emits exactly the autoregressive tokens (fp32, tiny models)."""

import pytest

from engine import LLM, SamplingParams, SpeculativeConfig
from tests.engine.tiny import noisy_copy, tiny_lm

# Fixtures target and ar_tokens (conftest.py): the tiny target, and greedy AR's tokens for PROMPTS under GREEDY.
PROMPTS = [[1, 2, 3, 4, 5], [7, 8], [9, 10, 11, 12, 13, 14, 15, 16]]
GREEDY = SamplingParams(temperature=0, max_new_tokens=30, stop_on_eos=False)


@pytest.mark.parametrize("K", [1, 2, 5])
def test_sd_with_a_different_draft_equals_ar(target, ar_tokens, K):
    draft = tiny_lm(1, layers=1, scale=4.0)
    out = LLM(target, draft, strategy="sd", speculative=SpeculativeConfig(K=K)).generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in out] == ar_tokens


def test_sd_with_the_target_as_draft_accepts_everything(target, ar_tokens):
    out = LLM(target, target, strategy="sd", speculative=SpeculativeConfig(K=4)).generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in out] == ar_tokens
    assert set(out.metrics.accepted_hist) == {4}


def test_partly_agreeing_draft_exercises_partial_acceptance(target, ar_tokens):
    # A noisy copy of the target agrees often but not always: several values of k show up.
    draft = noisy_copy(target, noise=1.0)
    out = LLM(target, draft, strategy="sd", speculative=SpeculativeConfig(K=3)).generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in out] == ar_tokens
    assert len(out.metrics.accepted_hist) >= 2


def test_saguaro_sampling_leaves_greedy_output_unchanged(target, ar_tokens):
    draft = tiny_lm(1, layers=1, scale=4.0)
    spec = SpeculativeConfig(K=3, C=0.3, fanout=(2, 1, 1, 2))
    out = LLM(target, draft, strategy="sd", speculative=spec).generate(PROMPTS, GREEDY)
    assert [o.token_ids for o in out] == ar_tokens


def test_batched_output_equals_each_prompt_alone(target, ar_tokens):
    for prompt, expected in zip(PROMPTS, ar_tokens, strict=True):
        assert LLM(target).generate([prompt], GREEDY)[0].token_ids == expected


def test_same_seed_same_output_at_temperature():
    target, draft = tiny_lm(0), tiny_lm(1, layers=1)
    params = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, max_new_tokens=20, seed=7)
    runs = [LLM(target, draft, strategy="sd").generate(PROMPTS, params) for _ in range(2)]
    assert [o.token_ids for o in runs[0]] == [o.token_ids for o in runs[1]]
    other = LLM(target, draft, strategy="sd").generate(
        PROMPTS, SamplingParams(temperature=0.8, top_k=20, top_p=0.9, max_new_tokens=20, seed=8)
    )
    assert [o.token_ids for o in other] != [o.token_ids for o in runs[0]]


def test_eos_and_length_limits_truncate_the_output(target, ar_tokens):
    eos = ar_tokens[0][5]
    target.generation_config.eos_token_id = eos
    try:
        params = SamplingParams(temperature=0, max_new_tokens=30)
        for strategy, draft in (("ar", None), ("sd", target)):
            out = LLM(target, draft, strategy=strategy).generate([PROMPTS[0]], params)[0]
            assert out.token_ids == ar_tokens[0][: ar_tokens[0].index(eos) + 1]
            assert out.finish_reason == "stop"
    finally:
        target.generation_config.eos_token_id = None
    out = LLM(target, target, strategy="sd").generate(
        PROMPTS, SamplingParams(temperature=0, max_new_tokens=7, stop_on_eos=False)
    )
    assert all(len(o.token_ids) == 7 and o.finish_reason == "length" for o in out)
