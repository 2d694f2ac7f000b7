"""Greedy SD on real models emits exactly the AR tokens (fp32, where block shapes round alike)."""

import pytest

from engine import LLM, SamplingParams, SpeculativeConfig
from saguaro.bench.prompts import load_prompts


@pytest.mark.smoke
def test_smollm2_as_its_own_draft_equals_its_greedy_output():
    params = SamplingParams(temperature=0, max_new_tokens=24, stop_on_eos=False)
    prompts = ["def fibonacci(n):", "The three primary colours are"]
    expected = LLM("smollm2-135m", dtype="float32", chat_template=False).generate(prompts, params)
    with LLM(
        "smollm2-135m",
        "smollm2-135m",
        strategy="sd",
        dtype="float32",
        chat_template=False,
        speculative=SpeculativeConfig(K=3),
    ) as llm:
        out = llm.generate(prompts, params)
    assert [o.token_ids for o in out] == [o.token_ids for o in expected]
    assert set(out.metrics.accepted_hist) == {3}  # a model always agrees with itself
    assert all(o.text.strip() for o in out)


@pytest.mark.slow
@pytest.mark.timeout(1800)  # fp32 1.5B on two cores: ~10 min for the ten prompts
def test_default_pair_greedy_sd_equals_ar_on_ten_spec_bench_prompts():
    prompts = [p.text for p in load_prompts("spec_bench", 10)]
    params = SamplingParams(temperature=0, max_new_tokens=32)
    with LLM("qwen-coder-1.5b", dtype="float32") as ar:
        expected = ar.generate(prompts, params)
    with LLM(
        "qwen-coder-1.5b", "qwen-coder-0.5b", strategy="sd", dtype="float32", speculative=SpeculativeConfig(K=4)
    ) as sd:
        out = sd.generate(prompts, params)
    assert [o.token_ids for o in out] == [o.token_ids for o in expected]
    assert out.metrics.acceptance_rate > 0.3  # a real draft: not a degenerate run
