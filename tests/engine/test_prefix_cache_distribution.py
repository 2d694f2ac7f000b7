"""With prefix-cache hits, SD and SSD still sample exactly the target's distribution (statistical).

The design of test_sd_distribution.py and test_ssd_distribution.py (tiny.py's enumeration and chi-square), with a
prompt longer than one KV block: a first request registers the prompt's full block, so each of the N rows that
follow takes that block from the cache, on the target and on the draft's side, and prefills only the rest. The
negative control plugs in the biased argmax verifier and must be rejected.
"""

import pytest

from engine import LLM, SamplingParams, SpeculativeConfig
from engine.blocks.pool import DEFAULT_BLOCK_SIZE
from engine.config import DraftPlacement
from tests.engine.tiny import FALSE_ALARM, PROMPT, STEPS, argmax_verifier, chi_square_p, exact_distribution
from tests.engine.tiny import sequence_counts as counts_of

N = 3_000
LONG = (PROMPT * DEFAULT_BLOCK_SIZE)[: DEFAULT_BLOCK_SIZE + 2]  # one full block, and two tokens past it
SPECS = {
    "sd": SpeculativeConfig(K=2),
    "ssd": SpeculativeConfig(K=2, schedule="given", fanout=(3, 3, 3), placement=DraftPlacement(in_process=True)),
}


def cached_counts(target, draft, strategy: str, params: SamplingParams):
    with LLM(target, draft, strategy=strategy, speculative=SPECS[strategy]) as llm:
        llm.generate([LONG], SamplingParams(max_new_tokens=1, stop_on_eos=False, seed=0))  # registers the block
        out = llm.generate([LONG] * N, params)
    assert all(o.metrics.cached_prompt_tokens == DEFAULT_BLOCK_SIZE for o in out)  # every row took the block
    return counts_of(out)


@pytest.mark.parametrize("strategy", ["sd", "ssd"])
def test_rows_that_take_a_cached_prefix_sample_the_target_distribution(target8, draft8, strategy):
    params = SamplingParams(temperature=1.0, max_new_tokens=STEPS, stop_on_eos=False, seed=11)
    counts = cached_counts(target8, draft8, strategy, params)
    assert chi_square_p(counts, exact_distribution(target8, params, LONG)) > FALSE_ALARM


def test_negative_control_biased_verifier_with_cached_prefixes_is_detected(target8, draft8, monkeypatch):
    monkeypatch.setattr("engine.verifier.verify", argmax_verifier)
    params = SamplingParams(temperature=1.0, max_new_tokens=STEPS, stop_on_eos=False, seed=11)
    counts = cached_counts(target8, draft8, "ssd", params)
    assert chi_square_p(counts, exact_distribution(target8, params, LONG)) < 1e-12
