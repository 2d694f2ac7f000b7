"""SD and SSD with compiled forwards on the static slot cache sample exactly the target's distribution
(statistical), and the biased verifier is still caught on that path.

The design of test_sd_distribution.py and test_ssd_distribution.py (tiny.py's enumeration and chi-square; each
test rejects at p < 1e-3 with fixed seeds, so the suite is deterministic), on engines whose every forward
runs in a compiled bucket: the batch is bounded by the largest bucket (max_num_seqs), so the N sequences run
as several batches that join as others leave, and SSD's branches have a bucket of their own."""

import numpy as np

from engine import LLM, SamplingParams, SpeculativeConfig
from engine.compile_config import CompileConfig
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

ROWS = 512  # a batch of the compiled bucket
COMPILED = CompileConfig(max_len=16, batch_buckets=(ROWS, 9 * ROWS))  # the larger: SSD's 9 branches per row
PARAMS = SamplingParams(temperature=1.0, max_new_tokens=STEPS, stop_on_eos=False, seed=11)


def compiled_counts(target, draft, strategy: str, spec: SpeculativeConfig, n: int) -> tuple[np.ndarray, LLM]:
    with LLM(target, draft, strategy=strategy, speculative=spec, compile=COMPILED, max_num_seqs=ROWS) as llm:
        out = llm.generate([PROMPT] * n, PARAMS)
    return sequence_counts(out), llm


def test_compiled_sd_matches_the_target_distribution(target8, draft8):
    counts, llm = compiled_counts(target8, draft8, "sd", SpeculativeConfig(K=2), 6_000)
    assert (ROWS, 3, 17) in llm._fed_target.first_call_s  # the verify ran compiled
    assert chi_square_p(counts, exact_distribution(target8, PARAMS)) > FALSE_ALARM


SSD_HITS = SpeculativeConfig(K=2, schedule="given", fanout=(3, 3, 3), placement=DraftPlacement(in_process=True))


def test_compiled_ssd_with_cache_hits_matches_the_target_distribution(target8, draft8):
    counts, llm = compiled_counts(target8, draft8, "ssd", SSD_HITS, 3_000)
    assert (9 * ROWS, 1, 17) in llm._fed_draft.first_call_s  # the branches were drafted compiled
    assert chi_square_p(counts, exact_distribution(target8, PARAMS)) > FALSE_ALARM


def test_negative_control_biased_verifier_is_detected_on_compiled_sd(target8, draft8, monkeypatch):
    monkeypatch.setattr("engine.verifier.verify", argmax_verifier)
    counts, _ = compiled_counts(target8, draft8, "sd", SpeculativeConfig(K=2), 6_000)
    assert chi_square_p(counts, exact_distribution(target8, PARAMS)) < 1e-12


def test_negative_control_biased_verifier_is_detected_on_compiled_ssd(target8, draft8, monkeypatch):
    monkeypatch.setattr("engine.verifier.verify", argmax_verifier)
    counts, _ = compiled_counts(target8, draft8, "ssd", SSD_HITS, 3_000)
    assert chi_square_p(counts, exact_distribution(target8, PARAMS)) < 1e-12
